"""Inputs and a brute-force oracle for the tropical tests (CPU and GPU)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from aionvrtc import Compiler, KernelSpec
from aionvrtc.tropical import SEMIRINGS


def compile_each_for_sm_90(specs: Sequence[KernelSpec], cache_dir: Path) -> None:
    """Compile ``specs`` concurrently for sm_90 through a Compiler (real NVRTC): each once, each
    a cubin holding its one kernel."""

    async def main() -> tuple[list[Any], Any]:
        async with Compiler(arch="sm_90", cache_dir=cache_dir, concurrency=2) as compiler:
            artifacts: list[Any] = [None] * len(specs)

            async def one(i: int) -> None:
                artifacts[i] = await compiler.compile(specs[i])

            async with anyio.create_task_group() as tg:
                for i in range(len(specs)):
                    tg.start_soon(one, i)
            return artifacts, compiler.stats()

    artifacts, stats = anyio.run(main)
    assert stats.compiles == len(specs)
    for spec, artifact in zip(specs, artifacts, strict=True):
        assert artifact.kind == "cubin"
        assert artifact.image[:4] == b"\x7fELF"
        assert set(artifact.lowered_names) == {spec.name_expressions[0]}


def operands(
    rng: np.random.Generator,
    ring: str,
    dtype: Any,
    shape_a: tuple[int, ...],
    shape_b: tuple[int, ...],
    *,
    ties: bool = False,
    infinities: bool = True,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Fresh random operands, with the type's infinities sprinkled in (unless ``infinities`` is
    false: then integer tiles take the fast path); ``ties`` draws from a handful of values so
    that equal products (and the smallest-k rule) are common."""
    dtype = np.dtype(dtype)

    def draw(shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
        if dtype == np.bool_:
            flags: np.ndarray[Any, Any] = rng.random(shape) < (0.2 if not ties else 0.5)
            return flags
        x: np.ndarray[Any, Any]
        if ties:
            x = rng.integers(0, 4, size=shape).astype(dtype)
        elif dtype.kind == "f":
            x = rng.standard_normal(shape).astype(dtype) * 10
        else:
            x = rng.integers(-1000, 1000, size=shape).astype(dtype)
        if ring == "maxmul":
            x = np.abs(x)  # max-times is defined for non-negative inputs
            return x
        if x.size and not ties and infinities:
            special = rng.random(shape) < 0.05
            if dtype.kind == "f":
                x[special] = rng.choice(np.array([-np.inf, np.inf], dtype=dtype), special.sum())
            else:
                info = np.iinfo(dtype)
                x[special] = rng.choice(np.array([info.min, info.max], dtype=dtype), special.sum())
        return x

    return draw(shape_a), draw(shape_b)


def _mul(ring: str, x: Any, y: Any, dtype: np.dtype[Any]) -> Any:
    if ring == "andor":
        return bool(x and y)
    if dtype.kind == "f":
        with np.errstate(invalid="ignore", over="ignore"):
            p = dtype.type(x + y) if ring != "maxmul" else dtype.type(x * y)
        return SEMIRINGS[ring].zero(dtype) if np.isnan(p) else p
    info = np.iinfo(dtype)
    x, y = int(x), int(y)  # Python ints: no overflow, then saturate by hand
    if ring == "maxmul":
        return min(x * y, info.max)
    if ring == "maxplus":
        if info.min in (x, y):
            return info.min
        return min(max(x + y, info.min + 1), info.max)
    if info.max in (x, y):
        return info.max
    return min(max(x + y, info.min), info.max - 1)


def brute_force(
    a: np.ndarray[Any, Any], b: np.ndarray[Any, Any], ring: str
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Triple loop over Python scalars: the definition, slowly."""
    semiring = SEMIRINGS[ring]
    dtype = a.dtype
    zero = semiring.zero(dtype)
    m, k = a.shape
    n = b.shape[1]
    value = np.empty((m, n), dtype=dtype)
    index = np.full((m, n), -1, dtype=np.int32)
    for i in range(m):
        for j in range(n):
            best, arg = zero, -1
            for t in range(k):
                p = _mul(ring, a[i, t], b[t, j], dtype)
                if ring == "andor":
                    wins = p and not best
                elif semiring.maximise:
                    wins = p > best
                else:
                    wins = p < best
                if wins:
                    best, arg = p, t
            value[i, j] = best
            index[i, j] = arg
    return value, index


def numpy_backward(
    g: np.ndarray[Any, Any],
    a: np.ndarray[Any, Any],
    b: np.ndarray[Any, Any],
    index: np.ndarray[Any, Any],
    ring: str,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The gradients of C = A (x) B given dL/dC ``g`` and the argmax, one output at a time."""
    grad_a, grad_b = np.zeros(a.shape, np.float64), np.zeros(b.shape, np.float64)
    for i, j in zip(*np.nonzero(index >= 0), strict=True):
        k = index[i, j]
        grad_a[i, k] += g[i, j] * (b[k, j] if ring == "maxmul" else 1)
        grad_b[k, j] += g[i, j] * (a[i, k] if ring == "maxmul" else 1)
    return grad_a, grad_b


def gpu(x: np.ndarray[Any, Any]) -> Any:
    """``x`` on the current GPU."""
    import cupy

    return cupy.asarray(x)


def host(x: Any) -> np.ndarray[Any, Any]:
    """``x`` (a CuPy array) in host memory."""
    import cupy

    result: np.ndarray[Any, Any] = cupy.asnumpy(x)
    return result


async def until_loaded(compiler: Compiler, spec: KernelSpec) -> None:
    """Wait until ``spec`` is loaded on device 0 (loading in the background)."""
    with anyio.fail_after(120):  # a background compile on the GPU machine's CPUs
        while compiler.loaded(spec, device=0) is None:
            await anyio.sleep(0.02)


def brute_force_counts(
    a: np.ndarray[Any, Any],
    b: np.ndarray[Any, Any],
    ring: str,
    counts: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] | None = None,
    modulus: int | None = None,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """A counted product by the definition, in Python's integers: each value (``brute_force``'s)
    with the sum, over the k whose product attains it, of the product of the two entries'
    counts (1 each without ``counts``); none where the value is the zero; modulo ``modulus``,
    else -1 past 2^63 - 1 or where a negative count takes part."""
    value, _ = brute_force(a, b, ring)
    semiring = SEMIRINGS[ring]
    zero = semiring.zero(a.dtype)
    na, nb = (
        counts
        if counts is not None
        else (((x != zero) & ~np.isnan(x.astype(np.float64))).astype(np.int64) for x in (a, b))
    )
    m, k = a.shape
    n = b.shape[1]
    found = np.zeros((m, n), np.int64)
    for i in range(m):
        for j in range(n):
            if value[i, j] == zero or value[i, j] != value[i, j]:
                continue
            terms = [
                (int(na[i, t]), int(nb[t, j]))
                for t in range(k)
                if _mul(ring, a[i, t], b[t, j], a.dtype) == value[i, j]
            ]
            if modulus is not None:
                found[i, j] = sum(x * y for x, y in terms) % modulus
            elif any(x < 0 or y < 0 for x, y in terms):
                found[i, j] = -1
            else:
                total = sum(x * y for x, y in terms)
                found[i, j] = total if total < 1 << 63 else -1
    return value, found
