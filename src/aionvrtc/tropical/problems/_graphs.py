"""The graph problems' builders: the maximum independent set, the maximum cut, the spin glass's
ground state and the maximal independent set, each a network of one index per vertex."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..products import SEMIRINGS
from ._constraints import MAX_DEGREE
from ._problem import Problem, made, total
from ._reading import (
    Array,
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

__all__ = [
    "GraphMeaning",
    "independent_set",
    "max_cut",
    "maximal_independent_set",
    "spin_glass",
]


@dataclass(frozen=True, slots=True)
class GraphMeaning:
    """What a configuration of one of the four graph problems means: its objective from the
    graph's weights, and its answer (the set, the side, the spins)."""

    kind: str
    vertices: tuple[Vertex, ...]
    edges: tuple[Edge, ...]
    vertex_weights: tuple[float, ...]
    edge_weights: tuple[float, ...]
    noun: str = "vertex"
    ints: bool = False  # (an integer dtype: sums as ints)

    def value(self, configuration: Mapping[Any, int]) -> float:
        x = configuration
        vertex_terms = zip(self.vertices, self.vertex_weights, strict=True)
        if self.kind == "max cut":
            pairs = zip(self.edges, self.edge_weights, strict=True)
            return total([w for (u, v), w in pairs if x[u] != x[v]], ints=self.ints)
        if self.kind == "spin glass":
            s = {v: 2 * b - 1 for v, b in x.items()}
            pairs = zip(self.edges, self.edge_weights, strict=True)
            couplings = (j * s[u] * s[v] for (u, v), j in pairs)
            terms = itertools.chain(couplings, (h * s[v] for v, h in vertex_terms))
            return total(list(terms), ints=self.ints)
        clash = next(((u, v) for u, v in self.edges if x[u] and x[v]), None)
        if clash is not None:
            raise ValueError(f"the set is not independent: vertices {clash[0]!r} and "
                             f"{clash[1]!r} share an edge")  # fmt: skip
        if self.kind == "maximal independent set":
            neighbours = neighbours_of(self.vertices, self.edges)
            free = next((v for v in self.vertices if not x[v] and not any(
                x[u] for u in neighbours[v])), None)  # fmt: skip
            if free is not None:
                raise ValueError(f"the independent set is not maximal: vertex {free!r} could "
                                 "join it")  # fmt: skip
        return total([w for v, w in vertex_terms if x[v]], ints=self.ints)

    def answer(self, configuration: Mapping[Any, int]) -> Any:
        if self.kind == "spin glass":
            return {v: 2 * x - 1 for v, x in configuration.items()}
        return [v for v, x in configuration.items() if x]


def independent_set(
    graph: Graph | Iterable[Edge],
    weights: Weights = None,
    *,
    vertices: Iterable[Vertex] | None = None,
    dtype: Any = "float32",
) -> Problem:
    """The maximum (weighted) independent set of a graph, as a max-plus network.

    Each vertex carries ``[0, w_v]`` (it adds its weight when it is in the set) and each edge
    ``[[0, 0], [0, -inf]]`` (both its ends in the set is forbidden); the network's operands are
    the vertices' tensors, in the order of ``vertices``, then the edges'. Contracted, it is the
    largest total weight of a set of vertices no two of which share an edge.

    Args:
        graph: A networkx graph, or the edges as pairs of vertices (any hashable values).
        weights: Each vertex's weight: None (1 each); a sequence, in the order of the
            vertices; a mapping from vertex to weight; for a networkx graph, the name of a
            node attribute. Finite numbers, integers for an integer ``dtype``.
        vertices: The vertices and their order (for an edge list: to name vertices on no edge,
            or to order them); by default a networkx graph's nodes, or the ends of the edges
            in the order they first appear.
        dtype: The operands' dtype: float32 (the default: integers up to 2^24 exact), float64,
            int32 or int64 (the semiring's zero is then the type's minimum).

    Returns:
        The problem.

    Raises:
        TypeError: ``graph`` is neither a networkx graph nor an iterable of pairs, or is a
            dict of adjacency lists or dicts (``networkx.from_dict_of_lists`` reads one).
        ValueError: The graph has no vertices, or more than 1,112,064 (the indices a network's
            subscripts can name); ``graph`` is a NumPy array not of shape (edges, 2), such as
            an adjacency matrix (``networkx.from_numpy_array`` reads one); an edge is not a
            pair, joins a vertex to itself, appears twice, or has an end not in ``vertices``; a
            vertex appears twice in ``vertices``; ``weights`` has another length than the
            vertices, misses one, is not finite, is not an integer for an integer ``dtype``,
            or names an attribute a vertex lacks; the weights' absolute values sum to more
            than ``dtype`` holds (an integer type's largest value less 2, a float type's less
            the room its roundings may take), where a sum of the contraction could saturate
            or round to an infinity; ``dtype`` is not one of float32, float64, int32, int64.
    """
    found, edges = read_graph(graph, vertices)
    dtype = checked_dtype(dtype)
    w = weights_of(graph, found, weights, dtype, "weights", edges=False)
    check_bounded(dtype, "weights", w)
    zero = SEMIRINGS["maxplus"].zero(dtype)
    index = indices_of(found)
    terms = [index[v] for v in found] + [index[u] + index[v] for u, v in edges]
    operands = [np.array([0, x], dtype) for x in w]
    operands += [np.array([[0, 0], [0, zero]], dtype)] * len(edges)
    return made(
        "independent set",
        terms,
        operands,
        "maxplus",
        vertices=found,
        edges=edges,
        indices=index,
        vertex_weights=tuple(w),
        edge_weights=(0.0,) * len(edges),
        meaning=GraphMeaning(
            "independent set", found, edges, tuple(w), (0.0,) * len(edges), ints=dtype.kind == "i"
        ),
    )


