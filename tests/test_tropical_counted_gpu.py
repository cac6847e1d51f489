"""Counted products on the GPU against the NumPy reference, on fresh random inputs (seeds
printed): every semiring and type, each counting (each entry once, given int64 counts, modulo a
prime) in every kernel form, strided views, batches, ``out=`` and ``accumulate``, K = 0, the
int64 bound, and a product whose kernel is not loaded running at once on the other form's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from aionvrtc import Compiler, tropical
from aionvrtc.tropical import SEMIRINGS, reference
from aionvrtc.tropical.products import _plan_cache
from aionvrtc.tropical.products._counted import counted_form
from aionvrtc.tropical.products._specs import counted_spec
from aionvrtc.tropical.products._top import top_lanes

from .support.einsum import (
    PETERSEN,
    independent_sets,
    network_values,
    random_network,
    shuffled,
    sliced_plan,
    with_output,
)
from .support.tropical_data import gpu, host, operands, until_loaded

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]

CASES = [(s, np.dtype(d)) for s, ring in SEMIRINGS.items() for d in ring.dtypes]
IDS = [f"{s}-{d}" for s, d in CASES]
# (M, K, N): the skinny form on tall, wide and small products, a warp per output on long sums
# into few, the tiled count pass on odd sizes past a tile and on a long K.
SIZES = [
    (1, 1, 1),
    (4100, 9, 3),
    (2, 20, 3000),
    (15, 40, 15),
    (3, 200, 5),
    (2, 5000, 1),
    (70, 33, 90),
    (130, 600, 65),
]
PRIME = 2_147_483_647


def draw(rng: np.random.Generator, ring: str, dtype: Any, m: int, k: int, n: int) -> Any:
    """Operands with many ties (counts above 1), and about a tenth of their entries the
    semiring's zero."""
    a, b = operands(rng, ring, dtype, (m, k), (k, n), ties=True)
    zero = SEMIRINGS[ring].zero(np.dtype(dtype))
    for x in (a, b):
        x[rng.random(x.shape) < 0.1] = zero
    return a, b


def assert_counted(got: Any, want: Any) -> None:
    np.testing.assert_array_equal(host(got[0]), want[0])
    np.testing.assert_array_equal(host(got[1]), want[1])


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
def test_counted_products_match_the_reference(
    rng: np.random.Generator, ring: str, dtype: Any
) -> None:
    forms = set()
    for m, k, n in SIZES:
        forms.add(counted_form(m, n, k))
        a, b = draw(rng, ring, dtype, m, k, n)
        given = (rng.integers(0, 1 << 20, a.shape), rng.integers(0, 1 << 20, b.shape))
        for counts in (True, given):
            on_gpu = True if counts is True else tuple(gpu(x) for x in given)
            for modulus in (None, PRIME):
                got = tropical.matmul_sync(gpu(a), gpu(b), ring, counts=on_gpu, modulus=modulus)
                want = reference.matmul(a, b, ring, counts=counts, modulus=modulus)
                assert_counted(got, want)
                # Into the zero with accumulate: the same, by the one-pass kernel.
                zero = SEMIRINGS[ring].zero(np.dtype(dtype))
                out = (gpu(np.full((m, n), zero, dtype)), gpu(np.zeros((m, n), np.int64)))
                tropical.matmul_sync(gpu(a), gpu(b), ring, counts=on_gpu, modulus=modulus,
                                     out=out, accumulate=True)  # fmt: skip
                assert_counted(out, want)
    assert forms == {"rows", "warps", "count"}


@pytest.mark.parametrize(("m", "k", "n"), [(70, 33, 90), (200, 300, 130)])
def test_exact_counts_of_2_31_and_more_are_multiplied_in_64_bits(
    rng: np.random.Generator, m: int, k: int, n: int
) -> None:
    # The count pass keeps counts below 2^31 in 32 bits; a k-tile holding a larger one (or a
    # -1) reads the int64 counts of its ties instead. A few large counts, so that most tiles
    # hold none, and some products and sums pass 2^63 (-1).
    a, b = draw(rng, "maxplus", np.int32, m, k, n)
    given = [rng.integers(0, 1 << 20, x.shape) for x in (a, b)]
    for x in given:
        large = rng.random(x.shape) < 0.002
        large.flat[0] = True
        x[large] = rng.integers(1 << 31, 1 << 45, int(large.sum()))
        x[rng.random(x.shape) < 0.001] = -1  # an earlier step's count past int64
    got = tropical.matmul_sync(gpu(a), gpu(b), counts=(gpu(given[0]), gpu(given[1])))
    want = reference.matmul(a, b, counts=(given[0], given[1]))
    assert_counted(got, want)


