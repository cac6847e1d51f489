"""tropical.Batcher with real tasks on the GPU: results equal direct calls for every semiring and
dtype, dependent chains batched without copies, cancellation and errors kept to the tasks they
concern, and devices and streams never mixed.

Each test draws fresh operands from a seed it prints; ``TROPICAL_TEST_SEED=<seed>`` repeats it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import aionvrtc
from aionvrtc import Compiler, CompilerClosed, tropical
from aionvrtc.tropical import reference

from .support.tropical_data import host, operands, until_loaded

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]

CASES = [(s, d) for s, ring in tropical.SEMIRINGS.items() for d in ring.dtypes]
IDS = [f"{s}-{np.dtype(d)}" for s, d in CASES]


@pytest.fixture(scope="module", autouse=True)
def _default_compiler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    os.environ["AIONVRTC_CACHE_DIR"] = str(tmp_path_factory.mktemp("batcher-cache"))
    aionvrtc.close_default_compiler()
    aionvrtc.default_compiler()
    yield
    aionvrtc.close_default_compiler()


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def assert_same(got: Any, want: Any, argmax: bool) -> None:
    if argmax:
        np.testing.assert_array_equal(host(got[0]), host(want[0]))
        np.testing.assert_array_equal(host(got[1]), host(want[1]))
    else:
        np.testing.assert_array_equal(host(got), host(want))


async def gather(batcher: Any, inputs: list[Any], ring: str, argmax: bool) -> list[Any]:
    """Each pair's product through ``batcher``, from a task of its own."""
    got: list[Any] = [None] * len(inputs)

    async def one(i: int) -> None:
        got[i] = await batcher.matmul(*inputs[i], ring, argmax=argmax)

    async with anyio.create_task_group() as tg:
        for i in range(len(inputs)):
            tg.start_soon(one, i)
    return got


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
async def test_batched_results_equal_direct_calls(
    ring: str, dtype: Any, rng: np.random.Generator
) -> None:
    import cupy

    batcher = tropical.Batcher(max_batch=8)
    shared = cupy.asarray(operands(rng, ring, dtype, (1, 1), (23, 31))[1])
    for argmax in (False, True):
        inputs = []
        for i in range(20):
            a, b = operands(rng, ring, dtype, (40, 23), (23, 31))
            # Some tasks share b (it broadcasts), the others bring their own (stacked).
            inputs.append((cupy.asarray(a), shared if i % 2 else cupy.asarray(b)))
        got = await gather(batcher, inputs, ring, argmax)
        for (a, b), result in zip(inputs, got, strict=True):
            assert_same(result, tropical.matmul_sync(a, b, ring, argmax=argmax), argmax)
            want = reference.matmul(host(a), host(b), ring, argmax=argmax)
            np.testing.assert_array_equal(
                host(result[0] if argmax else result), want[0] if argmax else want
            )
    stats = batcher.stats()
    assert stats.requests == 40
    # 20 requests at most 8 to a launch: 3 launches each on asyncio (trio's shuffled order may
    # split a group in two).
    assert 6 <= stats.launches <= 8


async def test_the_same_product_asked_by_many_gives_each_its_own(
    rng: np.random.Generator,
) -> None:
    """Every task passes the same a and the same b: one batched launch, each task a result of
    its own (not a row of one shared result)."""
    import cupy

    a, b = (cupy.asarray(x) for x in operands(rng, "maxplus", np.float32, (12, 7), (7, 9)))
    batcher = tropical.Batcher()
    got = await gather(batcher, [(a, b)] * 12, "maxplus", True)
    want = reference.matmul(host(a), host(b), "maxplus", argmax=True)
    for c, index in got:
        assert c.shape == (12, 9)
        np.testing.assert_array_equal(host(c), want[0])
        np.testing.assert_array_equal(host(index), want[1])
    got[0][0].fill(0)  # one task's result is its own to change
    np.testing.assert_array_equal(host(got[1][0]), want[0])
    assert batcher.stats().launches == 1


