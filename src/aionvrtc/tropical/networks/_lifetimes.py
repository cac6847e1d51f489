"""Where a compiled program's buffers go by their lifetimes: each of a graph's buffers at an
offset of one arena such that two buffers share bytes only where every use of one is ordered
before every use of the other in the graph, so that the arena holds about the peak live set
rather than every buffer at once (as PyTorch's and JAX's captured graphs reuse memory by
lifetime).

The graph is a program's units in order (a unit: one step's launches, or one launch of many
small steps), each after the units it depends on, on one of a few streams (lanes) where it also
follows its lane's previous unit (``lanes``: the rule ``_programs``' capture forks its streams
by). A buffer's uses are the units that write or read it, the first its writer. The offsets are
found greedily, largest buffer first, each at the lowest offset where it overlaps no buffer
placed already whose uses are not ordered with its own (the greedy-by-size placement of
TensorFlow Lite's memory planner). What finishes before a unit is kept as one number a lane:
the last place on that lane that does (a lane runs in order, so every earlier place does too),
which makes the test of two buffers a compare of a few numbers, done for every buffer placed
at once with NumPy (a slice of the 38 x 38 king's subgraph has some 10,000 buffers). Below
everything that prepares or captures: the tests check every placement against the order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["LANES", "Buffer", "Order", "before", "lanes", "placed"]

LANES = 8  # the streams a capture forks: the most units a graph runs side by side
_ALIGN = 256  # each offset, as an allocation of its own would be


@dataclass(frozen=True, slots=True)
class Buffer:
    """A buffer of ``nbytes`` that the units ``uses`` write or read (numbered as the graph's
    units)."""

    nbytes: int
    uses: frozenset[int]


def lanes(depends: Sequence[Sequence[int]], count: int = LANES) -> list[int]:
    """The lane each unit runs on: its first dependency's lane where that unit is the lane's
    last so far (a branch goes on), else the lane least recently used."""
    found: list[int] = []
    tail = [-1] * count  # each lane's last unit
    for unit, after in enumerate(depends):
        lane = next((lane for lane, last in enumerate(tail) if last in after), -1)
        if lane < 0:
            lane = min(range(count), key=lambda n: tail[n])
        found.append(lane)
        tail[lane] = unit
    return found


@dataclass(frozen=True, slots=True)
class Order:
    """A graph's order: each unit's lane and place on it (``lane``, ``place``), and for each
    unit and lane the last place on that lane that finishes before the unit starts (``reach``,
    -1 where none does)."""

    lane: Any  # int64 array of units
    place: Any  # int64 array of units
    reach: Any  # int64 array of units x lanes

    def precedes(self, first: int, then: int) -> bool:
        """Whether unit ``first`` finishes before unit ``then`` starts."""
        return bool(self.place[first] <= self.reach[then, self.lane[first]])


def before(depends: Sequence[Sequence[int]], on: Sequence[int]) -> Order:
    """The order of units that each start after those they depend on and their lane's
    previous unit (``on``: each unit's lane), and so after all that finish before those."""
    count = max(on, default=-1) + 1
    reach = np.full((len(depends), count), -1, np.int64)
    place = np.zeros(len(depends), np.int64)
    last: dict[int, int] = {}
    for unit, after in enumerate(depends):
        lane = on[unit]
        for p in [*after, *([last[lane]] if lane in last else [])]:
            if p >= unit:
                raise ValueError(f"unit {unit} depends on unit {p}, which does not come first")
            np.maximum(reach[unit], reach[p], out=reach[unit])
            reach[unit, on[p]] = max(reach[unit, on[p]], place[p])
        place[unit] = place[last[lane]] + 1 if lane in last else 0
        last[lane] = unit
    return Order(np.asarray(on, np.int64), place, reach)


def placed(buffers: Sequence[Buffer], order: Order) -> tuple[list[int], int]:
    """Each buffer's offset (aligned) and the arena's size: two buffers overlap only where
    every use of one finishes before the other's first starts. A buffer of no uses takes no
    space (its offset 0)."""
    count, lanes_ = len(buffers), order.reach.shape[1]
    # Each buffer's last place on each lane among its uses, and what finishes before its first.
    ends = np.full((count, lanes_), -1, np.int64)
    starts = np.zeros((count, lanes_), np.int64)
    sizes = [-(-max(b.nbytes, 1) // _ALIGN) * _ALIGN for b in buffers]
    for i, b in enumerate(buffers):
        if b.uses:
            uses = np.fromiter(b.uses, np.int64, len(b.uses))
            np.maximum.at(ends[i], order.lane[uses], order.place[uses])
            # (Per lane, the least of what finishes before any of its uses: its first's, where
            # every other use comes after the first, as for a buffer's writer and readers.)
            starts[i] = order.reach[uses].min(axis=0)
    offsets = [0] * count
    # The buffers placed so far, by where they start: their ends, starts and bytes' span.
    # (Lanes first: each lane's compare runs along one row.)
    held_ends = np.empty((lanes_, count), np.int64)
    held_starts = np.empty((lanes_, count), np.int64)
    lows, highs = np.zeros(count, np.int64), np.zeros(count, np.int64)
    n = end = 0
    for i in sorted(range(count), key=lambda k: (-sizes[k], k)):
        if not buffers[i].uses:
            continue
        first = np.ones(n, bool)  # those whose uses all finish before this one's first
        then = np.ones(n, bool)  # those whose first starts after this one's uses all finish
        for lane in range(lanes_):
            first &= held_ends[lane, :n] <= starts[i, lane]
            then &= held_starts[lane, :n] >= ends[i, lane]
        clash = np.flatnonzero(~(first | then))
        at = 0
        if len(clash):
            low, high = lows[clash], highs[clash]
            # Before the k-th clash (by start), the lowest free offset is past every earlier one.
            free = np.concatenate(([0], np.maximum.accumulate(high)[:-1]))
            fits = np.flatnonzero(free + sizes[i] <= low)
            at = int(free[fits[0]]) if len(fits) else int(high.max())
        offsets[i] = at
        k = int(np.searchsorted(lows[:n], at, side="right"))
        for array, value in ((held_ends, ends[i]), (held_starts, starts[i])):
            array[:, k + 1 : n + 1] = array[:, k:n]
            array[:, k] = value
        for line, value in ((lows, at), (highs, at + sizes[i])):
            line[k + 1 : n + 1] = line[k:n]
            line[k] = value
        n += 1
        end = max(end, at + sizes[i])
    return offsets, end
