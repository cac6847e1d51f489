"""Tropical products on the GPU against the NumPy reference, on fresh random
inputs: every semiring x type x variant, odd sizes, views, batches, infinities, ties, gradients."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import aionvrtc
from aionvrtc import Compiler, tropical
from aionvrtc.tropical import reference
from aionvrtc.tropical.tuning import tile_variant, tiled_supported

from .support.tropical_data import gpu, host, numpy_backward, operands

pytestmark = pytest.mark.gpu

CASES = [(s, d) for s, ring in tropical.SEMIRINGS.items() for d in ring.dtypes]
IDS = [f"{s}-{np.dtype(d)}" for s, d in CASES]
# Odd sizes (M, K, N) for every kernel class (tropical.shape_class): small and large tiles, the
# skinny kernel for each K class on tall products and on wide ones (run transposed), and the tall
# and wide tiles (argmax, or K past 64); multiples of 4 (aligned rows) take the tiles' unchecked
# interior path around the edges and the skinny kernel's 16-byte loads.
SIZES = [
    (1, 1, 1),
    (7, 33, 129),
    (33, 129, 7),
    (129, 7, 33),
    (1000, 65, 70),
    (4100, 5, 7),
    (4500, 20, 16),
    (4200, 30, 31),
    (5000, 40, 64),
    (300, 264, 136),
    (1100, 40, 1000),
    (4104, 32, 32),
    (4160, 64, 48),
    (4096, 4, 9),
    (4104, 16, 13),
    (3, 3, 4099),
    (5, 7, 4100),
    (20, 16, 4500),
    (31, 30, 4200),
    (64, 40, 5000),
    (4100, 70, 20),
    (20, 100, 4100),
    (9, 20, 4100),
]
# One size of each kernel class, for the tests that run every class once.
# (products of test size are never "large": test_large_tiles_at_test_sizes forces those tiles)
CLASS_SIZES = [(40, 23, 31), (300, 70, 260), (4100, 13, 31), (31, 13, 4100), (4100, 70, 20)]


@pytest.fixture(scope="module", autouse=True)
def _warm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One process-wide Compiler for these tests, its cache filled in parallel up front."""
    os.environ["AIONVRTC_CACHE_DIR"] = str(tmp_path_factory.mktemp("tropical-cache"))
    aionvrtc.close_default_compiler()
    aionvrtc.default_compiler()
    count = anyio.run(tropical.warm)
    assert count == len(tropical.all_specs())
    yield
    aionvrtc.close_default_compiler()


def check(ring: str, a: Any, b: Any, *, argmax: bool | None = None) -> None:
    """The GPU result (on the given device arrays, views included) against the reference,
    with and without the argmax (by default both: they take different kernels)."""
    for with_argmax in (False, True) if argmax is None else (argmax,):
        got = tropical.matmul_sync(a, b, ring, argmax=with_argmax)
        want = reference.matmul(host(a), host(b), ring, argmax=with_argmax)
        if with_argmax:
            np.testing.assert_array_equal(host(got[0]), want[0])
            np.testing.assert_array_equal(host(got[1]), want[1])
            assert got[1].dtype == np.int32
        else:
            np.testing.assert_array_equal(host(got), want)


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
@pytest.mark.parametrize("argmax", [False, True])
@pytest.mark.parametrize(("m", "k", "n"), SIZES)
def test_forward(ring: str, dtype: Any, argmax: bool, m: int, k: int, n: int) -> None:
    a, b = operands(np.random.default_rng(), ring, dtype, (m, k), (k, n))
    check(ring, gpu(a), gpu(b), argmax=argmax)


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
@pytest.mark.parametrize("layout", ["a transposed", "b transposed", "sliced", "reversed"])
def test_views_are_used_in_place(ring: str, dtype: Any, layout: str) -> None:
    rng = np.random.default_rng()
    m, k, n = 37, 45, 29
    if layout == "a transposed":
        at, b = operands(rng, ring, dtype, (k, m), (k, n))
        a_gpu, b_gpu = gpu(at).T, gpu(b)  # F-ordered view
    elif layout == "b transposed":
        a, bt = operands(rng, ring, dtype, (m, k), (n, k))
        a_gpu, b_gpu = gpu(a), gpu(bt).T
    elif layout == "sliced":
        a, b = operands(rng, ring, dtype, (2 * m, 3 * k + 1), (k + 5, 2 * n))
        a_gpu, b_gpu = gpu(a)[::2, 1::3], gpu(b)[5:, ::2]
    else:
        a, b = operands(rng, ring, dtype, (m, k), (k, n))
        a_gpu, b_gpu = gpu(a)[::-1], gpu(b)[:, ::-1]
    assert not (a_gpu.flags.c_contiguous and b_gpu.flags.c_contiguous)
    check(ring, a_gpu, b_gpu)


