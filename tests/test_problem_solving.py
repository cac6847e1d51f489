"""``Problem.solve``: every property of every problem against a brute force over all
configurations of seeded random small graphs (hypothesis), on the CPU; the network refused in
another semiring than its own; the arguments ``solve`` refuses; ``solve_async`` in a worker
thread; counts past 2^63 exact through one call."""

from __future__ import annotations

import itertools
import math
import pickle
from collections import Counter
from collections.abc import Callable
from typing import Any

import anyio
import networkx as nx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aionvrtc import tropical
from aionvrtc.tropical import problems, reference
from aionvrtc.tropical.networks import NetworkSubscripts
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
    Property,
    SampleAll,
    SampleMax,
    SampleMin,
    SingleConfigMax,
    SingleConfigMin,
    SingleConfigsMin,
    SizeMax,
    SizeMin,
    Solution,
)

Edge = tuple[int, int]


@st.composite
def graphs(draw: st.DrawFn) -> tuple[int, list[Edge]]:
    n = draw(st.integers(1, 8))
    pairs = [(u, v) for u in range(n) for v in range(u + 1, n)]
    edges = draw(st.lists(st.sampled_from(pairs), unique=True) if pairs else st.just([]))
    return n, edges


def build(kind: str, n: int, edges: list[Edge], seed: int, dtype: str) -> problems.Problem:
    """A problem of ``kind`` on the graph, its weights small integers drawn from ``seed``
    (every sum exact in each dtype, so values compare exactly)."""
    rng = np.random.default_rng(seed)
    vertices = range(n)
    if kind == "independent set":
        return problems.independent_set(
            edges, rng.integers(0, 4, n).tolist(), vertices=vertices, dtype=dtype
        )
    if kind == "max cut":
        return problems.max_cut(
            edges, rng.integers(-2, 4, len(edges)).tolist(), vertices=vertices, dtype=dtype
        )
    if kind == "spin glass":
        return problems.spin_glass(edges, rng.integers(-2, 3, len(edges)).tolist(),
                                   rng.integers(-1, 2, n).tolist(), vertices=vertices,
                                   dtype=dtype)  # fmt: skip
    return problems.maximal_independent_set(
        edges, rng.integers(1, 4, n).tolist(), vertices=vertices, dtype=dtype
    )


def brute_force(problem: problems.Problem) -> dict[tuple[int, ...], float]:
    """Every valid configuration (in the order of the vertices) and its objective, from the
    problem's input (``value`` refuses the invalid ones)."""
    scored = {}
    for x in itertools.product((0, 1), repeat=len(problem.vertices)):
        try:
            scored[x] = problem.value(x)
        except ValueError:
            continue
    return scored


KINDS = ["independent set", "max cut", "spin glass", "maximal independent set"]


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs(), seed=st.integers(0, 2**32 - 1), k=st.integers(1, 5),
       dtype=st.sampled_from(["float32", "int32", "int64", "float64"]))  # fmt: skip
