"""``tropical.einsum`` and ``einsum_sync``: a contraction's operands checked, its plan found
(known, or made in a worker thread), then run in slices where the plan has a slicing (_sliced),
else whole (_eager)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..._compiler import Compiler
from ..products import Work, cupy_module, run_async, run_sync
from ._counted import check_top_on_gpu, contract_counted
from ._eager import contract
from ._planner import planned_for
from ._runs import check_arrays, check_counted_plan, check_out, check_scalar, resolved_stream
from ._sliced import check_devices, in_slices
from ._subscripts import check_semiring

__all__ = ["einsum", "einsum_sync"]


async def einsum(
    subscripts: str,
    *operands: Any,
    semiring: str = "maxplus",
    argmax: bool = False,
    count: bool = False,
    top: int | None = None,
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
        argmax: Also find an assignment that attains the result: for a scalar contraction
            (an output of no indices, such as ``"ij,jk->"``) one, else one for each element
            of the result (not in slices: a sliced einsum's must be a scalar).
        count: Also count, for each element of the result, the assignments of the summed
            indices that attain it (each entry counting once, except the semiring's zero and
            NaN), as ``reference.einsum(..., count=True)`` does: each step a counted product
            (``matmul(..., counts=...)``), exact in int64; where a count passes 2^63 - 1 the
            network is counted again modulo primes below 2^31, the residues joined on the host
            (the call then waits for the GPU). In slices too (``memory_limit``: each
            intermediate's values and counts together within it), over ``devices`` too,
            their counts joined as the products join them, on the operands' device; into new
            arrays: not with ``argmax`` or ``out``.
        top: The ``top`` best distinct values of each element instead (1 to 16), each with
            its count, as ``reference.einsum(..., top=k)`` keeps them: lists on a last axis,
            best first, padded with the zero (count 0). Each step keeps its k best (a k-best
            kernel, the lists in registers); the counts exact in int64, -1 where one passes
            2^63 - 1 (never a wrong number; the values stand). In slices too (each slice's
            lists merged), over ``devices`` too, on the operands' device, into new arrays:
            not with ``count``, ``argmax`` or ``out``.
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
        operands' entries attains the result; for a result with indices, each index's int64
        array of the result's shape, holding the value at which each element is attained
        (an output index's array is that element's position). With ``count=True`` the pair
        (result, counts): the counts a CuPy int64 array of the result's shape where every one
        fits, else a NumPy array of Python's ints. With ``top=k`` the pair (values, counts),
        each of the result's shape and a last axis of k.

    Raises:
        TypeError: ``subscripts`` is not a str; an operand is not a ``cupy.ndarray`` (for a
            NumPy array the message says to move it with ``cupy.asarray``); the operands'
            dtypes differ, or ``semiring`` does not take theirs; ``out`` is not a
            ``cupy.ndarray``.
        TypeError: ``count`` is not a bool; ``top`` is not an int.
        ValueError: ``count=True`` or ``top`` with ``argmax`` or ``out``, or with each
            other; ``top`` below 1 or past 16.
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
            order). With ``argmax=True``: a sliced plan with output indices, more than
            2**24 elements of the result (or their assignments past 1 GiB or the device's
            memory), an index of size 0, a product over more than 2**31 values of k,
            or the argmaxes that the walk back keeps (every step's, of one slice where sliced)
            larger than the device's memory.
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
            count=count,
            top=top,
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
    count: bool = False,
    top: int | None = None,
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
        argmax: Also find an assignment that attains the result (of each element, for a
            result with indices).
        count: Also count the assignments attaining each element (as ``einsum``).
        top: The ``top`` best values of each element with their counts (as ``einsum``).
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
        As ``einsum``: the result, or with ``argmax=True`` the pair (result, assignment),
        with ``count=True`` the pair (result, counts), with ``top=k`` the pair (values,
        counts).

    Raises:
        TypeError: As ``einsum``: ``subscripts`` is not a str, an operand or ``out`` is not a
            ``cupy.ndarray``, the operands' dtypes differ or are not the semiring's, or
            ``count`` is not a bool, or ``top`` not an int.
        ValueError: As ``einsum``: bad arguments (``count=True`` or ``top`` with what they
            do not take among them), what ``einsum_plan`` refuses, and what the device cannot
            run.
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
            count=count,
            top=top,
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
    count: bool,
    top: int | None,
    optimize: Any,
    memory_limit: float | None,
    devices: Sequence[int] | None,
    out: Any,
    stream: Any,
    compiler: Compiler | None,
) -> Work[Any]:
    """The body of ``einsum`` and ``einsum_sync`` (see _twins)."""
    check_semiring(subscripts, semiring)
    _check_count(count, top, argmax=argmax, out=out)
    ring, arrays, device = check_arrays(operands, semiring)
    limit = _memory_limit(memory_limit, device)
    if (count or top is not None) and limit is not None:
        # The counts' bytes too (top's lists of them): slices whose lists fit the limit.
        itemsize = arrays[0].dtype.itemsize
        limit = max(1, limit * itemsize // ((itemsize + 8) * (top or 1)))
    planned = yield from planned_for(subscripts, arrays, optimize, memory_limit=limit)
    if argmax and planned.slicing is not None:
        check_scalar(planned, "a sliced einsum")
    check_out(out, arrays[0].dtype, tuple(planned.sizes[i] for i in planned.output), device)
    stream = resolved_stream(device, stream)
    if count or top is not None:
        check_counted_plan(planned, arrays[0].dtype, top=top, device=device)
        places = check_devices(devices, device) if devices is not None else []
        counted = contract_counted(
            planned, ring, arrays, device=device, stream=stream, compiler=compiler, top=top,
            devices=places,
        )  # fmt: skip
        return (yield from counted)
    if planned.slicing is not None or devices is not None:
        places = check_devices(devices, device)
        if planned.slicing is not None:
            sliced = in_slices(
                planned, ring, arrays, device=device, devices=places, argmax=argmax, out=out,
                stream=stream, compiler=compiler,
            )  # fmt: skip
            return (yield from sliced)
    whole = contract(
        planned, ring, arrays, device=device, argmax=argmax, out=out, stream=stream,
        compiler=compiler,
    )  # fmt: skip
    return (yield from whole)


_NEW_ARRAYS = "count=True and top=k return new arrays (the result with its counts): pass no out"


def _check_count(count: object, top: object, *, argmax: bool, out: object) -> None:
    if not isinstance(count, bool):
        raise TypeError(f"count must be True or False, got {type(count).__name__}")
    check_top_on_gpu(top, count)
    if not count and top is None:
        return
    if argmax:
        asked = "count=True" if count else "top=k"
        raise ValueError(
            f"pass {asked} or argmax=True, not both: the assignment comes from the "
            "contraction without counts"
        )
    if out is not None:
        raise ValueError(_NEW_ARRAYS)


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
