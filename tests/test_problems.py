"""``tropical.problems``: each builder's network against a brute-force solver over every
configuration of small random graphs (the optimum and how many configurations attain it, by
``reference.einsum(..., count=True)``), the way back from an assignment, networkx graphs, and
the errors bad input gets."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import networkx as nx
import numpy as np
import opt_einsum
import pytest

from aionvrtc import tropical
from aionvrtc.tropical import problems, reference

Edge = tuple[int, int]


def random_graph(rng: np.random.Generator) -> tuple[int, list[Edge]]:
    n = int(rng.integers(1, 10))
    p = float(rng.uniform(0.15, 0.7))
    edges = [(u, v) for u in range(n) for v in range(u + 1, n) if rng.random() < p]
    rng.shuffle(edges)  # any order, either way round
    return n, [(v, u) if rng.random() < 0.5 else (u, v) for u, v in edges]


def configurations(n: int) -> list[tuple[int, ...]]:
    return list(itertools.product((0, 1), repeat=n))


def best(scored: Sequence[float | None], maximise: bool) -> tuple[float, int]:
    """The optimum over the feasible configurations (None: infeasible) and how many attain it."""
    feasible = [s for s in scored if s is not None]
    top = max(feasible) if maximise else min(feasible)
    return top, sum(s == top for s in feasible)


def independent(x: Sequence[int], edges: Sequence[Edge]) -> bool:
    return not any(x[u] and x[v] for u, v in edges)


def maximal(x: Sequence[int], n: int, edges: Sequence[Edge]) -> bool:
    near: dict[int, set[int]] = {v: set() for v in range(n)}
    for u, v in edges:
        near[u].add(v)
        near[v].add(u)
    return independent(x, edges) and all(x[v] or any(x[u] for u in near[v]) for v in range(n))


def check(problem: problems.Problem, scored: Sequence[float | None], maximise: bool) -> None:
    """The network's optimum and count equal the brute force's; ``value`` equals each
    configuration's score, or raises where it is infeasible."""
    want = best(scored, maximise)
    value, count = reference.einsum(
        problem.subscripts, *problem.operands, semiring=problem.semiring, count=True
    )
    assert (float(value), int(count)) == want, problem.kind
    n = len(problem.vertices)
    for x, score in zip(configurations(n), scored, strict=True):
        if score is None:
            with pytest.raises(ValueError, match=r"not independent|not maximal"):
                problem.value(x)
        else:
            assert problem.value(x) == score
            # The same configuration as einsum's assignment gives it: by index.
            assignment = {problem.indices[v]: b for v, b in zip(problem.vertices, x, strict=True)}
            assert problem.value(assignment) == score


