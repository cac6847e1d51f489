"""The NumPy tropical einsum (the oracle of the GPU one) against a brute-force loop over every
assignment of the indices, and by hand: matmul, the index forms, a tropical tensor network, the
bounds on what it makes."""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aionvrtc import tropical
from aionvrtc.tropical import SEMIRINGS, reference
from aionvrtc.tropical.networks import _contraction as contraction  # the NumPy einsum's steps
from aionvrtc.tropical.networks import _reference as numpy_einsum  # and the einsum on them
from aionvrtc.tropical.reference import einsum

from .support.einsum import CASES, CYCLE5, IDS, PETERSEN, brute_force, expressions
from .support.tropical_data import operands as random_operands


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
@settings(derandomize=True, max_examples=400, deadline=None)
@given(data=st.data())
def test_einsum_matches_brute_force(ring: str, dtype: Any, data: st.DataObject) -> None:
    dtype = np.dtype(dtype)
    subscripts, operands = data.draw(expressions(ring, dtype))
    want = brute_force(subscripts, operands, ring)
    got = einsum(subscripts, *operands, semiring=ring)
    assert isinstance(got, np.ndarray)
    assert got.dtype == dtype
    assert got.shape == np.shape(np.einsum(subscripts, *(np.zeros(x.shape) for x in operands)))
    np.testing.assert_array_equal(got, want)
    if dtype.kind == "f":
        assert not np.isnan(got).any()
    # Tiny chunks: the operand-by-operand path, cut into blocks of a few products.
    chunk = data.draw(st.sampled_from([1, 2, 5]), label="CHUNK_ELEMENTS")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(contraction, "CHUNK_ELEMENTS", chunk)
        np.testing.assert_array_equal(einsum(subscripts, *operands, semiring=ring), want)


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
def test_matmul_subscripts_equal_matmul(
    ring: str, dtype: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(11)
    a, b = random_operands(rng, ring, dtype, (7, 9), (9, 5))
    want = reference.matmul(a, b, ring)
    np.testing.assert_array_equal(einsum("ij,jk->ik", a, b, semiring=ring), want)
    np.testing.assert_array_equal(einsum("ij,jk", a, b, semiring=ring), want)
    np.testing.assert_array_equal(einsum("jk,ij->ki", b, a, semiring=ring), want.T)
    a3, b3 = random_operands(rng, ring, dtype, (3, 4, 6), (3, 6, 2))
    batched = einsum("bij,bjk->bik", a3, b3, semiring=ring)
    np.testing.assert_array_equal(batched, reference.matmul(a3, b3, ring))
    monkeypatch.setattr(contraction, "CHUNK_ELEMENTS", 4)  # operand by operand, in blocks
    np.testing.assert_array_equal(einsum("ij,jk->ik", a, b, semiring=ring), want)
    np.testing.assert_array_equal(einsum("bij,bjk->bik", a3, b3, semiring=ring), batched)


def test_index_forms() -> None:
    inf = np.inf
    m = np.array([[1.0, 5.0, -2.0], [0.0, -inf, 4.0], [7.0, 2.0, 3.0]])
    assert einsum("ii->i", m).tolist() == [1.0, -inf, 3.0]  # the diagonal
    assert einsum("ii->", m).tolist() == 3.0  # its max: the tropical trace
    assert einsum("ii->", m, semiring="minplus").tolist() == -inf
    assert einsum("ii", m).tolist() == 3.0  # implicit: i appears twice, so it is summed
    assert einsum("ij->", m).tolist() == 7.0
    assert einsum("ij->i", m).tolist() == [5.0, 4.0, 7.0]
    assert einsum("ij->j", m, semiring="minplus").tolist() == [0.0, -inf, -2.0]
    np.testing.assert_array_equal(einsum("ij->ji", m), m.T)
    np.testing.assert_array_equal(einsum("ji", m), m.T)  # implicit: sorted, so a transpose
    u, v = np.array([1.0, 2.0]), np.array([10.0, 20.0, 30.0])
    np.testing.assert_array_equal(einsum("i,j->ij", u, v), u[:, None] + v[None, :])
    np.testing.assert_array_equal(einsum("i,j", u, v, semiring="maxmul"), np.outer(u, v))
    assert einsum("i,i->", u, u[::-1]).tolist() == 3.0  # a tropical dot product
    assert einsum("i,i->i", u, u).tolist() == [2.0, 4.0]
    scalar = einsum(",->", np.float32(2), np.float32(3))
    assert (scalar.shape, scalar.dtype, scalar.tolist()) == ((), np.float32, 5.0)
    assert einsum("i,->i", u, np.float64(-1)).tolist() == [0.0, 1.0]
    assert einsum("", np.int64(4)).tolist() == 4
    a = np.arange(6.0).reshape(2, 3)
    b = np.arange(12.0).reshape(3, 4)
    np.testing.assert_array_equal(einsum("ij,jk", a, b), einsum("ij,jk->ik", a, b))
    # An index repeated within one operand and shared with another: the diagonal's entries.
    np.testing.assert_array_equal(einsum("ii,i->i", m, v), np.diagonal(m) + v)
    t = np.arange(27, dtype=np.int32).reshape(3, 3, 3)
    assert einsum("iji->ij", t).tolist() == [[t[i, j, i] for j in range(3)] for i in range(3)]
    assert einsum("iii->i", t).tolist() == [0, 13, 26]


def test_implicit_output_sorts_like_numpy() -> None:
    # By character code, as numpy.einsum: upper case before lower case.
    cases: list[tuple[str, list[tuple[int, ...]]]] = [
        ("Ba,aC", [(2, 3), (3, 5)]),
        ("aB,Ca", [(3, 2), (5, 3)]),
        ("ba,aC", [(2, 3), (3, 5)]),
        ("zY,YX", [(2, 3), (3, 5)]),
        ("cab", [(2, 3, 5)]),
    ]
    for subscripts, shapes in cases:
        operands = [np.zeros(shape) for shape in shapes]
        want = np.einsum(subscripts, *operands).shape
        assert einsum(subscripts, *operands).shape == want, subscripts


def test_empty_sums_and_empty_outputs() -> None:
    for ring, ring_def in SEMIRINGS.items():
        dtype = ring_def.dtypes[0]
        zero = ring_def.zero(dtype)
        a, b = np.zeros((2, 0), dtype), np.zeros((0, 3), dtype)
        np.testing.assert_array_equal(
            einsum("ij,jk->ik", a, b, semiring=ring), np.full((2, 3), zero)
        )
        assert einsum("i->", np.zeros(0, dtype), semiring=ring).tolist() == zero
        assert einsum("i,j->ij", np.zeros(0, dtype), np.zeros(4, dtype), semiring=ring).shape == (
            0,
            4,
        )
        assert einsum("ij,jk->ik", b.T, b, semiring=ring).shape == (3, 3)


def test_nan_inputs_count_as_the_zero() -> None:
    x = np.array([np.nan, 1.0, np.nan], np.float32)
    assert einsum("i->i", x).tolist() == [-np.inf, 1.0, -np.inf]
    assert einsum("i->", x, semiring="minplus").tolist() == 1.0
    assert einsum("i,i->i", x, x, semiring="maxmul").tolist() == [0.0, 1.0, 0.0]


def test_saturation_and_infinities_in_a_chain() -> None:
    lo, hi = np.iinfo(np.int32).min, np.iinfo(np.int32).max
    x = np.array([hi - 5, -hi, lo, 7], np.int32)
    ten = np.array(10, np.int32)
    assert einsum("i,->i", x, ten).tolist() == [hi, -hi + 10, lo, 17]
    assert einsum("i,->i", x, ten, semiring="minplus").tolist() == [hi - 1, -hi + 10, lo + 10, 17]
    # Left to right: (hi - 5 + 10) saturates to hi before the -20 arrives.
    assert einsum(",,->", x[0], ten, np.int32(-20)).tolist() == hi - 20
    f = np.array([-np.inf, 1.0], np.float32)
    g = np.array([np.inf, 2.0], np.float32)
    assert einsum("i,i->", f, g).tolist() == 3.0  # -inf + inf counts as the zero


def _mis_network(
    n: int, edges: Sequence[tuple[int, int]], dtype: Any
) -> tuple[str, list[np.ndarray[Any, Any]]]:
    """The tropical tensor network of the maximum independent set: a vertex scores 1 when in
    the set, an edge forbids both its ends (-inf); the max-plus contraction is the largest set."""
    names = string.ascii_lowercase[:n]
    neg = -np.inf if np.dtype(dtype).kind == "f" else np.iinfo(dtype).min
    vertex = np.array([0, 1], dtype)
    edge = np.array([[0, 0], [0, neg]], dtype)
    subscripts = ",".join([*names, *(names[u] + names[v] for u, v in edges)]) + "->"
    return subscripts, [vertex] * n + [edge] * len(edges)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize(("n", "edges", "size"), [(5, CYCLE5, 2), (10, PETERSEN, 4)])
def test_maximum_independent_set(
    dtype: Any, n: int, edges: list[tuple[int, int]], size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    subscripts, tensors = _mis_network(n, edges, dtype)
    assert einsum(subscripts, *tensors).tolist() == size
    monkeypatch.setattr(contraction, "CHUNK_ELEMENTS", 3)  # operand by operand
    assert einsum(subscripts, *tensors).tolist() == size


def test_large_contractions_go_operand_by_operand(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    for ring, dtype in CASES:
        a, b = random_operands(rng, ring, dtype, (6, 5), (5, 7))
        c, d = random_operands(rng, ring, dtype, (7, 4), (4, 3, 3))
        cases = [
            ("ij,jk,kl->il", (a, b, c)),
            ("ij,jk,kl->", (a, b, c)),
            ("ij,jk,kl,lmm->im", (a, b, c, d)),
            ("ij,jk,kl,lmn->nji", (a, b, c, d)),
            ("ij,kl->li", (a, c)),
        ]
        # Each fits in one broadcast (the brute-force test covers that path), then not.
        wants = [einsum(e, *ops, semiring=ring) for e, ops in cases]
        with monkeypatch.context() as patch:
            patch.setattr(contraction, "CHUNK_ELEMENTS", 16)
            for (e, ops), want in zip(cases, wants, strict=True):
                got = einsum(e, *ops, semiring=ring)
                np.testing.assert_array_equal(got, want, err_msg=f"{ring} {dtype} {e}")


# -- bounds ------------------------------------------------------------------------------------

LIMIT = "(raise it where the machine has the memory)"


def _never(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a contraction began that the bound should have refused")


def test_an_output_over_max_bytes_is_refused_before_any_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The case: 40 indices of size 2 in one output, 2**40 elements (18 s, then NumPy's
    # MemoryError). Refused before anything is contracted or allocated: by construction here.
    monkeypatch.setattr(numpy_einsum, "contract", _never)
    letters = string.ascii_letters[:40]
    with pytest.raises(ValueError, match="^" + re.escape(
        f"einsum output {letters!r} would hold 1,099,511,627,776 elements (8,796,093,022,208 "
        f"bytes at 8 each), more than max_bytes=1,073,741,824 {LIMIT}; every order of "
        "contraction ends with it: compute it in slices (fix some output indices by indexing "
        "the operands) or contract a smaller network"
    ) + "$"):  # fmt: skip
        einsum(",".join(letters) + "->" + letters, *[np.zeros(2)] * 40)
    assert reference.MAX_BYTES == 1 << 30


def test_max_bytes_bounds_each_result_inclusively() -> None:
    a, b = np.arange(4.0), np.arange(4.0)  # an outer product of 16 float64: 128 bytes
    np.testing.assert_array_equal(einsum("i,j->ij", a, b, max_bytes=128), a[:, None] + b)
    with pytest.raises(ValueError, match=re.escape(
        f"einsum output 'ij' would hold 16 elements (128 bytes at 8 each), more than "
        f"max_bytes=127 {LIMIT}; "
    )):  # fmt: skip
        einsum("i,j->ij", a, b, max_bytes=127)


def test_an_intermediate_over_max_bytes_names_its_step_and_the_order_to_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = np.random.default_rng(11)
    i, j, ij = (rng.integers(-9, 9, size=s) for s in ((64,), (64,), (64, 64)))
    want = einsum("i,j,ij->", i, j, ij)
    outer = "einsum intermediate 'ij' of step 0 (i,j->ij) would hold 4,096 elements (32,768 "
    small = f"bytes at 8 each), more than max_bytes=32,767 {LIMIT}; "
    with pytest.raises(ValueError, match="^" + re.escape(
        outer + small + "pass a path with smaller intermediates (tropical.einsum_plan(subscripts, "
        "*shapes, optimize='auto-hq').path), or contract the network in slices"
    ) + "$"):  # fmt: skip
        einsum("i,j,ij->", i, j, ij, path=[(0, 1), (0, 1)], max_bytes=32_767)
    # Another path keeps every intermediate a vector.
    assert einsum("i,j,ij->", i, j, ij, path=[(0, 2), (0, 1)], max_bytes=32_767) == want
    # Without a path, operand by operand: the same outer product first.
    monkeypatch.setattr(contraction, "CHUNK_ELEMENTS", 16)
    with pytest.raises(ValueError, match="^" + re.escape(
        outer + small + "without path= the reference contracts left to right: pass path= "
        "(tropical.einsum_plan(subscripts, *shapes, optimize='auto-hq').path) for an order with "
        "smaller intermediates, or contract the network in slices"
    ) + "$"):  # fmt: skip
        einsum("i,j,ij->", i, j, ij, max_bytes=32_767)
    assert einsum("i,j,ij->", i, j, ij) == want


# 65 indices, one more than an array has dimensions (any non-ASCII character is an index).
SIXTY_FIVE = "".join(map(chr, range(0x100, 0x100 + 65)))


def test_more_distinct_indices_than_opt_einsum_names_are_refused_while_parsing() -> None:
    # The planner renames each index to opt_einsum.get_symbol(i), one character each; past
    # MAX_INDICES that was chr() past U+10FFFF ("chr() arg not in range"). Python's str holds
    # the surrogates get_symbol skips, so subscripts can name more indices than it has.
    limit = tropical.networks.MAX_INDICES
    letters = string.ascii_letters + "".join(
        c for c in map(chr, range(128, 0x110000)) if not c.isspace()
    )
    assert len(letters) > limit
    given = letters[: limit + 1]
    chunks = [given[i : i + 64] for i in range(0, len(given), 64)]
    message = (
        "einsum subscripts name 1,112,065 distinct indices, more than the 1,112,064 "
        "opt_einsum.get_symbol names (one character per index, which the planner renames them "
        "to): contract the network in parts"
    )
    one = np.ones((1,) * 64, np.float32)  # parsing comes first: the shapes are never read
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        einsum(",".join(chunks) + "->", *[one] * len(chunks))
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        tropical.einsum_plan(",".join(chunks) + "->", *[one.shape] * len(chunks))


def test_more_indices_than_a_broadcast_takes() -> None:
    # 66 indices of size 1: too many for one broadcast (NumPy's 64 dimensions), so the default
    # order goes operand by operand, each step within 64; a path joining all 66 is refused.
    x, y = SIXTY_FIVE[:33], SIXTY_FIVE[33:] + "z"
    subscripts = f"{x},{y},{x[:32]}{y[:32]}->"
    operands = [np.full((1,) * 33, 2), np.full((1,) * 33, 3), np.full((1,) * 64, 4)]
    assert einsum(subscripts, *operands) == 9
    with pytest.raises(ValueError, match="^" + re.escape(
        f"einsum step 0 ({x},{y},{x[:32]}{y[:32]}->) broadcasts 66 indices at once, more than the "
        "64 dimensions a NumPy array has; pass a path with smaller intermediates"
    )):  # fmt: skip
        einsum(subscripts, *operands, path=[(0, 1, 2)])


ERRORS: list[tuple[Any, type[Exception], str]] = [
    (
        lambda: einsum("ij->i", np.ones((2, 2)), semiring="plusmax"),
        ValueError,
        "semiring must be one of maxplus, minplus, maxmul, andor, got 'plusmax'",
    ),
    (
        lambda: einsum(["i", "j"], np.ones(2)),  # type: ignore[arg-type]  # the point
        TypeError,
        "einsum subscripts must be a str such as 'ij,jk->ik', got list",
    ),
    (
        lambda: einsum("...ij->ij", np.ones((2, 2))),
        ValueError,
        "einsum subscripts '...ij->ij' use an ellipsis '...', which is not supported; "
        "name every dimension with a letter",
    ),
    (
        lambda: einsum("i->i->i", np.ones(2)),
        ValueError,
        "einsum subscripts 'i->i->i' have more than one '->'",
    ),
    (
        lambda: einsum("i1->i", np.ones((2, 2))),
        ValueError,
        "einsum subscripts 'i1->i' contain '1'; indices are the letters a-z and A-Z and any "
        "non-ASCII character (opt_einsum.get_symbol(i) names the i-th), operands are separated "
        "by ',' and the output follows '->'",
    ),
    (
        lambda: einsum("i>j", np.ones((2, 2))),
        ValueError,
        "einsum subscripts 'i>j' contain '>'; indices are the letters",
    ),
    (
        lambda: einsum("ij,jk->ik", np.ones((2, 2))),
        ValueError,
        "einsum subscripts 'ij,jk->ik' name 2 operand(s) but 1 were given",
    ),
    (
        lambda: einsum("ij->ii", np.ones((2, 2))),
        ValueError,
        "einsum output index 'i' appears more than once in 'ij->ii'; "
        "take a diagonal on the input side instead ('ii->i')",
    ),
    (
        lambda: einsum("ij->k", np.ones((2, 2))),
        ValueError,
        "einsum output index 'k' appears in no operand in 'ij->k'; "
        "every output index must be an index of some operand",
    ),
    (
        lambda: einsum("ij,jk", np.ones((2, 2)), np.ones((2, 2), np.float32)),
        TypeError,
        "einsum operands must have one dtype, got float64 (operand 0) and float32 (operand 1); "
        "convert them with .astype()",
    ),
    (
        lambda: einsum("i", np.ones(2, np.float16)),
        TypeError,
        "einsum operand 0 has dtype float16; maxplus takes float32, float64, int32, int64",
    ),
    (
        lambda: einsum("i", np.ones(2, bool)),
        TypeError,
        "einsum operand 0 has dtype bool; maxplus takes float32, float64, int32, int64",
    ),
    (
        lambda: einsum("i", np.ones(2), semiring="andor"),
        TypeError,
        "einsum operand 0 has dtype float64; andor takes bool",
    ),
    (
        lambda: einsum("ij,jk->ik", np.ones((2, 3)), np.ones(3)),
        ValueError,
        "einsum operand 1 has 1 dimension(s) (shape (3,)) but its subscripts 'jk' name 2; "
        "give one letter per dimension",
    ),
    (
        lambda: einsum("ij,jk->ik", np.ones((2, 3)), np.ones((4, 2))),
        ValueError,
        "einsum index 'j' has size 3 in operand 0 and 4 in operand 1; "
        "an index must have one size everywhere",
    ),
    (
        lambda: einsum("ii->i", np.ones((2, 3))),
        ValueError,
        "einsum index 'i' has size 2 in operand 0 and 3 in operand 0",
    ),
    (
        lambda: einsum(SIXTY_FIVE, np.ones(2)),
        ValueError,
        "einsum operand 0's subscripts name 65 indices, more than the 64 dimensions an array can "
        "have (NumPy's and CuPy's bound); give one letter per dimension",
    ),
    (
        lambda: einsum(",".join(SIXTY_FIVE) + "->" + SIXTY_FIVE, *[np.ones(1)] * 65),
        ValueError,
        "einsum output names 65 indices, more than the 64 dimensions an array can have (NumPy's "
        "and CuPy's bound); sum some of them away (name an output without them after '->')",
    ),
    (
        lambda: einsum(",".join(SIXTY_FIVE), *[np.ones(1)] * 65),
        ValueError,
        "einsum implicit output (each index that appears once) has 65 indices, more than the 64 "
        "dimensions an array can have (NumPy's and CuPy's bound); sum some of them away",
    ),
    (
        lambda: einsum("i", np.ones(2), max_bytes="1GB"),  # type: ignore[arg-type]  # the point
        TypeError,
        "max_bytes must be an int (bytes), got str",
    ),
    (
        lambda: einsum("i", np.ones(2), max_bytes=1e9),  # type: ignore[arg-type]  # the point
        TypeError,
        "max_bytes must be an int (bytes), got float",
    ),
]


@pytest.mark.parametrize(("call", "error", "message"), ERRORS)
def test_errors(call: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        call()