TILED = [(s, d) for s, d in CASES if tiled_supported(s, np.dtype(d))]


@pytest.mark.parametrize(("ring", "dtype"), TILED, ids=[f"{s}-{np.dtype(d)}" for s, d in TILED])
@pytest.mark.parametrize(
    "layout",
    [
        "sweep tall",
        "sweep wide",
        "a transposed",
        "b transposed",
        "reversed",
        "sliced",
        "a aligned, b transposed",
        "a broadcast",
    ],
)
def test_skinny_kernel_reads_views_in_place(ring: str, dtype: Any, layout: str) -> None:
    # Tall (wide) products with small K and N (M) take the skinny kernel whatever their
    # strides: a tensor network's sweep reads A as (batch, m, k) with m's stride 1 and k's
    # the rest of the tensor ("sweep tall"), or B so ("sweep wide").
    seed = int(np.random.SeedSequence().entropy % (1 << 32))  # type: ignore[operator]
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    if layout == "sweep tall":
        x, y = operands(rng, ring, dtype, (2, 2, 5000), (2, 2, 3))  # (k, batch, m), (k, batch, n)
        a, b = gpu(x).transpose(1, 2, 0), gpu(y).transpose(1, 0, 2)
    elif layout == "sweep wide":
        x, y = operands(rng, ring, dtype, (2, 2, 3), (2, 5000, 2))  # (k, batch, m), (k, n, batch)
        a, b = gpu(x).transpose(1, 2, 0), gpu(y).transpose(2, 0, 1)
    elif layout == "a transposed":
        at, y = operands(rng, ring, dtype, (5, 4100), (5, 7))
        a, b = gpu(at).T, gpu(y)
    elif layout == "b transposed":
        x, bt = operands(rng, ring, dtype, (6, 3), (4100, 3))
        a, b = gpu(x), gpu(bt).T
    elif layout == "reversed":
        x, y = operands(rng, ring, dtype, (4100, 9), (9, 5))
        a, b = gpu(x)[::-1], gpu(y)[:, ::-1]
    elif layout == "sliced":
        x, y = operands(rng, ring, dtype, (8300, 7), (9, 12))
        a, b = gpu(x)[::2, 1:4], gpu(y)[:3, ::3]
    elif layout == "a aligned, b transposed":  # A's rows load 16 bytes at a time
        x, bt = operands(rng, ring, dtype, (4100, 8), (5, 8))
        a, b = gpu(x), gpu(bt).T
    else:  # one A for every batch (batch stride 0), read transposed
        at, y = operands(rng, ring, dtype, (3, 4100), (2, 3, 5))
        a, b = gpu(at).T, gpu(y)
    assert not (a.flags.c_contiguous and b.flags.c_contiguous)
    product = tropical.tuning.plan(a, b, ring, argmax=False, out=None, accumulate=False)
    assert product.spec.name_expressions[0].startswith("tropical_gemm_rows<")
    check(ring, a, b)


@pytest.mark.parametrize(("ring", "dtype"), TILED, ids=[f"{s}-{np.dtype(d)}" for s, d in TILED])
@pytest.mark.parametrize("argmax", [False, True])
@pytest.mark.parametrize("infinities", [True, False])
def test_large_tiles_at_test_sizes(ring: str, dtype: Any, argmax: bool, infinities: bool) -> None:
    # Products of test size are too small for the large class (too few 128 x 128 tiles to fill
    # the GPU), so its tiles are forced here: edges, and the 16-byte loads of aligned interiors.
    from aionvrtc.tropical.tuning import launch

    tile = tropical.TILES["large"][tile_variant(np.dtype(dtype), argmax=argmax)]
    rng = np.random.default_rng()
    for m, k, n in ((300, 257, 260), (129, 7, 33), (256, 64, 384)):
        a, b = operands(rng, ring, dtype, (m, k), (k, n), infinities=infinities)
        plan = tropical.tuning.plan(
            gpu(a), gpu(b), ring, argmax=argmax, out=None, accumulate=False, tile=tile
        )  # fmt: skip
        assert plan.tile == tile
        launch(plan, aionvrtc.get_sync(plan.spec, device=plan.device), None)
        want = reference.matmul(a, b, ring, argmax=argmax)
        if argmax:
            np.testing.assert_array_equal(host(plan.c), want[0])
            np.testing.assert_array_equal(host(plan.index), want[1])
        else:
            np.testing.assert_array_equal(host(plan.c), want)


