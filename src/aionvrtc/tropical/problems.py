"""Graph problems as tropical tensor networks: build the network of a problem from a graph,
contract it with ``tropical.einsum`` (or ``tropical.reference.einsum`` on the CPU), and read
the assignment back as vertices, edges or spins.

Each builder takes a networkx graph (anything with ``nodes`` and ``edges``, as networkx's
graphs have) or a sequence of edges ``(u, v)``, and returns a ``Problem``: its ``subscripts``,
``operands`` and ``semiring`` are einsum's arguments, and the scalar contraction is the
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
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol

import numpy as np
import opt_einsum

from .networks import MAX_INDICES
from .products import SEMIRINGS, numpy_dtype

__all__ = [
    "MAX_DEGREE",
    "Problem",
    "independent_set",
    "max_cut",
    "maximal_independent_set",
    "spin_glass",
]

Vertex = Hashable
Edge = tuple[Hashable, Hashable]
Array = np.ndarray[Any, Any]

# A vertex's tensor in the maximal independent set joins it with all its neighbours: 2^(d + 1)
# elements for degree d, 128 MiB of float32 at 24.
MAX_DEGREE = 24

# What the weights of a builder may be: one per vertex (or edge) in order, a mapping from
# vertex (or edge) to weight, or the name of a networkx attribute.
Weights = Sequence[float] | Mapping[Any, float] | str | None


class _Graph(Protocol):
    """What the builders read of a networkx graph."""

    @property
    def nodes(self) -> Any: ...

    @property
    def edges(self) -> Any: ...


@dataclass(frozen=True, slots=True, eq=False)
class Problem:
    """A graph problem as a tropical tensor network, and the way back from an assignment.

    ``await tropical.einsum(problem.subscripts, *map(cupy.asarray, problem.operands),
    semiring=problem.semiring)`` contracts it on the GPU, ``tropical.reference.einsum`` with the
    same arguments on the CPU; the scalar is the problem's optimum.

    Attributes:
        kind: ``"independent set"``, ``"max cut"``, ``"spin glass"`` or ``"maximal independent
            set"``.
        subscripts: The network's subscripts, one index per vertex (``opt_einsum.get_symbol(i)``
            for the i-th vertex of ``vertices``), ``"->"`` at the end: a scalar contraction.
        operands: The tensors, NumPy arrays of ``dtype``, one per term of ``subscripts``.
        semiring: The semiring to contract in: ``"maxplus"`` or ``"minplus"``.
        vertices: The graph's vertices, in the order of their indices.
        edges: The graph's edges, as given.
        indices: Each vertex's index in ``subscripts``.
        vertex_weights: The weight (or field) of each vertex, in the order of ``vertices``.
        edge_weights: The weight (or coupling) of each edge, in the order of ``edges``.
    """

    kind: str
    subscripts: str
    operands: tuple[Array, ...]
    semiring: str
    vertices: tuple[Vertex, ...]
    edges: tuple[Edge, ...]
    indices: Mapping[Vertex, str]
    vertex_weights: tuple[float, ...]
    edge_weights: tuple[float, ...]

    def configuration(self, assignment: Mapping[str, int] | Sequence[int]) -> dict[Vertex, int]:
        """Each vertex's value, 0 or 1, in an assignment of the network's indices.

        Args:
            assignment: What ``tropical.einsum(..., argmax=True)`` gives: a mapping from each
                index to its value; or one value per vertex, in the order of ``vertices``. A
                row of ``reference.configurations`` is in the order of its indices, which is
                not always that of ``vertices``: pass ``dict(zip(indices, row))``.

        Returns:
            A dict from each vertex to its value.

        Raises:
            ValueError: An index of a vertex is missing from ``assignment``, a sequence has
                another length than ``vertices``, or a value is not 0 or 1.
        """
        if isinstance(assignment, Mapping):
            missing = [v for v in self.vertices if self.indices[v] not in assignment]
            if missing:
                raise ValueError(
                    f"the assignment has no value for the index of vertex {missing[0]!r} "
                    f"({self.indices[missing[0]]!r}) and {len(missing) - 1} more: pass the "
                    "assignment of this problem's network, as einsum(..., argmax=True) gives it"
                )
            values = [assignment[self.indices[v]] for v in self.vertices]
        else:
            values = list(assignment)
            if len(values) != len(self.vertices):
                raise ValueError(
                    f"the configuration has {len(values)} values for {len(self.vertices)} "
                    "vertices: pass one value per vertex, in the order of problem.vertices"
                )
        bad = next((v for v, x in zip(self.vertices, values, strict=True) if x not in (0, 1)), None)
        if bad is not None:
            x = values[self.vertices.index(bad)]
            raise ValueError(f"vertex {bad!r} has the value {x!r}: each vertex's is 0 or 1")
        return {v: int(x) for v, x in zip(self.vertices, values, strict=True)}

    def selected(self, assignment: Mapping[str, int] | Sequence[int]) -> list[Vertex]:
        """The vertices whose value is 1: the set (independent set, maximal independent set),
        one side of the cut (max cut), the spins up (spin glass); in the order of ``vertices``.

        Args:
            assignment: As ``configuration`` takes it.

        Returns:
            The vertices at 1.

        Raises:
            ValueError: As ``configuration``.
        """
        return [v for v, x in self.configuration(assignment).items() if x]

    def cut(self, assignment: Mapping[str, int] | Sequence[int]) -> list[Edge]:
        """The edges whose ends have different values: the cut (max cut), the unsatisfied
        ferromagnetic bonds (spin glass); in the order of ``edges``.

        Args:
            assignment: As ``configuration`` takes it.

        Returns:
            The edges cut.

        Raises:
            ValueError: As ``configuration``.
        """
        x = self.configuration(assignment)
        return [(u, v) for u, v in self.edges if x[u] != x[v]]

    def spins(self, assignment: Mapping[str, int] | Sequence[int]) -> dict[Vertex, int]:
        """Each vertex's spin, -1 (value 0) or +1 (value 1).

        Args:
            assignment: As ``configuration`` takes it.

        Returns:
            A dict from each vertex to its spin.

        Raises:
            ValueError: As ``configuration``.
        """
        return {v: 2 * x - 1 for v, x in self.configuration(assignment).items()}

    def value(self, assignment: Mapping[str, int] | Sequence[int]) -> float:
        """The problem's objective at an assignment, computed from the graph (not from the
        network): what the contraction gives where the assignment attains it.

        The weight of the set (independent set, maximal independent set), the weight of the
        cut (max cut), the energy sum of J_uv s_u s_v + h_v s_v (spin glass), in float64. For
        integer weights this is the contraction's value exactly; for weights that are not
        integers the contraction, summed in the operands' dtype in another order, can differ
        in its last bits (compare with a tolerance).

        Args:
            assignment: As ``configuration`` takes it.

        Returns:
            The objective, a float.

        Raises:
            ValueError: As ``configuration``; or the set is not independent (two of its
                vertices share an edge), or for the maximal independent set not maximal (a
                vertex outside it has no neighbour in it).
        """
        x = self.configuration(assignment)
        vertex_terms = zip(self.vertices, self.vertex_weights, strict=True)
        if self.kind == "max cut":
            pairs = zip(self.edges, self.edge_weights, strict=True)
            return math.fsum(w for (u, v), w in pairs if x[u] != x[v])
        if self.kind == "spin glass":
            s = {v: 2 * b - 1 for v, b in x.items()}
            pairs = zip(self.edges, self.edge_weights, strict=True)
            couplings = (j * s[u] * s[v] for (u, v), j in pairs)
            return math.fsum(itertools.chain(couplings, (h * s[v] for v, h in vertex_terms)))
        clash = next(((u, v) for u, v in self.edges if x[u] and x[v]), None)
        if clash is not None:
            raise ValueError(f"the set is not independent: vertices {clash[0]!r} and "
                             f"{clash[1]!r} share an edge")  # fmt: skip
        if self.kind == "maximal independent set":
            neighbours = _neighbours(self.vertices, self.edges)
            free = next((v for v in self.vertices if not x[v] and not any(
                x[u] for u in neighbours[v])), None)  # fmt: skip
            if free is not None:
                raise ValueError(f"the independent set is not maximal: vertex {free!r} could "
                                 "join it")  # fmt: skip
        return math.fsum(w for v, w in vertex_terms if x[v])


def independent_set(
    graph: _Graph | Iterable[Edge],
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
    found, edges = _read_graph(graph, vertices)
    dtype = _dtype(dtype)
    w = _weights(graph, found, weights, dtype, "weights", edges=False)
    _bounded(dtype, "weights", w)
    zero = SEMIRINGS["maxplus"].zero(dtype)
    index = _indices(found)
    terms = [index[v] for v in found] + [index[u] + index[v] for u, v in edges]
    operands = [np.array([0, x], dtype) for x in w]
    operands += [np.array([[0, 0], [0, zero]], dtype)] * len(edges)
    return Problem("independent set", ",".join(terms) + "->", tuple(operands), "maxplus",
                   found, edges, index, tuple(w), (0.0,) * len(edges))  # fmt: skip


def max_cut(
    graph: _Graph | Iterable[Edge],
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
    found, edges = _read_graph(graph, vertices)
    dtype = _dtype(dtype)
    w = _weights(graph, edges, weights, dtype, "weights", edges=True)
    _bounded(dtype, "weights", w)
    tensors = [np.array([[0, x], [x, 0]], dtype) for x in w]
    return _edge_network(
        "max cut", "maxplus", found, edges, weights=w, tensors=tensors, dtype=dtype
    )


def spin_glass(
    graph: _Graph | Iterable[Edge],
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
    found, edges = _read_graph(graph, vertices)
    dtype = _dtype(dtype)
    j = _weights(graph, edges, couplings, dtype, "couplings", edges=True)
    h = None if fields is None else _weights(graph, found, fields, dtype, "fields", edges=False)
    _bounded(dtype, "couplings" if h is None else "couplings and fields", j, h or ())
    tensors = [np.array([[x, -x], [-x, x]], dtype) for x in j]
    if h is None:
        return _edge_network(
            "spin glass", "minplus", found, edges, weights=j, tensors=tensors, dtype=dtype
        )
    index = _indices(found)
    terms = [index[v] for v in found] + [index[u] + index[v] for u, v in edges]
    operands = [np.array([-x, x], dtype) for x in h] + tensors
    return Problem("spin glass", ",".join(terms) + "->", tuple(operands), "minplus", found,
                   edges, index, tuple(h), tuple(j))  # fmt: skip


def maximal_independent_set(
    graph: _Graph | Iterable[Edge],
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
    found, edges = _read_graph(graph, vertices)
    dtype = _dtype(dtype)
    w = _weights(graph, found, weights, dtype, "weights", edges=False)
    _bounded(dtype, "weights", w)
    zero = SEMIRINGS[semiring].zero(dtype)
    index = _indices(found)
    neighbours = _neighbours(found, edges)
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
    return Problem("maximal independent set", ",".join(terms) + "->", tuple(operands), semiring,
                   found, edges, index, tuple(w), (0.0,) * len(edges))  # fmt: skip


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
    """A network of one tensor per edge, and ``[0, 0]`` after them for each vertex on no edge:
    every vertex has its index, and the networks of graphs without such vertices are the
    edges' alone (their orders kept in files stay valid)."""
    index = _indices(found)
    touched = {v for edge in edges for v in edge}
    alone = [v for v in found if v not in touched]
    terms = [index[u] + index[v] for u, v in edges] + [index[v] for v in alone]
    operands = tensors + [np.zeros(2, dtype)] * len(alone)
    return Problem(kind, ",".join(terms) + "->", tuple(operands), semiring, found, edges, index,
                   (0.0,) * len(found), weights)  # fmt: skip


