"""tropical.matmul and friends: validation, layout, launch; kernels fetched through a Compiler."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import anyio
import anyio.to_thread
import numpy as np

from .._actor import Compiler
from .._cuda import Module
from .._spec import KernelSpec
from .._sync import default_compiler
from .._target import Target, TargetLike, as_target, resolve_target
from . import _semirings
from ._semirings import Semiring, semiring
from ._shapes import check_operands
from ._specs import (
    ARGMAX_MAX_TILES,
    TILES,
    Layout,
    Tile,
    all_specs,
    backward_spec,
    gemm_spec,
    rows_spec,
    shape_class,
    tile_variant,
    tiled_spec,
    tiled_supported,
)
from ._tune import tuned_tiles

if TYPE_CHECKING:
    import cupy

__all__ = ["backward", "backward_sync", "matmul", "matmul_sync", "warm"]

_THREADS = 256
_TILE = 64
_MAX_GRID_YZ = 65535


def _cupy() -> Any:
    import cupy

    return cupy


def _require_cupy(x: Any, what: str) -> Any:
    cupy = _cupy()
    if not isinstance(x, cupy.ndarray):
        hint = ": move it with cupy.asarray(...)" if isinstance(x, np.ndarray) else ""
        raise TypeError(
            f"{what} must be a cupy.ndarray, not {type(x).__module__}.{type(x).__name__}{hint}"
        )
    return x


def _strides(x: Any) -> tuple[int, int, int]:
    """Element strides (batch, rows, columns) of a 2-D or 3-D array; batch 0 for 2-D."""
    item = x.itemsize
    strides = [s // item for s in x.strides]
    if x.ndim == 2:
        return 0, strides[0], strides[1]
    return (0 if x.shape[0] == 1 else strides[0]), strides[1], strides[2]


@dataclass(frozen=True, slots=True)
class _Plan:
    ring: Semiring
    spec: KernelSpec
    a: Any
    b: Any
    c: Any
    index: Any  # int32 argmax output, or None
    batch: int
    m: int
    n: int
    k: int
    device: int
    batched: bool
    tile: Tile | None  # the tuned kernel's tile, if it serves
    rows: int  # KMAX of the skinny kernel, if it serves (else 0)
    transposed: bool  # the skinny kernel runs C' = B' A' (wide products)


def _plan(
    a: Any,
    b: Any,
    semiring_name: str,
    *,
    argmax: bool,
    out: Any,
    accumulate: bool,
    tile: Tile | Literal["auto"] | None = "auto",
) -> _Plan:
    """What to launch. ``tile``: "auto" picks the kernel by shape class (tuned_tiles); the
    autotuner names a tile of the tuned kernel, or None for the generic kernel."""
    ring = semiring(semiring_name)
    a = _require_cupy(a, "a")
    b = _require_cupy(b, "b")
    shapes = check_operands(ring, a, b)
    if a.device.id != b.device.id:
        raise ValueError(f"a is on device {a.device.id} and b on device {b.device.id}")
    batch, m, k, n, batched = shapes.batch, shapes.m, shapes.k, shapes.n, shapes.batched
    shape = (batch, m, n) if batched else (m, n)
    c, index = _outputs(ring, a, shape, argmax=argmax, out=out, accumulate=accumulate)
    _, _, sak = _strides(a)
    _, _, sbn = _strides(b)
    rowmajor = sak == 1 and sbn == 1
    if tile not in ("auto", None) and not rowmajor:
        raise ValueError("the tuned kernel needs row-major operands")
    table = tuned_tiles(a.device.id) if tile == "auto" else None
    spec, tile, rows, transposed = _choose(
        ring, a.dtype, m, n, k, batch=batch, argmax=argmax, accumulate=accumulate,
        rowmajor=rowmajor, tile=tile, table=table,
    )  # fmt: skip
    return _Plan(
        ring, spec, a, b, c, index, batch, m, n, k, a.device.id, batched, tile, rows, transposed
    )


def _choose(
    ring: Semiring,
    dtype: Any,
    m: int,
    n: int,
    k: int,
    *,
    batch: int,
    argmax: bool,
    accumulate: bool,
    rowmajor: bool,
    tile: Tile | Literal["auto"] | None,
    table: dict[str, dict[str, Tile]] | None,
) -> tuple[KernelSpec, Tile | None, int, bool]:
    """The kernel of a product (spec, tile, skinny KMAX or 0, transposed): by shape class from
    ``table`` when ``tile`` is "auto", else the named tile, or the generic kernel for None."""
    rows, transposed = 0, False
    if tile == "auto":
        tile = None
        if rowmajor and tiled_supported(ring.name, dtype):
            kind = shape_class(m, n, k, argmax=argmax, batch=batch)
            if kind.startswith(("rows", "cols")):
                rows, transposed = int(kind[4:]), kind.startswith("cols")
            else:
                tile = (table or TILES)[kind][tile_variant(dtype, argmax=argmax)]
    if argmax and tile is not None and -(-k // tile[2]) > ARGMAX_MAX_TILES:
        tile = None
    if rows:
        spec = rows_spec(ring.name, dtype, accumulate=accumulate, kmax=rows)
    elif tile is not None:
        spec = tiled_spec(ring.name, dtype, argmax=argmax, accumulate=accumulate, tile=tile)
    else:
        layout: Layout = "rowmajor" if rowmajor else "strided"
        spec = gemm_spec(ring.name, dtype, argmax=argmax, accumulate=accumulate, layout=layout)
    return spec, tile, rows, transposed


def kernel_spec(
    m: int,
    n: int,
    k: int,
    semiring: str = "maxplus",
    dtype: Any = "float32",
    *,
    argmax: bool = False,
    accumulate: bool = False,
    batch: int = 1,
) -> KernelSpec:
    """The kernel that ``matmul`` would launch for a ``batch`` x M x N x K product of
    contiguous operands, with the default tiles (TILES): for compiling it ahead of use, or on a
    machine without a GPU (``await compiler.compile(tropical.kernel_spec(...))``)."""
    ring = _semirings.semiring(semiring)
    dtype = ring.check_dtype(dtype)
    if min(m, n, k, batch) < 1:
        raise ValueError(f"sizes must be positive, got M={m}, N={n}, K={k}, batch={batch}")
    spec, *_ = _choose(
        ring, dtype, m, n, k, batch=batch, argmax=argmax, accumulate=accumulate,
        rowmajor=True, tile="auto", table=None,
    )  # fmt: skip
    return spec


def _outputs(
    ring: Semiring, a: Any, shape: tuple[int, ...], *, argmax: bool, out: Any, accumulate: bool
) -> tuple[Any, Any]:
    cupy = _cupy()
    if out is None:
        if accumulate:
            raise ValueError("accumulate=True needs out: C = C (+) A (x) B updates out in place")
        with cupy.cuda.Device(a.device.id):
            c = cupy.empty(shape, dtype=a.dtype)
            index = cupy.empty(shape, dtype=cupy.int32) if argmax else None
        return c, index
    if argmax:
        if not (isinstance(out, tuple) and len(out) == 2):
            raise TypeError("with argmax=True, out must be a (values, argmax) pair of arrays")
        c, index = out
        _require_cupy(index, "out[1] (argmax)")
        if index.dtype != np.int32 or index.shape != shape:
            raise ValueError(
                f"out[1] (argmax) must be int32 of shape {shape}, "
                f"got {index.dtype} of shape {index.shape}"
            )
    else:
        c, index = out, None
    _require_cupy(c, "out")
    if c.dtype != a.dtype or c.shape != shape:
        raise ValueError(
            f"out must be {a.dtype} of shape {shape}, got {c.dtype} of shape {c.shape}"
        )
    return c, index


def _launch(plan: _Plan, module: Module, stream: Any) -> None:
    cupy = _cupy()
    sab, sam, sak = _strides(plan.a)
    sbb, sbk, sbn = _strides(plan.b)
    c3 = plan.c if plan.batched else plan.c[None]
    scb, scm, scn = (s // c3.itemsize for s in c3.strides)
    if plan.index is not None:
        i3 = plan.index if plan.batched else plan.index[None]
        sib, sim, sin = (s // 4 for s in i3.strides)
        index_arg: Any = plan.index
    else:
        sib = sim = sin = 0
        index_arg = np.uint64(0)  # a null pointer
    sizes = (np.int64(plan.m), np.int64(plan.n), np.int64(plan.k), np.int64(plan.batch))
    if plan.rows:
        # The skinny kernel computes C' = A' B'; wide products run transposed (A' = B^T,
        # B' = A^T, C' = C^T: the products commute). Strides are (batch, rows, columns).
        if plan.transposed:
            operands = (plan.b, plan.a, plan.c)
            strides = (sbb, sbn, sbk, sab, sak, sam, scb, scn, scm)
            m, n = plan.n, plan.m
        else:
            operands = (plan.a, plan.b, plan.c)
            strides = (sab, sam, sak, sbb, sbk, sbn, scb, scm, scn)
            m, n = plan.m, plan.n
        # Rows of A' load 16 bytes at a time, and rows of C' store four elements at a time,
        # where contiguous and aligned (see tropical_gemm_rows).
        loads = strides[2] == 1 and _vectors(operands[0], strides[0:2], 16 // plan.a.itemsize)
        stores = strides[8] == 1 and _vectors(operands[2], strides[6:8], 4)
        grid = (min(-(-m // _THREADS), 1 << 16), 1, min(plan.batch, _MAX_GRID_YZ))
        block: tuple[int, ...] = (_THREADS,)
        dims = (m, n, plan.k, plan.batch)
        args: tuple[Any, ...] = (
            *operands,
            *map(np.int64, (*dims, *strides)),
            np.int32(loads | stores << 1),
        )
    elif plan.tile is not None:
        bm, bn, _, tm, tn, _ = plan.tile
        grid = _grid(plan, bm, bn)
        block = ((bm // tm) * (bn // tn),)
        # 16-byte loads need 16-byte aligned rows and batches.
        vector = 16 // plan.a.itemsize
        aligned = _vectors(plan.a, (sab, sam), vector) and _vectors(plan.b, (sbb, sbk), vector)
        args = (
            plan.a, plan.b, plan.c, index_arg, *sizes,
            np.int64(sab), np.int64(sam), np.int64(sbb), np.int64(sbk),
            np.int64(scb), np.int64(scm), np.int64(scn),
            np.int64(sib), np.int64(sim), np.int64(sin), np.int32(aligned),
        )  # fmt: skip
    else:
        grid = _grid(plan, _TILE, _TILE)
        block = (_THREADS,)
        args = (
            plan.a, plan.b, plan.c, index_arg, *sizes,
            np.int64(sab), np.int64(sam), np.int64(sak),
            np.int64(sbb), np.int64(sbk), np.int64(sbn),
            np.int64(scb), np.int64(scm), np.int64(scn),
            np.int64(sib), np.int64(sim), np.int64(sin),
        )  # fmt: skip
    function = module.get_function(plan.spec.name_expressions[0])
    with cupy.cuda.Device(plan.device):
        function(grid, block, args, stream=stream)


def _vectors(x: Any, strides: tuple[int, ...], width: int) -> bool:
    """Whether ``x`` can be read or written ``width`` elements at a time at offsets that are
    multiples of ``strides`` (in elements): its start and every stride aligned to the vector."""
    return bool(x.data.ptr % (width * x.itemsize) == 0 and all(s % width == 0 for s in strides))


def _grid(plan: _Plan, bm: int, bn: int) -> tuple[int, int, int]:
    # Row tiles on x (up to 2**31 - 1); column tiles and batches beyond 65535 are looped over.
    return (
        -(-plan.m // bm),
        min(-(-plan.n // bn), _MAX_GRID_YZ),
        min(plan.batch, _MAX_GRID_YZ),
    )


# Modules the default compiler loaded, by (key, device): matmul(compiler=None) reaches the
# process-wide Compiler (another thread's event loop) only on first use of a kernel.
_default_modules: dict[tuple[str, int], Module] = {}


def _default_module(spec: KernelSpec, device: int) -> Module:
    """Blocking: the default compiler's module for ``spec`` on ``device``, memoised."""
    memo = (default_compiler().key(spec), device)
    module = _default_modules.get(memo)
    if module is None:
        module = _default_modules[memo] = default_compiler().get_sync(spec, device=device)
    return module


