"""A compiled program's buffers placed by their lifetimes (``_lifetimes``), checked against the
graph's order worked out again by brute force: on drawn graphs of units (each after some
earlier ones, on the lanes the capture forks), no two buffers whose uses are not all ordered
share a byte; and what reuse gives where the order allows it. Then the schedule of a
program's units (``_schedule``) on real plans, and its arena's offsets moved."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aionvrtc.tropical import einsum_plan
from aionvrtc.tropical.networks._backtrace import Scan
from aionvrtc.tropical.networks._fusion import groups
from aionvrtc.tropical.networks._lifetimes import Buffer, before, lanes, placed
from aionvrtc.tropical.networks._schedule import Arena, schedule
from aionvrtc.tropical.networks._steps import ARENA, INPUT, VALUE

from .support.einsum import kings_graph, random_network


@st.composite
def graphs(draw: st.DrawFn) -> tuple[list[list[int]], list[int], list[Buffer]]:
    """Units each after up to three earlier ones, their lanes, and buffers each written by a
    unit and read by units after it (or by the writer alone: a temporary)."""
    count = draw(st.integers(1, 24))
    depends = [
        sorted(set(draw(st.lists(st.integers(0, u - 1), max_size=3)))) if u else []
        for u in range(count)
    ]
    on = lanes(depends, count=draw(st.integers(1, 4)))
    order = before(depends, on)
    buffers = []
    for _ in range(draw(st.integers(0, 30))):
        writer = draw(st.integers(0, count - 1))
        later = [v for v in range(count) if order.precedes(writer, v)]
        readers = draw(st.lists(st.sampled_from(later), max_size=3)) if later else []
        size = draw(st.sampled_from([1, 100, 256, 1000, 4096, 70_000]))
        buffers.append(Buffer(size, frozenset([writer, *readers])))
    return depends, on, buffers


def closure(depends: list[list[int]], on: list[int]) -> list[set[int]]:
    """Each unit's predecessors (dependencies and its lane's previous unit), transitively,
    found by a walk from each unit."""
    edges: list[set[int]] = [set(d) for d in depends]
    last: dict[int, int] = {}
    for unit, lane in enumerate(on):
        if lane in last:
            edges[unit].add(last[lane])
        last[lane] = unit
    found = []
    for unit in range(len(depends)):
        seen: set[int] = set()
        stack = list(edges[unit])
        while stack:
            p = stack.pop()
            if p not in seen:
                seen.add(p)
                stack.extend(edges[p])
        found.append(seen)
    return found


def apart(a: Buffer, b: Buffer, preceding: list[set[int]]) -> bool:
    """Whether every use of one buffer finishes before every use of the other starts."""
    return all(u in preceding[v] for u in a.uses for v in b.uses) or all(
        v in preceding[u] for u in a.uses for v in b.uses
    )


@settings(derandomize=True, max_examples=400, deadline=None)
@given(drawn=graphs())
def test_buffers_share_bytes_only_where_their_uses_are_ordered(drawn: Any) -> None:
    depends, on, buffers = drawn
    preceding = closure(depends, on)
    order = before(depends, on)
    units = range(len(depends))
    assert [{v for v in units if order.precedes(v, u)} for u in units] == preceding
    offsets, size = placed(buffers, order)
    aligned = [-(-b.nbytes // 256) * 256 for b in buffers]
    assert all(at % 256 == 0 for at in offsets)
    assert size == max((at + n for at, n in zip(offsets, aligned, strict=True)), default=0)
    assert size <= sum(aligned)
    for i, a in enumerate(buffers):
        for j in range(i + 1, len(buffers)):
            b = buffers[j]
            overlap = offsets[i] < offsets[j] + aligned[j] and offsets[j] < offsets[i] + aligned[i]
            if overlap:
                assert apart(a, b, preceding), (i, j, a, b, offsets[i], offsets[j])


def test_a_chain_holds_two_buffers_at_once_and_branches_hold_their_own() -> None:
    # Eight units in a chain, each buffer written by one unit and read by the next.
    chain = [[u - 1] if u else [] for u in range(8)]
    order = before(chain, lanes(chain))
    buffers = [Buffer(1 << 20, frozenset([u, u + 1])) for u in range(7)]
    offsets, size = placed(buffers, order)
    assert size == 2 << 20  # (every intermediate at once: 7 MiB)
    assert len(set(offsets)) == 2
    # Two branches from unit 0, side by side on their own lanes, joined by unit 3: the
    # branches' buffers are live together, and the join's reuses the first unit's.
    fork = [[], [0], [0], [1, 2]]
    on = lanes(fork)
    assert on[1] != on[2]
    order = before(fork, on)
    buffers = [
        Buffer(1000, frozenset([0, 1, 2])),  # read by both branches
        Buffer(1000, frozenset([1, 3])),
        Buffer(1000, frozenset([2, 3])),
        Buffer(1000, frozenset([3])),  # the join's own: the first's bytes are free by then
    ]
    offsets, size = placed(buffers, order)
    assert size == 3 * 1024
    assert len(set(offsets[:3])) == 3
    assert offsets[3] == offsets[0]


def test_a_buffer_no_unit_uses_takes_no_space_and_order_is_checked() -> None:
    offsets, size = placed([Buffer(4096, frozenset())], before([[]], [0]))
    assert (offsets, size) == ([0], 0)
    with pytest.raises(ValueError, match="unit 0 depends on unit 1, which does not come first"):
        before([[1], []], [0, 0])


@pytest.mark.parametrize("seed", range(6))
def test_a_programs_units_run_each_group_once_after_the_groups_it_reads(seed: int) -> None:
    """The schedule of drawn networks (and a king's subgraph, whose chains groups shorten):
    every group in one unit, launched with the small groups of its level in one launch of
    tropical_many, or alone; each unit after the units that make what it reads."""
    rng = np.random.default_rng(seed)
    if seed == 0:
        subscripts, shapes, path = kings_graph(4)
        plan = einsum_plan(subscripts, *shapes, optimize=path)
    else:
        subscripts, shapes = random_network(rng, int(rng.integers(4, 12)), 7)
        plan = einsum_plan(subscripts, *shapes, optimize="greedy")
    made = schedule(plan)
    assert made.made == tuple(groups(plan))
    placed = [group for unit in made.units for group in unit.groups]
    assert sorted(g.root for g in placed) == sorted(g.root for g in made.made)
    assert all(unit.many or len(unit.groups) == 1 for unit in made.units)
    unit_of = {g.root: u for u, unit in enumerate(made.units) for g in unit.groups}
    inputs = len(plan.terms)
    for u, unit in enumerate(made.units):
        assert all(d < u for d in made.depends[u])
        makers = {unit_of[o - inputs] for g in unit.groups for o in g.leaves if o >= inputs}
        assert set(made.depends[u]) == makers
    if seed == 0:  # the king's chains run as groups of several steps, in few launches
        assert len(made.made) < len(plan.steps)
        assert len(made.units) < len(made.made)


def test_an_arena_placed_anew_moves_each_block_and_what_lies_in_it() -> None:
    # Three blocks as the steps placed them (at 0, 256 and 1024), placed anew at 256, 0, 0.
    moved = Arena(512, (0, 256, 1024), (256, 0, 0))
    assert [moved.at(v) for v in (0, 200, 256, 300, 1024, 1100)] == [256, 456, 0, 44, 0, 76]
    sources = ((INPUT, 1024), (ARENA, 300), (VALUE, 7), (ARENA, 1024))
    assert moved.moved(sources) == ((INPUT, 1024), (ARENA, 44), (VALUE, 7), (ARENA, 0))
    scan = Scan(0, 1024, 2, 3, 4, (1, 2, 3), (4, 5, 6))
    assert moved.where(scan) == Scan(256, 0, 2, 3, 4, (1, 2, 3), (4, 5, 6))
    assert moved.where(300) == 44