@pytest.mark.parametrize(("m", "k", "n"), [*CLASS_SIZES, (4100, 16, 16), (3000, 500, 2000)])
@pytest.mark.parametrize("argmax", [False, True])
def test_kernel_spec_is_the_kernel_matmul_launches(argmax: bool, m: int, k: int, n: int) -> None:
    a, b = operands(np.random.default_rng(), "minplus", np.float32, (m, k), (k, n))
    plan = tropical.tuning.plan(
        gpu(a), gpu(b), "minplus", argmax=argmax, out=None, accumulate=False
    )
    assert plan.spec == tropical.kernel_spec(m, n, k, "minplus", argmax=argmax)


def test_argmax_past_the_tuned_kernels_tile_count() -> None:
    # The tuned kernel counts k-tiles in 16 bits for its argmax: longer products take the
    # generic kernel, even when a tile is named.
    tile = tropical.TILES["small"]["f4-argmax"]
    k = tropical.tuning.ARGMAX_MAX_TILES * tile[2] + 3
    a, b = operands(np.random.default_rng(), "maxplus", np.float32, (3, k), (k, 5))
    plan = tropical.tuning.plan(
        gpu(a), gpu(b), "maxplus", argmax=True, out=None, accumulate=False, tile=tile
    )
    assert plan.tile is None
    assert "tropical_gemm<" in plan.spec.name_expressions[0]
    check("maxplus", gpu(a), gpu(b))


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
@pytest.mark.parametrize(("m", "k", "n"), CLASS_SIZES)
def test_fast_path_without_infinities(ring: str, dtype: Any, m: int, k: int, n: int) -> None:
    # No infinities: integer tiles and rows take the fast step (DPX for int32), and the argmax
    # comes from the rescan of each output's last improving k-tile.
    a, b = operands(np.random.default_rng(), ring, dtype, (m, k), (k, n), infinities=False)
    check(ring, gpu(a), gpu(b))


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
@pytest.mark.parametrize(("m", "k", "n"), [(50, 40, 30), (300, 257, 260), (4100, 40, 30)])
def test_ties_resolve_to_the_smallest_k(ring: str, dtype: Any, m: int, k: int, n: int) -> None:
    # Small values: no infinities, so the tuned kernel takes its fast path (DPX for int32).
    a, b = operands(np.random.default_rng(), ring, dtype, (m, k), (k, n), ties=True)
    check(ring, gpu(a), gpu(b))


@pytest.mark.parametrize(
    ("shape_a", "shape_b"),
    [
        ((3, 17, 9), (3, 9, 11)),
        ((1, 17, 9), (4, 9, 11)),
        ((4, 17, 9), (1, 9, 11)),
        ((17, 9), (5, 9, 11)),
        ((5, 17, 9), (9, 11)),
        ((70_000, 2, 3), (70_000, 3, 2)),  # more batches than a grid dimension holds
        ((3, 5000, 7), (1, 7, 5)),  # the skinny kernel, batched
    ],
)
@pytest.mark.parametrize("ring", ["maxplus", "minplus", "maxmul"])
def test_batches(ring: str, shape_a: tuple[int, ...], shape_b: tuple[int, ...]) -> None:
    a, b = operands(np.random.default_rng(), ring, np.float32, shape_a, shape_b)
    check(ring, gpu(a), gpu(b))