def test_every_property_against_brute_force(
    kind: str, graph: tuple[int, list[Edge]], seed: int, k: int, dtype: str
) -> None:
    n, edges = graph
    problem = build(kind, n, edges, seed, dtype)
    scored = brute_force(problem)
    distinct = sorted(set(scored.values()))
    count = {v: sum(s == v for s in scored.values()) for v in distinct}
    largest, smallest = distinct[::-1][:k], distinct[:k]

    assert problem.solve(SizeMax(k)) == largest
    assert problem.solve(SizeMin(k)) == smallest
    assert problem.solve(CountingMax(k)) == [Counted(v, count[v]) for v in largest]
    assert problem.solve(CountingMin(k)) == [Counted(v, count[v]) for v in smallest]
    assert problem.solve(CountingAll()) == len(scored)

    singles: list[tuple[Property[Solution], float]] = [
        (SingleConfigMax(), distinct[-1]),
        (SingleConfigMin(), distinct[0]),
    ]
    for single, end in singles:
        one = problem.solve(single)
        assert one.value == end
        assert scored[tuple(one.configuration.values())] == end
        assert list(one.configuration) == list(problem.vertices)

    lists: list[tuple[Property[list[Solution]], float]] = [
        (ConfigsMax(), distinct[-1]),
        (ConfigsMin(), distinct[0]),
    ]
    for listed, end in lists:
        found = problem.solve(listed)
        rows = [tuple(s.configuration.values()) for s in found]
        assert rows == sorted(x for x, v in scored.items() if v == end)
        assert all(s.value == end for s in found)
    one_each = problem.solve(SingleConfigsMin(k))
    assert [s.value for s in one_each] == smallest
    assert all(scored[tuple(s.configuration.values())] == s.value for s in one_each)
    top = problem.solve(ConfigsMax(k=k))
    assert [(s.value, tuple(s.configuration.values())) for s in top] == [
        (v, x) for v in largest for x in sorted(x for x, s in scored.items() if s == v)
    ]
    every = problem.solve(ConfigsAll())
    assert [tuple(s.configuration.values()) for s in every] == sorted(scored)
    assert [s.value for s in every] == [scored[x] for x in sorted(scored)]

    assert problem.solve(GraphPolynomial()) == {int(v): count[v] for v in distinct}
    # Samples: each an optimum (or a valid configuration), its value worked out again.
    for drawn, end in ((SampleMax(5, seed), distinct[-1]), (SampleMin(5, seed), distinct[0])):
        found = problem.solve(drawn)
        assert len(found) == 5
        assert all(scored[tuple(s.configuration.values())] == s.value == end for s in found)
    found = problem.solve(SampleAll(5, seed))
    assert all(scored[tuple(s.configuration.values())] == s.value for s in found)
    # exp(-beta * energy), the energy minus the size where the optimum is the largest.
    sign = 1 if problem.semiring == "maxplus" else -1
    for beta in (0.0, 0.7, -1.3):
        z = math.fsum(math.exp(sign * beta * v) for v in scored.values())
        assert problem.solve(PartitionFunction(beta)) == pytest.approx(z, rel=1e-12)
        log_z = problem.solve(PartitionFunction(beta, log=True))
        assert log_z == pytest.approx(math.log(z), rel=1e-12, abs=1e-12)


def test_solutions_read_back_in_the_problems_own_terms() -> None:
    # A 5-cycle with a pendant vertex: three largest independent sets.
    edges = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 0), (0, 5)]
    mis = problems.independent_set(edges)
    assert [s.answer for s in mis.solve(ConfigsMax())] == [[2, 4, 5], [1, 4, 5], [1, 3, 5]]
    # The frustrated triangle: six ground states of energy -1, spins read back.
    glass = problems.spin_glass([(0, 1), (1, 2), (0, 2)], [1, 1, 1])
    ground = glass.solve(ConfigsMin())
    assert len(ground) == 6
    assert all(sorted(s.answer.values()) in ([-1, -1, 1], [-1, 1, 1]) for s in ground)
    assert glass.solve(SizeMin()) == [-1.0]
    assert glass.solve(CountingMin(3)) == [Counted(-1.0, 6), Counted(3.0, 2)]
    # A cut: the side at 1; the edges cut read back by problem.cut.
    cut = problems.max_cut([(0, 1), (1, 2), (2, 3)])
    best = cut.solve(SingleConfigMax())
    assert best.value == 3.0
    assert sorted(best.answer) in ([0, 2], [1, 3])
    assert len(cut.cut(list(best.configuration.values()))) == 3


