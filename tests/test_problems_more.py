"""The seven problems past the first four: coloring, dominating set, matching, set packing, set
covering, satisfiability and the binary paint shop. Each against a brute force over every
configuration of seeded random small instances (hypothesis), scored here from the input alone
(not by the problem's own ``value``); known values (the Petersen graph's 120 proper
3-colorings, 10 smallest dominating sets, 6 perfect matchings); and the bad input each
refuses, named."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aionvrtc.tropical import problems
from aionvrtc.tropical.problems import (
    ConfigsAll,
    ConfigsMax,
    ConfigsMin,
    Counted,
    CountingAll,
    CountingMax,
    CountingMin,
    GraphPolynomial,
    PartitionFunction,
    SampleMax,
    SampleMin,
    SingleConfigMax,
    SingleConfigMin,
    SingleConfigsMax,
    SingleConfigsMin,
    SizeMax,
    SizeMin,
)

Edge = tuple[int, int]
Scorer = Callable[[Sequence[int]], float | None]  # None: not a valid configuration


@st.composite
def graphs(draw: st.DrawFn, most: int = 7) -> tuple[int, list[Edge]]:
    n = draw(st.integers(1, most))
    pairs = [(u, v) for u in range(n) for v in range(u + 1, n)]
    edges = draw(st.lists(st.sampled_from(pairs), unique=True) if pairs else st.just([]))
    return n, edges


def check_against(problem: problems.Problem, score: Scorer, maximise: bool) -> None:
    """Every property that lists or counts, against ``score`` over every configuration."""
    scored = {}
    for x in itertools.product(range(problem.domain), repeat=len(problem.variables)):
        s = score(x)
        if s is None:
            with pytest.raises(ValueError, match=r"."):
                problem.value(list(x))
        else:
            assert problem.value(list(x)) == s, (problem.kind, x)
            scored[x] = s
    distinct = sorted(set(scored.values()), reverse=maximise)
    counts = {v: sum(s == v for s in scored.values()) for v in distinct}
    best, worst = (SizeMax, SizeMin) if maximise else (SizeMin, SizeMax)
    assert problem.solve(best(3)) == distinct[:3], problem.kind
    assert problem.solve(worst(2)) == distinct[::-1][:2], problem.kind
    counting = CountingMax if maximise else CountingMin
    assert problem.solve(counting(3)) == [Counted(v, counts[v]) for v in distinct[:3]]
    assert problem.solve(CountingAll()) == len(scored)
    configs = ConfigsMax() if maximise else ConfigsMin()
    found = problem.solve(configs)
    assert [tuple(s.configuration.values()) for s in found] == sorted(
        x for x, v in scored.items() if v == distinct[0]
    )
    single = problem.solve(SingleConfigMax() if maximise else SingleConfigMin())
    assert scored[tuple(single.configuration.values())] == distinct[0]
    every = problem.solve(ConfigsAll())
    assert [tuple(s.configuration.values()) for s in every] == sorted(scored)
    assert problem.solve(GraphPolynomial()) == {int(v): counts[v] for v in sorted(counts)}
    # The configurations of the three best values, best value first.
    top = problem.solve(ConfigsMax(k=3) if maximise else ConfigsMin(k=3))
    assert [(s.value, tuple(s.configuration.values())) for s in top] == [
        (v, x) for v in distinct[:3] for x in sorted(x for x, s in scored.items() if s == v)
    ]
    singles = problem.solve(SingleConfigsMax(3) if maximise else SingleConfigsMin(3))
    assert [s.value for s in singles] == distinct[:3]
    assert all(scored[tuple(s.configuration.values())] == s.value for s in singles)
    # exp(-beta * energy): the energy minus the size where the optimum is the largest.
    z = math.fsum(math.exp((1 if maximise else -1) * 0.5 * v) for v in scored.values())
    assert problem.solve(PartitionFunction(0.5)) == pytest.approx(z, rel=1e-12)
    drawn = problem.solve(SampleMax(4, 1) if maximise else SampleMin(4, 1))
    assert all(scored[tuple(s.configuration.values())] == distinct[0] for s in drawn)


SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(graph=graphs(5), colors=st.integers(1, 3), weights=st.lists(st.integers(0, 3)))
def test_coloring(graph: tuple[int, list[Edge]], colors: int, weights: list[int]) -> None:
    n, edges = graph
    w = (weights + [1] * len(edges))[: len(edges)]
    problem = problems.coloring(edges, colors, w, vertices=range(n))

    def score(x: Sequence[int]) -> float:
        return sum(wt for (u, v), wt in zip(edges, w, strict=True) if x[u] == x[v])

    check_against(problem, score, maximise=False)
    best = problem.solve(SingleConfigMin())
    assert best.answer == dict(enumerate(best.configuration.values()))


@SETTINGS
@given(graph=graphs(), weights=st.lists(st.integers(0, 3)))
def test_dominating_set(graph: tuple[int, list[Edge]], weights: list[int]) -> None:
    n, edges = graph
    w = (weights + [1] * n)[:n]
    problem = problems.dominating_set(edges, w, vertices=range(n))
    near = {v: {v} for v in range(n)}
    for u, v in edges:
        near[u].add(v)
        near[v].add(u)

    def score(x: Sequence[int]) -> float | None:
        if not all(any(x[u] for u in near[v]) for v in range(n)):
            return None
        return sum(w[v] for v in range(n) if x[v])

    check_against(problem, score, maximise=False)


@SETTINGS
@given(graph=graphs(), weights=st.lists(st.integers(0, 3)))
def test_matching(graph: tuple[int, list[Edge]], weights: list[int]) -> None:
    n, edges = graph
    if not edges:
        return
    w = (weights + [1] * len(edges))[: len(edges)]
    problem = problems.matching(edges, w, vertices=range(n))
    assert problem.variables == tuple(edges)

    def score(x: Sequence[int]) -> float | None:
        ends = [v for e, chosen in zip(edges, x, strict=True) if chosen for v in e]
        if len(ends) != len(set(ends)):
            return None
        return sum(wt for wt, chosen in zip(w, x, strict=True) if chosen)

    check_against(problem, score, maximise=True)


families = st.lists(st.frozensets(st.integers(0, 5), min_size=1, max_size=3), min_size=1,
                    max_size=6)  # fmt: skip


@SETTINGS
@given(family=families, weights=st.lists(st.integers(0, 3)))
def test_set_packing(family: list[frozenset[int]], weights: list[int]) -> None:
    w = (weights + [1] * len(family))[: len(family)]
    problem = problems.set_packing(family, w)

    def score(x: Sequence[int]) -> float | None:
        chosen = [s for s, c in zip(family, x, strict=True) if c]
        if sum(map(len, chosen)) != len(frozenset().union(*chosen)):
            return None
        return sum(wt for wt, c in zip(w, x, strict=True) if c)

    check_against(problem, score, maximise=True)


@SETTINGS
@given(family=families, weights=st.lists(st.integers(0, 3)))
def test_set_covering(family: list[frozenset[int]], weights: list[int]) -> None:
    w = (weights + [1] * len(family))[: len(family)]
    problem = problems.set_covering(family, w)
    universe = frozenset().union(*family)

    def score(x: Sequence[int]) -> float | None:
        chosen = [s for s, c in zip(family, x, strict=True) if c]
        if frozenset().union(*chosen) != universe:
            return None
        return sum(wt for wt, c in zip(w, x, strict=True) if c)

    check_against(problem, score, maximise=False)


clause_lists = st.lists(
    st.lists(st.integers(1, 5).flatmap(lambda k: st.sampled_from([k, -k])), min_size=1,
             max_size=3),
    min_size=1, max_size=6,
)  # fmt: skip


@SETTINGS
@given(clauses=clause_lists, weights=st.lists(st.integers(1, 3)))
def test_satisfiability(clauses: list[list[int]], weights: list[int]) -> None:
    w = (weights + [1] * len(clauses))[: len(clauses)]
    n = max(abs(x) for c in clauses for x in c)
    problem = problems.satisfiability(clauses, w, variables=n)

    def score(x: Sequence[int]) -> float:
        truth = {k + 1: bool(b) for k, b in enumerate(x)}
        return sum(wt for c, wt in zip(clauses, w, strict=True) if any(truth[abs(v)] == (v > 0)
                                                                        for v in c))  # fmt: skip

    check_against(problem, score, maximise=True)
    best = problem.solve(SingleConfigMax())
    assert best.answer == {k: bool(v) for k, v in best.configuration.items()}


@SETTINGS
@given(order=st.permutations([0, 0, 1, 1, 2, 2, 3, 3, 4, 4]), cars=st.integers(1, 5))
def test_paint_shop(order: list[int], cars: int) -> None:
    sequence = [car for car in order if car < cars]
    problem = problems.paint_shop(sequence)
    assert problem.variables == tuple(dict.fromkeys(sequence))

    def score(x: Sequence[int]) -> float:
        first = dict(zip(problem.variables, x, strict=True))
        seen: set[int] = set()
        painted: list[int] = []
        for car in sequence:
            painted.append(first[car] if car not in seen else 1 - first[car])
            seen.add(car)
        return float(sum(a != b for a, b in itertools.pairwise(painted)))

    check_against(problem, score, maximise=False)
    best = problem.solve(SingleConfigMin())
    assert sum(a != b for a, b in itertools.pairwise(best.answer)) == best.value


def test_known_values_of_the_petersen_graph() -> None:
    petersen = nx.petersen_graph()
    assert problems.coloring(petersen, 3).solve(CountingMin()) == [Counted(0.0, 120)]
    assert problems.coloring(petersen, 2).solve(SizeMin()) == [3.0]  # (odd cycles)
    assert problems.dominating_set(petersen).solve(CountingMin()) == [Counted(3.0, 10)]
    perfect = problems.matching(petersen).solve(ConfigsMax())
    assert len(perfect) == 6
    assert all(len(s.answer) == 5 for s in perfect)
    # The paint shop "abaccb": two changes at least, e.g. 0 1 1 1 0 0.
    shop = problems.paint_shop("abaccb")
    assert shop.solve(CountingMin()) == [Counted(2.0, 2)]


def _refused(make: Callable[[], Any]) -> str:
    with pytest.raises((TypeError, ValueError)) as caught:
        make()
    return str(caught.value)


def test_bad_input_is_named() -> None:
    path = [(0, 1), (1, 2)]
    assert _refused(lambda: problems.coloring(path, 0)) == "colors must be from 1 to 256, got 0"
    assert _refused(lambda: problems.coloring(path, 2.5)) == (  # type: ignore[arg-type]
        "colors must be an int (how many colors), got float"
    )
    assert _refused(lambda: problems.coloring([(0, 0)], 3)).startswith(
        "edge 0 joins vertex 0 to itself"
    )
    assert _refused(lambda: problems.coloring(path, 2, [1.0, float("nan")])) == (
        "the weight of edge (1, 2) is nan: each weight is a finite number"
    )
    adjacency: Any = {0: [1], 1: [0]}
    assert _refused(lambda: problems.dominating_set(adjacency)).startswith(
        "graph is a dict of adjacency lists"
    )
    assert _refused(lambda: problems.matching([], vertices=[0, 1])) == (
        "the graph has no edges: a matching is a set of edges, pass at least one"
    )
    assert _refused(lambda: problems.set_packing([{1}, set()])) == (
        "set 1 is empty: each set holds at least one element"
    )
    assert _refused(lambda: problems.set_packing({"a": {1}})).startswith(
        "sets must be a sequence of sets"
    )
    assert _refused(lambda: problems.set_packing(["ab"])).startswith("set 0 is a str")
    unhashable: Any = [[[1]]]
    assert _refused(lambda: problems.set_packing(unhashable)) == (
        "set 0 holds an element that is not hashable"
    )
    assert _refused(lambda: problems.set_packing([{1}], {1: 2})) == (
        "weights has no value for set 0"
    )
    assert _refused(lambda: problems.set_covering([{1}, {2}], universe=[1, 2, 3])) == (
        "element 3 of the universe is in no set: no cover exists"
    )
    assert _refused(lambda: problems.set_covering([{1}, {2}], universe=[1])).startswith(
        "set 1 holds 2, which is not in the universe"
    )
    assert _refused(lambda: problems.satisfiability([[1, -4]], variables=3)) == (
        "literal -4 of clause 0 is out of range: there are 3 variables, numbered 1 to 3"
    )
    assert _refused(lambda: problems.satisfiability([[1], [0]])) == (
        "clause 1 holds 0: literals are nonzero, +k for variable k, -k for its negation"
    )
    assert _refused(lambda: problems.satisfiability([[1], []])) == (
        "clause 1 is empty: a clause holds at least one literal"
    )
    assert _refused(lambda: problems.satisfiability([[True]])).startswith(
        "clause 0 holds True, not an int literal"
    )
    assert _refused(lambda: problems.satisfiability([[1, 2]], [float("inf")])) == (
        "the weight of clause 0 is inf: each weight is a finite number"
    )
    assert _refused(lambda: problems.paint_shop("abca")) == (
        "car 'b' appears 1 time: each car appears twice in the sequence"
    )
    assert _refused(lambda: problems.paint_shop([1, 1, 1])) == (
        "car 1 appears 3 times: each car appears twice in the sequence"
    )
    assert _refused(lambda: problems.paint_shop([])) == (
        "the sequence is empty: pass each car twice"
    )
    # A configuration out of a variable's range.
    assert _refused(lambda: problems.coloring(path, 3).value([0, 3, 1])) == (
        "vertex 1 has the value 3: each vertex's is from 0 to 2"
    )
