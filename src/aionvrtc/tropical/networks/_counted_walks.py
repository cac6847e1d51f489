"""Every assignment attaining a scalar contraction's value, on the GPU
(``tropical.configurations``): the reference's bounded enumeration with the contraction and the
walk on the device.

The plan's counted run (``_counted``) gives the value and the count of the assignments attaining
it, and keeps each step's values. Then partial assignments, one row each, are walked from the
last step back to the first: at a step, every row is extended by the values of the indices the
step sums at which its operands' product attains the row's cell of the step's result, so only
branches that reach the value are followed and the rows never outnumber the count. Each step's
extension is array work over all the rows at once (gathers, the semiring's product, a compare),
in chunks of at most ``MAX_GATHER`` pairs of a row and a branch. One body serves CuPy on the
GPU and NumPy on a CPU (the tests follow every plan there).

The walk reads the plan's steps by their indices: a long sum the planner cut in parts (a step
with a ``split`` index, then the sum of its partials) is walked as the one step it stands for,
its operands' product against the sum's cell (the partials' maximum is the whole's)."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from ..._compiler import Compiler
from ..products import (
    Offload,
    Semiring,
    Wait,
    Work,
    check_size,
    combine,
    cupy_module,
    entry_counts,
    run_async,
    run_sync,
)
from ._counted import counted_runs, on_stream, strided
from ._plan import EinsumPlan
from ._planner import planned_for
from ._runs import check_arrays, check_counted_plan, device_bytes, resolved_stream
from ._subscripts import check_semiring
from ._terms import contiguous
from ._walks import check_limit

__all__ = [
    "MAX_GATHER",
    "configurations",
    "configurations_sync",
    "in_order",
    "walk",
    "walked_indices",
]

# The most (row, branch) pairs one gather of a step's extension holds: each pair an operand's
# value and its int64 positions, some 100 MiB at this many.
MAX_GATHER = 1 << 22


class _Node(NamedTuple):
    """A step as the walk reads it: the operands it contracts (numbered as ``Step.operands``),
    the number of its result, and its result's indices."""

    operands: tuple[int, ...]
    number: int
    result: tuple[str, ...]


def _nodes(planned: EinsumPlan) -> list[_Node]:
    """``planned``'s steps as the walk reads them: a split step's partials and their sum as one
    node (its operands, the sum's result)."""
    partials: dict[int, tuple[int, ...]] = {}
    nodes = []
    for step in planned.steps:
        if step.split is not None:
            partials[step.number] = step.operands
            continue
        operands = step.operands
        if len(operands) == 1 and operands[0] in partials:
            operands = partials.pop(operands[0])
        nodes.append(_Node(operands, step.number, step.result))
    return nodes


def walked_indices(planned: EinsumPlan) -> str:
    """The indices a row of ``planned``'s assignments gives, each once, in the order they first
    appear in its inputs (as ``reference.configurations`` gives them)."""
    return "".join(dict.fromkeys("".join(planned.inputs)))


def walk(
    planned: EinsumPlan,
    ring: Semiring,
    values: Sequence[Any],
    kept: dict[int, Any],
    *,
    xp: Any,
    first: bool = False,
    gather: int = MAX_GATHER,
) -> Any:
    """Every assignment at which ``planned``'s product attains its scalar value, as int64 rows
    (one column per index of ``walked_indices``), in the order the walk found them; one alone
    with ``first``. ``values`` are the inputs, laid out as planned; ``kept`` each step's values
    by its result's number (``counted_run(..., kept=)``), contiguous over its result, taken
    out of ``kept`` and let go as the walk passes them; ``xp`` the array module. No rows where
    the value is the semiring's zero."""
    sizes = planned.sizes
    letters = walked_indices(planned)
    if 0 in sizes.values():  # an empty sum: the zero, attained by none
        return xp.zeros((0, len(letters)), np.int64)
    column = {c: i for i, c in enumerate(letters)}
    # Every operand by number: a view over its indices, and the indices.
    arrays: dict[int, tuple[Any, tuple[str, ...]]] = {
        i: (strided(xp, x, [sizes[c] for c in term.indices], term.strides), term.indices)
        for i, (x, term) in enumerate(zip(values, planned.terms, strict=True))
    }
    for step in planned.steps:  # (a split step's partials: not read, let go)
        x = kept.pop(step.number)
        if step.split is None:
            arrays[step.number] = (x.reshape([sizes[c] for c in step.result]), step.result)
    nodes = _nodes(planned)
    if not nodes:  # one input, the value itself
        ((only, _),) = arrays.values()
        alive = bool(entry_counts(ring, only))
        return xp.zeros((1 if alive else 0, len(letters)), np.int64)
    target, _ = arrays[nodes[-1].number]
    alive = bool(entry_counts(ring, target))
    rows = xp.zeros((1 if alive else 0, len(letters)), np.int64)
    for node in reversed(nodes):
        # The node's result goes once walked; an input, once its one reader is (a step's
        # result read here is its own node's target, walked later).
        target, keep = arrays.pop(node.number)
        operands = [arrays[o] for o in node.operands]
        for o in node.operands:
            if o < len(values):
                del arrays[o]
        if len(rows):
            rows = _extended(ring, xp, rows, (target, keep), operands, column=column,
                             sizes=sizes, first=first, gather=gather)  # fmt: skip
    return rows