def test_many_rows_and_columns() -> None:
    # More column tiles than a grid dimension holds, and a tall skinny product.
    for shape_a, shape_b in (((3, 4), (4, 65_536 * 64 + 70)), ((1 << 20, 8), (8, 4))):
        a, b = operands(np.random.default_rng(), "maxplus", np.float32, shape_a, shape_b)
        check("maxplus", gpu(a), gpu(b))


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
@pytest.mark.parametrize("argmax", [False, True])
@pytest.mark.parametrize(("m", "k", "n"), CLASS_SIZES)
def test_accumulate(ring: str, dtype: Any, argmax: bool, m: int, k: int, n: int) -> None:
    rng = np.random.default_rng()
    a, b = operands(rng, ring, dtype, (m, k), (k, n))
    old, _ = operands(rng, ring, dtype, (m, n), (1, 1))
    old_index = rng.integers(-1, k, size=(m, n)).astype(np.int32)
    c = gpu(old)
    index = gpu(old_index)
    out = (c, index) if argmax else c
    result = tropical.matmul_sync(gpu(a), gpu(b), ring, argmax=argmax, out=out, accumulate=True)
    assert (result[0] if argmax else result) is c  # in place
    value, new_index = reference.matmul(a, b, ring, argmax=True)
    semiring = tropical.SEMIRINGS[ring]
    if ring == "andor":
        new_wins = value & ~old
    elif semiring.maximise:
        new_wins = value > old
    else:
        new_wins = value < old
    np.testing.assert_array_equal(host(c), np.where(new_wins, value, old))
    if argmax:
        np.testing.assert_array_equal(host(index), np.where(new_wins, new_index, old_index))


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
def test_empty_dimensions(ring: str, dtype: Any) -> None:
    import cupy

    zero = tropical.SEMIRINGS[ring].zero(np.dtype(dtype))
    c, index = tropical.matmul_sync(
        cupy.ones((3, 0), dtype), cupy.ones((0, 4), dtype), ring, argmax=True
    )
    assert host(c).tolist() == [[zero] * 4] * 3
    assert host(index).tolist() == [[-1] * 4] * 3
    assert tropical.matmul_sync(cupy.ones((0, 5), dtype), cupy.ones((5, 4), dtype), ring).shape == (
        0,
        4,
    )
    assert tropical.matmul_sync(cupy.ones((2, 5), dtype), cupy.ones((5, 0), dtype), ring).shape == (
        2,
        0,
    )
    old = cupy.ones((3, 4), dtype)
    tropical.matmul_sync(
        cupy.ones((3, 0), dtype), cupy.ones((0, 4), dtype), ring, out=old, accumulate=True
    )
    assert host(old).tolist() == [[np.dtype(dtype).type(1)] * 4] * 3  # C (+) zero = C


