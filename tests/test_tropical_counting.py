"""``tropical.reference.einsum(..., count=True)``: the number of assignments attaining each
value, against a brute-force loop over every assignment, along orders and in blocks, and the
int64 bound at 2^63."""

from __future__ import annotations

import itertools
import math
import re
import string
import time
import weakref
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aionvrtc.tropical import SEMIRINGS
from aionvrtc.tropical.networks import _contraction as contraction  # the NumPy einsum's steps
from aionvrtc.tropical.networks import _walks as walks  # the walk back of the counts
from aionvrtc.tropical.reference import configurations, einsum

from .support.einsum import (
    CASES,
    IDS,
    PETERSEN,
    brute_force,
    every_product,
    exact_operands,
    expressions,
    output_shape,
)


def brute_force_counts(
    subscripts: str, operands: Sequence[np.ndarray[Any, Any]], ring: str
) -> np.ndarray[Any, Any]:
    """For each output cell, how many assignments of all the indices give a product equal to
    the cell's value (``brute_force``'s), none where that value is the zero; one assignment at
    a time (``every_product``)."""
    value = brute_force(subscripts, operands, ring)
    zero = SEMIRINGS[ring].zero(operands[0].dtype)
    counts = np.zeros(output_shape(subscripts, operands), np.int64)
    for _, cell, p in every_product(subscripts, operands, ring):
        if value[cell] != zero and p == value[cell]:
            counts[cell] += 1
    return counts


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
@settings(derandomize=True, max_examples=300, deadline=None)
@given(data=st.data())
def test_counts_match_brute_force(ring: str, dtype: Any, data: st.DataObject) -> None:
    dtype = np.dtype(dtype)
    subscripts, drawn = data.draw(expressions(ring, dtype))
    operands = exact_operands(data, ring, dtype, drawn)
    want_value = brute_force(subscripts, operands, ring)
    want = brute_force_counts(subscripts, operands, ring)
    got_value, got = einsum(subscripts, *operands, semiring=ring, count=True)
    np.testing.assert_array_equal(got_value, want_value)
    np.testing.assert_array_equal(einsum(subscripts, *operands, semiring=ring), want_value)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, want)
    # Tiny chunks: operand by operand, each step in blocks whose counts are merged.
    chunk = data.draw(st.sampled_from([1, 2, 5]), label="CHUNK_ELEMENTS")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(contraction, "CHUNK_ELEMENTS", chunk)
        blocked_value, blocked = einsum(subscripts, *operands, semiring=ring, count=True)
    np.testing.assert_array_equal(blocked_value, want_value)
    np.testing.assert_array_equal(blocked, want)
    path = draw_path(data, len(operands))
    along_value, along = einsum(subscripts, *operands, semiring=ring, path=path, count=True)
    np.testing.assert_array_equal(along_value, want_value)
    np.testing.assert_array_equal(along, want)