def max_cut(
    graph: Graph | Iterable[Edge],
    weights: Weights = None,
    *,
    vertices: Iterable[Vertex] | None = None,
    dtype: Any = "float32",
) -> Problem:
    """The maximum (weighted) cut of a graph, as a max-plus network.

    Each edge carries ``[[0, w], [w, 0]]`` (its weight counts when its ends are on different
    sides); a vertex on no edge carries ``[0, 0]``, after the edges. Contracted, it is the
    largest total weight of the edges between a set of vertices (those at 1) and the rest.

    Args:
        graph: As ``independent_set``.
        weights: Each edge's weight: None (1 each); a sequence, in the order of the edges; a
            mapping from edge ``(u, v)`` (either way round) to weight; for a networkx graph,
            the name of an edge attribute.
        vertices: As ``independent_set``.
        dtype: As ``independent_set``.

    Returns:
        The problem.

    Raises:
        TypeError: As ``independent_set``.
        ValueError: As ``independent_set``, ``weights`` being the edges'.
    """
    found, edges = read_graph(graph, vertices)
    dtype = checked_dtype(dtype)
    w = weights_of(graph, edges, weights, dtype, "weights", edges=True)
    check_bounded(dtype, "weights", w)
    tensors = [np.array([[0, x], [x, 0]], dtype) for x in w]
    return _edge_network(
        "max cut", "maxplus", found, edges, weights=w, tensors=tensors, dtype=dtype
    )


def spin_glass(
    graph: Graph | Iterable[Edge],
    couplings: Weights = None,
    fields: Weights = None,
    *,
    vertices: Iterable[Vertex] | None = None,
    dtype: Any = "float32",
) -> Problem:
    """The ground state of an Ising spin glass on a graph, as a min-plus network.

    The energy of spins s_v in {-1, +1} (index value 0 is -1, 1 is +1) is the sum over the
    edges of J_uv s_u s_v plus the sum over the vertices of h_v s_v. Each edge carries
    ``[[J, -J], [-J, J]]``; with ``fields``, each vertex carries ``[-h, h]``, those first, in
    the order of ``vertices``; without, a vertex on no edge carries ``[0, 0]``, after the
    edges. Contracted, it is the least energy.

    Args:
        graph: As ``independent_set``.
        couplings: Each edge's J_uv: None (1 each: a ferromagnet's energy with the sign
            flipped, an antiferromagnet); a sequence in the order of the edges; a mapping from
            edge ``(u, v)`` (either way round); for a networkx graph, an edge attribute's name.
        fields: Each vertex's h_v, as ``independent_set``'s ``weights``; None for no fields.
        vertices: As ``independent_set``.
        dtype: As ``independent_set``.

    Returns:
        The problem.

    Raises:
        TypeError: As ``independent_set``.
        ValueError: As ``independent_set``, for the couplings and the fields (whose absolute
            values are summed together).
    """
    found, edges = read_graph(graph, vertices)
    dtype = checked_dtype(dtype)
    j = weights_of(graph, edges, couplings, dtype, "couplings", edges=True)
    h = None if fields is None else weights_of(graph, found, fields, dtype, "fields", edges=False)
    check_bounded(dtype, "couplings" if h is None else "couplings and fields", j, h or ())
    tensors = [np.array([[x, -x], [-x, x]], dtype) for x in j]
    if h is None:
        return _edge_network(
            "spin glass", "minplus", found, edges, weights=j, tensors=tensors, dtype=dtype
        )
    index = indices_of(found)
    terms = [index[v] for v in found] + [index[u] + index[v] for u, v in edges]
    operands = [np.array([-x, x], dtype) for x in h] + tensors
    return made(
        "spin glass",
        terms,
        operands,
        "minplus",
        vertices=found,
        edges=edges,
        indices=index,
        vertex_weights=tuple(h),
        edge_weights=tuple(j),
        meaning=GraphMeaning(
            "spin glass", found, edges, tuple(h), tuple(j), ints=dtype.kind == "i"
        ),
    )


