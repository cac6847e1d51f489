"""Combinatorial problems as tropical tensor networks, and the questions they answer in one call.

Build the network of a problem from a graph, then ask it: ``problem.solve(SizeMax())`` (the
optimum), ``problem.solve(CountingMax())`` (how many configurations attain it),
``problem.solve(ConfigsMax())`` (every one of them), and the rest of ``Property``'s kinds. Each
property runs in the semiring it needs, on the CPU (the NumPy reference) or on a GPU
(``device=``), and its configurations come back in the problem's own terms.

Each builder takes a networkx graph (anything with ``nodes`` and ``edges``, as networkx's
graphs have) or a sequence of edges ``(u, v)``, and returns a ``Problem``: its ``subscripts``,
``operands`` and ``semiring`` are einsum's arguments too, and the scalar contraction is the
problem's optimum. Every vertex ``v`` has one index ``x_v`` in {0, 1} (``problem.indices[v]``);
``einsum(..., argmax=True)`` gives an assignment of every index, and ``problem.selected``,
``problem.cut``, ``problem.spins`` and ``problem.configuration`` read it back.

- ``independent_set``: the maximum (weighted) independent set, in max-plus.
- ``max_cut``: the maximum (weighted) cut, in max-plus.
- ``spin_glass``: the ground-state energy of an Ising spin glass with couplings on the edges
  and fields on the vertices, in min-plus.
- ``maximal_independent_set``: the minimum (or maximum) weight of a maximal independent set:
  one that no vertex can join. In min-plus by default (the independent domination number of
  the graph, for unit weights); in max-plus it equals the maximum independent set.
- ``coloring``: the least weight of the edges whose ends share one of q colors, in min-plus.
- ``dominating_set``: the minimum (weighted) dominating set, in min-plus.
- ``matching``: the maximum (weighted) matching, its edges the variables, in max-plus.
- ``set_packing`` and ``set_covering``: of a family of sets, the heaviest disjoint sets
  (max-plus) and the lightest sets that cover the universe (min-plus).
- ``satisfiability``: the most weight of CNF clauses an assignment satisfies, in max-plus.
- ``paint_shop``: the fewest color changes of the binary paint shop, in min-plus.

The face of the problems: ``aionvrtc.tropical.problems`` is this package.
"""

from ._constraints import MAX_DEGREE
from ._families import set_covering, set_packing
from ._graphs import independent_set, max_cut, maximal_independent_set, spin_glass
from ._neighbourhoods import MAX_COLORS, coloring, dominating_set, matching
from ._problem import Problem
from ._properties import (
    MAX_K,
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
    SingleConfigsMax,
    SingleConfigsMin,
    SizeMax,
    SizeMin,
    Solution,
)
from ._sequences import paint_shop, satisfiability

__all__ = [
    "MAX_COLORS",
    "MAX_DEGREE",
    "MAX_K",
    "ConfigsAll",
    "ConfigsMax",
    "ConfigsMin",
    "Counted",
    "CountingAll",
    "CountingMax",
    "CountingMin",
    "GraphPolynomial",
    "PartitionFunction",
    "Problem",
    "Property",
    "SampleAll",
    "SampleMax",
    "SampleMin",
    "SingleConfigMax",
    "SingleConfigMin",
    "SingleConfigsMax",
    "SingleConfigsMin",
    "SizeMax",
    "SizeMin",
    "Solution",
    "coloring",
    "dominating_set",
    "independent_set",
    "matching",
    "max_cut",
    "maximal_independent_set",
    "paint_shop",
    "satisfiability",
    "set_covering",
    "set_packing",
    "spin_glass",
]