def _read_graph(
    graph: _Graph | Iterable[Edge], vertices: Iterable[Vertex] | None
) -> tuple[tuple[Vertex, ...], tuple[Edge, ...]]:
    """The vertices, in order, and the edges, checked: pairs of two vertices, none twice."""
    order: list[Any] | None
    if hasattr(graph, "nodes") and hasattr(graph, "edges"):
        if getattr(graph, "is_directed", lambda: False)():
            raise ValueError(
                "the graph is directed: pass an undirected graph (networkx: graph.to_undirected())"
            )
        if getattr(graph, "is_multigraph", lambda: False)():
            raise ValueError(
                "the graph is a multigraph: pass a simple graph, its parallel edges merged "
                "(networkx: nx.Graph(graph), with their weights summed by hand)"
            )
        listed: list[Any] = list(graph.edges())
        order = list(graph.nodes) if vertices is None else list(vertices)
        left_out = next((v for v in graph.nodes if v not in set(order)), None)
        if vertices is not None and left_out is not None:
            raise ValueError(
                f"vertices leaves out node {left_out!r} of the graph: list every node, or pass "
                "the subgraph (networkx: graph.subgraph(vertices))"
            )
    elif isinstance(graph, (str, bytes)) or not isinstance(graph, Iterable):
        raise TypeError(
            "graph must be a networkx graph or an iterable of edges (u, v), got "
            f"{type(graph).__name__}"
        )
    else:
        _refuse_adjacency(graph)
        listed = list(graph)
        order = None if vertices is None else list(vertices)
    edges: list[Edge] = []
    seen: set[frozenset[Any]] = set()
    # A square array of two rows reads as two edges: where they are refused, say how it was read.
    read_as = ""
    if isinstance(graph, np.ndarray):
        read_as = (" (a NumPy array is read as edges, one row (u, v) each: for an adjacency "
                   "matrix pass networkx.from_numpy_array(a))")  # fmt: skip
    # The rows of a NumPy array of edges, as pairs of Python's ints.
    listed = [e.tolist() if isinstance(e, np.ndarray) else e for e in listed]
    for number, edge in enumerate(listed):
        if not isinstance(edge, (tuple, list)) or len(edge) != 2:
            raise ValueError(f"edge {number} is {edge!r}, not a pair of vertices (u, v)")
        u, v = edge
        if u == v:
            raise ValueError(
                f"edge {number} joins vertex {u!r} to itself: leave self-loops out{read_as}"
            )
        key = frozenset((u, v))
        if key in seen:
            raise ValueError(f"edge ({u!r}, {v!r}) appears twice: give each edge once (its "
                             f"weight summed){read_as}")  # fmt: skip
        seen.add(key)
        edges.append((u, v))
    if order is None:
        order = list(dict.fromkeys(v for edge in edges for v in edge))
    found = tuple(order)
    if not found:
        raise ValueError("the graph has no vertices: a problem needs at least one")
    if len(found) > MAX_INDICES:
        raise ValueError(
            f"the graph has {len(found):,} vertices, more than the {MAX_INDICES:,} a network "
            "can index (one character per vertex, opt_einsum.get_symbol's): solve it in parts, "
            "such as its connected components, each a problem of its own"
        )
    if len(set(found)) != len(found):
        twice = next(v for v in found if found.count(v) > 1)
        raise ValueError(f"vertex {twice!r} appears twice in the vertices")
    known = set(found)
    stray = next((e for e in edges if e[0] not in known or e[1] not in known), None)
    if stray is not None:
        raise ValueError(f"edge {stray!r} has an end that is not one of the vertices given")
    return found, tuple(edges)