@pytest.mark.parametrize("ring", ["maxplus", "minplus", "andor"])
@pytest.mark.parametrize(("m", "k", "n"), [(300, 50, 70), (2000, 12, 5), (4, 300, 3)])
def test_views_and_broadcast_batches_are_read_in_place(
    rng: np.random.Generator, ring: str, m: int, k: int, n: int
) -> None:
    import cupy

    dtype = np.bool_ if ring == "andor" else np.int32
    a, b = draw(rng, ring, dtype, m, k, 2 * n)
    na, nb = rng.integers(0, 50, a.shape), rng.integers(0, 50, b.shape)
    # A transposed (k contiguous no more), B every other column, their counts likewise (each
    # tile of the count pass loaded along the stride that is 1).
    ga = cupy.asfortranarray(gpu(a))
    gna = cupy.asfortranarray(gpu(na))
    gb, gnb = gpu(b)[:, ::2], gpu(nb)[:, ::2]
    got = tropical.matmul_sync(ga, gb, ring, counts=(gna, gnb))
    assert_counted(got, reference.matmul(a, b[:, ::2], ring, counts=(na, nb[:, ::2])))
    # B transposed (contiguous along k), its counts likewise.
    gbt, gnbt = cupy.asfortranarray(gpu(b)), cupy.asfortranarray(gpu(nb))
    got = tropical.matmul_sync(gpu(a), gbt, ring, counts=(gpu(na), gnbt))
    assert_counted(got, reference.matmul(a, b, ring, counts=(na, nb)))
    # Three batches of A against one B (broadcast), the counts given per batch.
    a3, _ = draw(rng, ring, dtype, 3 * m, k, 1)
    a3 = a3.reshape(3, m, k)
    na3 = rng.integers(0, 50, a3.shape)
    got = tropical.matmul_sync(gpu(a3), gb[None], ring, counts=(gpu(na3), gnb[None]),
                               modulus=7)  # fmt: skip
    want = reference.matmul(a3, b[None, :, ::2], ring, counts=(na3, nb[None, :, ::2]), modulus=7)
    assert_counted(got, want)


@pytest.mark.parametrize(("m", "k", "n"), [(100, 30, 80), (3000, 8, 2)])
def test_out_and_accumulate_join_the_counts_there(
    rng: np.random.Generator, m: int, k: int, n: int
) -> None:
    import cupy

    a, b = draw(rng, "maxplus", np.int64, m, k, n)
    c, d = draw(rng, "maxplus", np.int64, m, k, n)
    out = (cupy.empty((m, n), np.int64), cupy.empty((m, n), np.int64))
    got = tropical.matmul_sync(gpu(a), gpu(b), counts=True, out=out)
    assert got[0] is out[0]
    assert got[1] is out[1]
    first = reference.matmul(a, b, counts=True)
    assert_counted(out, first)
    tropical.matmul_sync(gpu(c), gpu(d), counts=True, out=out, accumulate=True)
    second = reference.matmul(c, d, counts=True)
    # (C, counts) (+) (C', counts'): the better value's counts, both where they are equal.
    value = np.maximum(first[0], second[0])
    count = np.where(first[0] == value, first[1], 0) + np.where(second[0] == value, second[1], 0)
    count[value == SEMIRINGS["maxplus"].zero(np.dtype(np.int64))] = 0
    assert_counted(out, (value, count))