def brute_force_top(
    subscripts: str, operands: Sequence[np.ndarray[Any, Any]], ring: str, k: int
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """For each output cell, its k best distinct products over all assignments, best first,
    with how many assignments give each; padded with the zero, of count 0."""
    semiring = SEMIRINGS[ring]
    dtype = operands[0].dtype
    zero = semiring.zero(dtype)
    tallies: dict[tuple[int, ...], Counter[Any]] = {}
    for _, cell, p in every_product(subscripts, operands, ring):
        if p != zero and p == p:  # noqa: PLR0124  # p == p is False for a NaN
            tallies.setdefault(cell, Counter())[p.item()] += 1
    shape = output_shape(subscripts, operands)
    best = np.full([*shape, k], zero, dtype)
    counts = np.zeros([*shape, k], np.int64)
    for cell, tally in tallies.items():
        ranked = sorted(tally.items(), reverse=semiring.maximise)[:k]
        for j, (value, many) in enumerate(ranked):
            best[(*cell, j)], counts[(*cell, j)] = value, many
    return best, counts


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
@settings(derandomize=True, max_examples=200, deadline=None)
@given(data=st.data())
def test_the_k_best_match_brute_force(ring: str, dtype: Any, data: st.DataObject) -> None:
    dtype = np.dtype(dtype)
    subscripts, drawn = data.draw(expressions(ring, dtype))
    operands = exact_operands(data, ring, dtype, drawn)
    k = data.draw(st.sampled_from([1, 2, 3, 8]), label="top")
    want_values, want_counts = brute_force_top(subscripts, operands, ring, k)
    got_values, got_counts = einsum(subscripts, *operands, semiring=ring, top=k)
    assert got_values.dtype == dtype
    assert got_counts.dtype == np.int64
    np.testing.assert_array_equal(got_values, want_values)
    np.testing.assert_array_equal(got_counts, want_counts)
    # top=1 is count=True's value and count, on an axis of one.
    value, count = einsum(subscripts, *operands, semiring=ring, count=True)
    one_value, one_count = einsum(subscripts, *operands, semiring=ring, top=1)
    np.testing.assert_array_equal(one_value[..., 0], value)
    np.testing.assert_array_equal(one_count[..., 0], count)
    chunk = data.draw(st.sampled_from([1, 2, 5]), label="CHUNK_ELEMENTS")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(contraction, "CHUNK_ELEMENTS", chunk)
        blocked = einsum(subscripts, *operands, semiring=ring, top=k)
    np.testing.assert_array_equal(blocked[0], want_values)
    np.testing.assert_array_equal(blocked[1], want_counts)
    path = draw_path(data, len(operands))
    along = einsum(subscripts, *operands, semiring=ring, path=path, top=k)
    np.testing.assert_array_equal(along[0], want_values)
    np.testing.assert_array_equal(along[1], want_counts)


def test_top_bounds_its_lists_and_takes_any_index() -> None:
    # Each operand as lists of top values and counts: 768 bytes an element at top=64.
    with pytest.raises(ValueError, match=r"operand 0 \('i'\) as lists of top=64 would hold"):
        einsum("i->", np.zeros(1 << 20, np.float32), top=64, max_bytes=1 << 20)
    # The list axis has no letter of its own: U+FFFF is an index like any other.
    y = np.array([[0.0, 1.0], [2.0, 0.0], [1.0, 1.0]], np.float32)
    for k in (2, 3):
        want = einsum("ab->ab", y, top=k)
        got = einsum("\uffffb->\uffffb", y, top=k)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_one_operand_along_an_empty_path() -> None:
    x = np.array([[1, 2], [3, 0]], np.float32)
    assert einsum("ij->i", x, path=[]).tolist() == [2.0, 3.0]
    assert [a.tolist() for a in einsum("ij->i", x, path=[], count=True)] == [[2.0, 3.0], [1, 1]]
    assert einsum("ij->i", x, path=[], top=2)[0].tolist() == [[2.0, 1.0], [3.0, 0.0]]
    assert configurations("ij->", x, path=[])[2].tolist() == [[1, 0]]


def test_top_is_checked() -> None:
    x = np.zeros(2, np.float32)
    with pytest.raises(ValueError, match="top must be from 1 to 64, got 0"):
        einsum("i->", x, top=0)
    with pytest.raises(ValueError, match="top must be from 1 to 64, got 65"):
        einsum("i->", x, top=65)
    with pytest.raises(TypeError, match="top must be an int"):
        einsum("i->", x, top=2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not both"):
        einsum("i->", x, top=2, count=True)


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
@settings(derandomize=True, max_examples=150, deadline=None)
@given(data=st.data())
def test_counting_keeps_the_value_on_every_special_value(
    ring: str, dtype: Any, data: st.DataObject
) -> None:
    # Infinities, saturation and NaN: the value is einsum's, counts never negative, and none
    # where the value is the zero.
    dtype = np.dtype(dtype)
    subscripts, operands = data.draw(expressions(ring, dtype))
    value, counts = einsum(subscripts, *operands, semiring=ring, count=True)
    np.testing.assert_array_equal(value, einsum(subscripts, *operands, semiring=ring))
    assert (counts >= 0).all()
    assert (counts[value == SEMIRINGS[ring].zero(dtype)] == 0).all()


def draw_path(data: st.DataObject, n: int) -> list[tuple[int, ...]]:
    """A random order: two (or, once in a while, three) of the operands left at a time; for
    one operand, no step at all (its own sums are then the reference's to add)."""
    path: list[tuple[int, ...]] = []
    while n > 1:
        take = data.draw(st.sampled_from([2, 2, 3]) if n > 2 else st.just(2), label="take")
        picked = data.draw(st.permutations(range(n)), label="order")[:take]
        path.append(tuple(sorted(picked)))
        n -= take - 1
    return path


def _independent_sets(n: int, edges: Sequence[tuple[int, int]]) -> tuple[str, list[Any]]:
    letters = [chr(ord("a") + v) for v in range(n)]
    terms = letters + [letters[u] + letters[v] for u, v in edges]
    vertex = np.array([0, 1], np.float32)
    edge = np.array([[0, 0], [0, -np.inf]], np.float32)
    return ",".join(terms) + "->", [vertex] * n + [edge] * len(edges)


def test_the_petersen_graph_has_five_maximum_independent_sets_along_every_order() -> None:
    # Its independence number is 4, attained by exactly 5 sets (a known count).
    subscripts, operands = _independent_sets(10, PETERSEN)
    value, count = einsum(subscripts, *operands, count=True)
    assert (float(value), int(count)) == (4.0, 5)
    rng = np.random.default_rng(47)
    for _ in range(5):  # other orders: random pairs until one operand is left
        path, left = [], len(operands)
        while left > 1:
            i, j = sorted(rng.choice(left, size=2, replace=False).tolist())
            path.append((i, j))
            left -= 1
        assert einsum(subscripts, *operands, path=path, count=True) == (4.0, 5)
    # The empty set is the only one of size 0: min-plus, with +inf forbidding, finds it.
    forbid = np.array([[0, 0], [0, np.inf]], np.float32)
    operands = [operands[0]] * 10 + [forbid] * len(PETERSEN)
    assert einsum(subscripts, *operands, semiring="minplus", count=True) == (0.0, 1)


def test_counts_are_exact_past_int64_in_python_ints() -> None:
    # n free bits, each of value 0 for both settings: 2^n assignments attain the value 0.
    def free(n: int) -> tuple[str, list[Any]]:
        import opt_einsum

        letters = [opt_einsum.get_symbol(i) for i in range(n)]
        return ",".join(letters) + "->", [np.zeros(2, np.int64)] * n

    value, count = einsum(*free(62)[:1], *free(62)[1], semiring="maxplus", count=True)
    assert (int(value), int(count)) == (0, 1 << 62)
    assert count.dtype == np.int64  # (within int64: counted in it)
    for n in (63, 64, 100, 200):  # past it: residues modulo primes, joined at the end
        value, count = einsum(*free(n)[:1], *free(n)[1], semiring="maxplus", count=True)
        assert (int(value), count.dtype, count.shape) == (0, object, ())
        assert int(count) == 1 << n
    # Within one broadcast: 2^61 ways before, times the 4 of a 2 x 2 operand's own sum.
    subscripts, operands = free(61)
    _, count = einsum(subscripts.replace("->", ",\u0100\u0101->"), *operands,
                      np.zeros((2, 2), np.int64), count=True)  # fmt: skip
    assert int(count) == 1 << 63
    # Along an explicit order, with an output v: 2^63 ways where v = 0 (u free besides the
    # 62 bits), 2^62 where v = 1 (the entry where u = 1 is the zero).
    subscripts, operands = free(62)
    cut = np.array([[0, 0], [0, np.iinfo(np.int64).min]], np.int64)
    path = [(0, 62)] + [(0, len(operands) - k) for k in range(1, 62)] + [(0, 1)]
    value, count = einsum(subscripts.replace("->", ",\u0100,\u0100\u0101->\u0101"), *operands,
                          np.zeros(2, np.int64), cut, path=path, count=True)  # fmt: skip
    assert value.tolist() == [0, 0]
    assert count.tolist() == [1 << 63, 1 << 62]
    # None at all past int64 (one operand all the zero): 0, a scalar.
    subscripts, operands = free(64)
    nothing = np.full(2, np.iinfo(np.int64).min, np.int64)
    value, count = einsum(subscripts, *operands[:-1], nothing, count=True)
    assert (int(value), int(count), count.shape) == (np.iinfo(np.int64).min, 0, ())
    # The k best count within int64: past it, refused.
    with pytest.raises(OverflowError, match=r"passes 2\^63 - 1, more than int64 holds"):
        einsum(*free(63)[:1], *free(63)[1], semiring="maxplus", top=2)


def _grid_edges(n: int) -> list[tuple[int, int]]:
    across = [(r * n + c, r * n + c + 1) for r in range(n) for c in range(n - 1)]
    return across + [(r * n + c, (r + 1) * n + c) for r in range(n - 1) for c in range(n)]


def _independent_sets_of_grid(n: int) -> int:
    """The independent sets of the n x n grid graph, row by row (a transfer matrix over the
    rows without two neighbours), in Python's integers."""
    rows = [m for m in range(1 << n) if m & (m >> 1) == 0]
    ways = dict.fromkeys(rows, 1)
    for _ in range(n - 1):
        ways = {m: sum(w for k, w in ways.items() if k & m == 0) for m in rows}
    return sum(ways.values())


def test_the_independent_sets_of_grids_are_counted_exactly_past_int64() -> None:
    from aionvrtc.tropical import einsum_plan, problems

    # OEIS A006506, which the transfer matrix agrees with.
    assert [_independent_sets_of_grid(n) for n in range(1, 6)] == [2, 7, 63, 1234, 55447]
    for n in range(1, 13):
        # Weight 0 on every vertex: every independent set attains the maximum, 0.
        problem = problems.independent_set(_grid_edges(n), [0.0] * n * n, vertices=range(n * n))
        plan = einsum_plan(problem.subscripts, *problem.operands)
        value, count = einsum(problem.subscripts, *problem.operands, count=True, path=plan.path)
        assert float(value) == 0.0
        assert int(count) == _independent_sets_of_grid(n), n
        assert count.dtype == (object if n >= 11 else np.int64), n  # (past 2^63 from n = 11)
    assert int(count) > 1 << 86
    # Every optimal configuration: refused past the limit, naming the exact count.
    problem = problems.independent_set(_grid_edges(11), [0.0] * 121, vertices=range(121))
    plan = einsum_plan(problem.subscripts, *problem.operands)
    many = f"{_independent_sets_of_grid(11):,} assignments attain the value 0.0, more than limit"
    with pytest.raises(ValueError, match="^" + re.escape(many)):
        configurations(problem.subscripts, *problem.operands, path=plan.path, limit=10)


def test_residues_name_every_count_below_the_product_of_their_primes() -> None:
    from aionvrtc.tropical.networks._residues import Joined, moduli

    def joined(residues: list[np.ndarray[Any, Any]], primes: tuple[int, ...]) -> Any:
        made = Joined(primes, residues[0].shape)
        for r in residues:
            made.add(r)
        return made.counts()

    for bound in (1 << 63, 1 << 64, 1 << 90, 3**200, 1 << 1000):
        primes = moduli(bound)
        assert math.prod(primes) > bound
        assert math.prod(primes[:-1]) <= bound  # (no more of them than it needs)
        assert all(p < 1 << 31 for p in primes)
        assert len(set(primes)) == len(primes)
        # Prime: no factor up to the square root of 2^31.
        small = np.arange(2, 46341, dtype=np.int64)
        assert all((p % small != 0).all() for p in primes)
    rng = np.random.default_rng(54)
    primes = moduli(1 << 200)
    for _ in range(50):
        want = [int(rng.integers(0, 1 << 62)) << int(rng.integers(0, 138)) for _ in range(6)]
        residues = [np.array([w % p for w in want], np.int64).reshape(2, 3) for p in primes]
        got = joined(residues, primes)
        assert got.shape == (2, 3)
        assert got.ravel().tolist() == want
    small = joined([np.array([5, 7], np.int64) % p for p in primes], primes)
    assert small.dtype == np.int64  # (every count within int64: an int64 array)
    assert small.tolist() == [5, 7]
    # 0-d, each of them: 0, a multiple of the first prime (its residue 0), and past int64.
    for count in (0, primes[0] * 5, primes[0] << 80, (1 << 63) + 1):
        got = joined([np.array(count % p, np.int64) for p in primes], primes)
        assert (got.shape, int(got)) == ((), count)
        assert got.dtype == (object if count > (1 << 63) - 1 else np.int64)


def test_count_bounds_the_counts_bytes_too() -> None:
    # 2^24 float32 cells are 64 MiB; with their int64 counts 192 MiB.
    x = np.zeros(1 << 12, np.float32)
    assert einsum("i,j->ij", x, x, max_bytes=100 << 20).shape == (4096, 4096)
    with pytest.raises(ValueError, match="bytes"):
        einsum("i,j->ij", x, x, max_bytes=100 << 20, count=True)


def brute_force_rows(
    subscripts: str, operands: Sequence[np.ndarray[Any, Any]], ring: str, letters: str
) -> list[tuple[int, ...]]:
    """Every assignment (a value per index, in the order of ``letters``) whose product equals
    the scalar contraction's value, none where that is the zero; in increasing order."""
    value = brute_force(subscripts, operands, ring)[()]
    if value == SEMIRINGS[ring].zero(operands[0].dtype):
        return []
    every = every_product(subscripts, operands, ring)
    return sorted(tuple(at[c] for c in letters) for at, _, p in every if p == value)


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
@settings(derandomize=True, max_examples=150, deadline=None)
@given(data=st.data())
def test_every_configuration_matches_brute_force(
    ring: str, dtype: Any, data: st.DataObject
) -> None:
    dtype = np.dtype(dtype)
    subscripts, drawn = data.draw(expressions(ring, dtype))
    subscripts = subscripts.partition("->")[0] + "->"  # a scalar contraction
    operands = exact_operands(data, ring, dtype, drawn)
    value, letters, rows = configurations(subscripts, *operands, semiring=ring)
    assert letters == "".join(dict.fromkeys(subscripts.replace(",", "").replace("->", "")))
    np.testing.assert_array_equal(value, einsum(subscripts, *operands, semiring=ring))
    assert rows.dtype == np.int64
    assert rows.shape[1] == len(letters)
    assert [tuple(r) for r in rows.tolist()] == brute_force_rows(
        subscripts, operands, ring, letters
    )
    assert len(rows) == einsum(subscripts, *operands, semiring=ring, count=True)[1]
    path = draw_path(data, len(operands))
    chunk = data.draw(st.sampled_from([1, 2, 5]), label="CHUNK_ELEMENTS")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(contraction, "CHUNK_ELEMENTS", chunk)
        along = configurations(subscripts, *operands, semiring=ring, path=path)
    np.testing.assert_array_equal(along[2], rows)


def test_configurations_along_orders_and_their_limit() -> None:
    subscripts, operands = _independent_sets(10, PETERSEN)
    value, letters, rows = configurations(subscripts, *operands)
    assert (float(value), letters, len(rows)) == (4.0, "abcdefghij", 5)
    for row in rows:  # each an independent set of 4
        assert row.sum() == 4
        assert not any(row[u] and row[v] for u, v in PETERSEN)
    path = [(0, 1)] * (len(operands) - 1)  # a chain: the first two, then with the next
    again = configurations(subscripts, *operands, path=path)
    np.testing.assert_array_equal(again[2], rows)
    with pytest.raises(ValueError, match=r"5 assignments attain the value 4\.0, more than limit=4"):
        configurations(subscripts, *operands, limit=4)
    assert len(configurations(subscripts, *operands, limit=5)[2]) == 5
    with pytest.raises(ValueError, match="limit must be at least 1, got 0"):
        configurations(subscripts, *operands, limit=0)
    with pytest.raises(TypeError, match="limit must be an int"):
        configurations(subscripts, *operands, limit=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="takes a scalar contraction"):
        configurations("ij->i", np.zeros((2, 2), np.float32))
    # No feasible assignment: no rows.
    forbid = np.full((2, 2), -np.inf, np.float32)
    none = configurations("ij->", forbid)
    assert (float(none[0]), none[2].shape) == (-np.inf, (0, 2))


def test_configurations_past_the_limit_or_max_bytes_are_refused_before_the_walk() -> None:
    # 40 free binary indices of equal weight: 2^40 optima, counted before any is listed (the
    # walk ran until memory ran out).
    letters = string.ascii_letters[:40]
    free = [np.zeros(2, np.float32)] * 40
    rows = 2**40 * 40
    started = time.perf_counter()
    with pytest.raises(ValueError, match="^" + re.escape(
        f"configurations' rows (1,099,511,627,776 assignments of 40 indices) would hold "
        f"{rows:,} elements ({8 * rows:,} bytes at 8 each), more than max_bytes=1,073,741,824 "
        "(raise it where the machine has the memory); count them alone with "
        "einsum(..., count=True)"
    ) + "$"):  # fmt: skip
        configurations(",".join(letters) + "->", *free, limit=2**62)
    assert time.perf_counter() - started < 1.0  # the 2^40 count, not the walk
    with pytest.raises(ValueError, match=r"1,099,511,627,776 assignments attain the value 0\.0"):
        configurations(",".join(letters) + "->", *free)
    # 4 of them: 16 rows of 4 indices, 512 bytes; refused at a byte less.
    with pytest.raises(ValueError, match=r"\(16 assignments of 4 indices\) would hold 64 "):
        configurations("a,b,c,d->", *free[:4], max_bytes=511)
    every = configurations("a,b,c,d->", *free[:4], max_bytes=512)[2]
    assert every.tolist() == [list(bits) for bits in itertools.product((0, 1), repeat=4)]


def test_configurations_let_each_step_result_go_once_the_walk_has_passed_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A chain along the Petersen graph's independent sets: step i takes step i - 1's result
    # and operand i + 1, and is read by the walk back at steps i + 1 (as an operand) and i (its
    # own). Each call of the walk's inner function sees which step results are still alive.
    subscripts, operands = _independent_sets(10, PETERSEN)
    steps = len(operands) - 1
    alive: list[int] = []
    results: dict[int, weakref.ref[Any]] = {}
    attaining = walks._attaining

    def watched(ring: Any, step: Any, held: Any, *args: Any, **kwargs: Any) -> Any:
        if not results:  # the first call: every step's result is there
            # (the last one's is the value the call returns, alive to the end)
            last = len(operands) + steps - 1
            results.update({k: weakref.ref(x) for k, (x, _) in held.items()
                            if len(operands) <= k < last})  # fmt: skip
        alive.append(sum(ref() is not None for ref in results.values()))
        return attaining(ring, step, held, *args, **kwargs)

    monkeypatch.setattr(walks, "_attaining", watched)
    value, _, rows = configurations(subscripts, *operands, path=[(0, 1)] * steps)
    assert (float(value), len(rows)) == (4.0, 5)
    assert len(results) == steps - 1
    # Walking step j, steps 0 to j's results are alive (j + 1 of them), the later ones gone;
    # before, all of them until the call returned.
    assert list(dict.fromkeys(alive)) == list(range(steps - 1, 0, -1))
