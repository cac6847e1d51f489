"""One row of the kernel of small products (``tropical_many``): a group of steps contracted as
one (``Group``), whether it fits a row, and the row's words; which steps a plan reads in place
(a short sum over few outputs as one row, where a product would copy an operand first), and
which products a compiled program scans again at its backtrace instead of keeping their argmax.

What a plan is made of comes from _terms; the plan itself is any object with its ``terms``,
``steps`` and ``sizes`` (``Planned``), so that the plan (_plan), which asks which of its steps
are read in place, stands above this module.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ._terms import Step, Term

__all__ = [
    "LEAVES",
    "MANY_OUT",
    "MANY_SUMMED",
    "ROW_WORDS",
    "SCAN_K",
    "SCAN_WORK",
    "THREADS",
    "Group",
    "Planned",
    "fits",
    "lanes",
    "lone",
    "many_blocks",
    "many_row",
    "read_in_place",
    "scanned",
    "tiny",
    "wide_indices",
]


class Planned(Protocol):
    """What this module reads of a plan (an ``EinsumPlan``)."""

    @property
    def terms(self) -> tuple[Term, ...]: ...

    @property
    def steps(self) -> tuple[Step, ...]: ...

    @property
    def sizes(self) -> Mapping[str, int]: ...


# What one row of tropical_many takes (EINSUM_LEAVES, EINSUM_OUT, EINSUM_SUMMED): the tensors a
# group reads, its output indices and its summed indices (those of more than one value).
LEAVES = 8
MANY_OUT = 24
MANY_SUMMED = 8
ROW_WORDS = 8 + LEAVES + (1 + LEAVES) * (MANY_OUT + MANY_SUMMED)  # EINSUM_ROW
# A lone step runs in tropical_many where its product would copy an operand first, with K at
# most SMALL_K and at most SMALL outputs (read_in_place: eager runs and programs alike), and in
# a program where its outputs times K are at most TINY_WORK with K at most TINY_K (``tiny``:
# there a level's small steps share a launch). Each output's K is summed by at most a warp's
# team of threads (see lanes): fine where K is short; measured on an H200, 2^20 outputs over
# K = 16 took 120 us there (one thread an output), a copy and a tiled product 40.
SMALL_K = 16
SMALL = 1 << 16
TINY_WORK = 1 << 15
TINY_K = 256
THREADS = 256  # a tropical_many block's
MAX_BLOCKS = 4096  # of a tropical_many launch (its threads stride over the rest)
NARROW = 1 << 31  # offsets into a tropical_many leaf below which 32 bits do
TEAMED = 1 << 16  # threads up to which the outputs' K is shared by teams (see lanes)


@dataclass(frozen=True, slots=True)
class Group:
    """Steps contracted as one: ``root`` writes the result, ``members`` are its steps in order,
    ``leaves`` the operands it reads (numbered as Step.operands: inputs, then steps' results),
    ``summed`` its summed indices of more than one value, last fastest in the kernel's order
    (its argmax numbers their values in C order over them), ``k`` their sizes' product."""

    root: int
    members: tuple[int, ...]
    leaves: tuple[int, ...]
    summed: tuple[str, ...]
    k: int


# A compiled program's product over at least SCAN_WORK values (outputs times K), with K at
# most SCAN_K, keeps no argmax: the backtrace scans its K again at the one position it reaches
# (a block's threads), where keeping it made its kernel compare and select an index beside
# each value. Measured on an H200, the 150-vertex MIS network of the benchmark took 290 us of
# GPU time keeping every argmax and 222 us scanning its four products past 2^22 values (the
# value alone: 185 us; the backtrace 26 us, then 34); past 2^20, five products, 221 us.
SCAN_WORK = 1 << 22
SCAN_K = 1 << 16


def scanned(plan: Planned, step: Step) -> bool:
    """Whether a compiled program with argmax scans ``step`` again at its backtrace: a large
    product of two operands that the program keeps where it made them (each an intermediate,
    or a copy: an input is read where the caller's call put it, at no fixed offset)."""
    if step.second is None:
        return False
    k = step.first.shape[2]
    if step.size * k < SCAN_WORK or k > SCAN_K:
        return False
    inputs = len(plan.terms)
    operands = step.operands[::-1] if step.swapped else step.operands
    return all(
        o >= inputs or read.copy is not None
        for o, read in zip(operands, (step.first, step.second), strict=True)
    )


def lone(plan: Planned, number: int) -> Group:
    """Step ``number`` as a group of its own."""
    step = plan.steps[number]
    summed = wide_indices(plan, step.k)
    return Group(number, (number,), step.operands, summed, _product(plan, summed))


def read_in_place(plan: Planned, number: int) -> bool:
    """Whether step ``number``, whose product would copy an operand first, runs instead as one
    row of tropical_many, reading its operands as they lie: a short sum over few outputs that
    fits a row (see SMALL_K). Its result is laid out as the product's."""
    step = plan.steps[number]
    if not any(read is not None and read.copy is not None for read in (step.first, step.second)):
        return False
    group = lone(plan, number)
    return group.k <= SMALL_K and step.size <= SMALL and fits(plan, group)


def tiny(plan: Planned, group: Group) -> bool:
    """Whether a lone step's outputs times K are few enough for tropical_many (see SMALL_K)."""
    k = group.k
    return plan.steps[group.root].size * k <= TINY_WORK and k <= TINY_K and fits(plan, group)


def many_row(
    plan: Planned, group: Group, leaves: Sequence[tuple[int, Term]], c: int, index: int
) -> list[int]:
    """``group``'s row of tropical_many (EINSUM_ROW): its result at address ``c`` and argmax at
    ``index`` (0: none), ``leaves`` its operands' addresses and layouts in its leaves' order."""
    step = plan.steps[group.root]
    sizes = plan.sizes
    strides = [dict(zip(t.indices, t.strides, strict=True)) for _, t in leaves]
    wide = wide_indices(plan, step.result)
    # Offsets in 32 bits where every leaf's elements are numbered below 2^31. (Each index's
    # whole size times its stride: the odometer steps one past the last value before it wraps.)
    reach = max(sum(sizes[i] * abs(n) for i, n in d.items()) for d in strides)
    return [
        c, index, step.size, group.k, len(wide), len(group.summed), len(leaves),
        lanes(group.k, step.size) + (256 if reach >= NARROW else 0),
        *(at for at, _ in leaves), *[0] * (LEAVES - len(leaves)),
        *_dims(wide, sizes, strides, MANY_OUT),
        *_dims(group.summed, sizes, strides, MANY_SUMMED),
    ]  # fmt: skip


def many_blocks(plan: Planned, group: Group) -> int:
    """The blocks of tropical_many that ``group`` fills."""
    outputs = plan.steps[group.root].size
    threads = outputs * lanes(group.k, outputs)
    return min(-(-threads // THREADS), MAX_BLOCKS)


def lanes(k: int, outputs: int) -> int:
    """The threads of tropical_many that share an output's K: a power of 2, at most 32 (a
    warp), at most K, and no more than bring the launch to TEAMED threads (each thread
    decodes its output's position itself: past a full GPU, more threads only add that)."""
    room = max(TEAMED // max(outputs, 1), 1)
    return 1 << min(max(k, 1).bit_length() - 1, 5, room.bit_length() - 1)


def _dims(
    indices: Sequence[str], sizes: Any, strides: Sequence[dict[str, int]], count: int
) -> list[int]:
    """A tropical_many row's ``count`` indices: the size of each of ``indices`` and each
    leaf's stride along it (0 where it lacks it), then zeros."""
    width = 1 + LEAVES
    row = []
    for i in indices:
        row += [sizes[i], *(s.get(i, 0) for s in strides)]
        row += [0] * (width - 1 - len(strides))
    return row + [0] * (width * count - len(row))


def fits(plan: Planned, group: Group) -> bool:
    """Whether ``group`` fits one row of tropical_many: its leaves, output and summed indices
    within the row's, and no step whose K is cut in parts (its argmax numbers a part's k) or
    that a program's backtrace scans again (it keeps no argmax: see ``scanned``)."""
    return (
        len(group.leaves) <= LEAVES
        and len(group.summed) <= MANY_SUMMED
        and len(wide_indices(plan, plan.steps[group.root].result)) <= MANY_OUT
        and all(
            plan.steps[n].split is None and not scanned(plan, plan.steps[n]) for n in group.members
        )
    )


def wide_indices(plan: Planned, indices: tuple[str, ...]) -> tuple[str, ...]:
    """Those of ``indices`` of more than one value (an index of one is no dimension of a
    tropical_many row)."""
    return tuple(i for i in indices if plan.sizes[i] != 1)


def _product(plan: Planned, indices: tuple[str, ...]) -> int:
    """The values a group sums per output (a step whose K is cut in parts sums a part's, but
    stays alone and never runs in tropical_many)."""
    return math.prod(plan.sizes[i] for i in indices)