def test_bad_input_names_the_argument() -> None:
    import cupy

    f32 = cupy.ones((4, 5), cupy.float32)
    cases: list[tuple[Any, type[Exception], str]] = [
        (
            lambda: tropical.matmul_sync(f32, cupy.ones((4, 5), cupy.float32)),
            ValueError,
            r"a's columns must match b's rows, got shapes \(4, 5\) and \(4, 5\)",
        ),
        (
            lambda: tropical.matmul_sync(f32, cupy.ones((5, 2), cupy.float64)),
            TypeError,
            "a and b must have one dtype, got float32 and float64",
        ),
        (
            lambda: tropical.matmul_sync(f32.astype(cupy.float16), f32.T.astype(cupy.float16)),
            TypeError,
            "a has dtype float16; maxplus takes",
        ),
        (lambda: tropical.matmul_sync(f32, f32.T, "andor"), TypeError, "andor takes bool"),
        (
            lambda: tropical.matmul_sync(f32, f32.T, out=cupy.empty((4, 5), cupy.float32)),
            ValueError,
            r"out must be float32 of shape \(4, 4\), got float32 of shape \(4, 5\)",
        ),
        (
            lambda: tropical.matmul_sync(f32, f32.T, out=cupy.empty((4, 4), cupy.float64)),
            ValueError,
            "out must be float32 of shape",
        ),
        (
            lambda: tropical.matmul_sync(
                f32, f32.T, argmax=True, out=cupy.empty((4, 4), cupy.float32)
            ),
            TypeError,
            r"with argmax=True, out must be a \(values, argmax\) pair",
        ),
        (
            lambda: tropical.matmul_sync(
                f32,
                f32.T,
                argmax=True,
                out=(cupy.empty((4, 4), cupy.float32), cupy.empty((4, 4), cupy.int64)),
            ),
            ValueError,
            r"out\[1\] \(argmax\) must be int32",
        ),
        (
            lambda: tropical.matmul_sync(f32, f32.T, accumulate=True),
            ValueError,
            "accumulate=True needs out",
        ),
        (
            lambda: tropical.matmul_sync(f32, np.ones((5, 4), np.float32)),
            TypeError,
            "b must be a cupy.ndarray, not numpy.ndarray",
        ),
        (
            lambda: tropical.matmul_sync(f32, f32.T, "tropical"),
            ValueError,
            "semiring must be one of",
        ),
        (
            lambda: tropical.matmul_sync(
                cupy.ones((2, 4, 5), cupy.float32), cupy.ones((3, 5, 4), cupy.float32)
            ),
            ValueError,
            "batch sizes must match or be 1",
        ),
        (
            lambda: tropical.backward_sync(
                cupy.ones((4, 4), cupy.int32),
                f32.astype(cupy.int32),
                f32.T.astype(cupy.int32),
                cupy.zeros((4, 4), cupy.int32),
            ),
            TypeError,
            "gradients need float32 or float64",
        ),
        (
            lambda: tropical.backward_sync(
                cupy.ones((4, 3), cupy.float32), f32, f32.T, cupy.zeros((4, 4), cupy.int32)
            ),
            ValueError,
            r"grad_c must be float32 of shape \(4, 4\)",
        ),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()


@pytest.mark.parametrize("ring", ["maxplus", "minplus", "maxmul"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_backward_routes_the_gradient_through_the_argmax(ring: str, dtype: Any) -> None:
    rng = np.random.default_rng()
    a, b = operands(rng, ring, dtype, (33, 20), (20, 17))
    g = rng.standard_normal((33, 17)).astype(dtype)
    _, index = tropical.matmul_sync(gpu(a), gpu(b), ring, argmax=True)
    grad_a, grad_b = tropical.backward_sync(gpu(g), gpu(a), gpu(b), index, ring)
    want_a, want_b = numpy_backward(g, a, b, host(index), ring)
    tolerance = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(host(grad_a), want_a, rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(host(grad_b), want_b, rtol=tolerance, atol=tolerance)


def test_backward_of_a_broadcast_operand_sums_over_the_batch() -> None:
    rng = np.random.default_rng()
    a, b = operands(rng, "maxplus", np.float64, (9, 6), (4, 6, 5))
    g = rng.standard_normal((4, 9, 5))
    _, index = tropical.matmul_sync(gpu(a), gpu(b), "maxplus", argmax=True)
    grad_a, grad_b = tropical.backward_sync(gpu(g), gpu(a), gpu(b), index, "maxplus")
    assert grad_a.shape == a.shape
    assert grad_b.shape == b.shape
    want_a = sum(numpy_backward(g[i], a, b[i], host(index)[i], "maxplus")[0] for i in range(4))
    np.testing.assert_allclose(host(grad_a), want_a, atol=1e-10)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_async_matmul_on_a_stream_through_a_compiler(tmp_path: Path) -> None:
    import cupy

    a, b = operands(np.random.default_rng(), "minplus", np.float32, (300, 200), (200, 100))
    stream = cupy.cuda.Stream(non_blocking=True)
    async with Compiler(cache_dir=tmp_path) as compiler:
        with stream:
            a_gpu, b_gpu = gpu(a), gpu(b)
        c, index = await tropical.matmul(
            a_gpu, b_gpu, "minplus", argmax=True, stream=stream, compiler=compiler
        )
        await aionvrtc.synchronize(stream)
        grads = await tropical.backward(
            cupy.ones_like(c), a_gpu, b_gpu, index, "minplus", stream=stream, compiler=compiler
        )
        await aionvrtc.synchronize(stream)
        assert compiler.stats().compiles == 2
    value, want_index = reference.matmul(a, b, "minplus", argmax=True)
    np.testing.assert_array_equal(host(c), value)
    np.testing.assert_array_equal(host(index), want_index)
    assert float(host(grads[0]).sum()) == pytest.approx(300 * 100)  # each output routes one 1
    # The default path (compiler=None) from an event loop.
    again = await tropical.matmul(a_gpu, b_gpu, "minplus")
    np.testing.assert_array_equal(host(again), value)


@pytest.mark.parametrize("ring", ["maxplus", "minplus", "maxmul"])
def test_torch_gradients_match_finite_differences(ring: str) -> None:
    torch = pytest.importorskip("torch")
    from aionvrtc.tropical.torch import matmul

    generator = torch.Generator(device="cuda").manual_seed(1)
    a = torch.rand((6, 5), dtype=torch.float64, device="cuda", generator=generator)
    b = torch.rand((5, 4), dtype=torch.float64, device="cuda", generator=generator)
    a.requires_grad_(True)
    b.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x, y: matmul(x, y, ring), (a, b), eps=1e-6, atol=1e-5)
    c = matmul(a, b, ring)
    want = reference.matmul(a.detach().cpu().numpy(), b.detach().cpu().numpy(), ring)
    np.testing.assert_array_equal(c.detach().cpu().numpy(), want)


def test_autotune_checks_times_and_remembers_through_the_compiler(tmp_path: Path) -> None:
    # _shape_classes: its table of installed tiles, emptied as a new process would start.
    from aionvrtc.tropical.products import _shape_classes
    from aionvrtc.tropical.tuning import tile_fits

    reports: list[dict[str, Any]] = []

    async def main() -> tuple[Any, Any, Any]:
        async with Compiler(cache_dir=tmp_path, concurrency=4) as compiler:
            first = await tropical.autotune(
                ["float32"], kinds=["small"], argmax=[False], compiler=compiler,
                repeats=2, report=reports.append,
            )  # fmt: skip
            in_use = tropical.tuned_tiles(0)["small"]["f4"]
            _shape_classes._installed.clear()  # as a new process would start
            again = await tropical.autotune(
                ["float32"], kinds=["small"], argmax=[False], compiler=compiler,
                report=reports.append,
            )  # fmt: skip
            return first, in_use, again

    try:
        first, in_use, again = anyio.run(main)
    finally:
        _shape_classes._installed.clear()
    # Every candidate that fits was checked and timed once; the second run read the record.
    candidates = [t for t in tropical.tuning.CANDIDATES["small"] if tile_fits(t, 4)]
    assert [tuple(r["tile"]) for r in reports] == candidates
    assert all(r["seconds"] > 0 and r["class"] == "small" for r in reports)
    fastest = tuple(min(reports, key=lambda r: r["seconds"])["tile"])
    assert first["small"]["f4"] == in_use == again["small"]["f4"] == fastest
    assert first["large"] == tropical.TILES["large"]  # classes not tuned keep their defaults


def test_device_figures_are_measured_once_and_kept_beside_the_tuned_tiles(tmp_path: Path) -> None:
    # The probe of each type and a copy, measured; the record read by a later process (here:
    # after the process's own memory is cleared), unless asked to measure again.
    import cupy

    from aionvrtc.tropical.products import _figures

    async def main() -> tuple[Any, ...]:
        async with Compiler(cache_dir=tmp_path) as compiler:
            _figures._known.clear()
            first = await tropical.device_figures(compiler=compiler)
            assert compiler.stats().compiles == len(_figures.PROBE_TYPES)
            _figures._known.clear()
            kept = await tropical.device_figures(compiler=compiler)
            again = await tropical.device_figures(compiler=compiler, remeasure=True)
            return first, kept, again

    first, kept, again = anyio.run(main)
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    assert kept == first  # read, not measured: floats equal to the bit
    assert again != first
    assert again.gpu == first.gpu
    assert first.multiprocessors == props["multiProcessorCount"]
    # Every recent GPU does at least 1e12 add+max pairs/s in f32 and copies 1e11 bytes/s; f64
    # at most as fast as f32.
    assert first.pairs_per_s["float32"] > 1e12
    assert first.copy_bytes_per_s > 1e11
    assert first.pairs_per_s["float64"] <= first.pairs_per_s["float32"] * 1.1
    assert set(first.pairs_per_s) == {"float32", "float64", "int32", "int64"}
    assert tropical.products.known_figures(cupy.cuda.Device().id) == again
    print(f"figures: {first.to_json()}")


def test_a_figures_record_no_gpu_has_is_measured_again_and_replaced(tmp_path: Path) -> None:
    # A record of a ceiling of 0 gave a roofline divided by zero; one nested past the JSON
    # parser's recursion limit, a RecursionError. Each is a miss, as a bad cache entry is.
    import json

    import cupy

    from aionvrtc.tropical.products import _figures

    device = cupy.cuda.Device().id
    props = cupy.cuda.runtime.getDeviceProperties(device)
    gpu = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    name = _figures._record_name(gpu, props)
    zero = json.dumps({**_figures.MODEL_FIGURES.to_json(), "copy_bytes_per_s": 0}).encode()
    nested = b"[" * 100_000 + b"]" * 100_000

    async def main() -> list[tuple[Any, bytes | None]]:
        found = []
        async with Compiler(cache_dir=tmp_path) as compiler:
            target = compiler.target_for(device)
            for record in (zero, nested):
                assert await compiler.save_record(name, record, arch=target)
                _figures._known.clear()
                figures = await tropical.device_figures(compiler=compiler)
                found.append((figures, await compiler.load_record(name, arch=target)))
        return found

    for figures, kept in anyio.run(main):
        assert figures.gpu == gpu
        assert figures.copy_bytes_per_s > 1e11  # measured, not the record's
        assert kept is not None
        assert _figures._parse(kept) == figures  # and kept in the bad record's place