async def test_devices_are_never_mixed(rng: np.random.Generator) -> None:
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("one GPU here: mixing devices needs two")
    pairs = [operands(rng, "minplus", np.float32, (24, 8), (8, 16)) for _ in range(8)]
    inputs = []
    for i, (x, y) in enumerate(pairs):
        with cupy.cuda.Device(i % 2):
            inputs.append((cupy.asarray(x), cupy.asarray(y)))
    batcher = tropical.Batcher()
    got = await gather(batcher, inputs, "minplus", False)
    for i, ((x, y), c) in enumerate(zip(pairs, got, strict=True)):
        assert c.device.id == i % 2
        np.testing.assert_array_equal(host(c), reference.matmul(x, y, "minplus"))
    assert batcher.stats().launches == 2  # a launch per device


async def test_a_dependent_chain_batches_every_step(rng: np.random.Generator) -> None:
    """The server's request: 8 dependent min-plus products with argmax, by 32 tasks; each step
    of every task after the first is one launch, its A the previous launch's C in place."""
    import cupy

    weights = [
        cupy.asarray(operands(rng, "minplus", np.float32, (1, 1), (64, 64))[1]) for _ in range(8)
    ]
    starts = [
        cupy.asarray(operands(rng, "minplus", np.float32, (64, 64), (1, 1))[0]) for _ in range(32)
    ]
    batcher = tropical.Batcher(max_batch=64)
    finals: list[Any] = [None] * len(starts)

    async def request(i: int) -> None:
        x = starts[i]
        for w in weights:
            x, index = await batcher.matmul(x, w, "minplus", argmax=True)
        finals[i] = (x, index)

    async with anyio.create_task_group() as tg:
        for i in range(len(starts)):
            tg.start_soon(request, i)
    for start, (x, index) in zip(starts, finals, strict=True):
        want = start
        for w in weights[:-1]:
            want = tropical.matmul_sync(want, w, "minplus")
        value, arg = tropical.matmul_sync(want, weights[-1], "minplus", argmax=True)
        np.testing.assert_array_equal(host(x), host(value))
        np.testing.assert_array_equal(host(index), host(arg))
    stats = batcher.stats()
    assert stats.requests == 32 * 8
    assert stats.launches <= 8 * 2 + 8  # a task may run ahead alone before the others start


async def test_a_task_alone_is_not_held(rng: np.random.Generator) -> None:
    import cupy

    batcher = tropical.Batcher(max_delay=0.2)
    a, b = (cupy.asarray(x) for x in operands(rng, "maxplus", np.float64, (16, 9), (9, 5)))
    with anyio.fail_after(5):
        for _ in range(5):
            c = await batcher.matmul(a, b)
    np.testing.assert_array_equal(host(c), reference.matmul(host(a), host(b), "maxplus"))
    stats = batcher.stats()
    assert (stats.requests, stats.launches) == (5, 5)
    assert stats.alone == 4  # the first request opened a group (of one), held for max_delay


async def test_max_delay_holds_a_group_until_it_is_full(rng: np.random.Generator) -> None:
    """Requests that arrive apart share a launch within max_delay, and a group launches as
    soon as max_batch have joined."""
    import cupy

    batcher = tropical.Batcher(max_batch=3, max_delay=60.0)
    inputs = [
        tuple(cupy.asarray(x) for x in operands(rng, "maxmul", np.int64, (6, 5), (5, 7)))
        for _ in range(3)
    ]
    got: list[Any] = [None] * 3

    async def one(i: int) -> None:
        await anyio.sleep(0.05 * i)
        got[i] = await batcher.matmul(inputs[i][0], inputs[i][1], "maxmul", argmax=True)

    with anyio.fail_after(20):  # not the 60 s of max_delay: the third request fills the group
        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(one, i)
    assert batcher.stats().launches == 1
    for (a, b), (c, index) in zip(inputs, got, strict=True):
        want = reference.matmul(host(a), host(b), "maxmul", argmax=True)
        np.testing.assert_array_equal(host(c), want[0])
        np.testing.assert_array_equal(host(index), want[1])