async def _module(spec: KernelSpec, device: int, compiler: Compiler | None) -> Module:
    if compiler is not None:
        return await compiler.get(spec, device=device)
    module = _default_modules.get((default_compiler().key(spec), device))
    if module is None:  # first use: the compile may take a while, so off this event loop
        module = await anyio.to_thread.run_sync(_default_module, spec, device)
    return module


def _module_sync(spec: KernelSpec, device: int, compiler: Compiler | None) -> Module:
    if compiler is not None:
        return compiler.get_sync(spec, device=device)
    return _default_module(spec, device)


def _prepare(plan: _Plan, accumulate: bool, stream: Any) -> bool:
    """Handle what needs no kernel; True if the product kernel must be launched."""
    if not (plan.m and plan.n and plan.batch):
        return False  # an empty result
    if plan.k == 0:
        # The sum over no k is the semiring's zero (and C (+) zero = C).
        if not accumulate:
            cupy = _cupy()
            on_stream = stream if stream is not None else contextlib.nullcontext()
            with cupy.cuda.Device(plan.device), on_stream:
                plan.c.fill(plan.ring.zero(plan.c.dtype))
                if plan.index is not None:
                    plan.index.fill(-1)
        return False
    return True


def _result(plan: _Plan, argmax: bool) -> Any:
    return (plan.c, plan.index) if argmax else plan.c


