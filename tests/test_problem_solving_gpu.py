"""``Problem.solve(..., device=0)`` on the GPU against the same call on the CPU: the best
value at either end, its count, the count of every valid configuration and a configuration
attaining the best, for every problem on seeded random graphs, blocking and async. Each test
prints its seed."""

from __future__ import annotations

import anyio
import numpy as np
import pytest

from aionvrtc.tropical import problems
from aionvrtc.tropical.problems import (
    ConfigsAll,
    ConfigsMax,
    ConfigsMin,
    CountingAll,
    CountingMax,
    CountingMin,
    SingleConfigMax,
    SingleConfigMin,
    SizeMax,
    SizeMin,
    Solution,
)

pytestmark = pytest.mark.gpu

SEED = 20261207


def _random(rng: np.random.Generator) -> list[problems.Problem]:
    n = int(rng.integers(8, 30))
    edges = [(u, v) for u in range(n) for v in range(u + 1, n) if rng.random() < 3 / n]
    vertices = range(n)
    return [
        problems.independent_set(edges, rng.integers(0, 5, n).tolist(), vertices=vertices),
        problems.max_cut(
            edges, rng.integers(-2, 5, len(edges)).tolist(), vertices=vertices, dtype="int32"
        ),
        problems.spin_glass(
            edges,
            rng.normal(size=len(edges)).round(2).tolist(),
            rng.normal(size=n).round(2).tolist(),
            vertices=vertices,
            dtype="float64",
        ),
        problems.maximal_independent_set(edges, vertices=vertices),
    ]


def test_the_gpu_answers_as_the_cpu_does() -> None:
    print(f"seed {SEED}")
    rng = np.random.default_rng(SEED)
    for _ in range(6):
        for problem in _random(rng):
            for size, single in ((SizeMax(), SingleConfigMax()), (SizeMin(), SingleConfigMin())):
                want = problem.solve(size)
                assert problem.solve(size, device=0) == pytest.approx(want), problem.kind
                one = problem.solve(single, device=0)
                # The configuration attains the optimum, worked out from the graph again.
                assert one.value == pytest.approx(want[0], abs=1e-9), problem.kind
                assert list(one.configuration) == list(problem.vertices)
            # The counts, exact: einsum(..., count=True) on the GPU, the reference on the CPU.
            for counting in (CountingMax(), CountingMin()):
                got = problem.solve(counting, device=0)
                want_counted = problem.solve(counting)
                assert [c.count for c in got] == [c.count for c in want_counted], problem.kind
                assert [c.value for c in got] == pytest.approx([c.value for c in want_counted])
            assert problem.solve(CountingAll(), device=0) == problem.solve(CountingAll())
            # The k best: einsum(..., top=k) on the GPU.
            for size in (SizeMax(3), SizeMin(4)):
                assert problem.solve(size, device=0) == pytest.approx(problem.solve(size))
            for ranked in (CountingMax(3), CountingMin(8)):
                got, want_ranked = problem.solve(ranked, device=0), problem.solve(ranked)
                assert [c.count for c in got] == [c.count for c in want_ranked], problem.kind
                assert [c.value for c in got] == pytest.approx([c.value for c in want_ranked])


def test_solve_async_on_the_gpu() -> None:
    print(f"seed {SEED + 1}")
    rng = np.random.default_rng(SEED + 1)
    mis, _, glass, _ = _random(rng)

    async def main() -> tuple[list[float], Solution]:
        return (
            await mis.solve_async(SizeMax(), device=0),
            await glass.solve_async(SingleConfigMin(), device=0),
        )

    size, ground = anyio.run(main)
    assert size == mis.solve(SizeMax())
    assert ground.value == pytest.approx(glass.solve(SizeMin())[0], abs=1e-9)


def test_every_best_configuration_on_the_gpu_is_the_cpus() -> None:
    """``ConfigsMax``, ``ConfigsMin`` and ``ConfigsAll`` (tropical.configurations: the counted
    contraction and the walk back on the GPU) on small random graphs, as the CPU lists them."""
    print(f"seed {SEED + 2}")
    rng = np.random.default_rng(SEED + 2)
    listed = 0
    for _ in range(4):
        n = int(rng.integers(6, 12))
        edges = [(u, v) for u in range(n) for v in range(u + 1, n) if rng.random() < 3 / n]
        for problem in (
            problems.independent_set(edges, vertices=range(n)),
            problems.max_cut(edges, vertices=range(n), dtype="int32"),
            problems.maximal_independent_set(edges, vertices=range(n)),
        ):
            for wanted in (ConfigsMax(), ConfigsMin(), ConfigsAll(limit=1 << 12)):
                got = problem.solve(wanted, device=0)
                assert got == problem.solve(wanted), (problem.kind, wanted)
                listed += len(got)
    assert listed >= 50