# On asyncio tasks run in the order they were started, so task 0 leads the group and the others
# have joined it when the canceller runs (trio shuffles that order).
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_cancelled_waiters_leave_the_others_results_whole(
    rng: np.random.Generator,
) -> None:
    """The leader and a follower of one group are cancelled while it waits: the group is still
    launched, and every other task gets its own correct result."""
    import cupy

    batcher = tropical.Batcher()
    inputs = [
        tuple(cupy.asarray(x) for x in operands(rng, "minplus", np.float32, (33, 20), (20, 17)))
        for _ in range(10)
    ]
    got: dict[int, Any] = {}
    scopes: dict[int, anyio.CancelScope] = {}
    cancelled: list[int] = []

    async def one(i: int) -> None:
        with anyio.CancelScope() as scope:
            scopes[i] = scope
            got[i] = await batcher.matmul(inputs[i][0], inputs[i][1], "minplus", argmax=True)
        if scope.cancelled_caught:
            cancelled.append(i)

    async def cancel() -> None:
        assert len(scopes) == len(inputs)  # all have asked: 0 leads, the others wait
        scopes[0].cancel()
        scopes[5].cancel()

    async with anyio.create_task_group() as tg:
        for i in range(len(inputs)):
            tg.start_soon(one, i)
        tg.start_soon(cancel)
    assert sorted(cancelled) == [0, 5]
    assert sorted(got) == [1, 2, 3, 4, 6, 7, 8, 9]
    assert batcher.stats().launches == 1
    for i, result in got.items():
        want = reference.matmul(host(inputs[i][0]), host(inputs[i][1]), "minplus", argmax=True)
        np.testing.assert_array_equal(host(result[0]), want[0])
        np.testing.assert_array_equal(host(result[1]), want[1])