def test_a_network_in_another_semiring_than_its_own_is_refused() -> None:
    glass = problems.spin_glass([(0, 1), (1, 2), (0, 2)], [1, 1, 1])
    assert isinstance(glass.subscripts, NetworkSubscripts)
    assert glass.subscripts == "ab,bc,ac->"
    refused = (
        "these subscripts are a spin glass problem's network, whose tensors are contracted in "
        "'minplus', not 'maxplus': pass semiring='minplus' (problem.semiring), or ask "
        "problem.solve(...) for the property, which picks the semiring"
    )
    with pytest.raises(ValueError, match="spin glass") as caught:
        reference.einsum(glass.subscripts, *glass.operands)  # the default, max-plus
    assert str(caught.value) == refused
    mis = problems.independent_set([(0, 1)])
    with pytest.raises(ValueError, match="an independent set problem's network"):
        reference.configurations(mis.subscripts, *mis.operands, semiring="minplus")
    with pytest.raises(ValueError, match="'maxplus', not 'andor'"):
        reference.einsum(mis.subscripts, *mis.operands, semiring="andor", top=2)
    # In its own semiring it is contracted; the plan is the plain network's, for any semiring.
    assert float(reference.einsum(glass.subscripts, *glass.operands, semiring="minplus")) == -1
    plan = tropical.einsum_plan(glass.subscripts, *glass.operands)
    assert type(plan.subscripts) is str
    # A plain str of the same text is a user's own network: contracted as asked.
    assert float(reference.einsum(str(glass.subscripts), *glass.operands)) == 3.0
    # Pickled (to Ray's workers), it keeps its semiring.
    again = pickle.loads(pickle.dumps(glass.subscripts))
    assert (again, again.semiring, again.what) == (glass.subscripts, "minplus",
                                                   "a spin glass problem")  # fmt: skip


def test_a_problems_tensors_are_read_only() -> None:
    mis = problems.independent_set([(0, 1), (1, 2)])
    assert not any(x.flags.writeable for x in mis.operands)
    with pytest.raises(ValueError, match="read-only"):
        mis.operands[0][1] = 5


BAD: list[tuple[Callable[[], Any], type[Exception], str]] = [
    (lambda: SizeMax(0), ValueError, "k must be from 1 to 64, got 0"),
    (lambda: CountingMin(65), ValueError, "k must be from 1 to 64, got 65"),
    (
        lambda: SizeMax(2.0),  # type: ignore[arg-type]
        TypeError,
        "k must be an int (how many best values), got float",
    ),
    (lambda: SizeMin(True), TypeError, "k must be an int (how many best values), got bool"),
    (lambda: ConfigsMax(0), ValueError, "limit must be at least 1, got 0"),
    (
        lambda: ConfigsAll("9"),  # type: ignore[arg-type]
        TypeError,
        "limit must be an int, got str",
    ),
]