async def matmul(
    a: cupy.ndarray,
    b: cupy.ndarray,
    semiring: str = "maxplus",
    *,
    argmax: bool = False,
    out: Any = None,
    accumulate: bool = False,
    stream: Any = None,
    compiler: Compiler | None = None,
) -> Any:
    """C = A (x) B over ``semiring`` on the GPU, enqueued on ``stream`` (default: CuPy's
    current stream) without synchronising. Returns C, or (C, argmax) with ``argmax=True``:
    the int32 index of the winning k (the smallest on ties; -1 where C is the semiring's zero).

    ``a`` (M, K) and ``b`` (K, N) are CuPy arrays of one dtype, with any strides (transposed
    and sliced views are used in place); 3-D operands carry a leading batch dimension, and a
    batch of 1 (or a 2-D operand) broadcasts. ``out`` receives C (with ``argmax``, a
    (C, argmax) pair); ``accumulate=True`` computes C = C (+) A (x) B into ``out``. The kernel is
    fetched through ``compiler`` (default: aionvrtc's process-wide Compiler), compiled on first use.
    """
    plan = _plan(a, b, semiring, argmax=argmax, out=out, accumulate=accumulate)
    if _prepare(plan, accumulate, stream):
        _launch(plan, await _module(plan.spec, plan.device, compiler), stream)
    return _result(plan, argmax)


