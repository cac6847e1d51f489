"""The eager run of a planned contraction, unsliced: its steps prepared once per plan, dtype,
semiring and device (_steps), launched over one arena from Python, and with ``argmax=True`` the
assignment walked back on the GPU and copied once."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from ..._compiler import Compiler
from ..._cuda import Module
from ..products import Offload, OnDevice, Packed, Semiring, Wait, Work, cupy_module
from ._plan import EinsumPlan
from ._runs import assignment, at_hand, copy_back, steps_for
from ._steps import Steps, known

__all__ = ["contract"]


def contract(
    planned: EinsumPlan,
    ring: Semiring,
    arrays: Sequence[Any],
    *,
    device: int,
    argmax: bool,
    out: Any,
    stream: Any,
    compiler: Compiler | None,
) -> Work[Any]:
    """``planned`` contracted over ``arrays`` (on ``device``) into ``out`` (else a new array),
    enqueued on ``stream`` (resolved: see ``resolved_stream``): the result, or with ``argmax``
    the pair (result, assignment). A plan with a slicing runs whole here: the sliced run is
    _sliced's. ``out`` is the caller's to have checked (``check_out``)."""
    # The steps take their kernels from the tiles of now, those fetched here, even where
    # autotune installs others meanwhile (a kernel missing from `modules` would be fetched on
    # the event loop's thread, blocking it, or raising with a caller's Compiler).
    dtype = arrays[0].dtype
    steps = known(planned, ring, dtype, argmax=argmax, device=device)
    if steps is None:  # a new plan: its launches prepared off the loop (Python, O(steps))
        steps = yield Offload(
            functools.partial(steps_for, planned, ring, dtype, argmax=argmax, device=device)
        )
    if steps is None:
        return _empty(planned, ring, dtype, argmax=argmax, out=out, at=(device, stream))
    modules, instead = yield from at_hand(steps, device, compiler)
    result, arena = _enqueue(steps, (modules, instead), arrays, out, stream)
    if not argmax:
        return result
    host = copy_back(steps, arena.ptr + steps.assignment, stream)
    yield Wait(stream)  # the copy into `host` (from the arena) lands before either is freed
    del arena
    return result, assignment(steps, host)


def _enqueue(
    steps: Steps,
    kernels: tuple[Sequence[Module | None], Mapping[int, tuple[Packed, Module]]],
    arrays: Sequence[Any],
    out: Any,
    stream: Any,
) -> tuple[Any, Any]:
    """Launch ``steps`` over ``arrays`` into ``out`` (else a new array), with ``kernels`` as
    ``at_hand`` gives them (the modules by spec, and the ops that run on stand-ins): (the
    result, the arena, which holds the assignment)."""
    modules, instead = kernels
    cupy = cupy_module()
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
            instead=instead,
        )
        if out is not None and not direct:
            cupy.copyto(out, result)
            result = out
    return result, arena


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
    with cupy.cuda.Device(device), stream:
        result = out if out is not None else cupy.empty(shape, dtype)
        result.fill(ring.zero(dtype))
    return result
