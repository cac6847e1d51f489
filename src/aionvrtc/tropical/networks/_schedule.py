"""A compiled program's schedule and arena: its steps' groups (``_fusion``) in units that run in
order, each after the units it depends on, and where each buffer of its prepared steps lies in
its one allocation, placed by lifetimes over that schedule (``_lifetimes``), so that a program
holds about its peak live set rather than every intermediate at once.

Groups are taken level by level (a group's level: one more than its operands' groups'); the
small groups of a level run in one launch of ``tropical_many`` per size class (a unit), each
reading its operands as they lie; every other group's launches are a unit of their own. The
final reordering and the backtrace come after every unit. Pure Python over the plan and the
prepared steps' numbers (offsets, sources): nothing here touches a device."""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from ._backtrace import Scan
from ._fusion import groups
from ._lifetimes import LANES, Buffer, before, lanes, placed
from ._plan import EinsumPlan
from ._rows import Group, many_blocks, read_in_place, tiny
from ._steps import ARENA, Source, Steps, walks

__all__ = ["Arena", "Schedule", "Unit", "arena", "schedule"]


@dataclass(frozen=True, slots=True)
class Unit:
    """Groups launched together: all in one launch of ``tropical_many`` (``many``), or the
    prepared launches of the one group's one step."""

    groups: tuple[Group, ...]
    many: bool


@dataclass(frozen=True, slots=True)
class Schedule:
    """A program's groups (``made``) and its units in order, each after the units ``depends``
    names."""

    made: tuple[Group, ...]
    units: tuple[Unit, ...]
    depends: tuple[tuple[int, ...], ...]


def schedule(planned: EinsumPlan) -> Schedule:
    """The units a program of ``planned`` launches, level by level."""
    inputs = len(planned.terms)
    made = groups(planned)
    levels: dict[int, int] = {}
    at_level: dict[int, list[Group]] = {}
    for group in made:
        made_by = [levels[o - inputs] for o in group.leaves if o >= inputs]
        levels[group.root] = level = 1 + max(made_by, default=0)
        at_level.setdefault(level, []).append(group)

    def small(group: Group) -> bool:
        return len(group.members) > 1 or tiny(planned, group) or read_in_place(planned, group.root)

    units: list[Unit] = []
    for level in sorted(at_level):
        here = at_level[level]
        # The small groups in one launch per size class (a launch's grid is its largest
        # group's: a tiny group beside a large one would take as many blocks, idle).
        classes: dict[int, list[Group]] = {}
        for group in filter(small, here):
            classes.setdefault(many_blocks(planned, group).bit_length(), []).append(group)
        units += [Unit(tuple(batch), True) for _, batch in sorted(classes.items())]
        units += [Unit((group,), False) for group in here if not small(group)]
    unit_of = {group.root: u for u, unit in enumerate(units) for group in unit.groups}
    depends = tuple(
        tuple(sorted({unit_of[o - inputs] for g in unit.groups for o in g.leaves if o >= inputs}))
        for unit in units
    )
    return Schedule(tuple(made), tuple(units), depends)


@dataclass(frozen=True, slots=True)
class Arena:
    """The prepared steps' arena placed anew: ``nbytes`` in all, each of the steps' blocks
    (``starts``, as the steps placed them) moved to ``offsets``."""

    nbytes: int
    starts: tuple[int, ...]
    offsets: tuple[int, ...]

    def at(self, offset: int) -> int:
        """Where the steps' arena offset ``offset`` lies now."""
        block = bisect.bisect_right(self.starts, offset) - 1
        return self.offsets[block] + offset - self.starts[block]

    def moved(self, sources: Sequence[Source]) -> tuple[Source, ...]:
        """``sources`` with their arena offsets moved."""
        return tuple((kind, self.at(v) if kind == ARENA else v) for kind, v in sources)

    def where(self, found: int | Scan) -> int | Scan:
        """A step's argmax offset, or its ``Scan``, moved."""
        if isinstance(found, Scan):
            return dataclasses.replace(found, a=self.at(found.a), b=self.at(found.b))
        return self.at(found)


def arena(steps: Steps, made: Schedule) -> Arena:
    """``steps``' blocks (prepared without reuse: each its own) placed by the lifetimes that
    the units of ``made`` give them, the final reordering and the backtrace a unit after all."""
    starts = [at for at, _ in steps.blocks]
    uses: list[set[int]] = [set() for _ in starts]

    def use(unit: int, sources: Sequence[Source]) -> None:
        for kind, value in sources:
            if kind == ARENA:
                block = bisect.bisect_right(starts, value) - 1
                at, nbytes = steps.blocks[block]
                assert at <= value < at + max(nbytes, 1), (value, steps.blocks[block])
                uses[block].add(unit)

    by_step: dict[int, list[Sequence[Source]]] = {}
    for op in steps.ops:
        by_step.setdefault(op.step, []).append(op.sources if not walks(op.launcher) else ())
    for u, unit in enumerate(made.units):
        for group in unit.groups:
            if unit.many:
                use(u, [steps.operands[o][0] for o in group.leaves])
                use(u, steps.writes[group.root])
            else:
                for sources in by_step.get(group.root, []):
                    use(u, sources)
    end = len(made.units)
    for sources in by_step.get(len(steps.plan.steps), []):
        use(end, sources)
    if steps.argmax:  # the backtrace reads every group's argmax (or scans its operands again)
        for group in made.made:
            found = steps.argmaxes[group.root]
            spots = [found.a, found.b] if isinstance(found, Scan) else [found]
            use(end, [(ARENA, at) for at in spots])
        use(end, [(ARENA, steps.assignment)])
    depends = [*made.depends, tuple(range(end))]
    offsets, nbytes = placed(
        [Buffer(size, frozenset(u)) for (_, size), u in zip(steps.blocks, uses, strict=True)],
        before(depends, lanes(depends, LANES)),
    )
    return Arena(nbytes, tuple(starts), tuple(offsets))