def test_a_sum_over_no_k_is_the_zero_counted_none(rng: np.random.Generator) -> None:
    import cupy

    a, b = cupy.empty((5, 0), np.float32), cupy.empty((0, 7), np.float32)
    value, count = tropical.matmul_sync(a, b, "minplus", counts=True)
    assert np.all(host(value) == np.inf)
    assert np.all(host(count) == 0)
    out = (cupy.full((5, 7), 3.0, np.float32), cupy.full((5, 7), 4, np.int64))
    tropical.matmul_sync(a, b, "minplus", counts=True, out=out, accumulate=True)
    assert np.all(host(out[0]) == 3.0)  # C (+) zero = C
    assert np.all(host(out[1]) == 4)
    empty = tropical.matmul_sync(cupy.empty((0, 3), np.float32), cupy.empty((3, 4), np.float32),
                                 counts=True)  # fmt: skip
    assert empty[0].shape == empty[1].shape == (0, 4)


@pytest.mark.parametrize(("m", "k", "n"), [(64, 40, 64), (1000, 40, 2)])
def test_an_exact_count_past_int64_is_minus_one_on_the_gpu(m: int, k: int, n: int) -> None:
    # Every product ties at 0; each count 2^58, so each output's sum of 40 is past 2^63.
    a, b = np.zeros((m, k), np.int32), np.zeros((k, n), np.int32)
    na, nb = np.full(a.shape, 1 << 29, np.int64), np.full(b.shape, 1 << 29, np.int64)
    got = tropical.matmul_sync(gpu(a), gpu(b), counts=(gpu(na), gpu(nb)))
    assert np.all(host(got[1]) == -1)
    assert_counted(got, reference.matmul(a, b, counts=(na, nb)))
    got = tropical.matmul_sync(gpu(a), gpu(b), counts=(gpu(na), gpu(nb)), modulus=PRIME)
    assert np.all(host(got[1]) == (40 << 58) % PRIME)


