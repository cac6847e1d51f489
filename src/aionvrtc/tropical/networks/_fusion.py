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

from dataclasses import replace

from ._plan import EinsumPlan
from ._rows import Group, fits, lone
from ._terms import Step

__all__ = ["grouped_plan", "groups"]

# A group's summed values per output and its outputs times those: a step is taken into its
# reader's group only within both, and only where the group does at most twice the work of the
# two apart (the intermediate between them then need not be written and read, and a launch
# goes). Measured on an H200 beside 16 and 2^20 (and 64 and 2^22): 32 and 2^19 were as fast or
# faster on every network of the benchmark (the 15x15 king's graph: 0.66 ms, 0.74 at 2^20).
FUSE_K = 32
FUSE_WORK = 1 << 19
_GROWTH = 2


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
