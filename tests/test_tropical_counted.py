"""Counted products on the CPU: the NumPy reference's counts against the definition (every
semiring and type, given counts, modulo a prime, batches, int64's bound), the arguments'
checks (made before any GPU is needed), the kernels' modular reduction and launch arguments,
and every counted kernel compiled for sm_90 (real NVRTC)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aionvrtc import tropical
from aionvrtc.tropical import SEMIRINGS, reference
from aionvrtc.tropical.products._counted import (  # the launch arithmetic, without a GPU
    WARPS_FROM_K,
    WARPS_UP_TO,
    counted_args,
    counted_form,
    counted_grid,
)
from aionvrtc.tropical.products._counts import barrett
from aionvrtc.tropical.products._specs import (
    COUNTED_FORMS,
    COUNTINGS,
    TOP_BOUNDS,
    TOP_LANES,
    counted_spec,
    top_spec,
)
from aionvrtc.tropical.products._top import top_lanes

from .support.tropical_data import brute_force_counts, compile_each_for_sm_90, operands

CASES = [(s, np.dtype(d)) for s, ring in SEMIRINGS.items() for d in ring.dtypes]
IDS = [f"{s}-{d}" for s, d in CASES]
# A prime near 2^31 (the largest below it) and a small one, whose residues wrap often.
PRIMES = (2_147_483_647, 7)


def special(rng: np.random.Generator, ring: str, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``x`` with about a fifth of its entries the zero or the other infinity (whose product
    with the zero is NaN for floats, and counts nothing)."""
    semiring = SEMIRINGS[ring]
    x = x.copy()
    x[rng.random(x.shape) < 0.1] = semiring.zero(x.dtype)
    if ring in ("maxplus", "minplus"):
        # (the other infinity: the zero of the other of max-plus and min-plus)
        other = SEMIRINGS["minplus" if ring == "maxplus" else "maxplus"].zero(x.dtype)
        x[rng.random(x.shape) < 0.1] = other
    return x


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
def test_reference_counts_match_the_definition(ring: str, dtype: np.dtype[Any]) -> None:
    seed = 20261207
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    for m, k, n in [(1, 1, 1), (3, 7, 5), (6, 12, 4), (5, 1, 3), (0, 3, 2), (2, 0, 3)]:
        a, b = operands(rng, ring, dtype, (m, k), (k, n), ties=True)
        a, b = special(rng, ring, a), special(rng, ring, b)
        given = (rng.integers(0, 6, a.shape), rng.integers(0, 6, b.shape))
        for counts in (True, given):
            for modulus in (None, *PRIMES):
                value, count = reference.matmul(a, b, ring, counts=counts, modulus=modulus)
                want = brute_force_counts(
                    a, b, ring, None if counts is True else given, modulus=modulus
                )
                np.testing.assert_array_equal(value, want[0])
                np.testing.assert_array_equal(count, want[1])
                assert count.dtype == np.int64
        # The values are the product's, counted or not.
        np.testing.assert_array_equal(value, reference.matmul(a, b, ring))


def test_reference_counts_batches_each_with_its_own_counts() -> None:
    rng = np.random.default_rng(7)
    a = rng.integers(0, 3, (3, 4, 6)).astype(np.int32)
    b = rng.integers(0, 3, (1, 6, 5)).astype(np.int32)  # broadcast over the batch
    na, nb = rng.integers(0, 9, a.shape), rng.integers(0, 9, b.shape)
    value, count = reference.matmul(a, b, "minplus", counts=(na, nb))
    assert value.shape == count.shape == (3, 4, 5)
    for i in range(3):
        want = brute_force_counts(a[i], b[0], "minplus", (na[i], nb[0]))
        np.testing.assert_array_equal(value[i], want[0])
        np.testing.assert_array_equal(count[i], want[1])


def test_an_exact_count_past_int64_is_minus_one_never_a_wrapped_number() -> None:
    a = np.zeros((1, 2), np.int64)
    b = np.zeros((2, 1), np.int64)  # both products 0: a tie, their counts add

    def count(na: list[int], nb: list[int], modulus: int | None = None) -> int:
        given = (np.array([na], np.int64), np.array([[x] for x in nb], np.int64))
        return int(reference.matmul(a, b, counts=given, modulus=modulus)[1][0, 0])

    assert count([1 << 62, (1 << 62) - 1], [1, 1]) == (1 << 63) - 1  # the largest int64
    assert count([1 << 62, 1 << 62], [1, 1]) == -1  # 2^63: the sum overflows
    assert count([1 << 40, 1], [1 << 30, 1]) == -1  # 2^70: a product overflows
    assert count([-1, 5], [1, 1]) == -1  # a count that overflowed before stays -1
    # A negative count (an overflow's -1) read modulo p by its 64 bits, as the kernels read it.
    assert count([-1, 0], [1, 1], 7) == ((1 << 64) - 1) % 7
    # Modulo a prime the same counts are residues: 2^63 mod p.
    p = PRIMES[0]
    assert count([1 << 62, 1 << 62], [1, 1], p) == (1 << 63) % p
    assert count([1 << 40, 1], [1 << 30, 1], p) == ((1 << 70) + 1) % p


