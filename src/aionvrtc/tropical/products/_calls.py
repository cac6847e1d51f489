"""tropical.matmul and friends: a plan (_product_plan) launched (_launching), a compiled kernel."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from ..._compiler import Compiler
from ..._cuda import Module
from ..._spec import KernelSpec
from ..._target import Target, TargetLike, as_target, resolve_target
from ._counted import CountedLaunch
from ._counts import check_counted
from ._launching import Launch, first_error, load_soon, loaded
from ._plan_cache import planned_backward, planned_counted, planned_product, ready
from ._product_plan import batch_specs
from ._specs import all_specs, pairs
from ._twins import Fetch, Work, run_async, run_sync

if TYPE_CHECKING:
    import cupy

__all__ = [
    "backward",
    "backward_sync",
    "matmul",
    "matmul_sync",
    "matmul_work",
    "warm",
    "warm_specs",
]


async def matmul(
    a: cupy.ndarray,
    b: cupy.ndarray,
    semiring: str = "maxplus",
    *,
    argmax: bool = False,
    out: Any = None,
    accumulate: bool = False,
    counts: Any = None,
    modulus: int | None = None,
    stream: Any = None,
    compiler: Compiler | None = None,
) -> Any:
    """C = A (x) B over ``semiring`` on the GPU, enqueued on ``stream`` without synchronising.

    ``a`` (M, K) and ``b`` (K, N) are CuPy arrays of one dtype, with any strides (transposed
    and sliced views are used in place); 3-D operands carry a leading batch dimension, and a
    batch of 1 (or a 2-D operand) broadcasts. The kernel is fetched through ``compiler``,
    compiled on first use. An empty result launches nothing; a sum over no k (K = 0) leaves the
    semiring's zero in C, and -1 in the argmax (C unchanged where it accumulates).

    A call with the layout of an earlier one (shapes, strides, dtypes, devices, semiring, flags)
    reuses its launch, checked and computed once, and only writes the new pointers. Where the
    product's kernel is not loaded yet but another that computes it is (another tile, the
    generic kernel), the call runs on that one at once, and its own is compiled and loaded in
    the background for the calls after it.

    Args:
        a: The left operand: a CuPy array of shape (M, K), or (batch, M, K).
        b: The right operand: a CuPy array of shape (K, N), or (batch, K, N), of ``a``'s dtype
            and on ``a``'s device.
        semiring: ``"maxplus"`` (max over k of a + b), ``"minplus"`` (min over k of a + b) or
            ``"maxmul"`` (max over k of a * b, for non-negative inputs), on float32, float64,
            int32 or int64; or ``"andor"`` on bool.
        argmax: Also compute the int32 index of the winning k: the smallest on ties, -1 where
            C is the semiring's zero.
        out: The array that receives C, of C's shape and dtype on the operands' device; with
            ``argmax``, a (C, argmax) pair of such arrays, the argmax int32; with ``counts``, a
            (C, counts) pair, the counts int64. Default: new arrays.
        accumulate: Compute C = C (+) A (x) B into ``out``, which must then be given (with
            ``counts``, the counts there joined too).
        counts: Also count, for each element of C, the ways it is attained: True (each entry
            of ``a`` and ``b`` counts once, except the semiring's zero and NaN), or a pair
            (counts of ``a``, counts of ``b``) of non-negative int64 CuPy arrays of their
            shapes, any strides. A product's count is the product of its two entries'; equal
            products' counts add, a better product's replace them. Not with ``argmax``.
        modulus: With ``counts``, count modulo this int from 2 to 2^31 - 1 (a prime: residues
            modulo several are joined by the Chinese remainder theorem); the counts given are
            reduced first (a negative one, an exact count's -1, read as its 64 bits unsigned,
            as the reference reads it: pass counts, not overflow marks). Default: exact int64
            counts, -1 where one passes 2^63 - 1 (and in every count made from it), never a
            wrong count.
        stream: The CuPy stream the work is enqueued on. Default: CuPy's current stream.
        compiler: The Compiler that fetches the kernel. Default: aionvrtc's process-wide
            Compiler.

    Returns:
        C, of shape (M, N), or (batch, M, N) where an operand is 3-D (``out`` where given,
        else a new array). With ``argmax=True``, the pair (C, argmax); with ``counts``, the
        pair (C, counts).

    Raises:
        TypeError: ``a``, ``b`` or ``out`` is not a CuPy array; ``a`` and ``b`` differ in
            dtype, or have one that ``semiring`` does not take; with ``argmax`` or ``counts``,
            ``out`` is not a pair; ``counts`` is neither True nor a pair of CuPy arrays;
            ``modulus`` is not an int.
        ValueError: ``semiring`` is not one of the four; an operand is not 2-D or 3-D, ``a``'s
            columns do not match ``b``'s rows, or the batch sizes differ and neither is 1; the
            operands, their counts or ``out`` are on different devices; ``out`` is not of C's
            shape and dtype (the argmax not int32, the counts not int64); ``accumulate``
            without ``out``; ``counts`` with ``argmax``, or not int64 of their operands'
            shapes; ``modulus`` out of range, or without ``counts``.
        cupy.cuda.memory.OutOfMemoryError: C, the argmax or the counts do not fit in GPU memory.
        CompileError: NVRTC refused the kernel. This and the errors below come from the
            kernel's first use on a device only.
        NvrtcError: NVRTC cannot be used, or cannot compile for this GPU.
        ModuleLoadError: The kernel could not be loaded onto the device
            (``GPUOutOfMemoryError`` where GPU memory is full).
        CompilerClosed: ``compiler`` is closed.
        RuntimeError: ``compiler`` has not been opened (``async with``).
    """
    return await run_async(
        matmul_work(
            a,
            b,
            semiring,
            argmax=argmax,
            out=out,
            accumulate=accumulate,
            counts=counts,
            modulus=modulus,
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
    counts: Any = None,
    modulus: int | None = None,
    stream: Any = None,
    compiler: Compiler | None = None,
) -> Any:
    """``matmul`` for code that is not async (scripts, PyTorch autograd functions).

    Like ``matmul`` it only enqueues the work. The kernel's first use on a device blocks this
    thread while it is compiled or loaded.

    Args:
        a: The left operand: a CuPy array of shape (M, K), or (batch, M, K).
        b: The right operand: a CuPy array of shape (K, N), or (batch, K, N), of ``a``'s dtype
            and on ``a``'s device.
        semiring: ``"maxplus"``, ``"minplus"``, ``"maxmul"`` or ``"andor"``, as for
            ``matmul``.
        argmax: Also compute the int32 index of the winning k (as ``matmul``).
        out: The array that receives C; with ``argmax``, a (C, argmax) pair. Default: new
            arrays.
        accumulate: Compute C = C (+) A (x) B into ``out``, which must then be given.
        counts: Also count the ways each element of C is attained (as ``matmul``).
        modulus: With ``counts``, count modulo this int (as ``matmul``).
        stream: The CuPy stream the work is enqueued on. Default: CuPy's current stream.
        compiler: The Compiler that fetches the kernel. Default: aionvrtc's process-wide
            Compiler, usable from any thread. Another must run in a portal
            (``Compiler.use_portal``), or this must be a worker thread of its event loop.

    Returns:
        C, or the pair (C, argmax) with ``argmax=True`` or (C, counts) with ``counts``, as
        ``matmul`` returns them.

    Raises:
        TypeError: ``a``, ``b`` or ``out`` is not a CuPy array, or the dtypes, ``counts`` or
            ``modulus`` do not fit (as for ``matmul``).
        ValueError: The semiring, shapes, devices, ``out``, ``counts`` or ``modulus`` do not
            fit (as for ``matmul``).
        cupy.cuda.memory.OutOfMemoryError: C, the argmax or the counts do not fit in GPU memory.
        CompileError: NVRTC refused the kernel. This and the errors below come from the
            kernel's first use on a device only.
        NvrtcError: NVRTC cannot be used, or cannot compile for this GPU.
        ModuleLoadError: The kernel could not be loaded onto the device
            (``GPUOutOfMemoryError`` where GPU memory is full).
        CompilerClosed: ``compiler`` is closed.
        RuntimeError: ``compiler`` has not been opened, or runs in no portal and this is not a
            worker thread of its event loop.
    """
    return run_sync(
        matmul_work(
            a,
            b,
            semiring,
            argmax=argmax,
            out=out,
            accumulate=accumulate,
            counts=counts,
            modulus=modulus,
            stream=stream,
            compiler=compiler,
        )
    )


def matmul_work(
    a: Any,
    b: Any,
    semiring: str,
    *,
    argmax: bool,
    out: Any,
    accumulate: bool,
    counts: Any,
    modulus: int | None,
    stream: Any,
    compiler: Compiler | None,
    standins: bool = True,
) -> Work[Any]:
    """The body of ``matmul`` and ``matmul_sync`` (see _twins): what a contraction's step
    runs inside its own body (``yield from``). ``standins``: a product whose kernel is not
    loaded may run on another that is, its own loading meanwhile; else its own kernel, always
    asked for (a Fetch, answered at once where it is loaded), so that a program's capture
    knows every module its graph launches."""
    if check_counted(counts, modulus, argmax=argmax):
        counted = _counted(a, b, semiring, counts, modulus, out=out, accumulate=accumulate,
                           stream=stream, compiler=compiler, standins=standins)  # fmt: skip
        return (yield from counted)
    product, c, index = planned_product(
        a, b, semiring, argmax=argmax, out=out, accumulate=accumulate
    )
    launch = product.launch
    if launch is not None:
        found = loaded(launch.spec, launch.device, compiler) if standins else None
        if found is None:  # a kernel that can stand in, else its own fetched
            standin = ready(product, compiler) if standins else None
            if standin is not None:
                launch, found = standin
            else:
                [found] = yield Fetch((launch.spec,), launch.device, compiler)
        launch.run(found, (a, b, c, index), stream)
    else:
        product.fill_outputs(c, index, stream)
    return (c, index) if argmax else c


def _counted(
    a: Any,
    b: Any,
    semiring: str,
    counts: Any,
    modulus: int | None,
    *,
    out: Any,
    accumulate: bool,
    stream: Any,
    compiler: Compiler | None,
    standins: bool,
) -> Work[tuple[Any, Any]]:
    """A counted product: its own kernels where loaded (in two passes, the value product's
    first, or a stand-in of it), else (with ``standins``) the other form's one pass where that
    is (its own loading in the background), else its own fetched."""
    product, (c, made) = planned_counted(
        a, b, semiring, counts, modulus, out=out, accumulate=accumulate
    )
    launch = product.launch
    if launch is None:
        product.fill_outputs(c, made, stream)
        return c, made
    given = (None, None) if counts is True else counts
    own: list[Launch | CountedLaunch] = [launch]
    value = None
    if product.after_value:  # the value product into C, then its counts
        value = planned_product(a, b, semiring, argmax=False, out=c, accumulate=False)[0]
        assert value.launch is not None  # both have work where either has
        own.insert(0, value.launch)
    runs: list[tuple[Launch | CountedLaunch, Module]] = []  # each launch with its kernel, loaded
    if standins:
        found = loaded(launch.spec, launch.device, compiler)
        if found is not None:
            runs = [(launch, found)]
            if value is not None:  # and the value product's kernel, or one standing in
                first = ready(value, compiler)
                runs = [first, *runs] if first is not None else []
        if not runs:  # the other form in one pass, if loaded, while its own load
            other = product.standin
            assert other is not None
            one = loaded(other.spec, other.device, compiler)
            if one is not None:
                load_soon([x.spec for x in own], launch.device, compiler)
                runs = [(other, one)]
    if not runs:
        modules = yield Fetch(tuple(x.spec for x in own), launch.device, compiler)
        runs = list(zip(own, modules, strict=True))
    for each, module in runs:
        if isinstance(each, CountedLaunch):
            each.run(module, (a, given[0], b, given[1], c, made), stream)
        else:
            each.run(module, (a, b, c, None), stream)
    return c, made


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
    product rule for max-times (grad_a[m, k] += g * b[k, n]). Where the argmax is -1 (no k
    won) nothing flows. A broadcast (batch 1) operand's gradient sums over the batch. float32
    and float64 only. Enqueued on ``stream`` without synchronising, the gradients zeroed there
    first; planned once per layout as ``matmul`` is.

    Args:
        grad_c: dL/dC: a CuPy array of C's shape and of the operands' dtype.
        a: The forward's left operand, as given to ``matmul``.
        b: The forward's right operand, as given to ``matmul``.
        argmax: The forward's argmax (``matmul(..., argmax=True)``): int32, of C's shape.
        semiring: The forward's semiring: ``"maxplus"``, ``"minplus"`` or ``"maxmul"``.
        stream: The CuPy stream the work is enqueued on. Default: CuPy's current stream.
        compiler: The Compiler that fetches the kernel. Default: aionvrtc's process-wide
            Compiler.

    Returns:
        The pair (grad_a, grad_b), new C-contiguous arrays of ``a``'s and ``b``'s shapes and
        dtype on their device (the two share one allocation).

    Raises:
        TypeError: An input is not a CuPy array; the operands are not float32 or float64, or
            differ in dtype; ``semiring`` is ``"andor"``.
        ValueError: ``semiring`` is not one of the four; the operands' dtype is none of the
            kernels'; ``a`` and ``b`` do not multiply (as for ``matmul``); ``grad_c`` is not
            of C's shape and the operands' dtype, or ``argmax`` not int32 of C's shape; the
            inputs are on different devices.
        cupy.cuda.memory.OutOfMemoryError: The gradients do not fit in GPU memory.
        CompileError: NVRTC refused the kernel. This and the errors below come from the
            kernel's first use on a device only.
        NvrtcError: NVRTC cannot be used, or cannot compile for this GPU.
        ModuleLoadError: The kernel could not be loaded onto the device
            (``GPUOutOfMemoryError`` where GPU memory is full).
        CompilerClosed: ``compiler`` is closed.
        RuntimeError: ``compiler`` has not been opened (``async with``).
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
    """``backward`` for code that is not async.

    Like ``backward`` it only enqueues the work. The kernel's first use on a device blocks this
    thread while it is compiled or loaded.

    Args:
        grad_c: dL/dC: a CuPy array of C's shape and of the operands' dtype.
        a: The forward's left operand.
        b: The forward's right operand.
        argmax: The forward's argmax: int32, of C's shape.
        semiring: The forward's semiring: ``"maxplus"``, ``"minplus"`` or ``"maxmul"``.
        stream: The CuPy stream the work is enqueued on. Default: CuPy's current stream.
        compiler: The Compiler that fetches the kernel. Default: aionvrtc's process-wide
            Compiler, usable from any thread. Another must run in a portal
            (``Compiler.use_portal``), or this must be a worker thread of its event loop.

    Returns:
        The pair (grad_a, grad_b), as ``backward`` returns it.

    Raises:
        TypeError: An input is not a CuPy array, or the dtype or semiring has no gradient (as
            for ``backward``).
        ValueError: The semiring, shapes, dtypes or devices do not fit (as for ``backward``).
        cupy.cuda.memory.OutOfMemoryError: The gradients do not fit in GPU memory.
        CompileError: NVRTC refused the kernel. This and the errors below come from the
            kernel's first use on a device only.
        NvrtcError: NVRTC cannot be used, or cannot compile for this GPU.
        ModuleLoadError: The kernel could not be loaded onto the device
            (``GPUOutOfMemoryError`` where GPU memory is full).
        CompilerClosed: ``compiler`` is closed.
        RuntimeError: ``compiler`` has not been opened, or runs in no portal and this is not a
            worker thread of its event loop.
    """
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
    launch = planned_backward(grad_c, a, b, argmax, semiring)
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
    batched: Iterable[tuple[int, int, int]] | None = None,
    max_batch: int = 64,
) -> int:
    """Compile every kernel of the named semirings and dtypes ahead of use, in parallel; or,
    with ``batched``, only those that a ``Batcher`` launches for products of those sizes.

    The kernels are those of ``all_specs(semirings, dtypes)``, compiled for target ``arch`` or
    each of several (``arch=["sm_80", "sm_90"]``); with ``batched``, each (M, N, K)'s
    ``batch_specs`` at every batch size up to ``max_batch``, with and without argmax, for each
    semiring and dtype (the default tiles: ``Batcher.warm`` loads a device's tuned ones).
    Without ``compiler``, a temporary Compiler with one worker per CPU fills the disk cache
    that later requests read. Every target is checked before anything is compiled.

    Args:
        semirings: The semirings' names, such as ``["maxplus"]``. Default: all four.
        dtypes: The element types, such as ``["float32", "int64"]``. Default: all that each
            semiring takes.
        arch: A target (``"sm_90"`` or a ``Target``) or several. Default: the compiler's
            target, else ``resolve_target``'s: ``$AIONVRTC_ARCH`` or the current GPU's.
        compiler: The Compiler that compiles and keeps the kernels. Default: a temporary one
            that writes them to the disk cache.
        batched: Product sizes (M, N, K), such as ``[(256, 256, 256)]``: only their kernels,
            at every batch size up to ``max_batch``. Default: every kernel.
        max_batch: The largest batch of ``batched`` (a Batcher's ``max_batch``).

    Returns:
        How many kernels were compiled or found, kernels times targets.

    Raises:
        TypeError: ``semirings`` or ``dtypes`` is a str, not a list of them; a target is
            neither a str nor a ``Target``.
        ValueError: A name is not a semiring or a dtype; a named semiring takes none of the
            named dtypes (``warm(["andor"], ["float32"])``: andor takes bool), or a named dtype
            none of the semirings; ``arch`` is an empty list, or names something that is not
            an arch such as ``sm_90`` (``$AIONVRTC_ARCH`` too); a size of ``batched`` is
            below 1, or ``max_batch`` is not a positive int.
        NoDeviceError: No ``arch`` is named, by the argument, the compiler or
            ``$AIONVRTC_ARCH``, and there is no GPU to detect it from.
        NvrtcError: NVRTC cannot compile for a target (raised before anything is compiled), or
            cannot be used at all.
        CompileError: NVRTC refused a kernel (the first that failed; the others are stopped).
        AionvrtcError: Without ``compiler``: kernels it compiled could not be kept on disk (the
            cache dir is not writable or not trusted), and would be lost with the temporary
            Compiler.
        CompilerClosed: ``compiler`` is closed.
        RuntimeError: ``compiler`` has not been opened (``async with``).
    """
    import os

    from ..._nvrtc import check_target

    specs = warm_specs(semirings, dtypes, batched=batched, max_batch=max_batch)
    if arch is None:
        targets = [compiler.target if compiler is not None else resolve_target()]
    elif isinstance(arch, str | Target):
        targets = [as_target(arch)]
    else:
        targets = list(dict.fromkeys(as_target(one) for one in arch))
        if not targets:
            raise ValueError("arch: name at least one target, such as ['sm_90']")
    for target in targets:
        await anyio.to_thread.run_sync(check_target, target)
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
        from ..._exceptions import AionvrtcError
        from ..._store.disk import default_cache_dir

        state = "not trusted" if not stats.disk.trusted else "not writable"
        names = ", ".join(target.arch for target in targets)
        raise AionvrtcError(
            f"{lost} of the {stats.compiles} kernels compiled for {names} were not kept: the "
            f"disk cache at {default_cache_dir()} is {state} (aionvrtc doctor says why, and "
            "the fix)"
        )
    return len(specs) * len(targets)


async def _compile_all(compiler: Compiler, specs: list[KernelSpec], targets: list[Target]) -> None:
    # A warm-up's compiles: never hot compiles of a serving Compiler (start_serving).
    try:
        async with anyio.create_task_group() as tg:
            for target in targets:
                tg.start_soon(functools.partial(compiler.warm, specs, arch=target))
    except ExceptionGroup as group:
        raise first_error(group) from None


def warm_specs(
    semirings: Any = None,
    dtypes: Any = None,
    *,
    batched: Iterable[tuple[int, int, int]] | None = None,
    max_batch: int = 64,
) -> list[KernelSpec]:
    """The kernels that ``warm`` (and ``aionvrtc warm tropical``) compiles: ``all_specs``'s,
    or with ``batched`` each (M, N, K)'s ``batch_specs`` up to ``max_batch``, with and
    without argmax, for each semiring and dtype named.

    Args:
        semirings: The semirings' names, such as ``["maxplus"]``. Default: all four.
        dtypes: The element types, such as ``["float32"]``. Default: all that each semiring
            takes.
        batched: Product sizes (M, N, K), such as ``[(256, 256, 256)]``. Default: every
            kernel.
        max_batch: The largest batch of ``batched``.

    Returns:
        The specs, each once.

    Raises:
        TypeError: ``semirings`` or ``dtypes`` is a str, not a list of them.
        ValueError: As ``all_specs`` raises it; ``batched`` is empty or a size is below 1;
            ``max_batch`` is not a positive int.
    """
    if batched is None:
        return all_specs(semirings, dtypes)
    sizes = [tuple(size) for size in batched]
    if not sizes or any(len(size) != 3 for size in sizes):
        raise ValueError(
            f"batched must list product sizes (M, N, K), such as [(256, 256, 256)], got {sizes!r}"
        )
    specs: list[KernelSpec] = []
    for ring, dtype in pairs(semirings, dtypes):
        for m, n, k in sizes:
            for argmax in (False, True):
                specs += batch_specs(m, n, k, ring.name, dtype, argmax=argmax, max_batch=max_batch)
    return list(dict.fromkeys(specs))