async def test_a_counted_product_waits_for_no_kernel_the_other_form_can_stand_in_for(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    async with Compiler(cache_dir=tmp_path) as compiler:
        a, b = draw(rng, "maxplus", np.float32, 3000, 16, 4)  # the skinny form's
        await tropical.matmul(gpu(a), gpu(b), counts=True, compiler=compiler)
        compiler.start_serving("error")  # a compile in front of the call would raise
        x, y = draw(rng, "maxplus", np.float32, 200, 16, 300)  # the tiled form's, not loaded
        got = await tropical.matmul(gpu(x), gpu(y), counts=True, compiler=compiler)
        assert_counted(got, reference.matmul(x, y, counts=True))
        # Its own: the value product's kernel, then the count pass, loaded in the background
        # meanwhile; then the two passes run.
        gx, gy = gpu(x), gpu(y)
        value, _ = _plan_cache.find(gx, gy, "maxplus", argmax=False, out=None, accumulate=False)
        assert value.launch is not None
        own = counted_spec(SEMIRINGS["maxplus"], np.dtype(np.float32), counting="ones",
                           form="count")  # fmt: skip
        for spec in (value.launch.spec, own):
            await until_loaded(compiler, spec)
        got = await tropical.matmul(gx, gy, counts=True, compiler=compiler)
        assert_counted(got, reference.matmul(x, y, counts=True))
        assert compiler.stats().hot_compiles == 0


def test_counted_arguments_on_the_gpu_name_what_is_wrong() -> None:
    import cupy

    a, b = cupy.zeros((2, 3), np.float32), cupy.zeros((3, 4), np.float32)
    na, nb = cupy.ones((2, 3), np.int64), cupy.ones((3, 4), np.int64)
    with pytest.raises(ValueError, match=r"counts of b must be int64 of b's shape \(3, 4\)"):
        tropical.matmul_sync(a, b, counts=(na, nb.astype(np.int32)))
    with pytest.raises(TypeError, match=r"counts\[0\] must be a cupy\.ndarray"):
        tropical.matmul_sync(a, b, counts=(np.ones((2, 3), np.int64), nb))
    with pytest.raises(TypeError, match=r"with counts, out must be a \(values, counts\) pair"):
        tropical.matmul_sync(a, b, counts=True, out=cupy.zeros((2, 4), np.float32))
    wrong = (cupy.zeros((2, 4), np.float32), cupy.zeros((2, 4), np.int32))
    with pytest.raises(ValueError, match=r"out\[1\] \(counts\) must be int64 of shape \(2, 4\)"):
        tropical.matmul_sync(a, b, counts=True, out=wrong)
    with pytest.raises(ValueError, match="accumulate=True needs out"):
        tropical.matmul_sync(a, b, counts=True, accumulate=True)


# -- counted contractions ----------------------------------------------------------------------


def drawn_network(
    rng: np.random.Generator, ring: str, dtype: Any, *, most: int
) -> tuple[str, list[Any], list[Any]]:
    """A random network, half of them with up to ``most`` output indices, whose products are
    exact in ``ring`` (no saturation, no rounding): its subscripts, its operands, and those on
    the GPU each in a drawn memory layout (transposed, reversed, gapped)."""
    subscripts, shapes = random_network(rng, int(rng.integers(6, 11)), int(rng.integers(5, 9)))
    if rng.random() < 0.5:
        subscripts = with_output(rng, subscripts, most=most)
    return (subscripts, *exact_values(rng, ring, dtype, shapes))


def exact_values(
    rng: np.random.Generator, ring: str, dtype: Any, shapes: Any
) -> tuple[list[Any], list[Any]]:
    """Operands of ``shapes`` whose products are exact in ``ring``, and those on the GPU each
    in a drawn memory layout (transposed, reversed, gapped)."""
    if ring == "andor":
        operands = [rng.random(s) < 0.7 for s in shapes]
    else:
        operands = network_values(rng, ring, dtype, shapes)
        if ring == "maxmul":  # 0 to 2: products of ten stay exact
            operands = [np.minimum(abs(x), 2).astype(dtype) for x in operands]
    return operands, [shuffled(rng, x, gpu) for x in operands]


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
def test_counted_einsum_matches_the_reference(
    rng: np.random.Generator, ring: str, dtype: Any
) -> None:
    for _ in range(4):
        subscripts, operands, viewed = drawn_network(rng, ring, dtype, most=2)
        value, count = tropical.einsum_sync(subscripts, *viewed, semiring=ring, count=True)
        want_value, want = reference.einsum(subscripts, *operands, semiring=ring, count=True)
        np.testing.assert_array_equal(host(value), want_value)
        np.testing.assert_array_equal(host(count), want)


def test_the_petersen_graph_has_five_maximum_independent_sets_on_the_gpu() -> None:
    subscripts, operands = independent_sets(10, PETERSEN, "maxplus", np.float32)
    value, count = tropical.einsum_sync(subscripts, *(gpu(x) for x in operands), count=True)
    assert (float(value), int(count)) == (4.0, 5)


def test_counts_past_int64_are_joined_on_the_host() -> None:
    names = [chr(c) for c in range(ord("a"), ord("z") + 1)] * 2
    names = names[:26] + [c.upper() for c in names[26:]]
    operands = [gpu(np.zeros(4, np.int64)) for _ in names]
    value, count = tropical.einsum_sync(",".join(names) + "->", *operands, count=True)
    assert int(value) == 0
    assert isinstance(count, np.ndarray)
    assert count.dtype == object
    assert count[()] == 4**52  # 2^104: joined from its residues modulo four primes


def test_a_sliced_counted_einsum_joins_its_slices(rng: np.random.Generator) -> None:
    sliced = 0
    for _ in range(4):
        subscripts, shapes = random_network(rng, int(rng.integers(8, 13)), int(rng.integers(7, 10)))
        operands = network_values(rng, "maxplus", np.int32, shapes)
        on_gpu = [gpu(x) for x in operands]
        plan = sliced_plan(subscripts, on_gpu)
        sliced += plan.slicing is not None
        value, count = tropical.einsum_sync(subscripts, *on_gpu, count=True, optimize=plan)
        want_value, want = reference.einsum(subscripts, *operands, count=True)
        np.testing.assert_array_equal(host(value), want_value)
        np.testing.assert_array_equal(host(count), want)
    assert sliced >= 2


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
def test_the_k_best_on_the_gpu_match_the_reference(
    rng: np.random.Generator, ring: str, dtype: Any
) -> None:
    for top in (1, 3, 8, 16):
        subscripts, operands, viewed = drawn_network(rng, ring, dtype, most=1)
        values, counts = tropical.einsum_sync(subscripts, *viewed, semiring=ring, top=top)
        want = reference.einsum(subscripts, *operands, semiring=ring, top=top)
        np.testing.assert_array_equal(host(values), want[0])
        np.testing.assert_array_equal(host(counts), want[1])


@pytest.mark.parametrize(("ring", "dtype"), [("maxplus", np.int32), ("minplus", np.float64)])
@pytest.mark.parametrize("top", [1, 3, 8, 16])
def test_the_k_best_of_long_sums_into_few_outputs_match_the_reference(
    rng: np.random.Generator, ring: str, dtype: Any, top: int
) -> None:
    # 6 outputs, each a sum over 700 (a warp each, its lanes' lists merged), values 0 to 9 so
    # that lists fill and values tie across lanes.
    a, b = rng.integers(0, 10, (3, 700)).astype(dtype), rng.integers(0, 10, (700, 2)).astype(dtype)
    assert top_lanes(6, 700) == 32
    values, counts = tropical.einsum_sync("ik,kj->ij", gpu(a), gpu(b), semiring=ring, top=top)
    want = reference.einsum("ik,kj->ij", a, b, semiring=ring, top=top)
    np.testing.assert_array_equal(host(values), want[0])
    np.testing.assert_array_equal(host(counts), want[1])


def test_the_petersen_graphs_three_best_sizes_and_their_counts() -> None:
    subscripts, operands = independent_sets(10, PETERSEN, "maxplus", np.float32)
    values, counts = tropical.einsum_sync(subscripts, *(gpu(x) for x in operands), top=3)
    want = reference.einsum(subscripts, *operands, top=3)
    assert host(values).tolist() == want[0].tolist() == [4.0, 3.0, 2.0]
    assert host(counts).tolist() == want[1].tolist()
    assert host(counts)[0] == 5


def test_a_sliced_k_best_einsum_merges_its_slices_lists(rng: np.random.Generator) -> None:
    sliced = 0
    for top in (2, 5, 8, 3):
        subscripts, shapes = random_network(rng, int(rng.integers(8, 13)), int(rng.integers(7, 10)))
        operands = network_values(rng, "minplus", np.float64, shapes)
        on_gpu = [gpu(x) for x in operands]
        plan = sliced_plan(subscripts, on_gpu)
        sliced += plan.slicing is not None
        values, counts = tropical.einsum_sync(subscripts, *on_gpu, semiring="minplus",
                                              top=top, optimize=plan)  # fmt: skip
        want = reference.einsum(subscripts, *operands, semiring="minplus", top=top)
        np.testing.assert_array_equal(host(values), want[0])
        np.testing.assert_array_equal(host(counts), want[1])
    assert sliced >= 2


# -- counted programs ----------------------------------------------------------------------------


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
def test_a_counted_program_replays_fresh_operands_as_the_reference_counts_them(
    rng: np.random.Generator, ring: str, dtype: Any
) -> None:
    for top in (None, 1, 3, 8):
        subscripts, operands, viewed = drawn_network(rng, ring, dtype, most=2)
        program = tropical.counted_program_sync(subscripts, *viewed, semiring=ring, top=top)
        for _ in range(2):  # the same program on fresh operands (in fresh layouts) each time
            got = program.run_sync(*viewed)
            want = reference.einsum(subscripts, *operands, semiring=ring, count=top is None,
                                    top=top)  # fmt: skip
            assert program.shape == want[0].shape
            np.testing.assert_array_equal(host(got[0]), want[0])
            np.testing.assert_array_equal(host(got[1]), want[1])
            operands, viewed = exact_values(rng, ring, dtype, [x.shape for x in operands])
        assert tropical.counted_program_sync(subscripts, *viewed, semiring=ring,
                                             top=top) is program  # fmt: skip


def test_a_counted_program_holds_its_live_set_not_every_intermediate(
    rng: np.random.Generator,
) -> None:
    # A chain of 40 products of 512 x 512 int32 matrices, left to right: 40 MiB of inputs,
    # 80 MiB of their counts, and for each product (its sum split in 4 by the planner) a
    # (4, 512, 512) intermediate of 12 MiB (values and counts) reduced to one of 3 MiB. A run
    # holds those of the step it is at: about 57 MiB with the inputs, where every intermediate
    # at once would be over 700 MiB. (CuPy's pool rounds, splits and merges its blocks.)
    names = [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("ABCDEFGHIJKLMNO")
    subscripts = ",".join(names[i] + names[i + 1] for i in range(40)) + f"->{names[0]}{names[40]}"
    operands = [rng.integers(-1000, 1000, (512, 512)).astype(np.int32) for _ in range(40)]
    on_gpu = [gpu(x) for x in operands]
    path = [(0, 1)] + [(0, 39 - t) for t in range(1, 39)]  # the next input times the result
    program = tropical.counted_program_sync(subscripts, *on_gpu, optimize=path)
    mib = 1 << 20
    print(f"counted program of the chain: {program.nbytes / mib:.1f} MiB")
    assert 40 * mib <= program.nbytes < 72 * mib, program.nbytes / mib
    value, count = program.run_sync(*on_gpu)
    want_value, want = reference.einsum(subscripts, *operands, count=True, path=path)
    np.testing.assert_array_equal(host(value), want_value)
    np.testing.assert_array_equal(host(count), want)


def test_a_counted_programs_counts_past_int64_are_joined_on_the_host() -> None:
    names = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    names += [c.upper() for c in names]
    operands = [gpu(np.zeros(4, np.int64)) for _ in names]
    program = tropical.counted_program_sync(",".join(names) + "->", *operands)
    value, count = program.run_sync(*operands)
    assert int(value) == 0
    assert count.dtype == object
    assert count[()] == 4**52


async def test_counted_program_calls_on_other_streams_and_threads_each_get_their_own(
    rng: np.random.Generator,
) -> None:
    import anyio.to_thread
    import cupy

    subscripts, shapes = random_network(rng, 9, 7)
    draws = [network_values(rng, "maxplus", np.float32, shapes) for _ in range(6)]
    program = await tropical.counted_program(subscripts, *(gpu(x) for x in draws[0]))

    def call(operands: list[Any]) -> tuple[Any, Any]:
        with cupy.cuda.Stream(non_blocking=True) as stream:
            got = program.run_sync(*(gpu(x) for x in operands), stream=stream)
            stream.synchronize()
        return host(got[0]), host(got[1])

    results: list[Any] = [None] * len(draws)

    async def one(i: int) -> None:
        results[i] = await anyio.to_thread.run_sync(call, draws[i])

    async with anyio.create_task_group() as tg:
        for i in range(len(draws)):
            tg.start_soon(one, i)
    for drawn, (value, count) in zip(draws, results, strict=True):
        want_value, want = reference.einsum(subscripts, *drawn, count=True)
        np.testing.assert_array_equal(value, want_value)
        np.testing.assert_array_equal(count, want)
    value, count = await program.run(*(gpu(x) for x in draws[1]))
    np.testing.assert_array_equal(host(count), reference.einsum(subscripts, *draws[1],
                                                                count=True)[1])  # fmt: skip


def test_a_counted_program_names_wrong_operands() -> None:
    subscripts, operands = independent_sets(10, PETERSEN, "maxplus", np.float32)
    on_gpu = [gpu(x) for x in operands]
    program = tropical.counted_program_sync(subscripts, *on_gpu)
    value, count = program.run_sync(*on_gpu)
    assert (float(value), int(count)) == (4.0, 5)
    value, count = program.run_sync()  # the inputs as the last call left them
    assert (float(value), int(count)) == (4.0, 5)
    with pytest.raises(ValueError, match=f"takes {len(on_gpu)} operands, got 1"):
        program.run_sync(on_gpu[0])
    with pytest.raises(TypeError, match="operand 0 must be a CuPy array, not ndarray"):
        program.run_sync(operands[0], *on_gpu[1:])
    wrong = [on_gpu[0].astype(np.float64), *on_gpu[1:]]
    with pytest.raises(ValueError, match=r"operand 0 is float64\[2\] on device 0; this program "
                                         r"takes float32\[2\]"):  # fmt: skip
        program.run_sync(*wrong)


# -- every optimum (configurations) ------------------------------------------------------------


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
def test_every_optimum_on_the_gpu_is_the_references(
    rng: np.random.Generator, ring: str, dtype: Any
) -> None:
    listed = drawn = 0
    while drawn < 4 or (listed < 4 and drawn < 16):  # (most draws have one optimum)
        drawn += 1
        subscripts, shapes = random_network(rng, int(rng.integers(6, 11)), int(rng.integers(5, 9)))
        operands, viewed = exact_values(rng, ring, dtype, shapes)
        want_value, letters, want = reference.configurations(
            subscripts, *operands, semiring=ring, limit=1 << 20
        )
        value, indices, rows = tropical.configurations_sync(
            subscripts, *viewed, semiring=ring, limit=1 << 20
        )
        assert indices == letters
        np.testing.assert_array_equal(host(value), want_value)
        assert (rows.dtype, rows.shape) == (np.int64, want.shape)
        np.testing.assert_array_equal(host(rows), want)
        _, _, first = tropical.configurations_sync(subscripts, *viewed, semiring=ring, first=True)
        assert len(first) == min(len(want), 1)
        assert all(any((host(first)[0] == row).all() for row in want) for _ in first)
        listed += len(want)
    assert listed >= 4


def test_the_petersen_graphs_five_maximum_independent_sets_listed_on_the_gpu() -> None:
    subscripts, operands = independent_sets(10, PETERSEN, "maxplus", np.float32)
    on_gpu = [gpu(x) for x in operands]
    value, letters, rows = tropical.configurations_sync(subscripts, *on_gpu)
    assert (float(value), letters, host(rows).shape) == (4.0, "abcdefghij", (5, 10))
    assert host(rows).sum(axis=1).tolist() == [4] * 5
    with pytest.raises(
        ValueError, match=r"^5 assignments attain the value 4\.0, more than limit=4"
    ):
        tropical.configurations_sync(subscripts, *on_gpu, limit=4)

    async def listed() -> Any:
        return await tropical.configurations(subscripts, *on_gpu, semiring="maxplus")

    _, _, again = anyio.run(listed)
    np.testing.assert_array_equal(host(again), host(rows))


def test_a_long_sum_cut_in_parts_is_walked_whole_on_the_gpu(rng: np.random.Generator) -> None:
    a = rng.integers(0, 4, size=(2, 4096)).astype(np.int32)
    b = rng.integers(0, 4, size=(4096, 2)).astype(np.int32)
    plan = tropical.einsum_plan("ij,jk->", a, b, optimize=[(0, 1)])
    assert any(step.split is not None for step in plan.steps)
    _, _, want = reference.configurations("ij,jk->", a, b, limit=1 << 20)
    _, _, rows = tropical.configurations_sync("ij,jk->", gpu(a), gpu(b), optimize=plan,
                                              limit=1 << 20)  # fmt: skip
    np.testing.assert_array_equal(host(rows), want)


# -- over the host's devices ---------------------------------------------------------------------


@pytest.mark.parametrize("top", [None, 3])
def test_counted_slices_over_two_devices_join_on_the_operands_device(
    rng: np.random.Generator, top: int | None
) -> None:
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs: run it on a machine with two")
    for home, devices in ((0, [0, 1]), (1, [0, 1]), (0, [1])):
        plan = None
        while plan is None or plan.slicing is None or plan.slicing.count < 2:  # (each sliced)
            subscripts, shapes = random_network(rng, int(rng.integers(8, 13)),
                                                int(rng.integers(7, 10)))  # fmt: skip
            operands = network_values(rng, "maxplus", np.int32, shapes)
            plan = sliced_plan(subscripts, operands)
        with cupy.cuda.Device(home):
            on_gpu = [gpu(x) for x in operands]
            value, count = tropical.einsum_sync(subscripts, *on_gpu, count=top is None, top=top,
                                                optimize=plan, devices=devices)  # fmt: skip
        assert value.device.id == count.device.id == home  # joined where the operands are
        want = reference.einsum(subscripts, *operands, count=top is None, top=top)
        np.testing.assert_array_equal(host(value), want[0])
        np.testing.assert_array_equal(host(count), want[1])