async def test_errors_reach_only_the_tasks_they_concern(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    import cupy

    batcher = tropical.Batcher()
    inputs = [
        tuple(cupy.asarray(x) for x in operands(rng, "maxplus", np.float32, (12, 7), (7, 9)))
        for _ in range(6)
    ]
    wrong = (inputs[0][0], cupy.asarray(host(inputs[0][1]).astype(np.float64)))
    outcomes: dict[int, Any] = {}

    async def one(i: int, pair: Any) -> None:
        try:
            outcomes[i] = await batcher.matmul(*pair)
        except Exception as exc:
            outcomes[i] = exc

    async with anyio.create_task_group() as tg:
        for i, pair in enumerate([*inputs[:3], wrong, *inputs[3:]]):
            tg.start_soon(one, i, pair)
    assert isinstance(outcomes[3], TypeError)
    assert "a and b must have one dtype" in str(outcomes[3])
    for i, pair in zip([0, 1, 2, 4, 5, 6], inputs, strict=True):
        np.testing.assert_array_equal(
            host(outcomes[i]), reference.matmul(host(pair[0]), host(pair[1]), "maxplus")
        )
    # A launch's own failure (here: its Compiler closed) reaches each member of its group, and
    # nobody waits for ever.
    async with Compiler(cache_dir=tmp_path) as compiler:
        closing = tropical.Batcher(compiler)
    failed: list[BaseException] = []

    async def member(pair: Any) -> None:
        try:
            await closing.matmul(pair[0], pair[1], "minplus")
        except CompilerClosed as exc:
            failed.append(exc)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for pair in inputs:
                tg.start_soon(member, pair)
    assert len(failed) == len(inputs)


async def test_streams_are_never_mixed(rng: np.random.Generator) -> None:
    import cupy

    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
    batcher = tropical.Batcher()
    inputs = [
        tuple(cupy.asarray(x) for x in operands(rng, "maxplus", np.float32, (24, 8), (8, 16)))
        for _ in range(12)
    ]
    got: list[Any] = [None] * len(inputs)

    async def one(i: int) -> None:
        got[i] = await batcher.matmul(*inputs[i], stream=streams[i % 2])

    async with anyio.create_task_group() as tg:
        for i in range(len(inputs)):
            tg.start_soon(one, i)
    for stream in streams:
        stream.synchronize()
    for (a, b), c in zip(inputs, got, strict=True):
        np.testing.assert_array_equal(host(c), reference.matmul(host(a), host(b), "maxplus"))
    # Each stream's requests in launches of their own: at least one per stream, and no launch
    # holds both (a launch of all 12 would be one).
    stats = batcher.stats()
    assert 2 <= stats.launches <= 4


async def test_batched_operands_and_empty_products_run_as_matmul(
    rng: np.random.Generator,
) -> None:
    import cupy

    batcher = tropical.Batcher()
    a, b = (cupy.asarray(x) for x in operands(rng, "maxplus", np.float32, (3, 5, 4), (4, 6)))
    c = await batcher.matmul(a, b)
    np.testing.assert_array_equal(host(c), reference.matmul(host(a), host(b), "maxplus"))
    empty = await batcher.matmul(cupy.empty((0, 4), np.float32), b)
    assert empty.shape == (0, 6)
    zero = await batcher.matmul(cupy.empty((2, 0), np.float32), cupy.empty((0, 3), np.float32))
    np.testing.assert_array_equal(host(zero), np.full((2, 3), -np.inf, np.float32))


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
async def test_a_new_batch_size_runs_at_once_on_a_loaded_kernel_and_then_on_its_own(
    ring: str, dtype: Any, rng: np.random.Generator, tmp_path: Path
) -> None:
    """One 256 x 32 x 256 product takes the small tiles, 64 of them the large ones: a burst of
    64 after a lone request runs on the lone request's kernel while its own loads (a serving
    Compiler that refuses hot compiles never refuses it), then on its own; every answer the
    reference's."""
    import cupy

    # Where one product and 64 take different kernels (8-byte types share some tiles).
    differ = {
        argmax: tropical.kernel_spec(256, 256, 32, ring, dtype, argmax=argmax, batch=64)
        != tropical.kernel_spec(256, 256, 32, ring, dtype, argmax=argmax)
        for argmax in (False, True)
    }
    async with Compiler(cache_dir=tmp_path) as compiler:
        batcher = tropical.Batcher(compiler, max_batch=64)
        for argmax in (False, True):
            probe = [cupy.asarray(x) for x in operands(rng, ring, dtype, (256, 32), (32, 256))]
            # One product's kernel, loaded by a direct call: the Batcher's first request of
            # the layout would have its batch sizes' kernels loaded in the background too.
            await tropical.matmul(probe[0], probe[1], ring, argmax=argmax, compiler=compiler)
            compiler.start_serving("error")
            own = tropical.kernel_spec(256, 256, 32, ring, dtype, argmax=argmax, batch=64)
            for burst in range(2):
                inputs = [
                    tuple(cupy.asarray(x) for x in operands(rng, ring, dtype, (256, 32), (32, 256)))
                    for _ in range(64)
                ]
                got = await gather(batcher, inputs, ring, argmax)
                for (a, b), result in zip(inputs, got, strict=True):
                    want = reference.matmul(host(a), host(b), ring, argmax=argmax)
                    assert_same(result, want, argmax)
                if burst == 0:
                    await until_loaded(compiler, own)
            compiler.start_serving(None)
        stats = batcher.stats()
        # Each argmax's first burst on a stand-in where its kernel differs, its second on its
        # own kernel.
        assert stats.standins == sum(differ.values())
        if tropical.tuning.tiled_supported(ring, np.dtype(dtype)) and np.dtype(dtype).itemsize == 4:
            assert stats.standins == 2
        assert compiler.stats().hot_compiles == 0


async def test_a_layouts_first_request_loads_its_batch_kernels_in_the_background(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    """A request alone (a readiness probe) has the kernels of its layout's larger batches
    loaded in the background: a burst that comes once they are runs on its own kernel, no
    stand-in, nothing compiled while serving."""
    import cupy

    own = tropical.kernel_spec(256, 256, 32, "minplus", argmax=True, batch=64)
    assert own != tropical.kernel_spec(256, 256, 32, "minplus", argmax=True)
    async with Compiler(cache_dir=tmp_path) as compiler:
        batcher = tropical.Batcher(compiler, max_batch=64)
        a, b = (cupy.asarray(x) for x in operands(rng, "minplus", np.float32, (256, 32), (32, 256)))
        assert_same(
            await batcher.matmul(a, b, "minplus", argmax=True),
            reference.matmul(host(a), host(b), "minplus", argmax=True),
            True,
        )
        await until_loaded(compiler, own)  # asked for by nothing but that request
        compiler.start_serving("error")
        inputs = [
            tuple(
                cupy.asarray(x) for x in operands(rng, "minplus", np.float32, (256, 32), (32, 256))
            )
            for _ in range(64)
        ]
        got = await gather(batcher, inputs, "minplus", True)
        for (x, y), result in zip(inputs, got, strict=True):
            assert_same(result, reference.matmul(host(x), host(y), "minplus", argmax=True), True)
        stats = batcher.stats()
        assert stats.standins == 0
        assert stats.launches < 10  # (the burst's 64 products in few launches)
        assert compiler.stats().hot_compiles == 0


async def test_a_direct_batched_matmul_runs_on_a_loaded_kernel_meanwhile(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    import cupy

    async with Compiler(cache_dir=tmp_path) as compiler:
        a, b = (cupy.asarray(x) for x in operands(rng, "maxplus", np.float32, (256, 64), (64, 256)))
        await tropical.matmul(a, b, compiler=compiler)  # loads the small tiles
        compiler.start_serving("error")
        a3, b3 = (
            cupy.asarray(x)
            for x in operands(rng, "maxplus", np.float32, (64, 256, 64), (64, 64, 256))
        )
        got = await tropical.matmul(a3, b3, compiler=compiler)  # the large tiles' batch
        want = reference.matmul(host(a3), host(b3), "maxplus")
        np.testing.assert_array_equal(host(got), want)
        own = tropical.kernel_spec(256, 256, 64, "maxplus", "float32", batch=64)
        await until_loaded(compiler, own)
        np.testing.assert_array_equal(host(await tropical.matmul(a3, b3, compiler=compiler)), want)
        assert compiler.stats().hot_compiles == 0


async def test_batcher_warm_loads_every_batch_sizes_kernel_ahead(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    import cupy

    async with Compiler(cache_dir=tmp_path) as compiler:
        batcher = tropical.Batcher(compiler, max_batch=64)
        assert await batcher.warm(256, 256, 32, "minplus", "float32", argmax=True) == 2
        compiles = compiler.stats().compiles
        compiler.start_serving("error")
        for size in (1, 8, 64):
            inputs = [
                tuple(
                    cupy.asarray(x)
                    for x in operands(rng, "minplus", np.float32, (256, 32), (32, 256))
                )
                for _ in range(size)
            ]
            got = await gather(batcher, inputs, "minplus", True)
            for (a, b), result in zip(inputs, got, strict=True):
                assert_same(result, reference.matmul(host(a), host(b), "minplus", argmax=True),
                            True)  # fmt: skip
        assert batcher.stats().standins == 0
        assert (compiler.stats().compiles, compiler.stats().hot_compiles) == (compiles, 0)
    with pytest.raises(ValueError, match="sizes must be positive"):
        await tropical.Batcher().warm(0, 256, 32)


async def test_past_max_queue_a_request_is_refused_at_once(rng: np.random.Generator) -> None:
    """Groups held open by max_delay: the first 8 requests wait in them, the next 4 are refused
    at once (not after the delay), naming the bound; the 8 get their answers, and once they
    have, there is room again."""
    import cupy

    from aionvrtc import QueueFull

    batcher = tropical.Batcher(max_batch=64, max_delay=0.5, max_queue=8)
    pairs = [operands(rng, "minplus", np.float32, (32, 16), (16, 8)) for _ in range(12)]
    inputs = [(cupy.asarray(x), cupy.asarray(y)) for x, y in pairs]
    got: dict[int, Any] = {}
    refused: dict[int, tuple[str, float]] = {}

    async def one(i: int) -> None:
        began = anyio.current_time()
        try:
            got[i] = await batcher.matmul(inputs[i][0], inputs[i][1], "minplus")
        except QueueFull as exc:
            refused[i] = (str(exc), anyio.current_time() - began)

    async with anyio.create_task_group() as tg:
        for i in range(12):
            tg.start_soon(one, i)
    assert len(got) == 8
    assert len(refused) == 4
    for message, waited in refused.values():
        assert message.startswith("8 requests are waiting in this Batcher (max_queue=8)")
        assert waited < 0.25  # at once, not after max_delay
    for i, c in got.items():
        np.testing.assert_array_equal(
            host(c), reference.matmul(pairs[i][0], pairs[i][1], "minplus")
        )
    stats = batcher.stats()
    assert (stats.requests, stats.rejected) == (8, 4)
    assert host(await batcher.matmul(inputs[0][0], inputs[0][1], "minplus")).shape == (
        32,
        8,
    )  # room again
