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
TensorFlow Lite's memory planner). Pure Python on plain numbers, below everything that
prepares or captures: the tests check every placement against the order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["LANES", "Buffer", "before", "lanes", "placed"]

LANES = 8  # the streams a capture forks: the most units a graph runs side by side
_ALIGN = 256  # each offset, as an allocation of its own would be


@dataclass(frozen=True, slots=True)
class Buffer:
    """A buffer of ``nbytes`` that the units ``uses`` write or read (numbered as the graph's
    units; the first writes it)."""

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


def before(depends: Sequence[Sequence[int]], on: Sequence[int]) -> list[int]:
    """For each unit, the set (a bit each, as an int) of the units that finish before it
    starts: those it depends on and its lane's previous unit (``on``: each unit's lane), and
    all that finish before them."""
    found: list[int] = []
    last: dict[int, int] = {}
    for unit, after in enumerate(depends):
        previous = [*after, *([last[on[unit]]] if on[unit] in last else [])]
        bits = 0
        for p in previous:
            if p >= unit:
                raise ValueError(f"unit {unit} depends on unit {p}, which does not come first")
            bits |= found[p] | (1 << p)
        found.append(bits)
        last[on[unit]] = unit
    return found


def placed(buffers: Sequence[Buffer], order: Sequence[int]) -> tuple[list[int], int]:
    """Each buffer's offset (aligned) and the arena's size: two buffers overlap only where
    every use of one finishes before the other's first starts (``order``: ``before``'s sets).
    A buffer of no uses takes no space (its offset 0)."""
    masks = [sum(1 << u for u in b.uses) for b in buffers]
    firsts = [min(b.uses) if b.uses else -1 for b in buffers]
    sizes = [-(-max(b.nbytes, 1) // _ALIGN) * _ALIGN for b in buffers]

    def ordered(i: int, j: int) -> bool:
        return masks[i] & ~order[firsts[j]] == 0 or masks[j] & ~order[firsts[i]] == 0

    offsets = [0] * len(buffers)
    held: list[tuple[int, int, int]] = []  # (offset, end, buffer) of those placed
    end = 0
    for i in sorted(range(len(buffers)), key=lambda n: (-sizes[n], n)):
        if not masks[i]:
            continue
        at = 0
        for start, stop, _ in sorted(h for h in held if not ordered(i, h[2])):
            if at + sizes[i] <= start:
                break
            at = max(at, stop)
        offsets[i] = at
        held.append((at, at + sizes[i], i))
        end = max(end, at + sizes[i])
    return offsets, end
