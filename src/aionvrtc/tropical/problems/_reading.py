"""What the problem builders read, checked: a graph (a networkx graph or an edge list) as
vertices and edges, weights (a sequence, a mapping, a networkx attribute), the dtype, and the
bound on the weights' sums; and what a builder names: each vertex's index, its neighbours."""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any, Protocol

import numpy as np
import opt_einsum

from ..networks import MAX_INDICES
from ..products import SEMIRINGS, numpy_dtype

__all__ = [
    "Array",
    "Edge",
    "Graph",
    "Vertex",
    "Weights",
    "check_bounded",
    "checked_dtype",
    "edge_terms",
    "indices_of",
    "neighbours_of",
    "read_graph",
    "weights_of",
]

Vertex = Hashable
Edge = tuple[Hashable, Hashable]
Array = np.ndarray[Any, Any]

# What the weights of a builder may be: one per vertex (or edge) in order, a mapping from
# vertex (or edge) to weight, or the name of a networkx attribute.
Weights = Sequence[float] | Mapping[Any, float] | str | None


class Graph(Protocol):
    """What the builders read of a networkx graph."""

    @property
    def nodes(self) -> Any: ...

    @property
    def edges(self) -> Any: ...


def read_graph(
    graph: Graph | Iterable[Edge], vertices: Iterable[Vertex] | None
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


def checked_dtype(dtype: Any) -> np.dtype[Any]:
    found = numpy_dtype(dtype, "dtype")
    if found.kind not in "fi" or found not in SEMIRINGS["maxplus"].dtypes:
        raise ValueError(f"dtype must be one of float32, float64, int32, int64, got {found}")
    return found


def indices_of(found: Sequence[Vertex]) -> dict[Vertex, str]:
    return {v: str(opt_einsum.get_symbol(i)) for i, v in enumerate(found)}


def edge_terms(
    found: Sequence[Vertex], edges: Sequence[Edge], index: Mapping[Vertex, str]
) -> tuple[list[str], int]:
    """A network of one term per edge, then one per vertex on no edge (every vertex has its
    index; a graph without such vertices has the edges' terms alone, so orders kept in files
    stay valid): the terms, and how many vertices are alone."""
    touched = {v for edge in edges for v in edge}
    alone = [v for v in found if v not in touched]
    return [index[u] + index[v] for u, v in edges] + [index[v] for v in alone], len(alone)


def neighbours_of(found: Sequence[Vertex], edges: Iterable[Edge]) -> dict[Vertex, list[Vertex]]:
    """Each vertex's neighbours, in the order of ``found``."""
    place = {v: i for i, v in enumerate(found)}
    around: dict[Vertex, list[Vertex]] = {v: [] for v in found}
    for u, v in edges:
        around[u].append(v)
        around[v].append(u)
    return {v: sorted(n, key=place.__getitem__) for v, n in around.items()}


def weights_of(
    graph: Any,
    owners: Sequence[Any],
    weights: Weights,
    dtype: np.dtype[Any],
    what: str,
    *,
    edges: bool,
    noun: str | None = None,
) -> tuple[float, ...]:
    """One weight per vertex (or edge) of ``owners``, from what the builder was given: none
    (1 each), a networkx attribute's name, a mapping (an edge's key either way round), or a
    sequence in their order."""
    if noun is None:
        noun, plural = ("edge", "edges") if edges else ("vertex", "vertices")
    else:
        plural = f"{noun}s"
    if weights is None:
        values: list[Any] = [1.0] * len(owners)
    elif isinstance(weights, str):
        if not hasattr(graph, "nodes"):
            given = "there is no graph" if graph is None else "the graph is an edge list"
            raise ValueError(f"{what} names an attribute ({weights!r}), but {given}: pass a "
                             "sequence or a mapping")  # fmt: skip
        table = graph.edges if edges else graph.nodes
        lacking = next((o for o in owners if weights not in table[o]), None)
        if lacking is not None:
            raise ValueError(f"{noun} {lacking!r} has no attribute {weights!r} ({what})")
        values = [table[o][weights] for o in owners]
    elif isinstance(weights, Mapping):
        values = [_given(weights, o, what, edge=edges, noun=noun) for o in owners]
    else:
        values = list(weights)
        if len(values) != len(owners):
            raise ValueError(f"{what} has {len(values)} values for {len(owners)} {plural}: one "
                             f"per {noun}, in their order")  # fmt: skip
    return _checked(values, dtype, what, owners, noun)


def _given(weights: Mapping[Any, Any], owner: Any, what: str, *, edge: bool, noun: str) -> Any:
    """``owner``'s value in ``weights``: an edge's under (u, v) or (v, u), the same if both."""
    keys = (owner, owner[::-1]) if edge else (owner,)
    found = [weights[k] for k in keys if k in weights]
    if not found:
        raise ValueError(f"{what} has no value for {noun} {owner!r}")
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


def check_bounded(dtype: np.dtype[Any], what: str, *weights: Sequence[float]) -> None:
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
