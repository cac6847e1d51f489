"""A sliced tropical einsum on the GPU (``memory_limit=``, ``devices=``): the slices of a plan
(_slicing) spread over the host's GPUs, each device's slices summed on its own stream into its
first slice's result, then the devices' sums into the result on the operands' device.

A device replays one compiled program (``einsum_program``: the slice's launches captured once
as a CUDA graph) per slice, gathering that slice's operands by address: the operands that hold
a sliced index are first laid out once per call as a stack of their slices (each slice's part
one contiguous run), the others are read as they are. Where the program would not be kept
(past MAX_PROGRAM_BYTES: made again for every call it would cost its capture each time),
cannot be made (out of memory), or would wait for a kernel not loaded yet (the program's
kernels then load in the background, for a later call), the
slice's prepared steps are launched one by one from the operands' addresses moved to that
slice's views instead, reusing the space of what no later step reads; a step whose kernel is
not loaded runs on one that is and computes the same product (``at_hand``). Other devices
get a copy of the operands, made on the caller's stream after the work queued there, which
their streams wait for by an event; the result's stream waits for theirs the same way before
their sums are copied over, and they wait for those copies before their memory is let go.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..._compiler import Compiler
from ..._cuda import Module
from ..products import Offload, OnDevice, Packed, Semiring, Wait, Work, cupy_module, run_sync
from ..products import semiring as lookup
from ._eager import contract
from ._plan import EinsumPlan
from ._planner import planned_for
from ._programs import EinsumProgram, make_program
from ._runs import (
    at_hand,
    check_arrays,
    check_plan,
    copied_to,
    resolved_stream,
    steps_for,
)
from ._slicing import Slicing, best_slice, sum_into, view_at
from ._steps import Steps, known

__all__ = ["assignment_sync", "check_devices", "in_slices", "partial_sync"]


@dataclasses.dataclass
class _Lane:
    """One device's share: the operands there, one slice's steps prepared for it, its stream,
    and the sum of the slices it ran (with argmax, each slice's value at its number)."""

    device: int
    stream: Any
    arrays: Sequence[Any]
    each: EinsumPlan
    steps: Steps | None  # without a program
    modules: Sequence[Module | None]
    # The ops (by number) that launch a stand-in, their own kernel not loaded (see at_hand).
    instead: Mapping[int, tuple[Packed, Module]] = dataclasses.field(default_factory=dict)
    program: EinsumProgram | None = None
    total: Any = None
    scores: Any = None


def in_slices(
    planned: EinsumPlan,
    ring: Semiring,
    arrays: Sequence[Any],
    *,
    device: int,
    devices: Sequence[int],
    argmax: bool,
    out: Any,
    stream: Any,
    compiler: Compiler | None,
) -> Work[Any]:
    """``planned``'s slices, slice n on ``devices[n % len(devices)]``, summed into ``out`` (or
    a new array) on ``device``, the operands' (see the module's docstring); with ``argmax``,
    the pair (result, the assignment of the first slice that attains it). ``out`` and the
    scalar rule of ``argmax`` are the caller's to have checked (see _runs)."""
    slicing = planned.slicing
    assert slicing is not None
    lanes = yield from _lanes(
        planned, ring, arrays, device=device, devices=devices[: slicing.count], stream=stream,
        compiler=compiler,
    )  # fmt: skip
    if argmax:  # the winning slice runs again with argmax: refused now, not after every slice
        check_plan(lanes[0].each, arrays[0].dtype, argmax=True, device=lanes[0].device)
    # Enqueuing every slice is Python for each: off the event loop's thread (Offload).
    yield Offload(
        functools.partial(
            _run, lanes, slicing, planned.inputs, ring, range(slicing.count), argmax=argmax
        )
    )
    result = _gathered(lanes, ring, out=out, device=device, stream=stream)
    if not argmax:
        return result
    cupy = cupy_module()
    values = []
    for lane in lanes:
        with OnDevice(lane.device):
            values.append(cupy.asnumpy(lane.scores, stream=lane.stream, blocking=False))
    for lane in lanes:
        yield Wait(lane.stream)
    for more in values[1:]:
        sum_into(ring.add, np, values[0], more)
    best = best_slice(ring.add, values[0])
    lane = lanes[best % len(lanes)]
    found = yield from _assignment(
        planned, ring, lane.arrays, best, each=lane.each, device=lane.device, stream=lane.stream,
        compiler=compiler,
    )  # fmt: skip
    return result, found


def _assignment(
    planned: EinsumPlan,
    ring: Semiring,
    arrays: Sequence[Any],
    best: int,
    *,
    each: EinsumPlan,
    device: int,
    stream: Any,
    compiler: Compiler | None,
) -> Work[dict[str, int]]:
    """The assignment of slice ``best`` of ``planned`` (its sliced indices included): the
    slice contracted once more, with its argmax, along ``each`` (one slice's plan, made for
    the views of ``arrays``, which are on ``device``)."""
    slicing = planned.slicing
    assert slicing is not None
    views = slicing.views(planned.inputs, arrays, best)
    _, found = yield from contract(
        each, ring, views, device=device, argmax=True, out=None, stream=stream, compiler=compiler
    )
    return {**found, **slicing.values(best)}


def _lanes(
    planned: EinsumPlan,
    ring: Semiring,
    arrays: Sequence[Any],
    *,
    device: int,
    devices: Sequence[int],
    stream: Any,
    compiler: Compiler | None,
) -> Work[list[_Lane]]:
    """A lane on each of ``devices``: the operands there (a copy but on ``device``, the
    operands'), one slice's plan and its program (else its prepared steps). (No index of a
    sliced plan has size 0: einsum_plan slices none that computes nothing.)"""
    slicing = planned.slicing
    assert slicing is not None
    dtype = arrays[0].dtype
    lanes: list[_Lane] = []
    for place in devices:
        here, there = (arrays, stream) if place == device else copied_to(arrays, place, stream)
        views = slicing.views(planned.inputs, here, 0)
        each = yield from planned_for(slicing.subscripts, views, planned.path)
        try:
            program = yield from make_program(
                slicing.subscripts, [x.shape for x in views], semiring=ring.name, argmax=False,
                optimize=planned.path, dtype=dtype, device=place, compiler=compiler,
                only_kept=True,
            )  # fmt: skip
        except cupy_module().cuda.memory.OutOfMemoryError:
            program = None
        if program is not None:
            lanes.append(_Lane(place, there, here, each, None, (), program=program))
            continue
        steps = known(each, ring, dtype, argmax=False, device=place)
        if steps is None:
            steps = yield Offload(
                functools.partial(steps_for, each, ring, dtype, argmax=False, device=place)
            )
        assert steps is not None  # (no index of size 0)
        modules, instead = yield from at_hand(steps, place, compiler)
        lanes.append(_Lane(place, there, here, each, steps, modules, instead))
    return lanes


def _run(
    lanes: Sequence[_Lane],
    slicing: Slicing,
    inputs: Sequence[str],
    ring: Semiring,
    numbers: Sequence[int],
    *,
    argmax: bool,
) -> None:
    """Enqueue the k-th of the slices ``numbers`` on ``lanes[k % len(lanes)]``: a lane's first
    into its total, each later one summed into it; with ``argmax``, each slice's value into
    the lane's scores at its number (the semiring's zero where no slice of the lane's ran)."""
    cupy = cupy_module()
    runs = []
    for lane in lanes:
        dtype = lane.arrays[0].dtype
        with OnDevice(lane.device), lane.stream:
            made = lane.program if lane.program is not None else lane.steps
            assert made is not None
            lane.total = cupy.ndarray(made.shape, dtype)
            if argmax:
                lane.scores = cupy.full(slicing.count, ring.zero(dtype), dtype)
            if lane.program is not None:
                runs.append(_replays(lane, slicing, inputs))
            else:
                runs.append(_launches(lane, slicing, inputs))
    for k, number in enumerate(numbers):
        lane, run = lanes[k % len(lanes)], runs[k % len(lanes)]
        first = k < len(lanes)
        with OnDevice(lane.device), lane.stream:
            result = run(number, lane.total if first else None)
            if lane.scores is not None:
                lane.scores[number] = result
            if not first:
                sum_into(ring.add, cupy, lane.total, result)


def _replays(lane: _Lane, slicing: Slicing, inputs: Sequence[str]) -> Any:
    """``run(number, into)``: slice ``number`` replayed by the lane's program into ``into``
    (None: a part of the lane's, reused), which it returns. The program's own output is copied
    out within the replay, before its next caller may overwrite it (programs are shared). The
    operands that hold a sliced index are first stacked on the lane's stream, one contiguous
    run a slice of them."""
    cupy = cupy_module()
    program = lane.program
    assert program is not None
    part = cupy.ndarray(program.shape, program.dtype)
    bases = np.empty(len(inputs), np.int64)
    moves = np.zeros((len(slicing.indices), len(inputs)), np.int64)  # bytes per unit
    stacks = []
    for column, (letters, x) in enumerate(zip(inputs, lane.arrays, strict=True)):
        held = [slicing.indices.index(i) for i in dict.fromkeys(letters) if i in slicing.indices]
        if not held:
            stack = cupy.ascontiguousarray(x)
            bases[column] = stack.data.ptr
        else:
            # One part for each combination of the values of the sliced indices it holds.
            parts = []
            for values in np.ndindex(*(slicing.sizes[n] for n in held)):
                at = {slicing.indices[n]: v for n, v in zip(held, values, strict=True)}
                parts.append(view_at(x, letters, at))
            stack = cupy.stack(parts)  # (C-contiguous: each part one run)
            bases[column] = stack.data.ptr
            weight = stack.nbytes // len(parts)
            for n in reversed(held):  # the slice's part, numbered in mixed radix
                moves[n, column] = weight
                weight *= slicing.sizes[n]
        stacks.append(stack)

    def run(number: int, into: Any) -> Any:
        assert stacks  # (held until the last replay that reads them is enqueued)
        addresses = bases + slicing.position(number) @ moves
        return program.replay(addresses.tolist(), part if into is None else into, lane.stream)

    return run


def _launches(lane: _Lane, slicing: Slicing, inputs: Sequence[str]) -> Any:
    """``run(number, into)``: slice ``number``'s prepared steps launched one by one from the
    operands' addresses moved to its views, into ``into`` (None: a part reused for each)."""
    cupy = cupy_module()
    steps = lane.steps
    assert steps is not None
    strides = [tuple(s // x.itemsize for s in x.strides) for x in lane.arrays]
    moves = slicing.offsets(inputs, strides) * steps.dtype.itemsize
    bases = np.array([x.data.ptr for x in lane.arrays], np.int64)
    part = cupy.ndarray(steps.shape, steps.dtype)
    arena = cupy.cuda.alloc(steps.nbytes) if steps.nbytes else None
    at = arena.ptr if arena is not None else 0

    def run(number: int, into: Any) -> Any:
        assert arena is None or arena.ptr == at  # (held until the last launch is enqueued)
        result = part if into is None else into
        steps.enqueue(
            lane.modules,
            (bases + slicing.position(number) @ moves).tolist(),
            at,
            result.data.ptr,
            lane.stream,
            instead=lane.instead,
        )
        return result

    return run


def _gathered(lanes: Sequence[_Lane], ring: Semiring, *, out: Any, device: int, stream: Any) -> Any:
    """The lanes' totals summed on ``device``'s ``stream`` into ``out`` (or the device's own
    lane's total, else a new array)."""
    cupy = cupy_module()
    home = next((lane for lane in lanes if lane.device == device), None)
    result = home.total if home is not None else None
    others = [lane for lane in lanes if lane is not home]
    with OnDevice(device), stream:
        for lane in others:
            with OnDevice(lane.device):
                summed = lane.stream.record()
            stream.wait_event(summed)
            copy = cupy.empty(lane.total.shape, lane.total.dtype)
            copy.data.copy_from_device_async(lane.total.data, lane.total.nbytes, stream)
            if result is None:
                result = copy
            else:
                sum_into(ring.add, cupy, result, copy)
        if others:
            copied = stream.record()
            for lane in others:  # their memory goes back to their pools after the copies
                with OnDevice(lane.device):
                    lane.stream.wait_event(copied)
        if out is not None:
            cupy.copyto(out, result)
            result = out
    return result


def check_devices(devices: Any, device: int) -> list[int]:
    """``devices`` (None: the operands' ``device``) as a list of distinct device numbers."""
    if devices is None:
        return [device]
    count = cupy_module().cuda.runtime.getDeviceCount()
    if isinstance(devices, int | str) or not all(
        isinstance(d, int | np.integer) and not isinstance(d, bool) for d in devices
    ):
        raise ValueError(
            f"devices must be a list of device numbers such as [0, 1], got {devices!r}"
        )
    found = [int(d) for d in devices]
    if not found or len(set(found)) != len(found) or not all(0 <= d < count for d in found):
        raise ValueError(
            f"devices must name distinct devices of the {count} this process sees "
            f"(0 to {count - 1}), got {devices!r}"
        )
    return found


def partial_sync(
    planned: EinsumPlan, semiring: str, arrays: Sequence[Any], numbers: range, *, scored: bool
) -> tuple[Any, Any]:
    """For a worker given a share of the slices (``tropical.cluster``): the NumPy ``arrays``
    put on this process's current GPU, the sum of the slices ``numbers`` of ``planned`` and
    (``scored``) each one's value, in order, both on the host; without a slicing, the whole
    contraction (and its value as the one score)."""
    if not numbers:
        raise ValueError("partial_sync: no slices to contract (an empty range)")
    cupy = cupy_module()
    ring = lookup(semiring)
    device = cupy.cuda.Device().id
    stream = resolved_stream(device, None)
    gpu = [cupy.asarray(x) for x in arrays]
    if planned.slicing is None:
        value = run_sync(_whole(planned, ring, gpu, argmax=False, stream=stream))
        host = cupy.asnumpy(value, stream=stream)
        return host, (host.reshape(1) if scored else None)
    work = _partial(planned, ring, gpu, numbers, scored=scored, device=device, stream=stream)
    total, scores = run_sync(work)
    picked = cupy.asnumpy(scores, stream=stream)[numbers.start : numbers.stop] if scored else None
    return cupy.asnumpy(total, stream=stream), picked


def assignment_sync(
    planned: EinsumPlan, semiring: str, arrays: Sequence[Any], best: int
) -> dict[str, int]:
    """For a worker (``tropical.cluster``): the assignment of slice ``best`` of ``planned``
    (or of the whole contraction, unsliced), on this process's current GPU."""
    cupy = cupy_module()
    ring = lookup(semiring)
    device = cupy.cuda.Device().id
    stream = resolved_stream(device, None)
    gpu = [cupy.asarray(x) for x in arrays]
    if planned.slicing is None:
        _, found = run_sync(_whole(planned, ring, gpu, argmax=True, stream=stream))
        return found  # type: ignore[no-any-return]
    return run_sync(_assigned(planned, ring, gpu, best, device=device, stream=stream))


def _assigned(
    planned: EinsumPlan,
    ring: Semiring,
    arrays: Sequence[Any],
    best: int,
    *,
    device: int,
    stream: Any,
) -> Work[dict[str, int]]:
    """``_assignment`` of slice ``best``, one slice's plan made here first (along
    ``planned``'s path) for this process's copy of the operands."""
    slicing = planned.slicing
    assert slicing is not None
    views = slicing.views(planned.inputs, arrays, best)
    each = yield from planned_for(slicing.subscripts, views, planned.path)
    return (
        yield from _assignment(
            planned, ring, arrays, best, each=each, device=device, stream=stream, compiler=None
        )
    )


def _whole(
    planned: EinsumPlan, ring: Semiring, arrays: Sequence[Any], *, argmax: bool, stream: Any
) -> Work[Any]:
    """The whole contraction (unsliced) along ``planned``'s path."""
    _, arrays, device = check_arrays(arrays, ring.name)
    whole = yield from planned_for(planned.subscripts, arrays, planned.path)
    run = contract(
        whole, ring, arrays, device=device, argmax=argmax, out=None, stream=stream,
        compiler=None,
    )  # fmt: skip
    return (yield from run)


def _partial(
    planned: EinsumPlan,
    ring: Semiring,
    arrays: Sequence[Any],
    numbers: range,
    *,
    scored: bool,
    device: int,
    stream: Any,
) -> Work[tuple[Any, Any]]:
    slicing = planned.slicing
    assert slicing is not None
    lanes = yield from _lanes(
        planned, ring, arrays, device=device, devices=[device], stream=stream, compiler=None
    )
    _run(lanes, slicing, planned.inputs, ring, numbers, argmax=scored)
    (lane,) = lanes
    return lane.total, lane.scores
