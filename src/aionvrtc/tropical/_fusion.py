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
from dataclasses import dataclass, replace

from ._contraction import EinsumPlan, Step, scanned

__all__ = [
    "LEAVES",
    "MANY_OUT",
    "MANY_SUMMED",
    "Group",
    "fits",
    "grouped_plan",
    "groups",
    "wide_indices",
]

# What one row of tropical_many takes (EINSUM_LEAVES, EINSUM_OUT, EINSUM_SUMMED): the tensors a
# group reads, its output indices and its summed indices (those of more than one value).
LEAVES = 8
MANY_OUT = 24
MANY_SUMMED = 8
# A group's summed values per output and its outputs times those: a step is taken into its
# reader's group only within both, and only where the group does at most twice the work of the
# two apart (the intermediate between them then need not be written and read, and a launch
# goes). Measured on an H200 beside 16 and 2^20 (and 64 and 2^22): 32 and 2^19 were as fast or
# faster on every network of the benchmark (the 15x15 king's graph: 0.66 ms, 0.74 at 2^20).
FUSE_K = 32
FUSE_WORK = 1 << 19
_GROWTH = 2


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
        summed = wide_indices(plan, step.k)
        group = Group(number, (number,), step.operands, summed, _product(plan, summed))
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
