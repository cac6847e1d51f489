"""Which of a compiled contraction's steps run as one launch: a step and the steps that made its
operands (a chain of the contraction tree, ``Group``) are one contraction of every tensor the
chain reads, summed over every index its steps sum, since (x) distributes over (+) in every
semiring. A group's outputs are its last step's; ``tropical_many`` computes each over the
product of the group's summed sizes, reading each tensor through its own strides.

A chain of steps that each absorb a small tensor into a large one (a king's graph contracted
row by row) is latency bound: each launch on the chain costs several us however little it
computes. Measured on an H200, the 15x15 king's graph's 1036 steps ran as 227 launches in
1.33 ms of GPU time, and in groups as 75 launches in 0.66 ms (three steps of 2^16 outputs and
K = 2 in one: 8 values per output). The intermediates inside a group are never written.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ._einsum_plan import EinsumPlan, Step, Term, scanned

__all__ = [
    "LEAVES",
    "MANY_OUT",
    "MANY_SUMMED",
    "ROW_WORDS",
    "THREADS",
    "Group",
    "fits",
    "grouped_plan",
    "groups",
    "lone",
    "many_blocks",
    "many_row",
    "read_in_place",
    "tiny",
    "wide_indices",
]

# What one row of tropical_many takes (EINSUM_LEAVES, EINSUM_OUT, EINSUM_SUMMED): the tensors a
# group reads, its output indices and its summed indices (those of more than one value).
LEAVES = 8
MANY_OUT = 24
MANY_SUMMED = 8
ROW_WORDS = 8 + LEAVES + (1 + LEAVES) * (MANY_OUT + MANY_SUMMED)  # EINSUM_ROW
# A group's summed values per output and its outputs times those: a step is taken into its
# reader's group only within both, and only where the group does at most twice the work of the
# two apart (the intermediate between them then need not be written and read, and a launch
# goes). Measured on an H200 beside 16 and 2^20 (and 64 and 2^22): 32 and 2^19 were as fast or
# faster on every network of the benchmark (the 15x15 king's graph: 0.66 ms, 0.74 at 2^20).
FUSE_K = 32
FUSE_WORK = 1 << 19
_GROWTH = 2
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


def groups(plan: EinsumPlan) -> list[Group]:
    """The plan's steps in groups, each step in one, ordered by root (a group's operands are
    made by groups before it). A group is a chain: each of its steps takes in at most one
    group that made an operand of it (the one of most work that fits), while the whole fits
    one row of tropical_many and the limits above; a step whose K is cut in parts (``split``)
    stays on its own.

    Only chains, so that one fold computes every product exactly as the steps apart would:
    the leaves are the deepest step's operands, then each later step's other operand, and
    (x) taken along them in that order associates as the steps do ((x) commutes exactly in
    every semiring; it does not associate exactly in floating point). (+) moves past (x)
    exactly: a (x) max(y) = max(a (x) y) where (x) a is monotone, as rounding is."""
    inputs = len(plan.terms)
    found: dict[int, Group] = {}
    for number, step in enumerate(plan.steps):
        group = lone(plan, number)
        children = [found[o - inputs] for o in step.operands if o >= inputs]
        children.sort(key=lambda child: -plan.steps[child.root].size * child.k)
        for child in children:
            others = tuple(o for o in step.operands if o != inputs + child.root)
            merged = Group(
                number,
                (*child.members, number),
                child.leaves + others,
                child.summed + group.summed,
                child.k * group.k,
            )
            work = step.size * merged.k
            apart = step.size * group.k + plan.steps[child.root].size * child.k
            if (
                fits(plan, merged)
                and merged.k <= FUSE_K
                and work <= FUSE_WORK
                and work <= _GROWTH * apart
            ):
                del found[child.root]
                group = merged
                break
        found[number] = group
    return [found[root] for root in sorted(found)]


def lone(plan: EinsumPlan, number: int) -> Group:
    """Step ``number`` as a group of its own."""
    step = plan.steps[number]
    summed = wide_indices(plan, step.k)
    return Group(number, (number,), step.operands, summed, _product(plan, summed))


def read_in_place(plan: EinsumPlan, number: int) -> bool:
    """Whether step ``number``, whose product would copy an operand first, runs instead as one
    row of tropical_many, reading its operands as they lie: a short sum over few outputs that
    fits a row (see SMALL_K). Its result is laid out as the product's."""
    step = plan.steps[number]
    if not any(read is not None and read.copy is not None for read in (step.first, step.second)):
        return False
    group = lone(plan, number)
    return group.k <= SMALL_K and step.size <= SMALL and fits(plan, group)


def tiny(plan: EinsumPlan, group: Group) -> bool:
    """Whether a lone step's outputs times K are few enough for tropical_many (see SMALL_K)."""
    k = group.k
    return plan.steps[group.root].size * k <= TINY_WORK and k <= TINY_K and fits(plan, group)


def many_row(
    plan: EinsumPlan, group: Group, leaves: Sequence[tuple[int, Term]], c: int, index: int
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


def many_blocks(plan: EinsumPlan, group: Group) -> int:
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


def fits(plan: EinsumPlan, group: Group) -> bool:
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


def grouped_plan(plan: EinsumPlan, made: list[Group]) -> EinsumPlan:
    """``plan`` with each group as one step (its root's, summing the group's ``summed`` with no
    split unless it is a lone step's): what the backtrace walks where groups ran as one. Its
    steps' operands are renumbered: inputs, then the groups' results."""
    inputs = len(plan.terms)
    number = {group.root: n for n, group in enumerate(made)}
    steps: list[Step] = []
    for n, group in enumerate(made):
        root = plan.steps[group.root]
        operands = tuple(o if o < inputs else inputs + number[o - inputs] for o in group.leaves)
        if len(group.members) == 1:
            steps.append(replace(root, operands=operands, number=inputs + n))
        else:
            steps.append(
                replace(root, operands=operands, number=inputs + n, k=group.summed, split=None)
            )
    # (Not a plan to run or cache: no key, so that nothing keyed by the plan's takes it.)
    return replace(plan, steps=tuple(steps), key=("", -1))


def wide_indices(plan: EinsumPlan, indices: tuple[str, ...]) -> tuple[str, ...]:
    """Those of ``indices`` of more than one value (an index of one is no dimension of a
    tropical_many row)."""
    return tuple(i for i in indices if plan.sizes[i] != 1)


def _product(plan: EinsumPlan, indices: tuple[str, ...]) -> int:
    """The values a group sums per output (a step whose K is cut in parts sums a part's, but
    stays alone and never runs in tropical_many)."""
    return math.prod(plan.sizes[i] for i in indices)