DTYPES = ["float32", "float64", "int32", "int64"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_independent_set_against_brute_force(dtype: str) -> None:
    rng = np.random.default_rng([47, 1, DTYPES.index(dtype)])
    for _ in range(40):
        n, edges = random_graph(rng)
        weights = rng.integers(-2, 5, n).tolist() if rng.random() < 0.7 else [1] * n
        problem = problems.independent_set(edges, weights, vertices=range(n), dtype=dtype)
        assert problem.semiring == "maxplus"
        assert all(x.dtype == np.dtype(dtype) for x in problem.operands)
        scored = [
            float(np.dot(x, weights)) if independent(x, edges) else None for x in configurations(n)
        ]
        check(problem, scored, maximise=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_max_cut_against_brute_force(dtype: str) -> None:
    rng = np.random.default_rng([47, 2, DTYPES.index(dtype)])
    for _ in range(40):
        n, edges = random_graph(rng)
        weights = rng.integers(-1, 4, len(edges)).tolist()
        problem = problems.max_cut(edges, weights, vertices=range(n), dtype=dtype)
        pairs = list(zip(edges, weights, strict=True))
        scored = [float(sum(w for (u, v), w in pairs if x[u] != x[v])) for x in configurations(n)]
        check(problem, scored, maximise=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_spin_glass_against_brute_force(dtype: str) -> None:
    rng = np.random.default_rng([47, 3, DTYPES.index(dtype)])
    for trial in range(40):
        n, edges = random_graph(rng)
        couplings = rng.integers(-2, 3, len(edges)).tolist()
        fields = rng.integers(-1, 2, n).tolist() if trial % 2 else None
        problem = problems.spin_glass(edges, couplings, fields, vertices=range(n), dtype=dtype)
        assert problem.semiring == "minplus"
        h = fields or [0] * n
        scored = []
        for x in configurations(n):
            s = [2 * b - 1 for b in x]
            energy = sum(j * s[u] * s[v] for (u, v), j in zip(edges, couplings, strict=True))
            scored.append(float(energy + sum(hv * sv for hv, sv in zip(h, s, strict=True))))
        check(problem, scored, maximise=False)
        assert problem.spins([1] * n) == dict.fromkeys(range(n), 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("semiring", ["minplus", "maxplus"])
def test_maximal_independent_set_against_brute_force(dtype: str, semiring: str) -> None:
    rng = np.random.default_rng([47, 4, DTYPES.index(dtype), semiring == "maxplus"])
    for _ in range(30):
        n, edges = random_graph(rng)
        weights = rng.integers(1, 4, n).tolist()
        problem = problems.maximal_independent_set(
            edges, weights, semiring=semiring, vertices=range(n), dtype=dtype
        )
        scored = [
            float(np.dot(x, weights)) if maximal(x, n, edges) else None for x in configurations(n)
        ]
        check(problem, scored, maximise=semiring == "maxplus")


def test_a_networkx_graph_its_attributes_and_the_way_back() -> None:
    petersen = nx.petersen_graph()
    problem = problems.independent_set(petersen)
    assert problem.vertices == tuple(range(10))
    assert reference.einsum(problem.subscripts, *problem.operands, count=True) == (4.0, 5)
    # Unit weights on a cycle of 6: the smallest maximal independent set has 2 vertices, and
    # the cycle has 3 of them; its largest cut takes every edge (an even cycle), in 2 ways.
    cycle = nx.cycle_graph(6)
    smallest = problems.maximal_independent_set(cycle)
    assert reference.einsum(smallest.subscripts, *smallest.operands, semiring="minplus",
                            count=True) == (2.0, 3)  # fmt: skip
    cut = problems.max_cut(cycle)
    assert reference.einsum(cut.subscripts, *cut.operands, count=True) == (6.0, 2)
    # Attributes by name, vertices of any hashable kind.
    g = nx.Graph()
    g.add_nodes_from([("a", {"w": 3}), ("b", {"w": 1}), ("c", {"w": 1}), ("lone", {"w": 2})])
    g.add_edges_from([("a", "b", {"j": 2.0}), ("a", "c", {"j": 1.0}), ("b", "c", {"j": 5.0})])
    weighted = problems.independent_set(g, "w")
    assert weighted.vertex_weights == (3.0, 1.0, 1.0, 2.0)
    value = reference.einsum(weighted.subscripts, *weighted.operands)
    assert float(value) == 5.0  # a and the lone vertex
    assignment = {weighted.indices[v]: int(v in ("a", "lone")) for v in g}
    assert weighted.selected(assignment) == ["a", "lone"]
    assert weighted.configuration(assignment) == {"a": 1, "b": 0, "c": 0, "lone": 1}
    assert weighted.value(assignment) == 5.0
    cut = problems.max_cut(g, "j")
    assert cut.edge_weights == (2.0, 1.0, 5.0)
    assert float(reference.einsum(cut.subscripts, *cut.operands)) == 7.0  # b apart: 2 + 5
    assert cut.cut({cut.indices[v]: int(v == "b") for v in g}) == [("a", "b"), ("b", "c")]
    # A mapping of edges either way round.
    glass = problems.spin_glass(g, {("b", "a"): 1, ("a", "c"): 1, ("c", "b"): 1}, {"a": 0,
                                "b": 0, "c": 0, "lone": 1})  # fmt: skip
    assert glass.edge_weights == (1.0, 1.0, 1.0)
    # A frustrated triangle: -1 at best, in 6 ways; the lone spin down: -1 more, in 1 way.
    energy = reference.einsum(glass.subscripts, *glass.operands, semiring="minplus", count=True)
    assert energy == (-2.0, 6)


def test_integer_weights_stay_exact_and_edges_may_be_a_numpy_array() -> None:
    # Past 2^53 a float would have rounded the weight.
    exact = problems.independent_set([(0, 1)], [2**53 + 1, 0], dtype="int64")
    assert exact.operands[0].tolist() == [0, 2**53 + 1]
    assert int(reference.einsum(exact.subscripts, *exact.operands)) == 2**53 + 1
    rows = problems.max_cut(np.array([[0, 1], [1, 2]]))
    assert rows.edges == ((0, 1), (1, 2))
    assert float(reference.einsum(rows.subscripts, *rows.operands)) == 2.0
    # Agreeing values for both orientations of an edge are taken.
    same = problems.max_cut([(0, 1)], {(0, 1): 3, (1, 0): 3})
    assert same.edge_weights == (3.0,)


def test_the_published_networks_are_unchanged() -> None:
    # The example's MIS and spin-glass networks, as it built them before the builders (their
    # kept orders are keyed by the subscripts): vertices' vectors then the edges' matrices;
    # for the spin glass, the edges' alone.
    edges = [(0, 1), (1, 2), (0, 2), (2, 3)]
    mis = problems.independent_set(edges, vertices=range(4))
    assert mis.subscripts == "a,b,c,d,ab,bc,ac,cd->"
    np.testing.assert_array_equal(mis.operands[0], np.array([0, 1], np.float32))
    np.testing.assert_array_equal(mis.operands[4], np.array([[0, 0], [0, -np.inf]], np.float32))
    glass = problems.spin_glass(edges, [1, -1, 1, -1])
    assert glass.subscripts == "ab,bc,ac,cd->"
    np.testing.assert_array_equal(glass.operands[1], np.array([[-1, 1], [1, -1]], np.float32))


def _bad(build: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    with pytest.raises((TypeError, ValueError)) as caught:
        build(*args, **kwargs)
    return str(caught.value)


def test_bad_input_is_named() -> None:
    tri = [(0, 1), (1, 2), (0, 2)]
    build = problems.independent_set
    assert "joins vertex 1 to itself" in _bad(build, [(0, 1), (1, 1)])
    assert "appears twice" in _bad(build, [(0, 1), (1, 0)])
    assert "not a pair" in _bad(build, [(0, 1, 2)])
    assert "not one of the vertices given" in _bad(build, tri, vertices=[0, 1])
    assert "vertex 1 appears twice" in _bad(build, tri, vertices=[0, 1, 1, 2])
    assert "2 values for 3 vertices" in _bad(build, tri, [1, 2])
    assert "no value for vertex 2" in _bad(build, tri, {0: 1, 1: 1})
    # A weight is named by its vertex or edge.
    nan = _bad(build, tri, [1, float("nan"), 1])
    assert nan == "the weight of vertex 1 is nan: each weight is a finite number"
    text = _bad(build, tri, [1, "x", 1])
    assert text == "the weight of vertex 1 is 'x', not a finite number"
    cut = _bad(problems.max_cut, tri, {(0, 1): 1, (1, 2): float("inf"), (0, 2): 1})
    assert cut == "the weight of edge (1, 2) is inf: each weight is a finite number"
    field = _bad(problems.spin_glass, tri, None, [0, 0, float("-inf")])
    assert field == "the field of vertex 2 is -inf: each field is a finite number"
    half = _bad(build, tri, [1, 1.5, 1], dtype="int32")
    assert half == (
        "the weight of vertex 1 is 1.5, not an integer: pass dtype='float32' or 'float64'"
    )
    # Sums that would saturate (and read as an infinity) are refused, naming a wider dtype.
    big = _bad(build, tri, [2**30, 2**30, 1], dtype="int32")
    assert big == (
        "weights sum to 2,147,483,649 in absolute value, more than 2,147,483,645, the most "
        "int32 sums without saturating: pass dtype='int64'"
    )
    assert "dtype='float64'" in _bad(problems.max_cut, tri, [2**62, 2**62, 1], dtype="int64")
    assert "the graph is a multigraph" in _bad(build, nx.MultiGraph([(0, 1), (1, 2)]))
    assert "leaves out node 2 of the graph" in _bad(build, nx.path_graph(3), vertices=[0, 1])
    both = _bad(problems.max_cut, tri, {(0, 1): 1, (1, 0): 2, (1, 2): 1, (0, 2): 1})
    assert "gives edge (0, 1) two values, 1 as (0, 1) and 2 as (1, 0)" in both
    assert "but the graph is an edge list" in _bad(build, tri, "weight")
    assert "dtype must be one of" in _bad(build, tri, dtype="bool")
    assert "dtype must be one of" in _bad(build, tri, dtype="nonsense")
    assert "the graph has no vertices" in _bad(build, [])
    assert "the graph has no vertices" in _bad(build, nx.Graph())
    assert "graph must be a networkx graph" in _bad(build, 7)
    assert "graph must be a networkx graph" in _bad(build, "ab")
    assert "has no attribute 'w'" in _bad(build, nx.path_graph(3), "w")
    assert "no attribute 'j' (couplings)" in _bad(problems.spin_glass, nx.path_graph(3), "j")
    assert "no value for edge (1, 2)" in _bad(problems.max_cut, tri, {(0, 1): 1, (0, 2): 1})
    assert "2 values for 3 edges" in _bad(problems.max_cut, tri, [1, 2])
    assert "the graph is directed" in _bad(build, nx.DiGraph([(0, 1)]))
    semiring = _bad(problems.maximal_independent_set, tri, semiring="maxmul")
    assert "semiring must be 'minplus'" in semiring
    # A vertex of too many neighbours is refused before any tensor is made.
    star = [(0, leaf) for leaf in range(1, problems.MAX_DEGREE + 2)]
    assert "vertex 0 has 25 neighbours" in _bad(problems.maximal_independent_set, star)
    problem = build(tri)
    assert "no value for the index of vertex 0" in _bad(problem.configuration, {})
    assert "2 values for 3 vertices" in _bad(problem.configuration, [0, 1])
    assert "vertex 1 has the value 2" in _bad(problem.configuration, [0, 2, 0])
    assert "vertices 0 and 1 share an edge" in _bad(problem.value, [1, 1, 0])


def test_an_adjacency_dict_or_matrix_is_named_with_what_reads_it() -> None:
    # Read as edge lists, their keys or rows were refused as bad edges ("edge 0 is 0").
    lists = _bad(problems.independent_set, {0: [1], 1: [0]})
    assert lists == (
        "graph is a dict of adjacency lists (each vertex's neighbours), not a graph or an edge "
        "list: pass networkx.from_dict_of_lists(graph), or the edges as pairs [(u, v), ...]"
    )
    dicts = _bad(problems.max_cut, {0: {1: {}}, 1: {0: {}}})
    assert "a dict of adjacency dicts" in dicts
    assert "networkx.from_dict_of_dicts(graph)" in dicts
    matrix = np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]], float)
    square = _bad(problems.spin_glass, matrix)
    assert square == (
        "graph is a NumPy array of shape (3, 3) (an adjacency matrix?), not an edge list (an "
        "array of shape (edges, 2), one row (u, v) per edge): pass "
        "networkx.from_numpy_array(graph) for an adjacency matrix, or the edges"
    )
    assert "of shape (4,), not an edge list" in _bad(problems.max_cut, np.arange(4))
    # A 2 x 2 matrix reads as two edges; where they are refused, the message says so.
    two = _bad(problems.independent_set, np.array([[0, 1], [1, 0]]))
    assert two.startswith("edge (1, 0) appears twice")
    assert two.endswith("for an adjacency matrix pass networkx.from_numpy_array(a))")
    # What the advice gives is the same graph's problem.
    via = problems.independent_set(nx.from_dict_of_lists({0: [1], 1: [0, 2], 2: [1]}))
    assert via.edges == ((0, 1), (1, 2))
    assert problems.independent_set(nx.from_numpy_array(matrix)).edges == ((0, 1), (1, 2))
    # A mapping keyed by edges still reads as its edges.
    assert problems.max_cut({(0, 1): 1, (1, 2): 1}).edges == ((0, 1), (1, 2))


def test_weights_whose_sums_would_not_stay_finite_are_refused() -> None:
    biggest32, biggest64 = float(np.finfo(np.float32).max), float(np.finfo(np.float64).max)
    # Each gave an optimum of inf; the last, Problem.value an OverflowError.
    one = _bad(problems.independent_set, [(0, 1)], [1e39, 1], dtype="float32")
    assert one == (
        "weights sum to 1.00000e+39 in absolute value, more than 3.40282e+38, the most float32 "
        "sums with no risk of rounding to an infinity: pass dtype='float64', or scale the "
        "weights down"
    )
    two = _bad(problems.independent_set, [(0, 2)], [3e38, 3e38], dtype="float32")
    assert two.startswith("weights sum to 6.00000e+38 in absolute value, more than 3.40282e+38")
    cut = _bad(problems.max_cut, [(0, 1), (1, 2)], [1e308, 1e308], dtype="float64")
    assert cut == (
        "weights sum to 2.00000e+308 in absolute value, more than 1.79769e+308, the most float64 "
        "sums with no risk of rounding to an infinity: pass weights scaled down (float64 is "
        "the widest dtype)"
    )
    # Couplings and fields count together: each alone is within int32's range.
    both = _bad(problems.spin_glass, [(0, 1)], [2**30], [2**29, 2**29], dtype="int32")
    assert both.startswith("couplings and fields sum to 2,147,483,648 in absolute value")
    # Just inside the bound, every sum of the contraction stays finite, and value's too.
    for dtype, biggest in (("float32", biggest32), ("float64", biggest64)):
        near = problems.max_cut([(0, 1), (1, 2)], [biggest * 0.49] * 2, dtype=dtype)
        optimum = reference.einsum(near.subscripts, *near.operands, semiring=near.semiring)
        assert np.isfinite(optimum)
        assert near.value([0, 1, 0]) == math.fsum([biggest * 0.49] * 2)


def test_a_graph_of_more_vertices_than_a_network_can_index_is_refused() -> None:
    # Past it the index of a vertex was chr() of more than U+10FFFF: "chr() arg not in range".
    limit = tropical.networks.MAX_INDICES
    assert limit == 1_112_064
    many = _bad(problems.independent_set, [(0, 1)], vertices=range(1_112_065))
    assert many == (
        "the graph has 1,112,065 vertices, more than the 1,112,064 a network can index (one "
        "character per vertex, opt_einsum.get_symbol's): solve it in parts, such as its "
        "connected components, each a problem of its own"
    )
    # The last index there is, and the first past it.
    assert opt_einsum.get_symbol(limit - 1) == chr(0x10FFFF)
    with pytest.raises(ValueError, match="chr"):
        opt_einsum.get_symbol(limit)


def test_tropical_exports_the_module() -> None:
    assert tropical.problems is problems
    assert set(problems.__all__) == {
        "MAX_DEGREE", "MAX_K", "Problem", "Property", "Counted", "Solution", "SizeMax", "SizeMin",
        "CountingAll", "CountingMax", "CountingMin", "SingleConfigMax", "SingleConfigMin",
        "ConfigsMax", "ConfigsMin", "ConfigsAll", "GraphPolynomial", "PartitionFunction",
        "SampleMax", "SampleMin", "SampleAll", "SingleConfigsMax", "SingleConfigsMin",
        "MAX_COLORS", "coloring", "dominating_set", "matching", "set_packing", "set_covering",
        "satisfiability", "paint_shop",
        "independent_set", "max_cut",
        "maximal_independent_set", "spin_glass",
    }  # fmt: skip
    assert all(hasattr(problems, name) for name in problems.__all__)


def test_every_optimal_configuration_read_back() -> None:
    rng = np.random.default_rng([47, 5])
    for _ in range(25):
        n, edges = random_graph(rng)
        glass = problems.spin_glass(edges, rng.integers(-1, 2, len(edges)).tolist(),
                                    vertices=range(n))  # fmt: skip
        energy, letters, rows = reference.configurations(
            glass.subscripts, *glass.operands, semiring=glass.semiring
        )
        ground = [dict(zip(letters, map(int, row), strict=True)) for row in rows]
        assert all(glass.value(x) == float(energy) for x in ground)
        every = {tuple(x) for x in configurations(n) if glass.value(x) == float(energy)}
        assert {tuple(glass.configuration(x).values()) for x in ground} == every
        # The three best energies, with how many configurations reach each.
        best, counts = reference.einsum(glass.subscripts, *glass.operands, semiring="minplus",
                                        top=3)  # fmt: skip
        scored = sorted({glass.value(x) for x in configurations(n)})[:3]
        assert best[: len(scored)].tolist() == scored
        assert counts[: len(scored)].tolist() == [
            sum(glass.value(x) == e for x in configurations(n)) for e in scored
        ]