def matmul_sync(
    a: cupy.ndarray,
    b: cupy.ndarray,
    semiring: str = "maxplus",
    *,
    argmax: bool = False,
    out: Any = None,
    accumulate: bool = False,
    stream: Any = None,
    compiler: Compiler | None = None,
) -> Any:
    """``matmul`` for code that is not async (scripts, PyTorch autograd functions). Like
    ``matmul`` it only enqueues the work; ``compiler``, if given, must run in a portal or this
    must be a worker thread of its event loop."""
    plan = _plan(a, b, semiring, argmax=argmax, out=out, accumulate=accumulate)
    if _prepare(plan, accumulate, stream):
        _launch(plan, _module_sync(plan.spec, plan.device, compiler), stream)
    return _result(plan, argmax)


# -- backward --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _BackwardPlan:
    spec: KernelSpec
    args: tuple[Any, ...]
    blocks: int
    device: int
    grads: tuple[Any, Any]


def _backward_plan(grad_c: Any, a: Any, b: Any, argmax: Any, semiring_name: str) -> _BackwardPlan:
    cupy = _cupy()
    ring = semiring(semiring_name)
    for x, what in ((grad_c, "grad_c"), (a, "a"), (b, "b"), (argmax, "argmax")):
        _require_cupy(x, what)
    spec = backward_spec(ring.name, a.dtype)
    dims = check_operands(ring, a, b)
    shape = (dims.batch, dims.m, dims.n) if dims.batched else (dims.m, dims.n)
    if grad_c.shape != shape or grad_c.dtype != a.dtype:
        raise ValueError(
            f"grad_c must be {a.dtype} of shape {shape}, got {grad_c.dtype} of {grad_c.shape}"
        )
    if argmax.shape != shape or argmax.dtype != np.int32:
        raise ValueError(
            f"argmax must be int32 of shape {shape}, got {argmax.dtype} of {argmax.shape}"
        )
    device = a.device.id
    with cupy.cuda.Device(device):
        grad_a, grad_b = cupy.zeros_like(a, order="C"), cupy.zeros_like(b, order="C")

    g3 = grad_c if dims.batched else grad_c[None]
    i3 = argmax if dims.batched else argmax[None]
    args = (
        grad_c,
        argmax,
        a,
        b,
        grad_a,
        grad_b,
        np.int64(dims.m),
        np.int64(dims.n),
        np.int64(dims.batch),
        *(np.int64(s // g3.itemsize) for s in g3.strides),
        *(np.int64(s // 4) for s in i3.strides),
        *(np.int64(s) for s in _strides(a)),
        *(np.int64(s) for s in _strides(b)),
        *(np.int64(s) for s in _strides(grad_a)),
        *(np.int64(s) for s in _strides(grad_b)),
    )
    total = dims.batch * dims.m * dims.n
    blocks = max(1, min(-(-total // _THREADS), 1 << 20))  # a grid-stride loop covers the rest
    return _BackwardPlan(spec, args, blocks if total else 0, device, (grad_a, grad_b))


def _backward_launch(plan: _BackwardPlan, module: Module, stream: Any) -> None:
    cupy = _cupy()
    function = module.get_function(plan.spec.name_expressions[0])
    with cupy.cuda.Device(plan.device):
        function((plan.blocks,), (_THREADS,), plan.args, stream=stream)


async def backward(
    grad_c: Any,
    a: Any,
    b: Any,
    argmax: Any,
    semiring: str = "maxplus",
    *,
    stream: Any = None,
    compiler: Compiler | None = None,
) -> tuple[Any, Any]:
    """Gradients (grad_a, grad_b) of C = A (x) B given dL/dC and the forward argmax.

    The gradient flows through the winning k only: unchanged for max-plus and min-plus, by the
    product rule for max-times (grad_a[m, k] += g * b[k, n]). A broadcast (batch 1) operand's
    gradient sums over the batch. float32 and float64 only.
    """
    plan = _backward_plan(grad_c, a, b, argmax, semiring)
    if plan.blocks:
        _backward_launch(plan, await _module(plan.spec, plan.device, compiler), stream)
    return plan.grads


def backward_sync(
    grad_c: Any,
    a: Any,
    b: Any,
    argmax: Any,
    semiring: str = "maxplus",
    *,
    stream: Any = None,
    compiler: Compiler | None = None,
) -> tuple[Any, Any]:
    """``backward`` for code that is not async."""
    plan = _backward_plan(grad_c, a, b, argmax, semiring)
    if plan.blocks:
        _backward_launch(plan, _module_sync(plan.spec, plan.device, compiler), stream)
    return plan.grads


# -- warm-up --------------------------------------------------------------------------------


async def warm(
    semirings: Any = None,
    dtypes: Any = None,
    *,
    arch: TargetLike | Iterable[TargetLike] | None = None,
    compiler: Compiler | None = None,
) -> int:
    """Compile every kernel of the named semirings and dtypes (default: all) ahead of use, in
    parallel, for target ``arch`` or each of several (``arch=["sm_80", "sm_90"]``); returns
    how many kernels were compiled or found (kernels times targets). Without ``compiler``, a
    temporary Compiler with one worker per CPU fills the disk cache that later requests read.
    ``arch`` defaults to the compiler's target, else ``resolve_target``'s: ``$AIONVRTC_ARCH``
    or the current GPU's.

    ValueError for names that are not semirings or dtypes, and for a semiring asked for with
    none of the dtypes it takes (``warm(["andor"], ["float32"])``: andor takes bool);
    NvrtcError, before anything is compiled, for a target this NVRTC cannot compile for.
    Without ``compiler``, AionvrtcError if kernels it compiled could not be kept on disk (the
    cache dir is not writable or not trusted): they would be lost with the temporary
    Compiler."""
    import os

    from .. import _nvrtc

    specs = all_specs(semirings, dtypes)
    if arch is None:
        targets = [compiler.target if compiler is not None else resolve_target()]
    elif isinstance(arch, str | Target):
        targets = [as_target(arch)]
    else:
        targets = list(dict.fromkeys(as_target(one) for one in arch))
        if not targets:
            raise ValueError("arch: name at least one target, such as ['sm_90']")
    for target in targets:
        await anyio.to_thread.run_sync(_nvrtc.check_target, target)
    if compiler is not None:
        await _compile_all(compiler, specs, targets)
        return len(specs) * len(targets)
    # It fills the disk cache: no layers to serve from, no manifest to record to (see the CLI).
    async with Compiler(
        arch=targets[0], concurrency=os.cpu_count() or 1, manifest=False, layers=[]
    ) as temporary:
        await _compile_all(temporary, specs, targets)
        stats = temporary.stats()
    lost = stats.compiles - stats.disk.writes
    if lost > 0:
        from .._exceptions import AionvrtcError
        from .._store.disk import default_cache_dir

        state = "not trusted" if not stats.disk.trusted else "not writable"
        names = ", ".join(target.arch for target in targets)
        raise AionvrtcError(
            f"{lost} of the {stats.compiles} kernels compiled for {names} were not kept: the "
            f"disk cache at {default_cache_dir()} is {state} (aionvrtc doctor says why, and "
            "the fix)"
        )
    return len(specs) * len(targets)


async def _compile_all(compiler: Compiler, specs: list[KernelSpec], targets: list[Target]) -> None:
    try:
        async with anyio.create_task_group() as tg:
            for target in targets:
                for spec in specs:
                    tg.start_soon(functools.partial(compiler.compile, spec, arch=target))
    except ExceptionGroup as group:
        # The first compile that failed stopped the others: raise its error as compile()
        # would, not a group of one (a failure is rarely more than one error repeated).
        first = group.exceptions[0]
        while isinstance(first, ExceptionGroup):
            first = first.exceptions[0]
        raise first from None