def maximal_independent_set(
    graph: Graph | Iterable[Edge],
    weights: Weights = None,
    *,
    semiring: str = "minplus",
    vertices: Iterable[Vertex] | None = None,
    dtype: Any = "float32",
) -> Problem:
    """The minimum (or maximum) weight of a maximal independent set: an independent set that
    no other vertex can join, each vertex outside it having a neighbour in it.

    Each vertex carries one tensor over its own index and its neighbours' (in the order of
    ``vertices``): ``w_v`` where it is in the set and no neighbour is, ``0`` where it is out
    and a neighbour is in, the semiring's zero elsewhere. In min-plus (the default) the
    contraction is the least weight of a maximal independent set (for unit weights, the
    graph's independent domination number); in max-plus the largest, which is the maximum
    independent set's where every weight is positive.

    Args:
        graph: As ``independent_set``.
        weights: As ``independent_set``.
        semiring: ``"minplus"`` (the smallest) or ``"maxplus"`` (the largest).
        vertices: As ``independent_set``.
        dtype: As ``independent_set``.

    Returns:
        The problem.

    Raises:
        TypeError: As ``independent_set``.
        ValueError: As ``independent_set``; ``semiring`` is neither ``"minplus"`` nor
            ``"maxplus"``; a vertex has more than ``MAX_DEGREE`` neighbours (its tensor would
            hold 2^(degree + 1) elements).
    """
    if semiring not in ("minplus", "maxplus"):
        raise ValueError(
            f"semiring must be 'minplus' (the smallest maximal independent set) or 'maxplus' "
            f"(the largest), got {semiring!r}"
        )
    found, edges = read_graph(graph, vertices)
    dtype = checked_dtype(dtype)
    w = weights_of(graph, found, weights, dtype, "weights", edges=False)
    check_bounded(dtype, "weights", w)
    zero = SEMIRINGS[semiring].zero(dtype)
    index = indices_of(found)
    neighbours = neighbours_of(found, edges)
    busiest = max(found, key=lambda v: len(neighbours[v]), default=None)
    if busiest is not None and len(neighbours[busiest]) > MAX_DEGREE:
        raise ValueError(
            f"vertex {busiest!r} has {len(neighbours[busiest])} neighbours: a maximal "
            "independent set's tensor of a vertex holds 2^(degree + 1) elements, and "
            f"{MAX_DEGREE} neighbours at most are taken (tropical.problems.MAX_DEGREE)"
        )
    terms, operands = [], []
    for v, weight in zip(found, w, strict=True):
        around = neighbours[v]
        tensor = np.full((2,) * (len(around) + 1), zero, dtype)
        any_in = np.ones((2,) * len(around), bool)
        any_in[(0,) * len(around)] = False  # some neighbour is in the set
        tensor[0, ...][any_in] = 0
        tensor[(1,) + (0,) * len(around)] = weight
        terms.append(index[v] + "".join(index[u] for u in around))
        operands.append(tensor)
    return made(
        "maximal independent set",
        terms,
        operands,
        semiring,
        vertices=found,
        edges=edges,
        indices=index,
        vertex_weights=tuple(w),
        edge_weights=(0.0,) * len(edges),
        meaning=GraphMeaning(
            "maximal independent set",
            found,
            edges,
            tuple(w),
            (0.0,) * len(edges),
            ints=dtype.kind == "i",
        ),
    )


def _edge_network(
    kind: str,
    semiring: str,
    found: tuple[Vertex, ...],
    edges: tuple[Edge, ...],
    *,
    weights: tuple[float, ...],
    tensors: list[Array],
    dtype: np.dtype[Any],
) -> Problem:
    """A network of one tensor per edge, and ``[0, 0]`` after them for each vertex on no edge
    (``edge_terms``)."""
    index = indices_of(found)
    terms, alone = edge_terms(found, edges, index)
    operands = tensors + [np.zeros(2, dtype)] * alone
    return made(
        kind,
        terms,
        operands,
        semiring,
        vertices=found,
        edges=edges,
        indices=index,
        vertex_weights=(0.0,) * len(found),
        edge_weights=weights,
        meaning=GraphMeaning(
            kind, found, edges, (0.0,) * len(found), weights, ints=dtype.kind == "i"
        ),
    )