def _refuse_adjacency(graph: Iterable[Any]) -> None:
    """Refuse an adjacency dict or matrix passed as the graph, naming what reads it as one: as
    an edge list its keys or rows would be refused one by one, as if they were bad edges."""
    if isinstance(graph, Mapping) and graph:
        values = list(graph.values())
        if all(isinstance(x, Mapping) for x in values):
            kind = "dicts"
        elif all(isinstance(x, Iterable) and not isinstance(x, (str, bytes)) for x in values):
            kind = "lists"
        else:
            return  # a mapping keyed by edges: its keys are the edges
        raise TypeError(
            f"graph is a dict of adjacency {kind} (each vertex's neighbours), not a graph or "
            f"an edge list: pass networkx.from_dict_of_{kind}(graph), or the edges as pairs "
            "[(u, v), ...]"
        )
    if isinstance(graph, np.ndarray) and (graph.ndim != 2 or graph.shape[1] != 2):
        square = graph.ndim == 2 and graph.shape[0] == graph.shape[1]
        raise ValueError(
            f"graph is a NumPy array of shape {graph.shape}"
            f"{' (an adjacency matrix?)' if square else ''}, not an edge list (an array of "
            "shape (edges, 2), one row (u, v) per edge): pass networkx.from_numpy_array(graph) "
            "for an adjacency matrix, or the edges"
        )


