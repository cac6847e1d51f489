"""The graph problems whose tensors join a vertex with what touches it: coloring (an edge's two
colors), the dominating set (a vertex with its neighbours: at least one in the set) and the
matching (a vertex's edges: at most one matched)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..products import SEMIRINGS
from ._constraints import at_least_one, at_most_one, check_joined
from ._problem import Problem, made, total
from ._reading import (
    Edge,
    Graph,
    Vertex,
    Weights,
    check_bounded,
    checked_dtype,
    edge_terms,
    indices_of,
    neighbours_of,
    read_graph,
    weights_of,
)

__all__ = ["MAX_COLORS", "coloring", "dominating_set", "matching"]

# The most colors: an edge's tensor holds q^2 elements.
MAX_COLORS = 256


@dataclass(frozen=True, slots=True)
class _Coloring:
    vertices: tuple[Vertex, ...]
    edges: tuple[Edge, ...]
    weights: tuple[float, ...]
    noun: str = "vertex"
    ints: bool = False  # (an integer dtype: sums as ints)

    def value(self, configuration: Mapping[Any, int]) -> float:
        pairs = zip(self.edges, self.weights, strict=True)
        return total(
            [w for (u, v), w in pairs if configuration[u] == configuration[v]], ints=self.ints
        )

    def answer(self, configuration: Mapping[Any, int]) -> Any:
        return dict(configuration)


def coloring(
    graph: Graph | Iterable[Edge],
    colors: int,
    weights: Weights = None,
    *,
    vertices: Iterable[Vertex] | None = None,
    dtype: Any = "float32",
) -> Problem:
    """Coloring the vertices with ``colors`` colors, as a min-plus network: the objective is the
    total weight of the edges whose two ends share a color (GenericTensorNetworks.jl's
    ``Coloring``), so ``SizeMin`` is 0 where the graph has a proper coloring, and
    ``CountingMin`` then counts them (the chromatic polynomial at ``colors``).

    Each vertex's index takes a color from 0 to ``colors - 1``; each edge carries the q x q
    tensor of its weight on the diagonal, 0 elsewhere; a vertex on no edge carries zeros,
    after the edges.

    Args:
        graph: As ``independent_set``.
        colors: How many colors, from 1 to ``MAX_COLORS`` (256).
        weights: Each edge's weight, as ``max_cut`` takes them (1 each by default).
        vertices: As ``independent_set``.
        dtype: As ``independent_set``.

    Returns:
        The problem; ``answer`` gives each vertex's color.

    Raises:
        TypeError: As ``independent_set``; ``colors`` is not an int.
        ValueError: As ``max_cut``; ``colors`` is not from 1 to 256.
    """
    if not isinstance(colors, int) or isinstance(colors, bool):
        raise TypeError(f"colors must be an int (how many colors), got {type(colors).__name__}")
    if not 1 <= colors <= MAX_COLORS:
        raise ValueError(f"colors must be from 1 to {MAX_COLORS}, got {colors}")
    found, edges = read_graph(graph, vertices)
    dtype = checked_dtype(dtype)
    w = weights_of(graph, edges, weights, dtype, "weights", edges=True)
    check_bounded(dtype, "weights", w)
    index = indices_of(found)
    terms, alone = edge_terms(found, edges, index)
    same = np.eye(colors, dtype=bool)
    operands = [np.where(same, x, 0).astype(dtype) for x in w]
    operands += [np.zeros(colors, dtype)] * alone
    return made(
        "coloring",
        terms,
        operands,
        "minplus",
        vertices=found,
        edges=edges,
        indices=index,
        vertex_weights=(0.0,) * len(found),
        edge_weights=w,
        meaning=_Coloring(found, edges, w, ints=dtype.kind == "i"),
        domain=colors,
    )


@dataclass(frozen=True, slots=True)
class _Dominating:
    vertices: tuple[Vertex, ...]
    edges: tuple[Edge, ...]
    weights: tuple[float, ...]
    noun: str = "vertex"
    ints: bool = False  # (an integer dtype: sums as ints)

    def value(self, configuration: Mapping[Any, int]) -> float:
        around = neighbours_of(self.vertices, self.edges)
        for v in self.vertices:
            if not configuration[v] and not any(configuration[u] for u in around[v]):
                raise ValueError(
                    f"vertex {v!r} is not dominated: neither it nor a neighbour is in the set"
                )
        chosen = [w for v, w in zip(self.vertices, self.weights, strict=True) if configuration[v]]
        return total(chosen, ints=self.ints)

    def answer(self, configuration: Mapping[Any, int]) -> Any:
        return [v for v, x in configuration.items() if x]


def dominating_set(
    graph: Graph | Iterable[Edge],
    weights: Weights = None,
    *,
    vertices: Iterable[Vertex] | None = None,
    dtype: Any = "float32",
) -> Problem:
    """The minimum (weighted) dominating set, as a min-plus network: a set of vertices such that
    every vertex is in it or has a neighbour in it.

    Each vertex carries ``[0, w_v]``, then, after them all, a tensor over itself and its
    neighbours (in the order of ``vertices``): the zero where none of them is in the set.

    Args:
        graph: As ``independent_set``.
        weights: Each vertex's weight, as ``independent_set`` takes them.
        vertices: As ``independent_set``.
        dtype: As ``independent_set``.

    Returns:
        The problem; ``answer`` gives the vertices of the set.

    Raises:
        TypeError: As ``independent_set``.
        ValueError: As ``independent_set``; a vertex has more than ``MAX_DEGREE`` neighbours.
    """
    found, edges = read_graph(graph, vertices)
    dtype = checked_dtype(dtype)
    w = weights_of(graph, found, weights, dtype, "weights", edges=False)
    check_bounded(dtype, "weights", w)
    zero = SEMIRINGS["minplus"].zero(dtype)
    index = indices_of(found)
    around = neighbours_of(found, edges)
    terms = [index[v] for v in found]
    operands = [np.array([0, x], dtype) for x in w]
    for v in found:
        check_joined(f"vertex {v!r} with its neighbours", len(around[v]) + 1, "vertices")
        terms.append(index[v] + "".join(index[u] for u in around[v]))
        operands.append(at_least_one(len(around[v]) + 1, zero, dtype))
    return made(
        "dominating set",
        terms,
        operands,
        "minplus",
        vertices=found,
        edges=edges,
        indices=index,
        vertex_weights=w,
        edge_weights=(0.0,) * len(edges),
        meaning=_Dominating(found, edges, w, ints=dtype.kind == "i"),
    )


@dataclass(frozen=True, slots=True)
class _Matching:
    edges: tuple[Edge, ...]
    weights: tuple[float, ...]
    noun: str = "edge"
    ints: bool = False  # (an integer dtype: sums as ints)

    def value(self, configuration: Mapping[Any, int]) -> float:
        held: dict[Any, Edge] = {}
        for edge in self.edges:
            if not configuration[edge]:
                continue
            for end in edge:
                if end in held:
                    raise ValueError(
                        f"edges {held[end]!r} and {edge!r} share vertex {end!r}: a matching's "
                        "edges share none"
                    )
                held[end] = edge
        pairs = zip(self.edges, self.weights, strict=True)
        return total([w for edge, w in pairs if configuration[edge]], ints=self.ints)

    def answer(self, configuration: Mapping[Any, int]) -> Any:
        return [edge for edge, x in configuration.items() if x]


def matching(
    graph: Graph | Iterable[Edge],
    weights: Weights = None,
    *,
    vertices: Iterable[Vertex] | None = None,
    dtype: Any = "float32",
) -> Problem:
    """The maximum (weighted) matching, as a max-plus network: a set of edges no two of which
    share a vertex.

    Each edge has an index (the problem's ``variables`` are the edges) and carries
    ``[0, w_e]``; after them, each vertex of two edges or more carries a tensor over its
    edges: the zero where more than one is matched.

    Args:
        graph: As ``independent_set``; it has at least one edge.
        weights: Each edge's weight, as ``max_cut`` takes them.
        vertices: As ``independent_set``.
        dtype: As ``independent_set``.

    Returns:
        The problem; ``answer`` gives the edges matched.

    Raises:
        TypeError: As ``independent_set``.
        ValueError: As ``max_cut``; the graph has no edges; a vertex has more than
            ``MAX_DEGREE + 1`` edges.
    """
    found, edges = read_graph(graph, vertices)
    if not edges:
        raise ValueError("the graph has no edges: a matching is a set of edges, pass at least one")
    dtype = checked_dtype(dtype)
    w = weights_of(graph, edges, weights, dtype, "weights", edges=True)
    check_bounded(dtype, "weights", w)
    zero = SEMIRINGS["maxplus"].zero(dtype)
    index = indices_of(edges)
    at: dict[Vertex, list[Edge]] = {v: [] for v in found}
    for edge in edges:
        for end in edge:
            at[end].append(edge)
    terms = [index[edge] for edge in edges]
    operands = [np.array([0, x], dtype) for x in w]
    for v in found:
        if len(at[v]) > 1:
            check_joined(f"vertex {v!r}", len(at[v]), "edges")
            terms.append("".join(index[edge] for edge in at[v]))
            operands.append(at_most_one(len(at[v]), zero, dtype))
    return made(
        "matching",
        terms,
        operands,
        "maxplus",
        vertices=found,
        edges=edges,
        indices=index,
        vertex_weights=(0.0,) * len(found),
        edge_weights=w,
        meaning=_Matching(edges, w, ints=dtype.kind == "i"),
        variables=edges,
    )
