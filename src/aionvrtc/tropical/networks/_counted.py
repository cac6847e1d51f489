"""Counted contractions (``einsum(..., count=True)`` on the GPU): a plan's steps followed with
each operand's counts beside its values, every step one counted product
(``matmul(..., counts=...)``).

The run reads the plan as the eager run does (each step's two reads, copied to an order first
or viewed in place, the reductions times a vector of ones) but over array objects rather than
an arena of offsets, so that one body serves CuPy on the GPU and NumPy with the reference's
counted product on a CPU (the tests follow every plan there). Each operand's counts lie with
its values' element strides, so each read's view applies to both. Counts are exact in int64
first; where one passes 2^63 - 1 (a -1 on the GPU) the network is counted again modulo each of
the primes a count's bound needs, the residues joined on the host (_residues), as the NumPy
reference counts past int64."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Generator, Sequence
from typing import Any

import numpy as np

from ..._compiler import Compiler
from ..products import (
    MAX_TOP_GPU,
    OnDevice,
    Semiring,
    Wait,
    Work,
    cupy_module,
    entry_counts,
    matmul_work,
    top_product,
)
from ._counting import MAX_TOP, check_top
from ._plan import EinsumPlan
from ._planner import planned_for
from ._residues import INT64_MAX, Joined, moduli
from ._runs import copied_to
from ._slicing import added
from ._terms import Term, View, contiguous

__all__ = [
    "Counted",
    "CountedLane",
    "Product",
    "check_top_on_gpu",
    "contract_counted",
    "count_bound",
    "counted_run",
    "counted_runs",
    "counted_slices",
    "exact_counts",
    "join_counted",
    "joined",
    "merged",
    "on_stream",
    "strided",
]

# A counted product of 3-D views (a, b, counts of a, counts of b): (values, counts), as a body
# that may yield what it needs done (fetches: products' Work).
Product = Callable[[Any, Any, Any, Any], Generator[Any, Any, tuple[Any, Any]]]
# An operand: its values, their counts laid out alike, and how the plan sees it.
Counted = tuple[Any, Any, Term]


def counted_run(
    planned: EinsumPlan,
    ring: Semiring,
    values: Sequence[Any],
    *,
    xp: Any,
    product: Product,
    top: int | None = None,
    on: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    kept: dict[int, Any] | None = None,
) -> Generator[Any, Any, tuple[Any, Any]]:
    """``planned`` contracted over ``values`` (its inputs, laid out as planned) with each
    entry counting once: (the result, the count of the assignments attaining each element),
    the result in the output's order. With ``top``, each element is a list of the ``top`` best
    distinct values and their counts instead, on a last axis (``einsum(..., top=k)``), every
    operand and step laid out so. ``xp`` is the array module (CuPy, or NumPy for the tests),
    ``product`` each step's counted (or k-best) product, and ``on`` the context each stretch
    of array work runs in (the caller's stream). Where ``kept`` is given, each step's values
    go into it by the number of its result (contiguous over ``step.result``), held past the
    run (the walk of ``_counted_walks`` reads them)."""
    sizes = planned.sizes
    dtype = np.dtype(values[0].dtype)
    shape = tuple(sizes[i] for i in planned.output) + (() if top is None else (top,))
    if 0 in sizes.values():  # an empty sum, or an empty result: the zero, attained by none
        with on():
            return xp.full(shape, ring.zero(dtype), dtype), xp.zeros(shape, np.int64)
    # An input's counts (and with ``top`` its lists) are made when a step first reads it, so
    # a run holds those of the inputs it is reading, not of every input at once.
    inputs = dict(enumerate(zip(values, planned.terms, strict=True)))
    made: dict[int, Counted] = {}
    for step in planned.steps:
        with on():
            chosen = [
                made.pop(o) if o in made else _entries(xp, ring, *inputs.pop(o), top)
                for o in step.operands
            ]
        if step.swapped:
            chosen = chosen[::-1]
        with on():
            reads = [
                _read(xp, operand, view, sizes, top)
                for operand, view in zip(chosen, (step.first, step.second), strict=False)
                if view is not None
            ]
            if step.second is None:  # a reduction: times a vector of ones, each counting once
                k = step.first.shape[2]
                ones = _ones(xp, ring, dtype, k, top)
                reads.append(tuple(strided(xp, x, (1, k, 1), (0, 1, 1), top) for x in ones))
        (a, na), (b, nb) = reads
        value, count = yield from product(a, b, na, nb)
        if kept is not None:
            kept[step.number] = value
        # What the step read goes now (a copy's memory back to the pool for the next step).
        del reads, a, na, b, nb, chosen
        result = Term(step.result, contiguous([sizes[i] for i in step.result]))
        made[step.number] = (value, count, result)
    if not planned.steps:  # one input, the result itself
        with on():
            made[0] = _entries(xp, ring, *inputs.pop(0), top)
    ((value, count, term),) = made.values()
    with on():
        if term.indices != tuple(planned.output) or not planned.steps:
            value, count = (
                _ordered(xp, x, term, planned.output, sizes, top=top) for x in (value, count)
            )
        if not planned.steps:  # the result is never an input itself
            value, count = value.copy(), count.copy()
        return value.reshape(shape), count.reshape(shape)


def counted_slices(
    planned: EinsumPlan,
    each: EinsumPlan,
    ring: Semiring,
    values: Sequence[Any],
    *,
    xp: Any,
    product: Product,
    modulus: int | None,
    top: int | None = None,
    on: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    numbers: Sequence[int] | None = None,
) -> Generator[Any, Any, tuple[Any, Any]]:
    """``counted_run`` of a sliced ``planned``: each slice's views of ``values`` along
    ``each`` (the plan of one slice), the slices' (value, count) pairs joined in turn
    (``join_counted``), or with ``top`` their lists merged by ``product`` (``merged``); the
    slices ``numbers`` alone where given (a device's share)."""
    slicing = planned.slicing
    assert slicing is not None
    total: tuple[Any, Any] | None = None
    for number in slicing if numbers is None else numbers:
        views = slicing.views(planned.inputs, values, number)
        run = counted_run(each, ring, views, xp=xp, product=product, top=top, on=on)
        part = yield from run
        if total is None:
            total = part
        elif top is not None:
            total = yield from merged(ring, xp, (total, part), product=product, on=on)
        else:
            with on():
                total = join_counted(ring, xp, total, part, modulus)
    assert total is not None
    return total


def merged(
    ring: Semiring,
    xp: Any,
    pairs: tuple[tuple[Any, Any], tuple[Any, Any]],
    *,
    product: Product,
    on: Callable[[], contextlib.AbstractContextManager[Any]],
) -> Generator[Any, Any, tuple[Any, Any]]:
    """Two sets of lists (values, counts; the lists on a last axis) merged into the best of
    both, the counts of equal values added: each pair of lists is a sum over two, a k-best
    product with a vector of two ones."""
    (old, before), (new, more) = pairs
    shape, top = old.shape, old.shape[-1]
    elements = math.prod(shape[:-1])
    with on():
        a, na = (xp.stack(pair, axis=-2).reshape(elements, 1, 2, top)
                 for pair in ((old, new), (before, more)))  # fmt: skip
        ones = _ones(xp, ring, old.dtype, 2, top)
        b, nb = (strided(xp, x, (1, 2, 1), (0, 1, 1), top) for x in ones)
    value, count = yield from product(a, b, na, nb)
    return value.reshape(shape), count.reshape(shape)


def join_counted(
    ring: Semiring, xp: Any, total: tuple[Any, Any], part: tuple[Any, Any], modulus: int | None
) -> tuple[Any, Any]:
    """(value, count) pairs joined elementwise as the counted kernels join them: the better
    value with its count, the counts added where the values are equal (exact, -1 past
    2^63 - 1 or from a -1; else modulo ``modulus``)."""
    (old, before), (new, more) = total, part
    best = added(ring.add, xp)(old, new)
    left, right = xp.where(old == best, before, 0), xp.where(new == best, more, 0)
    with np.errstate(over="ignore"):  # (int64 sums that wrap are marked below)
        both = left + right
    if modulus is not None:
        return best, xp.where(both >= modulus, both - modulus, both)
    return best, xp.where((left < 0) | (right < 0) | (both < 0), -1, both)


def _entries(xp: Any, ring: Semiring, x: Any, term: Term, top: int | None) -> Counted:
    """``x``'s entries (values, counts, ``term``), laid out with ``x``'s element strides (the
    plan's views of ``x`` read them too): ``x`` itself and its counts (1 each, 0 for the zero
    and NaN); with ``top``, lists of ``top`` of both, each entry first and the zero (count 0)
    after it. Over buffers spanning every element ``x`` reaches, as a view of ``x``'s would."""
    each = [s // x.itemsize for s in x.strides]
    low = sum(s * (n - 1) for s, n in zip(each, x.shape, strict=True) if s < 0)
    high = sum(s * (n - 1) for s, n in zip(each, x.shape, strict=True) if s > 0)
    span = (max(high - low + 1, 1) if x.size else 1) * (top or 1)
    start = -low * (top or 1)
    counts = strided(xp, xp.zeros(span, np.int64)[start:], x.shape, each, top)
    entries = entry_counts(ring, x) if x.size else None
    if top is None:
        if x.size:
            counts[...] = entries
        return x, counts, term
    zero = ring.zero(x.dtype)
    lists = strided(xp, xp.full(span, zero, x.dtype)[start:], x.shape, each, top)
    if x.size:
        lists[..., 0] = xp.where(entries, x, zero)
        counts[..., 0] = entries
    return lists, counts, term


def _ones(xp: Any, ring: Semiring, dtype: Any, k: int, top: int | None) -> tuple[Any, Any]:
    """A vector of ``k`` of the semiring's ones, each counting once (lists of ``top`` where
    given: the one first)."""
    if top is None:
        return xp.full(k, ring.one(dtype), dtype), xp.ones(k, np.int64)
    values, counts = xp.full((k, top), ring.zero(dtype), dtype), xp.zeros((k, top), np.int64)
    values[:, 0], counts[:, 0] = ring.one(dtype), 1
    return values, counts


def _read(xp: Any, operand: Counted, view: View, sizes: Any, top: int | None) -> tuple[Any, Any]:
    """The 3-D views (values, counts) a step takes of ``operand`` (4-D with ``top``: the lists
    last): copied to ``view.copy``'s order first where the plan says so."""
    value, count, term = operand
    if view.copy is not None:
        value, count = (_ordered(xp, x, term, view.copy, sizes, top=top) for x in (value, count))
    return (strided(xp, value, view.shape, view.strides, top),
            strided(xp, count, view.shape, view.strides, top))  # fmt: skip


def _ordered(
    xp: Any, x: Any, term: Term, order: Sequence[str], sizes: Any, *, top: int | None
) -> Any:
    """``x`` (laid out as ``term`` says, from its first element) copied to C order over
    ``order`` (the lists last, with ``top``)."""
    stride_of = dict(zip(term.indices, term.strides, strict=True))
    shape = [sizes[i] for i in order]
    return xp.ascontiguousarray(strided(xp, x, shape, [stride_of[i] for i in order], top))


def strided(
    xp: Any, x: Any, shape: Sequence[int], strides: Sequence[int], top: int | None = None
) -> Any:
    """A view of ``x``'s memory from its first element, of ``shape`` and element ``strides``;
    with ``top``, of lists of ``top`` on a last axis (each stride in whole lists)."""
    if top is not None:
        shape, strides = (*shape, top), (*(s * top for s in strides), 1)
    return xp.lib.stride_tricks.as_strided(
        x, shape=tuple(shape), strides=tuple(s * x.itemsize for s in strides)
    )


def check_top_on_gpu(top: object, count: bool) -> None:
    """``top`` as ``check_top`` takes it with ``count``, and within the lists the GPU keeps:
    TypeError or ValueError naming what is wrong."""
    check_top(top, count)
    if top is not None and top > MAX_TOP_GPU:  # type: ignore[operator]  # (an int: checked)
        raise ValueError(
            f"top must be at most {MAX_TOP_GPU} on the GPU (each output's list is kept in "
            f"registers), got {top}; tropical.reference.einsum takes up to {MAX_TOP}"
        )


def contract_counted(
    planned: EinsumPlan,
    ring: Semiring,
    arrays: Sequence[Any],
    *,
    device: int,
    stream: Any,
    compiler: Compiler | None,
    top: int | None = None,
    devices: Sequence[int] = (),
) -> Work[tuple[Any, Any]]:
    """``planned`` contracted over CuPy ``arrays`` on ``device`` with counts, enqueued on
    ``stream``: (the result, its counts). The counts are a CuPy int64 array where every one
    fits; past 2^63 - 1 (counted again modulo primes, after waiting for the GPU) a NumPy array
    of Python's ints. With ``top``, (the ``top`` best values, their counts) on a last axis,
    a count past 2^63 - 1 there -1. A sliced plan's slices spread over ``devices`` where
    they name another than ``device`` (slice n on the n-th modulo their count, each with a
    copy of the operands and its own stream), the devices' parts joined on ``device``."""
    on = on_stream(device, stream)
    slicing, each = planned.slicing, planned
    lanes: list[CountedLane] = []
    if slicing is not None:  # one slice's plan, along the whole's order (as _sliced's)
        views = slicing.views(planned.inputs, arrays, 0)
        each = yield from planned_for(slicing.subscripts, views, planned.path)
        if any(place != device for place in devices):
            lanes = yield from _lanes(planned, arrays, device=device,
                                      devices=devices[: slicing.count], stream=stream)  # fmt: skip
    run = counted_runs(planned, ring, arrays, each=each, top=top, stream=stream, on=on,
                       compiler=compiler, lanes=lanes)  # fmt: skip
    value, count = yield from run(None)
    if top is not None:  # (a count past int64 is -1: the values stand, exact)
        return value, count
    return value, (yield from exact_counts(planned, count, run, stream=stream, on=on))


def on_stream(device: int, stream: Any) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    """The context a counted run's array work takes on ``device``: ``stream`` current."""

    @contextlib.contextmanager
    def on() -> Any:
        # Allocations on the stream the products run on: CuPy's pool hands memory freed on a
        # stream only to allocations on the same stream, after the work queued there.
        with OnDevice(device), stream:
            yield

    return on


def counted_runs(
    planned: EinsumPlan,
    ring: Semiring,
    arrays: Sequence[Any],
    *,
    each: EinsumPlan | None = None,
    top: int | None,
    stream: Any,
    on: Callable[[], contextlib.AbstractContextManager[Any]],
    compiler: Compiler | None,
    standins: bool = True,
    kept: dict[int, Any] | None = None,
    lanes: Sequence[CountedLane] = (),
) -> Callable[[int | None], Generator[Any, Any, tuple[Any, Any]]]:
    """The counted run of ``planned`` over CuPy ``arrays`` on the GPU, as a function of the
    modulus (None: exact int64): ``counted_run`` (each step's values into ``kept`` where
    given), or for a sliced plan ``counted_slices`` with ``each`` (one slice's plan), each
    step a ``_counted_product``; over ``lanes`` where given (a share of the slices on each,
    the parts joined on ``stream``)."""

    def run(modulus: int | None) -> Generator[Any, Any, tuple[Any, Any]]:
        step = _counted_product(ring, top=top, modulus=modulus, stream=stream, on=on,
                                compiler=compiler, standins=standins)  # fmt: skip
        if lanes:
            return _over_lanes(planned, ring, lanes, step, modulus=modulus, top=top,
                               stream=stream, on=on, compiler=compiler,
                               standins=standins)  # fmt: skip
        if planned.slicing is None:
            return counted_run(planned, ring, arrays, xp=cupy_module(), product=step, top=top,
                               on=on, kept=kept)  # fmt: skip
        assert each is not None
        assert kept is None  # (the walk takes a whole run)
        return counted_slices(planned, each, ring, arrays, xp=cupy_module(), product=step,
                              modulus=modulus, top=top, on=on)  # fmt: skip

    return run


@dataclasses.dataclass(frozen=True)
class CountedLane:
    """One device's share of a sliced counted run: the device, its stream, the operands
    there, and one slice's plan for them."""

    device: int
    stream: Any
    arrays: Sequence[Any]
    each: EinsumPlan


def _lanes(
    planned: EinsumPlan, arrays: Sequence[Any], *, device: int, devices: Sequence[int], stream: Any
) -> Work[list[CountedLane]]:
    """A lane on each of ``devices``: the operands there (a copy but on ``device``, the
    operands', made once for every run of the call) and one slice's plan for them."""
    slicing = planned.slicing
    assert slicing is not None
    lanes = []
    for place in devices:
        here, there = (arrays, stream) if place == device else copied_to(arrays, place, stream)
        views = slicing.views(planned.inputs, here, 0)
        each = yield from planned_for(slicing.subscripts, views, planned.path)
        lanes.append(CountedLane(place, there, here, each))
    return lanes


def _over_lanes(
    planned: EinsumPlan,
    ring: Semiring,
    lanes: Sequence[CountedLane],
    merge: Product,
    *,
    modulus: int | None,
    top: int | None,
    stream: Any,
    on: Callable[[], contextlib.AbstractContextManager[Any]],
    compiler: Compiler | None,
    standins: bool = True,
) -> Generator[Any, Any, tuple[Any, Any]]:
    """The slices of ``planned``, slice n on ``lanes[n % len(lanes)]`` (each lane's share
    enqueued on its own stream, so a device runs while the next lane's share is enqueued),
    each lane's part copied to ``stream``'s device once its stream is done, and joined there
    (top's lists merged by ``merge``, a k-best product there)."""
    slicing = planned.slicing
    assert slicing is not None
    parts = []
    for number, lane in enumerate(lanes):
        there = on_stream(lane.device, lane.stream)
        step = _counted_product(ring, top=top, modulus=modulus, stream=lane.stream, on=there,
                                compiler=compiler, standins=standins)  # fmt: skip
        share = range(number, slicing.count, len(lanes))
        part = yield from counted_slices(planned, lane.each, ring, lane.arrays,
                                         xp=cupy_module(), product=step, modulus=modulus,
                                         top=top, on=there, numbers=share)  # fmt: skip
        parts.append(part)
    total: tuple[Any, Any] | None = None
    away = []
    for lane, (value, count) in zip(lanes, parts, strict=True):
        part = (value, count)
        if lane.stream is not stream:  # (another device's: copied here after its work)
            with OnDevice(lane.device):
                done = lane.stream.record()
            with on():
                stream.wait_event(done)
                part = (_brought(value, stream), _brought(count, stream))
            away.append(lane)
        if total is None:
            total = part
        elif top is not None:
            total = yield from merged(ring, cupy_module(), (total, part), product=merge, on=on)
        else:
            with on():
                total = join_counted(ring, cupy_module(), total, part, modulus)
    if away:  # each lane's memory goes back to its pool after the copies
        with on():
            copied = stream.record()
        for lane in away:
            with OnDevice(lane.device):
                lane.stream.wait_event(copied)
    assert total is not None
    return total


def _brought(x: Any, stream: Any) -> Any:
    """A copy of ``x`` (C-contiguous, on another device) on the current one, enqueued on
    ``stream``."""
    assert x.flags.c_contiguous  # (every part a run makes: its own arrays)
    copy = cupy_module().empty(x.shape, x.dtype)
    if x.size:
        copy.data.copy_from_device_async(x.data, x.nbytes, stream)
    return copy


def _counted_product(
    ring: Semiring,
    *,
    top: int | None,
    modulus: int | None,
    stream: Any,
    on: Callable[[], contextlib.AbstractContextManager[Any]],
    compiler: Compiler | None,
    standins: bool = True,
) -> Product:
    """Each step's counted product (modulo ``modulus``), or with ``top`` its k-best one, on
    the GPU into new arrays made in ``on``; ``standins`` as ``matmul_work``'s (False: each
    product's own kernel, always asked for)."""
    cupy = cupy_module()

    def step(a: Any, b: Any, na: Any, nb: Any) -> Generator[Any, Any, tuple[Any, Any]]:
        shape = (max(a.shape[0], b.shape[0]), a.shape[1], b.shape[2], *([top] if top else []))
        with on():
            out = (cupy.empty(shape, a.dtype), cupy.empty(shape, np.int64))
        work = (
            matmul_work(a, b, ring.name, argmax=False, out=out, accumulate=False,
                        counts=(na, nb), modulus=modulus, stream=stream, compiler=compiler,
                        standins=standins)
            if top is None
            else top_product((a, b, na, nb), out, ring=ring, stream=stream, compiler=compiler,
                             standins=standins)
        )  # fmt: skip
        made: tuple[Any, Any] = yield from work
        return made

    return step


def exact_counts(
    planned: EinsumPlan,
    count: Any,
    run: Callable[[int | None], Generator[Any, Any, tuple[Any, Any]]],
    *,
    stream: Any,
    on: Callable[[], contextlib.AbstractContextManager[Any]],
) -> Work[Any]:
    """``count`` (int64, enqueued on ``stream``), or where one passed 2^63 - 1 (a -1) the
    counts again: ``run(p)`` (the counted run modulo ``p``) for each of the primes a count's
    bound needs, the residues joined on the host (a NumPy array of Python's ints then)."""
    if count_bound(planned) <= INT64_MAX:
        return count  # no count can pass int64: nothing to wait for
    yield Wait(stream)
    with on():
        overflowed = bool((count < 0).any())
    if not overflowed:
        return count
    primes = moduli(count_bound(planned))
    residues = []
    for prime in primes:
        residues.append((yield from run(prime))[1])
    yield Wait(stream)
    with on():
        return joined([cupy_module().asnumpy(r) for r in residues], primes)


def count_bound(planned: EinsumPlan) -> int:
    """The most assignments a count of ``planned``'s result can reach: those of the inputs'
    indices that its output does not keep (not the planner's own, which split a sum)."""
    summed = set().union(*planned.inputs) - set(planned.output)
    return math.prod(planned.sizes[i] for i in summed)


def joined(residues: Sequence[np.ndarray[Any, Any]], primes: Sequence[int]) -> Any:
    """Counts from their residues modulo ``primes`` (host arrays, one per prime): int64 where
    every one fits, else Python's ints (dtype object)."""
    total = Joined(primes, residues[0].shape)
    for residue in residues:
        total.add(residue)
    return total.counts()
