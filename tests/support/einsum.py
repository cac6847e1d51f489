"""The tropical einsum tests' cases and checks: expressions and their shapes, the graphs whose
independent sets they count, random networks, layouts, and whether an assignment attains a value."""

from __future__ import annotations

import itertools
import math
import string
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from aionvrtc.tropical import (
    SEMIRINGS,
    EinsumPlan,
    einsum_plan,
    reference,
)
from aionvrtc.tropical.networks._terms import Step, Term, View
from aionvrtc.tropical.products import combine as _combine

from .tropical_data import host
from .tropical_data import operands as operand_pair

CASES = [(s, d) for s, ring in SEMIRINGS.items() for d in ring.dtypes]


IDS = [f"{s}-{d}" for s, d in CASES]


ALPHABET = "abcD"  # small, so the brute force stays fast; an upper-case letter sorts first


def special_values(ring: str, dtype: np.dtype[Any]) -> list[Any]:
    """A few ordinary values, the infinities, and values whose (x) overflows or is NaN."""
    if dtype == np.bool_:
        return [False, True]
    if dtype.kind == "f":
        big = float(np.finfo(dtype).max)
        if ring == "maxmul":  # defined for non-negative inputs; 0 * inf is NaN
            return [0.0, 0.5, 1.0, 3.0, big, np.inf]
        return [-np.inf, -big, -2.5, -1.0, 0.0, 1.0, 3.25, big, np.inf]  # -inf + inf is NaN
    info = np.iinfo(dtype)
    lo, hi = int(info.min), int(info.max)
    if ring == "maxmul":
        return [0, 1, 2, 7, math.isqrt(hi) + 1, hi // 2 + 1, hi]
    return [lo, lo + 1, lo // 2, -5, -1, 0, 2, 7, hi // 2 + 1, hi - 1, hi]


@st.composite
def expressions(
    draw: st.DrawFn, ring: str, dtype: np.dtype[Any]
) -> tuple[str, list[np.ndarray[Any, Any]]]:
    terms = [draw(st.text(ALPHABET, max_size=3)) for _ in range(draw(st.integers(1, 3)))]
    letters = sorted(set("".join(terms)))
    # Size 0 (an empty sum or an empty result) in a few of them, not in most.
    sizes = {c: draw(st.sampled_from([2, 3, 1, 2, 3, 1, 0])) for c in letters}
    subscripts = ",".join(terms)
    if draw(st.booleans()):
        output = draw(st.permutations(letters))[: draw(st.integers(0, len(letters)))]
        subscripts += "->" + "".join(output)
    elements = st.sampled_from(special_values(ring, dtype))
    operands = [
        draw(hnp.arrays(dtype, tuple(sizes[c] for c in t), elements=elements)) for t in terms
    ]
    return subscripts, operands


CYCLE5 = [(i, (i + 1) % 5) for i in range(5)]


PETERSEN = [*CYCLE5, *((i, i + 5) for i in range(5)), *((5 + i, 5 + (i + 2) % 5) for i in range(5))]


Array = np.ndarray[Any, Any]


def relayout(
    x: Array,
    perm: Sequence[int],
    flip: Sequence[bool],
    gap: bool,
    upload: Callable[[Array], Any] = np.asarray,
) -> Any:
    """A view holding ``x``'s values in another memory order: its axes stored in the order
    ``perm``, those marked in ``flip`` reversed (negative strides), and with ``gap`` every
    other element of the innermost stored axis skipped. ``upload`` moves the stored array to
    where the view is taken (``cupy.asarray`` for the GPU)."""
    x = np.asarray(x)
    if x.ndim == 0:
        return upload(np.array(x))
    axes = tuple(slice(None, None, -1) if f else slice(None) for f in flip)
    stored = np.ascontiguousarray(x[axes].transpose(list(perm)))
    if gap:
        padded = np.zeros((*stored.shape[:-1], 2 * stored.shape[-1]), stored.dtype)
        padded[..., ::2] = stored
        view = upload(padded)[..., ::2]
    else:
        view = upload(stored)
    inverse = [list(perm).index(axis) for axis in range(x.ndim)]
    return view.transpose(inverse)[axes]


def shuffled(
    rng: np.random.Generator, x: Array, upload: Callable[[Array], Any] = np.asarray
) -> Any:
    """``relayout`` of ``x`` in a layout drawn from ``rng``: its axes stored in a random
    order, each reversed or not, the innermost gapped or not."""
    perm = [int(i) for i in rng.permutation(x.ndim)]
    return relayout(x, perm, list(rng.random(x.ndim) < 0.5), bool(rng.random() < 0.5), upload)


@st.composite
def layouts(draw: st.DrawFn, ndim: int) -> tuple[list[int], list[bool], bool]:
    """Arguments of ``relayout`` for an operand of ``ndim`` axes."""
    perm = draw(st.permutations(range(ndim)))
    flip = draw(st.lists(st.booleans(), min_size=ndim, max_size=ndim))
    return list(perm), flip, ndim > 0 and draw(st.booleans())


ARGMAX_CASES = [
    (r, d) for r in ("maxplus", "minplus") for d in ("float32", "float64", "int32", "int64")
]


def network_values(
    rng: np.random.Generator, ring: str, dtype: Any, shapes: Sequence[tuple[int, ...]]
) -> list[Array]:
    """Small integers (any order of sums is exact, floats too), a tenth of them the
    semiring's zero: entries no assignment may use unless the value is the zero."""
    zero = SEMIRINGS[ring].zero(np.dtype(dtype))
    out = []
    for shape in shapes:
        x = rng.integers(-20, 21, size=shape).astype(dtype)
        out.append(np.where(rng.random(shape) < 0.1, zero, x).astype(dtype))
    return out


def check_assignment(
    subscripts: str, operands: Sequence[Array], ring: str, value: Array, assignment: Any
) -> None:
    """``assignment`` names every index within its size, and unless ``value`` is the zero,
    the operands' entries there are not the zero and sum to ``value`` (exact on the host)."""
    inputs = subscripts.partition("->")[0].split(",")
    sizes = {
        c: n for t, x in zip(inputs, operands, strict=True) for c, n in zip(t, x.shape, strict=True)
    }
    assert isinstance(assignment, dict)
    assert sorted(assignment) == sorted(sizes), assignment
    for index, at in assignment.items():
        assert isinstance(at, int), (index, at)
        assert 0 <= at < sizes[index], (index, at)
    found = np.asarray(value)
    assert found.shape == ()
    zero = SEMIRINGS[ring].zero(found.dtype)
    if found == zero:
        return
    entries = [x[tuple(assignment[c] for c in t)] for t, x in zip(inputs, operands, strict=True)]
    assert all(e != zero for e in entries), (assignment, entries)
    if found.dtype.kind == "f":
        total: float = sum(float(e) for e in entries)
        assert total == float(found), (assignment, entries)
    else:
        assert sum(int(e) for e in entries) == int(found), (assignment, entries)


def check_assignments(
    subscripts: str, operands: Sequence[Array], ring: str, values: Array, assignment: Any
) -> int:
    """``check_assignment`` for each element of a result with indices, whose assignment is each
    index's int64 array of the result's shape (argmax=True with output indices); an output
    index's array is the element's position. Returns how many elements are not the zero."""
    found = np.asarray(values)
    output = subscripts.partition("->")[2]
    assert isinstance(assignment, dict)
    for index, at in assignment.items():
        assert isinstance(at, np.ndarray), (index, type(at))
        assert (at.shape, at.dtype) == (found.shape, np.int64), (index, at.shape, at.dtype)
    attained = 0
    for position in np.ndindex(found.shape):
        each = {index: int(at[position]) for index, at in assignment.items()}
        assert [each[c] for c in output] == list(position), (position, each)
        check_assignment(subscripts, operands, ring, found[position], each)
        attained += int(found[position] != SEMIRINGS[ring].zero(found.dtype))
    return attained


def random_network(
    rng: np.random.Generator, count: int, indices: int
) -> tuple[str, list[tuple[int, ...]]]:
    """A scalar contraction of ``count`` tensors of one to three of ``indices`` indices
    (sizes 2 or 3), each index in some tensor, the first tensor's first index repeated (a
    diagonal)."""
    letters = list(string.ascii_letters[:indices])
    sizes = {c: int(rng.integers(2, 4)) for c in letters}
    terms = [
        "".join(rng.choice(letters, size=int(rng.integers(1, 4)), replace=False))
        for _ in range(count)
    ]
    for c in letters:
        if not any(c in t for t in terms):
            terms[int(rng.integers(count))] += c
    terms[0] = terms[0][0] + terms[0]
    return ",".join(terms) + "->", [tuple(sizes[c] for c in t) for t in terms]


def with_output(rng: np.random.Generator, subscripts: str, most: int = 2) -> str:
    """``subscripts`` of a scalar contraction with 1 to ``most`` of its indices kept in the
    output (drawn from ``rng``)."""
    inputs = subscripts.partition("->")[0]
    letters = sorted(set(inputs) - {","})
    kept = "".join(rng.choice(letters, size=int(rng.integers(1, most + 1)), replace=False))
    return f"{inputs}->{kept}"


def independent_sets(
    n: int, edges: Sequence[tuple[int, int]], ring: str, dtype: Any
) -> tuple[str, list[Array]]:
    """The tropical network of the maximum independent set (max-plus: a vertex in the set
    scores 1, an edge forbids both ends), or its negation (min-plus: -1, the minimum)."""
    names = string.ascii_lowercase[:n]
    zero = SEMIRINGS[ring].zero(np.dtype(dtype))
    sign = 1 if ring == "maxplus" else -1
    vertex = np.array([0, sign], dtype)
    edge = np.array([[0, 0], [0, zero]], dtype)
    subscripts = ",".join([*names, *(names[u] + names[v] for u, v in edges)]) + "->"
    return subscripts, [vertex] * n + [edge] * len(edges)


def kings_graph(side: int) -> tuple[str, list[tuple[int, ...]], list[tuple[int, ...]]]:
    """The MIS network of a side x side king's graph (a tensor per vertex and per edge) and a
    row-by-row elimination path: the chain of steps the groups shorten."""
    letters = [chr(0x100 + v) for v in range(side * side)]
    edges = [
        (r * side + c, (r + dr) * side + c + dc)
        for r in range(side)
        for c in range(side)
        for dr, dc in ((0, 1), (1, -1), (1, 0), (1, 1))
        if 0 <= r + dr < side and 0 <= c + dc < side
    ]
    terms = letters + [letters[u] + letters[v] for u, v in edges]
    shapes: list[tuple[int, ...]] = [(2,)] * len(letters) + [(2, 2)] * len(edges)
    live = list(terms)
    path: list[tuple[int, ...]] = []
    for v in letters:  # contract every tensor that holds v, then the next vertex
        holding = [n for n, t in enumerate(live) if v in t]
        while len(holding) > 1:
            a, b = holding[:2]
            merged = "".join(dict.fromkeys(live[a] + live[b]))
            path.append((a, b))
            live = [t for n, t in enumerate(live) if n not in (a, b)] + [merged]
            holding = [n for n, t in enumerate(live) if v in t]
        live[holding[0]] = live[holding[0]].replace(v, "")
    while len(live) > 1:
        path.append((0, 1))
        live = [*live[2:], ""]
    return ",".join(terms) + "->", shapes, path


def tensors(
    rng: np.random.Generator,
    ring: str,
    dtype: Any,
    shapes: Sequence[tuple[int, ...]],
    *,
    infinities: bool = True,
) -> list[Array]:
    """Random operands of ``shapes`` (tropical_data's values: the type's infinities sprinkled
    in unless ``infinities`` is false, non-negative for max-times)."""
    out = []
    for shape in shapes:
        # Drawn flat (tropical_data draws arrays of at least one dimension), then shaped.
        flat, _ = operand_pair(rng, ring, dtype, (math.prod(shape),), (1,), infinities=infinities)
        out.append(flat.reshape(shape))
    return out


def assert_same(got: Any, want: Array, what: str) -> None:
    """Exactly the reference's values, shape and dtype (``got`` on the GPU)."""
    values = host(got)
    assert (values.shape, values.dtype) == (want.shape, want.dtype), what
    np.testing.assert_array_equal(values, want, err_msg=what)


SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
}
"""


def in_eighths(subscripts: str, operands: Sequence[Array], ring: str) -> tuple[int, Any, Array]:
    """A budget of an eighth of ``operands``' largest intermediate, their plan sliced to it (4
    slices or more), and the unsliced reference's value: what cluster.einsum's tests split
    into tasks."""
    whole = einsum_plan(subscripts, *operands)
    budget = max(1, round(2**whole.space_complexity) // 8) * operands[0].itemsize
    plan = einsum_plan(subscripts, *operands, memory_limit=budget)
    assert plan.slicing is not None
    assert plan.slicing.count >= 4
    return budget, plan, reference.einsum(subscripts, *operands, semiring=ring, path=whole.path)


def _read(
    subscripts: str, operands: Sequence[np.ndarray[Any, Any]]
) -> tuple[list[str], str, dict[str, int]]:
    """The terms, the output (numpy.einsum's implicit one without ``->``) and each index's
    size."""
    lhs, arrow, rhs = subscripts.partition("->")
    terms = lhs.split(",")
    if not arrow:  # numpy.einsum's implicit output
        counts = Counter(lhs.replace(",", ""))
        rhs = "".join(sorted(c for c, n in counts.items() if n == 1))
    sizes = {
        c: n for t, x in zip(terms, operands, strict=True) for c, n in zip(t, x.shape, strict=True)
    }
    return terms, rhs, sizes


def output_shape(subscripts: str, operands: Sequence[np.ndarray[Any, Any]]) -> list[int]:
    _, rhs, sizes = _read(subscripts, operands)
    return [sizes[c] for c in rhs]


def every_product(
    subscripts: str, operands: Sequence[np.ndarray[Any, Any]], ring: str
) -> Iterator[tuple[dict[str, int], tuple[int, ...], Any]]:
    """Each assignment of all the indices (in sorted order of the indices, then of their
    values), the output cell it adds to, and the product of the operands' entries there as a
    NumPy scalar: formed left to right with ``_combine`` on 0-d arrays, nothing else shared
    with einsum (test_tropical_cpu.py checks it, through ``matmul``, against arithmetic on
    Python ints)."""
    semiring = SEMIRINGS[ring]
    terms, rhs, sizes = _read(subscripts, operands)
    letters = sorted(sizes)
    for values in itertools.product(*(range(sizes[c]) for c in letters)):
        at = dict(zip(letters, values, strict=True))
        factors = [
            np.asarray(x[tuple(at[c] for c in t)]) for t, x in zip(terms, operands, strict=True)
        ]
        p = factors[0]
        for f in factors[1:]:
            p = np.asarray(_combine(semiring, p, f))
        yield at, tuple(at[c] for c in rhs), p[()]


def brute_force(subscripts: str, operands: Sequence[np.ndarray[Any, Any]], ring: str) -> Any:
    """The definition, one assignment of all the indices at a time (``every_product``)."""
    semiring = SEMIRINGS[ring]
    dtype = operands[0].dtype
    out = np.full(output_shape(subscripts, operands), semiring.zero(dtype), dtype=dtype)
    for _, cell, new in every_product(subscripts, operands, ring):
        old = out[cell]
        if ring == "andor":
            out[cell] = old or new
        elif semiring.maximise:
            out[cell] = new if new > old else old  # a NaN never wins
        else:
            out[cell] = new if new < old else old
    return out


# -- a plan run in NumPy, as the GPU runs it ---------------------------------------------------

Trace = list[tuple[Step, Array, Array, Array]]


def _as_strided(x: Array, shape: Sequence[int], strides: Sequence[int]) -> Array:
    return np.lib.stride_tricks.as_strided(
        x, shape=tuple(shape), strides=tuple(s * x.itemsize for s in strides), writeable=False
    )


def _axes(x: Array, term: Term, sizes: dict[str, int]) -> Array:
    """``x`` with one axis per index of ``term``, read with the strides the plan says."""
    return _as_strided(x, [sizes[i] for i in term.indices], term.strides)


def _read_view(x: Array, term: Term, view: View, sizes: dict[str, int]) -> Array:
    if view.copy is not None:
        x = np.ascontiguousarray(
            _axes(x, term, sizes).transpose([term.indices.index(i) for i in view.copy])
        )
    return _as_strided(x, view.shape, view.strides)


def run_plan(
    plan: EinsumPlan,
    ring: str,
    arrays: Sequence[Array],
    trace: list[tuple[Step, Array, Array, Array]] | None = None,
) -> Array:
    """``plan`` run as the GPU runs it, step by step on the steps' strided 3-D views (copied
    first where the plan copies), each product by ``reference.matmul``: a plan that reads the
    wrong elements anywhere gives a wrong result. With ``trace``, each step's argmax (the
    kernels' rule: the smallest k attaining the value, -1 for the zero) is appended to it, as
    the GPU einsum records it for ``backtrace``, with the step's two 3-D operands."""
    semiring = SEMIRINGS[ring]
    dtype = arrays[0].dtype
    sizes = dict(plan.sizes)
    shape = tuple(sizes[i] for i in plan.output)
    if 0 in sizes.values():
        return np.full(shape, semiring.zero(dtype), dtype)
    # Operands by number: the inputs, then each step's result.
    live: dict[int, tuple[Array, Term]] = dict(enumerate(zip(arrays, plan.terms, strict=True)))
    for step in plan.steps:
        chosen = [live.pop(i) for i in step.operands]
        if step.second is None:
            assert len(chosen) == 1
            (x, term), k = chosen[0], step.first.shape[2]
            first = _read_view(x, term, step.first, sizes)
            ones = np.full(k, semiring.one(dtype), dtype)
            second = _as_strided(ones, (1, k, 1), (0, 1, 1))
        else:
            assert len(chosen) == 2
            if step.swapped:
                chosen.reverse()
            first = _read_view(*chosen[0], step.first, sizes)
            second = _read_view(*chosen[1], step.second, sizes)
        # The groups are what the views merge: batch, m, k (and k, n) in that order.
        b, m, k, n = (math.prod(sizes[i] for i in g) for g in (step.batch, step.m, step.k, step.n))
        if step.split is not None:  # K cut in parts, the batch index of the partials
            assert step.batch[0] == step.split  # then the batch indices, of size 1
            k //= b
        assert first.shape == (b, m, k), step
        assert second.shape in ((b, k, n), (1, k, n)), step  # the ones broadcast over a batch
        assert step.result == step.batch + step.m + step.n
        if trace is None:
            c = reference.matmul(first, second, ring)
        else:
            c, index = reference.matmul(first, second, ring, argmax=True)
            trace.append((step, index, first, second))
        c = np.ascontiguousarray(c)
        result = c.reshape([sizes[i] for i in step.result])
        strides = tuple(s // result.itemsize for s in result.strides)
        live[step.number] = (result, Term(step.result, strides))
    ((x, term),) = live.values()
    order = [term.indices.index(i) for i in plan.output]
    return _axes(x, term, sizes).transpose(order).copy()  # C order (a 0-d one stays 0-d)


def exact_values(ring: str, dtype: np.dtype[Any]) -> list[Any]:
    """The zero and small integers: values whose products are exact (no rounding, no
    saturation, no infinity but the zero), where counting along any order is."""
    if dtype == np.bool_:
        return [False, True]
    zero = SEMIRINGS[ring].zero(dtype)
    if ring == "maxmul":
        return [0, 1, 2, 3]
    return [zero, -2, -1, 0, 1, 2]


def exact_operands(
    data: st.DataObject, ring: str, dtype: np.dtype[Any], drawn: Sequence[np.ndarray[Any, Any]]
) -> list[np.ndarray[Any, Any]]:
    """Operands of the shapes drawn, their values drawn from the exact ones: ties are frequent."""
    values = exact_values(ring, dtype)
    return [
        np.asarray(data.draw(st.lists(st.sampled_from(values), min_size=x.size, max_size=x.size)),
                   dtype).reshape(x.shape)
        for x in drawn
    ]  # fmt: skip


def sliced_plan(subscripts: str, operands: Sequence[Any]) -> EinsumPlan:
    """``subscripts``'s plan over ``operands`` in slices of a quarter of its largest
    intermediate, else of half where no slicing of its order fits a quarter, else unsliced."""
    plan = einsum_plan(subscripts, *operands)
    itemsize = operands[0].itemsize
    for elements in (plan.largest_intermediate // 4, plan.largest_intermediate // 2):
        try:
            return einsum_plan(subscripts, *operands, memory_limit=itemsize * elements)
        except ValueError:  # no slicing of this order fits so little
            continue
    return plan
