"""tropical.matmul and friends: a plan (_product_plan) launched (_launching), a compiled kernel."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from .._compiler import Compiler
from .._spec import KernelSpec
from .._target import Target, TargetLike, as_target, resolve_target
from . import _plan_cache
from ._launching import first_error, loaded
from ._specs import all_specs
from ._twins import Fetch, Work, run_async, run_sync

if TYPE_CHECKING:
    import cupy

__all__ = ["backward", "backward_sync", "matmul", "matmul_sync", "warm"]


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

    A call with the layout of an earlier one (shapes, strides, dtypes, devices, semiring, flags)
    reuses its launch, checked and computed once, and only writes the new pointers.
    """
    return await run_async(
        _matmul(
            a,
            b,
            semiring,
            argmax=argmax,
            out=out,
            accumulate=accumulate,
            stream=stream,
            compiler=compiler,
        )
    )


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
    return run_sync(
        _matmul(
            a,
            b,
            semiring,
            argmax=argmax,
            out=out,
            accumulate=accumulate,
            stream=stream,
            compiler=compiler,
        )
    )


def _matmul(
    a: Any,
    b: Any,
    semiring: str,
    *,
    argmax: bool,
    out: Any,
    accumulate: bool,
    stream: Any,
    compiler: Compiler | None,
) -> Work[Any]:
    """The body of ``matmul`` and ``matmul_sync`` (see _twins)."""
    product, c, index = _plan_cache.product(
        a, b, semiring, argmax=argmax, out=out, accumulate=accumulate
    )
    launch = product.launch
    if launch is not None:
        found = loaded(launch.spec, launch.device, compiler)
        if found is None:
            [found] = yield Fetch((launch.spec,), launch.device, compiler)
        launch.run(found, (a, b, c, index), stream)
    else:
        product.fill_outputs(c, index, stream)
    return (c, index) if argmax else c


# -- backward --------------------------------------------------------------------------------


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
    gradient sums over the batch. float32 and float64 only. Enqueued on ``stream`` (default:
    CuPy's current stream), the gradients zeroed there first; planned once per layout as
    ``matmul`` is.
    """
    return await run_async(
        _backward(grad_c, a, b, argmax, semiring, stream=stream, compiler=compiler)
    )


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
    return run_sync(_backward(grad_c, a, b, argmax, semiring, stream=stream, compiler=compiler))


def _backward(
    grad_c: Any,
    a: Any,
    b: Any,
    argmax: Any,
    semiring: str,
    *,
    stream: Any,
    compiler: Compiler | None,
) -> Work[tuple[Any, Any]]:
    """The body of ``backward`` and ``backward_sync`` (see _twins)."""
    launch = _plan_cache.backward(grad_c, a, b, argmax, semiring)
    grads = launch.gradients(stream)
    if not launch.empty:
        found = loaded(launch.spec, launch.device, compiler)
        if found is None:
            [found] = yield Fetch((launch.spec,), launch.device, compiler)
        launch.run(found, (grad_c, argmax, a, b, *grads), stream)
    return grads


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
        raise first_error(group) from None
