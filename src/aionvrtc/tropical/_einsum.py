"""tropical.einsum: a planned contraction (_einsum_plan) run as batched tropical products over
one arena (_einsum_steps), and the backtrace of its argmaxes to an assignment, on the GPU."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._compiler import Compiler
from .._cuda import Module
from ._einsum_plan import EinsumPlan, check_step, einsum_plan, known_plan
from ._einsum_steps import Steps, known, prepared
from ._launching import OnDevice
from ._product_plan import cupy_module
from ._semirings import Semiring
from ._semirings import semiring as lookup
from ._shape_classes import tables_version, tuned_tiles
from ._subscripts import check_dtypes, check_output
from ._twins import Fetch, Offload, Wait, Work, run_async, run_sync

__all__ = [
    "assignment",
    "copy_back",
    "einsum",
    "einsum_sync",
    "steps_for",
]

# The kernels write a product's argmax as an int32 k, so with argmax=True no product may sum
# over more than 2**31 values of k. (Everything else they index with 64-bit integers.)
ARGMAX_MAX_K = 2**31


async def einsum(
    subscripts: str,
    *operands: Any,
    semiring: str = "maxplus",
    argmax: bool = False,
    optimize: Any = "auto",
    memory_limit: float | None = None,
    devices: Sequence[int] | None = None,
    out: Any = None,
    stream: Any = None,
    compiler: Compiler | None = None,
) -> Any:
    """The tropical einsum of CuPy arrays on the GPU, with ``reference.einsum``'s semantics.

    The work is enqueued on ``stream``. With ``argmax=True`` the assignment is found on the GPU
    and copied back once: the call waits for the GPU then, without blocking the event loop.

    Each pairwise contraction is one batched tropical product over strided views; its kernel is
    fetched through ``compiler``, compiled on first use. A network contracted again is neither
    planned nor prepared again: its launches are kept (see ``einsum_program`` to replay them
    from a CUDA graph). Planning runs in a worker thread unless the plan is known. An output or
    intermediate larger than the device's memory, and with ``argmax=True`` a product over more
    than 2**31 values of k (its argmax is an int32), are refused with a ValueError before
    anything is allocated.

    With ``memory_limit`` the network is contracted in slices, so that no intermediate of a
    slice holds more (a run holds more beside its largest intermediate: leave room): some
    indices that the output does not keep are fixed to each of their values in turn
    (``einsum_plan`` says which), each slice is contracted over views of the operands, and the
    slices' results are summed in the semiring. With ``argmax=True`` the assignment is the
    first slice's that attains the result (found by contracting that slice once more, with its
    argmax). A plan with a slicing (``einsum_plan(..., memory_limit=)``, or a cotengra
    optimizer that sliced) passed as ``optimize`` runs in its slices too. A contraction that is
    not sliced runs on the operands' device alone, whatever ``devices`` says.

    Args:
        subscripts: NumPy's einsum grammar, as ``reference.einsum`` takes it (``"ij,jk->ik"``;
            without ``->``, NumPy's implicit output).
        *operands: The tensors, one per operand of ``subscripts``: CuPy arrays of one dtype
            that ``semiring`` takes, on one device. Their strides are read: an operand that no
            strided view can read is copied first (``einsum_plan`` says which).
        semiring: ``"maxplus"``, ``"minplus"``, ``"maxmul"`` or ``"andor"`` (``SEMIRINGS``).
        argmax: Also find an assignment that attains the result. For a scalar contraction
            only: an output of no indices, such as ``"ij,jk->"``.
        optimize: The order of the pairwise contractions, as ``einsum_plan`` takes it: an
            opt_einsum strategy name, an opt_einsum optimizer, a cotengra optimizer, an
            explicit path, or an ``EinsumPlan`` from ``einsum_plan`` (which also says which
            operands are copied). A plan skips planning: pass one on a hot path.
        memory_limit: Contract in slices so that no intermediate of a slice holds more than
            this: bytes (an int), or a fraction of the device's free memory now (a float,
            ``0 < f <= 1``, such as ``0.5``). None: in slices only where ``optimize`` is a
            plan with a slicing.
        devices: The device numbers (such as ``[0, 1]``) that a sliced contraction spreads its
            slices over, slice n on the n-th modulo their count, each with a copy of the
            operands and its own stream; the result is summed on the operands' device. None:
            the operands' device.
        out: A CuPy array to receive the result: of the result's dtype and shape, on the
            operands' device, of any strides. None: a new array.
        stream: The CuPy stream to enqueue the work on (default: CuPy's current stream of the
            operands' device).
        compiler: The Compiler that fetches the kernels (default: aionvrtc's process-wide
            Compiler).

    Returns:
        The result, a new CuPy array (or ``out``, filled) with one axis per output index (0-d
        for a scalar). With ``argmax=True`` the pair (result, assignment): the assignment is a
        dict giving every index of ``subscripts`` a value at which the product of the
        operands' entries attains the result.

    Raises:
        TypeError: ``subscripts`` is not a str; an operand is not a ``cupy.ndarray`` (for a
            NumPy array the message says to move it with ``cupy.asarray``); the operands'
            dtypes differ, or ``semiring`` does not take theirs; ``out`` is not a
            ``cupy.ndarray``.
        ValueError: Bad arguments: no operands, or operands on more than one device;
            ``semiring`` is not one of ``SEMIRINGS``; ``memory_limit`` is neither bytes
            (an int > 0) nor a fraction (0 < f <= 1); ``devices`` is not a list of distinct
            numbers of the devices this process sees; ``out`` has another dtype, shape or
            device than the result's.
        ValueError: What ``einsum_plan`` refuses: malformed subscripts (or more than 64
            indices for an operand or the output), an operand whose dimensions are not the
            ones its subscripts name, an index of two sizes, an ``optimize`` that is not a
            strategy, optimizer, path or plan for these operands, an exhaustive search on more
            operands than ``SEARCH_LIMITS`` allows, a ``memory_limit`` that no slicing meets
            (the message names the smallest that does), a planner that sliced an index the
            output keeps.
        ValueError: What the device cannot run: an output or intermediate larger than its
            memory; an operand copy of more than 32 axes that no view merges (pick another
            order). With ``argmax=True``: an output with indices, an index of size 0, a product
            over more than 2**31 values of k, or the argmaxes that the walk back keeps (every
            step's, of one slice where sliced) larger than the device's memory.
        cupy.cuda.memory.OutOfMemoryError: The memory in use on the device leaves too little
            for the result, the intermediates or the operands' copies (the bounds above count
            the device's whole memory).
        RuntimeError: ``compiler`` is not open yet (``async with Compiler(...)``).
        aionvrtc.AionvrtcError: A kernel could not be fetched: ``compiler`` is closed
            (``CompilerClosed``), NVRTC cannot be used (``NvrtcError``) or failed
            (``CompileError``), or the module cannot be loaded on the device
            (``ModuleLoadError``; ``GPUOutOfMemoryError`` where the GPU is full).
    """
    return await run_async(
        _einsum(
            subscripts,
            operands,
            semiring=semiring,
            argmax=argmax,
            optimize=optimize,
            memory_limit=memory_limit,
            devices=devices,
            out=out,
            stream=stream,
            compiler=compiler,
        )
    )


def einsum_sync(
    subscripts: str,
    *operands: Any,
    semiring: str = "maxplus",
    argmax: bool = False,
    optimize: Any = "auto",
    memory_limit: float | None = None,
    devices: Sequence[int] | None = None,
    out: Any = None,
    stream: Any = None,
    compiler: Compiler | None = None,
) -> Any:
    """``einsum`` for code that is not async: the same contraction, run in this thread.

    ``compiler``, if given, must run in a portal or this must be a worker thread of its event
    loop. With ``argmax=True`` it waits for the GPU. See ``einsum`` for the whole story.

    Args:
        subscripts: NumPy's einsum grammar, as ``einsum`` takes it.
        *operands: The tensors: CuPy arrays of one dtype, on one device.
        semiring: ``"maxplus"``, ``"minplus"``, ``"maxmul"`` or ``"andor"``.
        argmax: Also find an assignment that attains the result (a scalar contraction only).
        optimize: The order, as ``einsum_plan`` takes it (a plan skips planning).
        memory_limit: Contract in slices of at most this much in an intermediate: bytes, or a
            fraction of the device's free memory (``0 < f <= 1``).
        devices: The device numbers that a sliced contraction spreads its slices over.
        out: A CuPy array to receive the result (None: a new array).
        stream: The CuPy stream to enqueue on (default: CuPy's current stream of the
            operands' device).
        compiler: The Compiler that fetches the kernels (default: aionvrtc's process-wide
            Compiler).

    Returns:
        As ``einsum``: the result, or with ``argmax=True`` the pair (result, assignment).

    Raises:
        TypeError: As ``einsum``: ``subscripts`` is not a str, an operand or ``out`` is not a
            ``cupy.ndarray``, or the operands' dtypes differ or are not the semiring's.
        ValueError: As ``einsum``: bad arguments, what ``einsum_plan`` refuses, and what the
            device cannot run.
        cupy.cuda.memory.OutOfMemoryError: As ``einsum``: the memory in use on the device
            leaves too little for the contraction.
        RuntimeError: ``compiler`` is not open yet, or a kernel must be fetched through a
            ``compiler`` without a portal (``Compiler.use_portal``) from a thread that is not
            a worker thread of its event loop.
        aionvrtc.AionvrtcError: As ``einsum``: a kernel could not be fetched.
    """
    return run_sync(
        _einsum(
            subscripts,
            operands,
            semiring=semiring,
            argmax=argmax,
            optimize=optimize,
            memory_limit=memory_limit,
            devices=devices,
            out=out,
            stream=stream,
            compiler=compiler,
        )
    )


def _einsum(
    subscripts: str,
    operands: Sequence[Any],
    *,
    semiring: str,
    argmax: bool,
    optimize: Any,
    memory_limit: float | None,
    devices: Sequence[int] | None,
    out: Any,
    stream: Any,
    compiler: Compiler | None,
) -> Work[Any]:
    """The body of ``einsum`` and ``einsum_sync`` (see _twins)."""
    ring, arrays, device = _check(operands, semiring)
    limit = _memory_limit(memory_limit, device)
    planned = known_plan(subscripts, arrays, optimize) if limit is None else None
    if planned is None:
        planned = yield Offload(
            functools.partial(
                einsum_plan, subscripts, *arrays, optimize=optimize, memory_limit=limit
            )
        )
    if planned.slicing is not None or devices is not None:
        from ._einsum_slices import check_devices, in_slices  # (it imports this module)

        places = check_devices(devices, device)
        if planned.slicing is not None:
            sliced = in_slices(
                planned, ring, arrays, device=device, devices=places, argmax=argmax, out=out,
                stream=_stream(device, stream), compiler=compiler,
            )  # fmt: skip
            return (yield from sliced)
    # The steps take their kernels from the tiles of now, those fetched here, even where
    # autotune installs others meanwhile (a kernel missing from `modules` would be fetched on
    # the event loop's thread, blocking it, or raising with a caller's Compiler).
    dtype = arrays[0].dtype
    steps = known(planned, ring, dtype, argmax=argmax, device=device)
    if steps is None:  # a new plan: its launches prepared off the loop (Python, O(steps))
        steps = yield Offload(
            functools.partial(steps_for, planned, ring, dtype, argmax=argmax, device=device)
        )
    stream = _stream(device, stream)
    if steps is None:
        return _empty(planned, ring, dtype, argmax=argmax, out=out, at=(device, stream))
    modules = yield Fetch(steps.specs, device, compiler)
    result, arena = _enqueue(steps, modules, arrays, out, stream)
    if not argmax:
        return result
    host = copy_back(steps, arena.ptr, stream)
    yield Wait(stream)  # the copy into `host` (from the arena) lands before either is freed
    del arena
    return result, assignment(steps, host)


def _memory_limit(memory_limit: float | None, device: int) -> int | None:
    """``memory_limit`` in bytes: a fraction (0 < f <= 1) of ``device``'s free memory now."""
    if memory_limit is None:
        return None
    if isinstance(memory_limit, float) and 0 < memory_limit <= 1:
        free, _ = cupy_module().cuda.Device(device).mem_info
        return max(1, int(free * memory_limit))
    if (
        isinstance(memory_limit, bool)
        or not isinstance(memory_limit, int | np.integer)
        or memory_limit <= 0
    ):
        raise ValueError(
            f"memory_limit must be bytes (an int > 0) or a fraction of the device's free memory "
            f"(0 < f <= 1, such as 0.5), got {memory_limit!r}"
        )
    return int(memory_limit)


def steps_for(
    planned: EinsumPlan,
    ring: Semiring,
    dtype: Any,
    *,
    argmax: bool,
    device: int,
    reuse: bool = True,
) -> Steps | None:
    """``planned``'s steps, prepared once with the device's tiles of now (checked when first
    prepared: see _check_plan); None for a contraction with an index of size 0, whose result
    is the semiring's zero and launches nothing."""
    check = functools.partial(_check_plan, planned, dtype, argmax=argmax, device=device)
    if 0 in planned.sizes.values():
        check()
        return None
    version = tables_version()  # (before the table: a table installed between is fetched next)
    return prepared(
        planned, ring, dtype, argmax=argmax, device=device, table=tuned_tiles(device),
        version=version, reuse=reuse, check=check,
    )  # fmt: skip


def _enqueue(
    steps: Steps, modules: Sequence[Module], arrays: Sequence[Any], out: Any, stream: Any
) -> tuple[Any, Any]:
    """Launch ``steps`` over ``arrays`` into ``out`` (else a new array): (the result, the
    arena, which holds the assignment)."""
    cupy = cupy_module()
    _check_out(out, steps.dtype, steps.shape, steps.device)
    # Allocated on the stream the steps run on: CuPy's pool hands memory freed on a stream only
    # to allocations on the same stream, after the work queued there.
    with OnDevice(steps.device), stream:
        arena = cupy.cuda.alloc(steps.nbytes) if steps.nbytes else None
        direct = out is not None and out.flags.c_contiguous
        result = out if direct else cupy.ndarray(steps.shape, steps.dtype)
        steps.enqueue(
            modules,
            [x.data.ptr for x in arrays],
            arena.ptr if arena is not None else 0,
            result.data.ptr,
            stream,
        )
        if out is not None and not direct:
            cupy.copyto(out, result)
            result = out
    return result, arena


def copy_back(steps: Steps, arena: int, stream: Any) -> Any:
    """Enqueue on ``stream`` the copy of the assignment (and the value's bytes) from the arena
    at address ``arena`` to pinned host memory, returned (read it with ``assignment``)."""
    cupy = cupy_module()
    count = len(steps.plan.sizes) + 1
    try:  # one that ``assignment`` gave back (a pinned allocation took half this call's time)
        host = steps.hosts.pop()
    except IndexError:
        host = cupy.cuda.alloc_pinned_memory(count * 8)
    with OnDevice(steps.device):
        cupy.cuda.runtime.memcpyAsync(
            host.ptr, arena + steps.assignment, count * 8,
            cupy.cuda.runtime.memcpyDeviceToHost, stream.ptr,
        )  # fmt: skip
    return host


def assignment(steps: Steps, host: Any) -> dict[str, int]:
    """The assignment ``copy_back`` brought to ``host``, once the copy is done (``host`` is
    taken again by a later copy: read nothing from it after this)."""
    names, numbers = steps.named
    values = np.frombuffer(host, np.int64, count=len(steps.plan.sizes))[numbers].tolist()
    steps.hosts.append(host)
    return dict(zip(names, values, strict=True))


def _empty(
    planned: EinsumPlan, ring: Semiring, dtype: Any, *, argmax: bool, out: Any, at: Any
) -> Any:
    """The sum over an index of size 0: the semiring's zero everywhere."""
    if argmax:
        empty = next(i for i, n in planned.sizes.items() if n == 0)
        raise ValueError(
            f"einsum index {empty!r} has size 0: the sum is empty and no assignment attains it"
        )
    cupy = cupy_module()
    shape = tuple(planned.sizes[i] for i in planned.output)
    device, stream = at  # (filled on the stream the caller orders its work on)
    _check_out(out, dtype, shape, device)
    with cupy.cuda.Device(device), stream:
        result = out if out is not None else cupy.empty(shape, dtype)
        result.fill(ring.zero(dtype))
    return result


def _stream(device: int, stream: Any) -> Any:
    """``stream``, else CuPy's current stream on ``device``: resolved once, here, because the
    backtrace waits for it from a worker thread, whose current stream is another."""
    if stream is not None:
        return stream
    cupy = cupy_module()
    with cupy.cuda.Device(device):
        return cupy.cuda.get_current_stream()


def _check(operands: Sequence[Any], semiring: str) -> tuple[Semiring, list[Any], int]:
    cupy = cupy_module()
    ring = lookup(semiring)
    if not operands:
        raise ValueError("einsum needs at least one operand")
    for i, x in enumerate(operands):
        if not isinstance(x, cupy.ndarray):
            hint = ": move it with cupy.asarray(...)" if isinstance(x, np.ndarray) else ""
            raise TypeError(
                f"einsum operand {i} must be a cupy.ndarray, not "
                f"{type(x).__module__}.{type(x).__name__}{hint}"
            )
    arrays = list(operands)
    check_dtypes(ring, arrays)
    devices = sorted({x.device.id for x in arrays})
    if len(devices) > 1:
        raise ValueError(f"einsum operands are on devices {devices}; move them to one device")
    return ring, arrays, devices[0]


def _check_scalar(planned: EinsumPlan) -> None:
    if planned.output:
        raise ValueError(
            f"einsum argmax=True backtracks a scalar contraction, and {planned.subscripts!r} "
            f"has output indices {planned.output!r}; give it an output of no indices "
            "('ij,jk->') to find an assignment that attains it"
        )


def _check_plan(planned: EinsumPlan, dtype: Any, *, argmax: bool, device: int) -> None:
    """Refuse, before anything is allocated or launched, what the run could not do."""
    if argmax:
        _check_scalar(planned)
    # No array larger than the device's memory can be allocated (one that fits may still
    # meet others in use: CuPy's OutOfMemoryError says so then). With argmax=True each result
    # has an int32 argmax beside it.
    limit = _device_bytes(device)
    bound = f"the {limit:,} bytes of device {device}'s memory"
    check_output(planned.output, planned.sizes, itemsize=dtype.itemsize, limit=limit, bound=bound)
    itemsize = dtype.itemsize + (4 if argmax else 0)
    if argmax:
        bound += " (an int32 argmax, 4 bytes, beside each element)"
    for number, step in enumerate(planned.steps):
        check_step(number, step, itemsize=itemsize, limit=limit, bound=bound)
        if argmax and step.first.shape[2] > ARGMAX_MAX_K:
            raise ValueError(
                f"einsum step {number} ({step.subscripts}) sums over {step.first.shape[2]:,} "
                f"values of its indices {''.join(step.k)!r} in one product, more than the "
                f"{ARGMAX_MAX_K:,} an int32 argmax (argmax=True) can number; pick an order "
                "that sums fewer at once (another optimize=), contract the network in slices, "
                "or run without argmax"
            )
    kept = 4 * sum(step.size for step in planned.steps) if argmax else 0
    if kept > limit:  # the walk back reads every step's argmax: all are kept to the end
        raise ValueError(
            f"einsum with argmax=True keeps an int32 argmax of every step's result for the walk "
            f"back: {kept:,} bytes for this plan, more than {bound}; contract it in (smaller) "
            "slices (memory_limit=: only the winning slice's argmaxes are kept), pick an order "
            "with smaller intermediates (optimize=), or run without argmax"
        )


@functools.cache
def _device_bytes(device: int) -> int:
    """The memory of ``device``, in bytes (it does not change while the process runs)."""
    _, total = cupy_module().cuda.Device(device).mem_info
    return int(total)


def _check_out(out: Any, dtype: Any, shape: tuple[int, ...], device: int) -> None:
    if out is None:
        return
    cupy = cupy_module()
    if not isinstance(out, cupy.ndarray):
        raise TypeError(f"out must be a cupy.ndarray, not {type(out).__name__}")
    if out.dtype != dtype or out.shape != shape or out.device.id != device:
        raise ValueError(
            f"out must be {dtype} of shape {shape} on device {device}, got {out.dtype} of "
            f"shape {out.shape} on device {out.device.id}"
        )