def _dtype(dtype: Any) -> np.dtype[Any]:
    found = numpy_dtype(dtype, "dtype")
    if found.kind not in "fi" or found not in SEMIRINGS["maxplus"].dtypes:
        raise ValueError(f"dtype must be one of float32, float64, int32, int64, got {found}")
    return found


def _indices(found: Sequence[Vertex]) -> dict[Vertex, str]:
    return {v: str(opt_einsum.get_symbol(i)) for i, v in enumerate(found)}


def _neighbours(found: Sequence[Vertex], edges: Iterable[Edge]) -> dict[Vertex, list[Vertex]]:
    """Each vertex's neighbours, in the order of ``found``."""
    place = {v: i for i, v in enumerate(found)}
    around: dict[Vertex, list[Vertex]] = {v: [] for v in found}
    for u, v in edges:
        around[u].append(v)
        around[v].append(u)
    return {v: sorted(n, key=place.__getitem__) for v, n in around.items()}


def _weights(
    graph: Any,
    owners: Sequence[Any],
    weights: Weights,
    dtype: np.dtype[Any],
    what: str,
    *,
    edges: bool,
) -> tuple[float, ...]:
    """One weight per vertex (or edge) of ``owners``, from what the builder was given: none
    (1 each), a networkx attribute's name, a mapping (an edge's key either way round), or a
    sequence in their order."""
    noun, plural = ("edge", "edges") if edges else ("vertex", "vertices")
    if weights is None:
        values: list[Any] = [1.0] * len(owners)
    elif isinstance(weights, str):
        if not hasattr(graph, "nodes"):
            raise ValueError(f"{what} names an attribute ({weights!r}), but the graph is an edge "
                             "list: pass a sequence or a mapping")  # fmt: skip
        table = graph.edges if edges else graph.nodes
        lacking = next((o for o in owners if weights not in table[o]), None)
        if lacking is not None:
            raise ValueError(f"{noun} {lacking!r} has no attribute {weights!r} ({what})")
        values = [table[o][weights] for o in owners]
    elif isinstance(weights, Mapping):
        values = [_given(weights, o, what, edge=edges) for o in owners]
    else:
        values = list(weights)
        if len(values) != len(owners):
            raise ValueError(f"{what} has {len(values)} values for {len(owners)} {plural}: one "
                             f"per {noun}, in their order")  # fmt: skip
    return _checked(values, dtype, what, owners, noun)


