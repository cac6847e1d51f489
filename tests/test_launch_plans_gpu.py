"""Launch plans computed once (tropical._plan_cache): reused for calls of one layout with fresh
operands, planned again for new strides, shapes, outputs, tiles and devices, and bounded.

Each test draws fresh operands from a seed it prints; ``TROPICAL_TEST_SEED=<seed>`` repeats it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import numpy as np
import pytest

import aionvrtc
from aionvrtc import tropical
from aionvrtc.tropical import reference
from aionvrtc.tropical.products import _plan_cache, _shape_classes

from .support.tropical_data import host, numpy_backward, operands

pytestmark = pytest.mark.gpu

CASES = [(s, d) for s, ring in tropical.SEMIRINGS.items() for d in ring.dtypes]
IDS = [f"{s}-{np.dtype(d)}" for s, d in CASES]
# A shape of each kernel: the generic (strided operands), the tiled (small, row-major), the
# skinny kernel (tall) and the skinny kernel run transposed (wide).
SHAPES = [(8, 8, 8), (40, 23, 31), (4100, 13, 31), (31, 13, 4100)]


@pytest.fixture(scope="module", autouse=True)
def _default_compiler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    os.environ["AIONVRTC_CACHE_DIR"] = str(tmp_path_factory.mktemp("plans-cache"))
    aionvrtc.close_default_compiler()
    aionvrtc.default_compiler()
    yield
    aionvrtc.close_default_compiler()


def assert_product(got: Any, a: Any, b: Any, ring: str, argmax: bool) -> None:
    want = reference.matmul(host(a), host(b), ring, argmax=argmax)
    if argmax:
        np.testing.assert_array_equal(host(got[0]), want[0])
        np.testing.assert_array_equal(host(got[1]), want[1])
    else:
        np.testing.assert_array_equal(host(got), want)


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
@pytest.mark.parametrize("argmax", [False, True])
def test_calls_of_one_layout_share_a_launch_with_their_own_operands(
    ring: str, dtype: Any, argmax: bool, rng: np.random.Generator
) -> None:
    import cupy

    for m, k, n in SHAPES:
        found = set()
        for _ in range(3):
            a, b = (cupy.asarray(x) for x in operands(rng, ring, dtype, (m, k), (k, n)))
            product, _ = _plan_cache.find(a, b, ring, argmax=argmax, out=None, accumulate=False)
            found.add(id(product))
            assert_product(tropical.matmul_sync(a, b, ring, argmax=argmax), a, b, ring, argmax)
        assert len(found) == 1, (m, k, n)


def test_new_strides_shapes_and_outputs_plan_again(rng: np.random.Generator) -> None:
    import cupy

    a, b = (cupy.asarray(x) for x in operands(rng, "maxplus", np.float32, (64, 48), (48, 40)))
    at = cupy.asarray(host(a).T.copy()).T  # the same values, column-major
    bigger = cupy.asarray(operands(rng, "maxplus", np.float32, (70, 48), (48, 40))[0])
    out = cupy.empty((64, 80), np.float32)[:, ::2]  # C written through a strided view
    seen = []
    for x, y, o in ((a, b, None), (at, b, None), (bigger, b, None), (a, b, out), (a, b, None)):
        product, _ = _plan_cache.find(x, y, "maxplus", argmax=False, out=o, accumulate=False)
        seen.append(product)
        got = tropical.matmul_sync(x, y, "maxplus", out=o)
        assert o is None or got is o
        assert_product(got, x, y, "maxplus", False)
    assert len({id(p) for p in seen[:4]}) == 4  # each layout its own launch
    assert seen[4] is seen[0]  # and the first found again
    assert seen[1].spec != seen[0].spec  # column-major: the strided kernel


# The wide product runs transposed (A' = B^T is read down B's columns): no 16-byte loads.
@pytest.mark.parametrize(
    ("shape", "vectors"),
    [(SHAPES[1], True), (SHAPES[2], True), (SHAPES[3], False)],
    ids=["tiled", "tall", "wide"],
)
def test_alignment_is_checked_per_call(
    shape: tuple[int, int, int], vectors: bool, rng: np.random.Generator
) -> None:
    """Views of one layout at 16-byte aligned and unaligned starts share a launch, and each
    call's pointers decide whether the kernel reads 16 bytes at a time (bit 1 of its last
    argument): row strides that are multiples of 4 elements allow it where a view starts
    aligned."""
    import cupy

    m, k, n = shape
    columns_a, columns_b = -(-(k + 4) // 4) * 4, -(-(n + 4) // 4) * 4
    wide_a, wide_b = operands(rng, "minplus", np.float32, (m, columns_a), (k + 4, columns_b))
    a_all, b_all = cupy.asarray(wide_a), cupy.asarray(wide_b)
    products = set()
    for offset in (0, 1, 4, 3):
        a = a_all[:, offset : offset + k]
        b = b_all[offset : offset + k, offset : offset + n]
        product, _ = _plan_cache.find(a, b, "minplus", argmax=False, out=None, accumulate=False)
        products.add(id(product))
        assert_product(tropical.matmul_sync(a, b, "minplus"), a, b, "minplus", False)
        assert product.launch is not None
        assert product.launch._values[-1] & 1 == (vectors and offset % 4 == 0), offset
        c = cupy.empty((m, n + 1), np.float32)[:, offset % 2 : offset % 2 + n]
        assert_product(tropical.matmul_sync(a, b, "minplus", out=c), a, b, "minplus", False)
    assert len(products) == 1


def test_installed_tiles_take_effect_on_the_next_call(rng: np.random.Generator) -> None:
    import cupy

    a, b = (cupy.asarray(x) for x in operands(rng, "maxplus", np.float32, (300, 70), (70, 260)))
    before, _ = _plan_cache.find(a, b, "maxplus", argmax=False, out=None, accumulate=False)
    assert before.launch is not None
    assert before.launch.grid[0] > 0
    kind = tropical.shape_class(300, 260, 70)
    table = {name: dict(variants) for name, variants in _shape_classes.TILES.items()}
    table[kind]["f4"] = (32, 32, 8, 2, 2, 1)
    device = a.device.id
    try:
        _shape_classes.install(device, table)
        after, _ = _plan_cache.find(a, b, "maxplus", argmax=False, out=None, accumulate=False)
        assert after is not before
        assert after.spec != before.spec
        assert after.launch is not None
        assert "32, 32, 8, 2, 2, 1>" in after.launch.spec.name_expressions[0]
        assert_product(tropical.matmul_sync(a, b, "maxplus"), a, b, "maxplus", False)
    finally:
        _shape_classes.install(device, _shape_classes.TILES)  # the built-in tiles again
    again, _ = _plan_cache.find(a, b, "maxplus", argmax=False, out=None, accumulate=False)
    assert again.spec == before.spec


def test_bad_input_is_refused_after_a_good_call_of_its_layout(rng: np.random.Generator) -> None:
    import cupy

    a, b = (cupy.asarray(x) for x in operands(rng, "maxplus", np.float32, (16, 8), (8, 12)))
    tropical.matmul_sync(a, b)
    with pytest.raises(TypeError, match=r"a must be a cupy.ndarray, not numpy.ndarray"):
        tropical.matmul_sync(host(a), b)
    with pytest.raises(TypeError, match="a and b must have one dtype"):
        tropical.matmul_sync(a, b.astype(np.float64))
    with pytest.raises(ValueError, match=r"out must be float32 of shape \(16, 12\)"):
        tropical.matmul_sync(a, b, out=cupy.empty((16, 11), np.float32))
    with pytest.raises(TypeError, match=r"out must be a \(values, argmax\) pair"):
        tropical.matmul_sync(a, b, argmax=True, out=[cupy.empty((16, 12), np.float32)] * 2)
    with pytest.raises(ValueError, match="semiring must be one of"):
        tropical.matmul_sync(a, b, "maxplux")
    with pytest.raises(ValueError, match="semiring must be one of"):
        tropical.matmul_sync(a, b, ["maxplus"])  # type: ignore[arg-type]


def test_plans_are_bounded(monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator) -> None:
    import cupy

    monkeypatch.setattr(_plan_cache, "MAX_PLANS", 4)
    _plan_cache.clear()
    for m in range(1, 11):
        a, b = (cupy.asarray(x) for x in operands(rng, "maxplus", np.float32, (m, 5), (5, 3)))
        assert_product(tropical.matmul_sync(a, b), a, b, "maxplus", False)
    assert len(_plan_cache._products) == 4


def test_threads_launching_one_layout_keep_their_own_pointers(rng: np.random.Generator) -> None:
    import cupy

    inputs = [operands(rng, "maxplus", np.float32, (40, 23), (23, 31)) for _ in range(8)]
    results: list[Any] = [None] * len(inputs)
    tropical.matmul_sync(*(cupy.asarray(x) for x in inputs[0]))  # compiled and planned
    barrier = threading.Barrier(len(inputs))

    def work(i: int) -> None:
        a, b = (cupy.asarray(x) for x in inputs[i])
        barrier.wait()
        for _ in range(50):
            results[i] = tropical.matmul_sync(a, b, argmax=True)
        cupy.cuda.get_current_stream().synchronize()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (a, b), got in zip(inputs, results, strict=True):
        want = reference.matmul(a, b, "maxplus", argmax=True)
        np.testing.assert_array_equal(host(got[0]), want[0])
        np.testing.assert_array_equal(host(got[1]), want[1])


@pytest.mark.parametrize("ring", ["maxplus", "minplus", "maxmul"])
def test_backward_reuses_its_launch_and_zeroes_on_the_stream(
    ring: str, rng: np.random.Generator
) -> None:
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    launches = set()
    for _ in range(3):
        a, b = operands(rng, ring, np.float64, (33, 17), (17, 21), infinities=False)
        g = rng.standard_normal((33, 21))
        with stream:
            ga, gb = cupy.asarray(a), cupy.asarray(b)
            _, index = tropical.matmul_sync(ga, gb, ring, argmax=True)
            gg = cupy.asarray(g)
        launches.add(id(_plan_cache.planned_backward(gg, ga, gb, index, ring)))
        # The current stream is the default one; the zeroing and the kernel run on `stream`.
        grad_a, grad_b = tropical.backward_sync(gg, ga, gb, index, ring, stream=stream)
        stream.synchronize()
        want_a, want_b = numpy_backward(g, a, b, host(index), ring)
        np.testing.assert_allclose(host(grad_a), want_a, atol=1e-9)
        np.testing.assert_allclose(host(grad_b), want_b, atol=1e-9)
    assert len(launches) == 1


def test_async_calls_reuse_the_launch(rng: np.random.Generator) -> None:
    import cupy

    async def main() -> None:
        for _ in range(3):
            a, b = (cupy.asarray(x) for x in operands(rng, "minplus", np.int32, (9, 70), (70, 5)))
            got = await tropical.matmul(a, b, "minplus", argmax=True)
            assert_product(got, a, b, "minplus", True)

    anyio.run(main)


def test_another_device_plans_its_own_launch(rng: np.random.Generator) -> None:
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("one GPU here: the second device's plan needs two")
    x, y = operands(rng, "maxplus", np.float32, (40, 23), (23, 31))
    with cupy.cuda.Device(0):
        a0, b0 = cupy.asarray(x), cupy.asarray(y)
    with cupy.cuda.Device(1):
        a1, b1 = cupy.asarray(x), cupy.asarray(y)
    first, _ = _plan_cache.find(a0, b0, "maxplus", argmax=False, out=None, accumulate=False)
    second, _ = _plan_cache.find(a1, b1, "maxplus", argmax=False, out=None, accumulate=False)
    assert first is not second
    assert (first.device, second.device) == (0, 1)
    with cupy.cuda.Device(0):  # launched on device 1 from device 0's thread state
        got = tropical.matmul_sync(a1, b1)
    assert got.device.id == 1
    assert_product(got, a1, b1, "maxplus", False)
    with cupy.cuda.Device(0):
        elsewhere = cupy.empty((40, 31), np.float32)
    with pytest.raises(ValueError, match="out is on device 0, a and b on device 1"):
        tropical.matmul_sync(a1, b1, out=elsewhere)