@pytest.mark.parametrize(("make", "error", "message"), BAD)
def test_bad_properties_are_named(
    make: Callable[[], Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as caught:
        make()
    assert str(caught.value) == message


def test_solve_refuses_what_it_cannot_answer() -> None:
    mis = problems.independent_set([(0, 1), (1, 2), (2, 0), (2, 3)])
    with pytest.raises(TypeError) as caught:
        mis.solve("size max")  # type: ignore[arg-type]
    assert str(caught.value) == (
        "solve takes a property such as problems.SizeMax() or problems.CountingAll(), got str"
    )
    # Past 16 best values, the configurations of the k best and samples are the CPU's, refused
    # before any GPU work.
    cpu_only: list[Property[Any]] = [CountingMax(17), SizeMax(20), ConfigsMin(k=2), SampleMax(3)]
    for wanted in cpu_only:
        with pytest.raises(ValueError, match="runs on the CPU") as refused:
            mis.solve(wanted, device=0)
        assert str(refused.value).startswith(f"{wanted!r} runs on the CPU (device=None)")
    with pytest.raises(TypeError, match="device must be a GPU's number or None, got bool"):
        mis.solve(SizeMax(), device=True)
    # Past the limit: refused before any configuration is listed, naming how many.
    ring = problems.independent_set([(i, (i + 1) % 12) for i in range(12)], [0] * 12)
    with pytest.raises(ValueError, match=r"^322 assignments attain the value 0\.0, more than"):
        ring.solve(ConfigsAll(limit=100))
    assert ring.solve(CountingAll()) == 322  # (the Lucas number L_12)
    # An intermediate past max_bytes.
    with pytest.raises(ValueError, match="max_bytes"):
        ring.solve(CountingAll(), max_bytes=16)


def test_solve_async_answers_in_a_worker_thread() -> None:
    glass = problems.spin_glass([(0, 1), (1, 2), (0, 2)], [1, 1, 1])

    async def main() -> tuple[Any, ...]:
        return (
            await glass.solve_async(CountingMin()),
            await glass.solve_async(ConfigsAll()),
            await glass.solve_async(SingleConfigMax()),
        )

    counted, every, highest = anyio.run(main)
    assert counted == [Counted(-1.0, 6)]
    assert len(every) == 8
    assert highest.value == 3.0


def test_counts_past_int64_are_exact_through_one_call() -> None:
    # Every independent set of the 11 x 11 grid graph: OEIS A006506, past 2^63.
    n = 11
    edges = [(r * n + c, r * n + c + 1) for r in range(n) for c in range(n - 1)]
    edges += [(r * n + c, (r + 1) * n + c) for r in range(n - 1) for c in range(n)]
    grid = problems.independent_set(edges, vertices=range(n * n))
    rows = [m for m in range(1 << n) if m & (m >> 1) == 0]
    ways = dict.fromkeys(rows, 1)
    for _ in range(n - 1):
        ways = {m: sum(w for k, w in ways.items() if k & m == 0) for m in rows}
    assert grid.solve(CountingAll()) == sum(ways.values()) > 1 << 63
    # The empty set alone has the smallest size.
    assert grid.solve(CountingMin()) == [Counted(0.0, 1)]


def test_the_independence_polynomial_of_known_graphs() -> None:
    petersen = problems.independent_set(nx.petersen_graph())
    assert petersen.solve(GraphPolynomial()) == {0: 1, 1: 10, 2: 30, 3: 30, 4: 5}
    # The n x n grid graph's independent sets by size, from a row-by-row transfer matrix in
    # Python's integers; summed, OEIS A006506 (2, 7, 63, 1234, 55447, ...), past 2^63 at 11.
    known = {1: 2, 2: 7, 3: 63, 4: 1234, 5: 55447}
    for n in (1, 2, 3, 4, 5, 11):
        grid = problems.independent_set(_grid(n), vertices=range(n * n))
        by_size = _grid_polynomial(n)
        assert grid.solve(GraphPolynomial()) == by_size, n
        assert sum(by_size.values()) == known.get(n, sum(by_size.values())), n
    assert sum(by_size.values()) > 1 << 63  # (n = 11)
    # The frustrated triangle's energies.
    glass = problems.spin_glass([(0, 1), (1, 2), (0, 2)], [1, 1, 1])
    assert glass.solve(GraphPolynomial()) == {-1: 6, 3: 2}


def _grid(n: int) -> list[Edge]:
    edges = [(r * n + c, r * n + c + 1) for r in range(n) for c in range(n - 1)]
    return edges + [(r * n + c, (r + 1) * n + c) for r in range(n - 1) for c in range(n)]


def _grid_polynomial(n: int) -> dict[int, int]:
    """How many independent sets of the n x n grid have each size: rows as bit masks without
    two neighbours, each row's polynomial carried to the next."""
    rows = [m for m in range(1 << n) if m & (m >> 1) == 0]
    ways = {m: {m.bit_count(): 1} for m in rows}
    for _ in range(n - 1):
        after: dict[int, dict[int, int]] = {}
        for m in rows:
            made: dict[int, int] = {}
            for k, poly in ways.items():
                if k & m == 0:
                    for size, c in poly.items():
                        made[size + m.bit_count()] = made.get(size + m.bit_count(), 0) + c
            after[m] = made
        ways = after
    total: dict[int, int] = {}
    for poly in ways.values():
        for size, c in poly.items():
            total[size] = total.get(size, 0) + c
    return dict(sorted(total.items()))


def test_the_partition_function_stays_finite_in_logs() -> None:
    grid = problems.independent_set(_grid(6), vertices=range(36))
    poly = grid.solve(GraphPolynomial())
    # ln Z from the polynomial, at a beta where Z itself passes float64's range.
    beta = 60.0
    top = max(poly)
    want = beta * top + math.log(math.fsum(c * math.exp(beta * (s - top)) for s, c in poly.items()))
    assert grid.solve(PartitionFunction(beta, log=True)) == pytest.approx(want, rel=1e-12)
    with pytest.raises(OverflowError, match=r"log=True\) for ln Z"):
        grid.solve(PartitionFunction(beta))
    assert grid.solve(PartitionFunction(1.0)) == pytest.approx(
        math.fsum(c * math.exp(s) for s, c in poly.items()), rel=1e-12
    )
    with pytest.raises(ValueError, match="beta must be finite, got inf"):
        PartitionFunction(math.inf)
    with pytest.raises(TypeError, match="beta must be a real number, got str"):
        PartitionFunction("1")  # type: ignore[arg-type]


def test_a_polynomial_needs_integer_sizes() -> None:
    mis = problems.independent_set([(0, 1), (1, 2)], [1.5, 1, 1])
    with pytest.raises(ValueError, match="not an integer: a polynomial's powers are integers"):
        mis.solve(GraphPolynomial())
    wide = problems.independent_set([(0, 1), (1, 2)], [10_000, 1, 1])
    with pytest.raises(ValueError, match="more than 4,096"):
        wide.solve(GraphPolynomial())


def test_the_best_values_need_no_count_that_fits_int64() -> None:
    # A 70-cycle whose one edge weighs 1: cut or not, each by 2^69 configurations.
    weights = [1] + [0] * 69
    ring = problems.max_cut([(i, (i + 1) % 70) for i in range(70)], weights)
    assert ring.solve(SizeMax(2)) == [1.0, 0.0]
    assert ring.solve(SizeMin(3)) == [0.0, 1.0]
    assert ring.solve(CountingMax()) == [Counted(1.0, 1 << 69)]  # exact past int64
    with pytest.raises(OverflowError, match="passes 2\\^63 - 1"):
        ring.solve(CountingMax(2))  # (k > 1 counts within int64)


def test_answers_of_integer_weights_are_exact_ints() -> None:
    assert type(problems.independent_set([(0, 1)]).solve(SingleConfigMin()).value) is float
    heavy = problems.independent_set([(0, 1)], [2**60 + 1, 3], dtype="int64")
    assert heavy.solve(SizeMax()) == [2**60 + 1]
    best = heavy.solve(SingleConfigMax())
    assert (best.value, type(best.value), best.answer) == (2**60 + 1, int, [0])


def test_a_semiring_object_and_a_bad_sense() -> None:
    glass = problems.spin_glass([(0, 1), (1, 2), (0, 2)], [1, 1, 1])
    ring = tropical.SEMIRINGS["minplus"]
    # (the reference takes a Semiring where it takes a name)
    as_object: Any = ring
    other: Any = tropical.SEMIRINGS["maxplus"]
    assert float(reference.einsum(glass.subscripts, *glass.operands, semiring=as_object)) == -1.0
    with pytest.raises(ValueError, match="in 'minplus', not 'maxplus'"):
        reference.einsum(glass.subscripts, *glass.operands, semiring=other)
    with pytest.raises(ValueError, match="sense must be one of 'max', 'min', 'all', 'every'"):
        glass.network("MAX")
    assert glass.network("max").semiring == "maxplus"
    with pytest.raises(TypeError, match="solve takes a property such as"):
        glass.solve(problems.Property())


def test_samples_are_uniform_over_the_configurations() -> None:
    # A star: the centre alone, or any set of its 5 leaves: 33 independent sets, the centre
    # in 1 of them (a walk that took each branch with equal odds would take it half the time).
    star = problems.independent_set([(0, leaf) for leaf in range(1, 6)])
    drawn = star.solve(SampleAll(33_000, seed=20261207))
    seen = Counter(tuple(s.configuration.values()) for s in drawn)
    assert len(seen) == 33
    assert all(850 < n < 1150 for n in seen.values())  # 1,000 each expected (sd 31)
    # The six ground states of the frustrated triangle, each about a sixth of the draws.
    glass = problems.spin_glass([(0, 1), (1, 2), (0, 2)], [1, 1, 1])
    ground = Counter(tuple(s.answer.values()) for s in glass.solve(SampleMin(6_000, seed=7)))
    assert len(ground) == 6
    assert all(850 < n < 1150 for n in ground.values())
    # The same seed draws the same samples.
    assert glass.solve(SampleMin(50, seed=3)) == glass.solve(SampleMin(50, seed=3))
    with pytest.raises(ValueError, match="count must be at least 1, got 0"):
        SampleMax(0)
    with pytest.raises(TypeError, match="count must be an int \\(how many samples\\), got float"):
        SampleAll(2.0)  # type: ignore[arg-type]