def test_an_exact_overflow_at_a_worse_value_is_dropped_with_it() -> None:
    # The overflowing product ties no better value: the best one's count stands.
    a = np.array([[0, 5]], np.int32)
    b = np.array([[0], [0]], np.int32)
    given = (np.array([[1 << 62, 3]]), np.array([[4], [2]]))
    value, count = reference.matmul(a, b, "maxplus", counts=given)
    assert (int(value[0, 0]), int(count[0, 0])) == (5, 6)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"counts": "yes"}, TypeError, "counts must be True .* or a pair"),
        ({"counts": True, "argmax": True}, ValueError, "pass counts= or argmax=True, not both"),
        ({"counts": True, "modulus": 1}, ValueError, r"modulus must be from 2 to 2\^31 - 1"),
        ({"counts": True, "modulus": 1 << 31}, ValueError, r"from 2 to 2\^31 - 1 .*got 2147483648"),
        ({"counts": True, "modulus": 7.0}, TypeError, "modulus must be an int .*got float"),
        ({"counts": True, "modulus": True}, TypeError, "modulus must be an int .*got bool"),
        ({"modulus": 7}, ValueError, "modulus is for counts: pass counts=True"),
    ],
)
def test_counted_arguments_are_checked_before_any_gpu_is_needed(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    a, b = np.zeros((2, 3), np.float32), np.zeros((3, 4), np.float32)
    with pytest.raises(error, match=message):
        tropical.matmul_sync(a, b, **options)
    with pytest.raises(error, match=message):
        reference.matmul(a, b, **options)


def test_counted_operands_and_count_arrays_are_named() -> None:
    a, b = np.zeros((2, 3), np.float32), np.zeros((3, 4), np.float32)
    with pytest.raises(TypeError, match=r"a must be a cupy\.ndarray, not numpy\.ndarray"):
        tropical.matmul_sync(a, b, counts=True)
    na, nb = np.ones((2, 3), np.int64), np.ones((3, 4), np.int64)
    with pytest.raises(ValueError, match=r"counts of a must be int64 of a's shape \(2, 3\), got "
                       r"int32 of shape \(2, 3\)"):  # fmt: skip
        reference.matmul(a, b, counts=(na.astype(np.int32), nb))
    with pytest.raises(ValueError, match=r"counts of b must be int64 of b's shape \(3, 4\), got "
                       r"int64 of shape \(4, 3\)"):  # fmt: skip
        reference.matmul(a, b, counts=(na, nb.T))
    with pytest.raises(ValueError, match=r"with its int64 counts.* more than max_bytes=64"):
        reference.matmul(a, b, counts=True, max_bytes=64)


@pytest.mark.parametrize("p", [2, 3, 7, 65_537, 2_147_483_629, 2_147_483_647])
def test_the_kernels_modular_reduction_is_exact_for_every_64_bit_value(p: int) -> None:
    # tropical_counted.cu's reduce(), in Python's integers: q = mu x / 2^64 leaves x - q p
    # below 2p, and one subtraction below p.
    modulus, mu = barrett(p)
    assert modulus == p
    mu %= 1 << 64  # the kernel reads the slot unsigned
    assert mu == (1 << 64) // p
    rng = np.random.default_rng(p)
    values = [0, 1, p - 1, p, p + 1, (p - 1) ** 2, (1 << 62) - 1, 1 << 63, (1 << 64) - 1]
    values += [int(x) for x in rng.integers(0, 1 << 63, 2000, dtype=np.uint64)]
    values += [int(x) << 1 | 1 for x in rng.integers(0, 1 << 63, 2000, dtype=np.uint64)]
    for x in values:
        q = (x * mu) >> 64
        r = x - q * p
        assert 0 <= r < 2 * p
        assert (r - p if r >= p else r) == x % p
    assert barrett(None) == (0, 0)


def test_counted_launches_take_the_form_and_grid_of_their_shape() -> None:
    assert counted_form(4096, 2) == "rows"  # a tensor network's tall step
    assert counted_form(3, 1 << 20) == "rows"
    assert counted_form(15, 15) == "rows"
    # Tiles count after the value product, unless they accumulate or K passes 32-bit tallies.
    assert counted_form(16, 16) == counted_form(16, 16, (1 << 31) - 1) == "count"
    assert counted_form(16, 16, accumulate=True) == counted_form(64, 64, 1 << 31) == "tiles"
    assert counted_form(4096, 2, accumulate=True) == "rows"
    # A long sum into few outputs: a warp each.
    assert counted_form(4, 4, WARPS_FROM_K) == counted_form(4, 4, 1 << 20, 4096) == "warps"
    assert counted_form(4, 4, WARPS_FROM_K - 1) == counted_form(4, 4, 1 << 20, 4097) == "rows"
    # A block per 64 x 64 tile; column tiles and batches past 65535 are looped over.
    assert counted_grid("tiles", 130, 64, 1) == (3, 1, 1)
    assert counted_grid("tiles", 64, 65536 * 64 + 1, 70000) == (1, 65535, 65535)
    assert counted_grid("count", 130, 64, 1) == (3, 1, 1)
    # A thread per output, up to 2^20 blocks of 256.
    assert counted_grid("rows", 1000, 3, 2) == (24, 1, 1)
    assert counted_grid("rows", 1 << 30, 2, 1) == (1 << 20, 1, 1)
    assert counted_grid("warps", 4, 4, 4) == (8, 1, 1)  # 64 outputs, a warp each
    # The k best choose alike.
    assert top_lanes(16, WARPS_FROM_K) == top_lanes(WARPS_UP_TO, 1 << 20) == 32
    assert top_lanes(16, WARPS_FROM_K - 1) == top_lanes(WARPS_UP_TO + 1, 1 << 20) == 1
    each = [(i, i + 1, i + 2) for i in range(0, 18, 3)]
    args = counted_args((5, 6, 7, 8), each, modulus=7, accumulate=True)
    assert args == [5, 6, 7, 8, *range(18), 7, (1 << 64) // 7, 1]
    assert counted_args((5, 6, 7, 8), each, modulus=None, accumulate=False)[-3:] == [0, 0, 0]
    # mu for p = 2 is 2^63, one past a signed slot: stored as its two's complement.
    assert counted_args((1, 1, 1, 1), each, modulus=2, accumulate=False)[-2] == -(1 << 63)


def test_every_counted_kernel_is_in_all_specs_and_compiles_for_sm_90(tmp_path: Path) -> None:
    specs = tropical.all_specs()
    counted = [s for s in specs if s.name == "tropical_counted.cu"]
    # Every semiring and type, each counting (ones, exact, modular) in each form; the k-best
    # kernels of each bound on k.
    assert len(counted) == len(CASES) * len(COUNTINGS) * len(COUNTED_FORMS)
    tops = [s for s in specs if s.name == "tropical_top.cu"]
    assert len(tops) == len(CASES) * len(TOP_BOUNDS) * len(TOP_LANES)
    assert top_spec(SEMIRINGS["minplus"], np.dtype(np.int64), kmax=8).name_expressions == (
        "tropical_top<long long, MinPlus, 8, 1>",
    )
    warps = top_spec(SEMIRINGS["andor"], np.dtype(np.bool_), kmax=4, lanes=32)
    assert warps.name_expressions == ("tropical_top<bool, AndOr, 4, 32>",)
    with pytest.raises(ValueError, match=r"no k-best kernel with 8 threads per output: \(1, 32\)"):
        top_spec(SEMIRINGS["minplus"], np.dtype(np.int64), kmax=4, lanes=8)
    with pytest.raises(ValueError, match=r"no k-best kernel for lists of 5: the bounds are"):
        top_spec(SEMIRINGS["minplus"], np.dtype(np.int64), kmax=5)
    ring, dtype = SEMIRINGS["maxplus"], np.dtype(np.float32)
    assert counted_spec(ring, dtype, counting="exact", form="tiles").name_expressions == (
        "tropical_counted<float, MaxPlus, Exact>",
    )
    assert counted_spec(ring, dtype, counting="modular", form="count").name_expressions == (
        "tropical_count<float, MaxPlus, Modular>",
    )
    with pytest.raises(ValueError, match="no counted kernel 'tiles' counting 'twice'"):
        counted_spec(ring, dtype, counting="twice", form="tiles")
    # One type of each semiring here (the exhaustive test compiles every spec).
    chosen = [
        counted_spec(SEMIRINGS[s], np.dtype(d), counting=c, form=f)
        for s, d in (
            ("maxplus", "int64"),
            ("minplus", "float64"),
            ("maxmul", "int32"),
            ("andor", "bool"),
        )
        for c in COUNTINGS
        for f in COUNTED_FORMS
    ]
    for s, d in (("maxplus", "float32"), ("andor", "bool")):
        chosen += [
            top_spec(SEMIRINGS[s], np.dtype(d), kmax=k, lanes=w)
            for k, w in itertools.product(TOP_BOUNDS, TOP_LANES)
        ]
    compile_each_for_sm_90(chosen, tmp_path)