def _given(weights: Mapping[Any, Any], owner: Any, what: str, *, edge: bool) -> Any:
    """``owner``'s value in ``weights``: an edge's under (u, v) or (v, u), the same if both."""
    keys = (owner, owner[::-1]) if edge else (owner,)
    found = [weights[k] for k in keys if k in weights]
    if not found:
        raise ValueError(f"{what} has no value for {'edge' if edge else 'vertex'} {owner!r}")
    if len(found) == 2 and found[0] != found[1]:
        raise ValueError(f"{what} gives edge {owner!r} two values, {found[0]!r} as {owner!r} "
                         f"and {found[1]!r} as {owner[::-1]!r}: give one")  # fmt: skip
    return found[0]


def _checked(
    values: Sequence[Any], dtype: np.dtype[Any], what: str, owners: Sequence[Any], noun: str
) -> tuple[float, ...]:
    """The weights, each finite: floats, or for an integer dtype exact ints (not through a
    float, which would round past 2^53)."""
    one = what.removesuffix("s")
    out: list[float] = []
    for owner, value in zip(owners, values, strict=True):
        named = f"the {one} of {noun} {owner!r} is {value!r}"
        try:
            x = float(value)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"{named}, not a finite number") from None
        if not math.isfinite(x):
            raise ValueError(f"{named}: each {one} is a finite number")
        if dtype.kind == "i":
            exact = int(value) if isinstance(value, int | np.integer) else int(x)
            if exact != x and not isinstance(value, int | np.integer):
                raise ValueError(f"{named}, not an integer: pass dtype='float32' or 'float64'")
            out.append(exact)
        else:
            out.append(x)
    return tuple(out)


def _bounded(dtype: np.dtype[Any], what: str, *weights: Sequence[float]) -> None:
    """Refuse a network's weights whose sums could leave ``dtype``'s finite range: each sum
    the contraction forms is of some of them, so the sum of all their absolute values bounds
    it. An integer type saturates at its extremes, the semiring's infinities; a float type's
    sum rounds up, to an infinity past its largest value."""
    every = [x for group in weights for x in group]
    if dtype.kind == "i":
        total = sum(abs(int(x)) for x in every)  # exact
        bound = int(np.iinfo(dtype).max) - 2
        over, shown = total > bound, f"{total:,}"
        most = f"{bound:,}, the most {dtype} sums without saturating"
    else:
        # Scaled by 2^-64, the sum of float64s cannot overflow; the exact sum, rounded once
        # (the bits lost below 2^-1010 count for nothing against the bound).
        scaled = math.fsum(math.ldexp(abs(x), -64) for x in every)
        info = np.finfo(dtype)
        # Each weight is rounded into dtype, then added along the contraction: every rounding
        # grows a magnitude by 1 + eps / 2 at most, (1 + eps / 2)^(n + 1) <= e^((n + 1) eps / 2)
        # for the n weights' sum; a few more for this bound's own roundings in float64.
        limit = float(info.max) * math.exp(-(len(every) + 8) * float(info.eps) / 2)
        over, shown = scaled > math.ldexp(limit, -64), f"{Decimal(scaled) * 2**64:.6g}"
        most = f"{limit:.6g}, the most {dtype} sums with no risk of rounding to an infinity"
    if over:
        wider = {"int32": "dtype='int64'", "int64": "dtype='float64'",
                 "float32": "dtype='float64', or scale the weights down",
                 "float64": "weights scaled down (float64 is the widest dtype)"}  # fmt: skip
        raise ValueError(
            f"{what} sum to {shown} in absolute value, more than {most}: pass {wider[dtype.name]}"
        )