def _extended(
    ring: Semiring,
    xp: Any,
    rows: Any,
    target: tuple[Any, tuple[str, ...]],
    operands: Sequence[tuple[Any, tuple[str, ...]]],
    *,
    column: Mapping[str, int],
    sizes: Mapping[str, int],
    first: bool,
    gather: int,
) -> Any:
    """``rows`` each extended by every value of the indices the node sums at which its
    ``operands``' product attains the row's cell of ``target`` (the node's result): a row per
    (row, values) pair, in chunks of at most ``gather`` pairs."""
    cells, keep = target
    kept = set(keep)
    summed = tuple(dict.fromkeys(c for _, indices in operands for c in indices if c not in kept))
    shape = [sizes[c] for c in summed]
    branches = math.prod(shape)
    at = xp.asarray([column[c] for c in summed], np.int64)
    wanted = _picked(xp, cells, keep, rows, column)
    per_row = min(branches, gather)
    row_chunk = max(1, gather // per_row)
    strides = contiguous(shape)
    chunks = [(s0, min(s0 + per_row, branches)) for s0 in range(0, branches, per_row)]
    # Each chunk's values of the summed indices, made once for every chunk of rows where one
    # chunk spans the branches (by C strides: cupy.unravel_index waits for the GPU).
    ready = [_values(xp, *chunks[0], shape, strides)] if len(chunks) == 1 else None
    made = []
    for r0 in range(0, len(rows), row_chunk):
        part = rows[r0 : r0 + row_chunk]
        for number, (s0, s1) in enumerate(chunks):
            where = ready[number] if ready else _values(xp, s0, s1, shape, strides)
            product: Any = None
            for x, indices in operands:
                index = tuple(
                    part[:, column[c], None] if c in kept else where[summed.index(c)][None, :]
                    for c in indices
                )
                entry = x[index] if index else x[()]
                product = entry if product is None else combine(ring, product, entry)
            product = xp.broadcast_to(xp.asarray(product), (len(part), s1 - s0))
            hits = (product == wanted[r0 : r0 + row_chunk, None]) & entry_counts(ring, product)
            row_at, branch_at = xp.nonzero(hits)
            if first:
                row_at, branch_at = row_at[:1], branch_at[:1]
            grown = part[row_at]
            if shape:
                grown[:, at] = xp.stack([w[branch_at] for w in where], axis=1)
            made.append(grown)
            if first and len(grown):
                return grown
    return xp.concatenate(made) if made else rows[:0]


def _values(xp: Any, start: int, stop: int, shape: Sequence[int], strides: Sequence[int]) -> Any:
    """The values of each summed index (of ``shape``, in C order) at the flat positions
    ``start`` to ``stop``: one int64 array an index."""
    flat = xp.arange(start, stop, dtype=np.int64)
    return [(flat // stride) % size for size, stride in zip(shape, strides, strict=True)]


def _picked(xp: Any, x: Any, indices: Sequence[str], rows: Any, column: Mapping[str, int]) -> Any:
    """``x`` (over ``indices``) at each row's values of them: one element a row."""
    if not indices:
        return xp.broadcast_to(xp.asarray(x), (len(rows),))
    return x[tuple(rows[:, column[c]] for c in indices)]


def in_order(xp: Any, rows: Any) -> Any:
    """``rows`` in increasing order (the first index the first key)."""
    if not rows.shape[1] or len(rows) < 2:
        return rows
    return rows[xp.lexsort(rows.T[::-1])]


# -- the GPU call --------------------------------------------------------------------------------


async def configurations(
    subscripts: str,
    *operands: Any,
    semiring: str = "maxplus",
    limit: int = 10_000,
    first: bool = False,
    optimize: Any = "auto",
    stream: Any = None,
    compiler: Compiler | None = None,
) -> tuple[Any, str, Any]:
    """Every assignment of the indices that attains a scalar contraction's value, found on the
    GPU: ``reference.configurations`` for CuPy arrays.

    The bounded method, on the device: the network is contracted once with counts
    (``einsum(..., count=True)``), each step's values kept; past ``limit`` assignments the call
    is refused before any row is made. Then partial assignments are walked from the last step
    back to the first, each extended at a step by the values of the indices it sums at which
    the step's operands attain the row's cell, all rows at once: the work past the contraction
    is about the number of assignments times the number of steps. The call waits for the GPU
    (for the count, and at each step for the rows it extends), without blocking the event
    loop.

    Args:
        subscripts: As ``einsum``; the output has no index (``"...->"``).
        *operands: As ``einsum``: CuPy arrays of one dtype, on one device.
        semiring: As ``einsum``.
        limit: The most assignments returned (default 10,000). Past it the call raises a
            ValueError saying how many there are.
        first: Return one assignment alone, the first the walk finds, however many there are
            (``limit`` is not checked).
        optimize: The order, as ``einsum`` takes it, without a slicing (every step's values
            are kept through the walk).
        stream: The CuPy stream to enqueue on (default: CuPy's current stream of the
            operands' device).
        compiler: The Compiler that fetches the kernels (default: aionvrtc's process-wide
            Compiler).

    Returns:
        The triple (value, indices, rows): the value, a 0-d CuPy array; the indices, a str,
        each once, in the order they first appear in ``subscripts``; a CuPy int64 array of one
        row per assignment and one column per index, the rows in increasing order. No rows
        where the value is the semiring's zero.

    Raises:
        TypeError: As ``einsum``; ``limit`` is not an int, ``first`` not a bool.
        ValueError: As ``einsum``; the output has an index; a plan with a slicing; ``limit``
            is below 1; more than ``limit`` assignments attain the value (the message says how
            many); every step's values, or the rows, would pass the device's memory.
        cupy.cuda.memory.OutOfMemoryError: The memory in use on the device leaves too little
            for the contraction's kept values or the rows.
        RuntimeError: ``compiler`` is not open yet; the walk found another number of
            assignments than the count (a defect, never expected: please report it).
        aionvrtc.AionvrtcError: As ``einsum``: a kernel could not be fetched.
    """
    return await run_async(
        _configurations(
            subscripts,
            operands,
            semiring=semiring,
            limit=limit,
            first=first,
            optimize=optimize,
            stream=stream,
            compiler=compiler,
        )
    )


def configurations_sync(
    subscripts: str,
    *operands: Any,
    semiring: str = "maxplus",
    limit: int = 10_000,
    first: bool = False,
    optimize: Any = "auto",
    stream: Any = None,
    compiler: Compiler | None = None,
) -> tuple[Any, str, Any]:
    """``configurations`` for code that is not async: the same walk, run in this thread.

    Args:
        subscripts: As ``configurations``.
        *operands: As ``configurations``.
        semiring: As ``configurations``.
        limit: As ``configurations``.
        first: As ``configurations``.
        optimize: As ``configurations``.
        stream: As ``configurations``.
        compiler: As ``einsum_sync``.

    Returns:
        As ``configurations``: (value, indices, rows).

    Raises:
        TypeError: As ``configurations``.
        ValueError: As ``configurations``.
        cupy.cuda.memory.OutOfMemoryError: As ``configurations``.
        RuntimeError: As ``einsum_sync``.
        aionvrtc.AionvrtcError: As ``configurations``.
    """
    return run_sync(
        _configurations(
            subscripts,
            operands,
            semiring=semiring,
            limit=limit,
            first=first,
            optimize=optimize,
            stream=stream,
            compiler=compiler,
        )
    )


def check_walk(limit: object, first: object) -> None:
    """``limit`` and ``first`` as ``configurations`` takes them: TypeError or ValueError."""
    check_limit(limit)
    if not isinstance(first, bool):
        raise TypeError(f"first must be True or False, got {type(first).__name__}")


def check_walked_plan(planned: EinsumPlan, dtype: Any, device: int) -> None:
    """Refuse, before anything is allocated, a plan the walk does not take: one with an output
    index or a slicing, or whose steps' values, all kept, would pass ``device``'s memory."""
    if planned.output:
        raise ValueError(
            f"configurations takes a scalar contraction (subscripts ending in '->'), not one "
            f"with the output {planned.output!r}: the assignments of a cell are those of the "
            "network with the output's indices fixed to it (slice the operands there)"
        )
    if planned.slicing is not None:
        raise ValueError(
            "configurations keeps every step's values of one whole contraction, and this plan "
            "runs in slices: pass a plan without a slicing (no memory_limit)"
        )
    check_counted_plan(planned, dtype, top=None, device=device)
    elements = sum(step.size for step in planned.steps)
    limit = device_bytes(device)
    check_size("configurations' kept values (every step's)", elements,
               itemsize=np.dtype(dtype).itemsize, limit=limit,
               bound=f"the {limit:,} bytes of device {device}'s memory",
               fix="pick an order of smaller intermediates (optimize=), or count alone with "
               "einsum(..., count=True)")  # fmt: skip


def _configurations(
    subscripts: str,
    operands: Sequence[Any],
    *,
    semiring: str,
    limit: int,
    first: bool,
    optimize: Any,
    stream: Any,
    compiler: Compiler | None,
) -> Work[tuple[Any, str, Any]]:
    """The body of ``configurations`` and ``configurations_sync`` (see _twins)."""
    check_semiring(subscripts, semiring)
    check_walk(limit, first)
    ring, arrays, device = check_arrays(operands, semiring)
    planned = yield from planned_for(subscripts, arrays, optimize)
    check_walked_plan(planned, arrays[0].dtype, device)
    stream = resolved_stream(device, stream)
    on = on_stream(device, stream)
    kept: dict[int, Any] = {}
    run = counted_runs(planned, ring, arrays, top=None, stream=stream, on=on, compiler=compiler,
                       kept=kept)  # fmt: skip
    value, count = yield from run(None)
    yield Wait(stream)
    with on():
        many = int(count)
    letters = walked_indices(planned)
    if first:  # (a count past int64, -1, is many too)
        many = 1 if many else 0
    elif many < 0 or many > limit:
        how = "more than 2^63 - 1" if many < 0 else f"{many:,}"
        raise ValueError(
            f"{how} assignments attain the value {value.item()}, more than limit={limit:,}: "
            "pass a larger limit, or count them alone with einsum(..., count=True)"
        )
    bound = device_bytes(device)
    # The walk holds up to three times the rows at its peak: the rows, their next extension,
    # and the sorted copy (as the reference's).
    check_size(f"configurations' rows ({many:,} assignments of {len(letters)} indices, three "
               "times over at the walk's peak)", 3 * many * len(letters), itemsize=8,
               limit=bound, bound=f"the {bound:,} bytes of device {device}'s memory",
               fix="count them alone with einsum(..., count=True)")  # fmt: skip
    rows = yield Offload(
        functools.partial(_walked, planned, ring, arrays, kept, first=first, on=on)
    )
    if len(rows) != many:  # (never: the walk follows the kernels' values exactly)
        raise RuntimeError(
            f"configurations walked {len(rows):,} assignments back where the count is {many:,}: "
            "the GPU's products and the walk's disagree; please report this"
        )
    return value, letters, rows


def _walked(
    planned: EinsumPlan,
    ring: Semiring,
    arrays: Sequence[Any],
    kept: dict[int, Any],
    *,
    first: bool,
    on: Any,
) -> Any:
    """The walk on the GPU (in a worker thread: each step waits for its rows), the rows sorted;
    the kept values let go as the walk passes them."""
    with on():
        return in_order(
            cupy_module(), walk(planned, ring, arrays, kept, xp=cupy_module(), first=first)
        )
