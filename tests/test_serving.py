"""A service's first burst without NVRTC on its path: the guard against compiles while serving
(start_serving), kernels loaded ahead (prefetch with a device, warm), and the tropical products
that run on a loaded kernel while their own loads (ready). Real NVRTC on the CPU; the GPU
that loads the modules is the FakeDriver."""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import anyio.lowlevel
import numpy as np
import pytest

from aionvrtc import CompileOnHotPath, Compiler, KernelSpec, read_manifests, tropical
from aionvrtc.tropical.products import Launch, Plan, choose
from aionvrtc.tropical.products._plan_cache import Product, ready
from aionvrtc.tropical.products._product_plan import standins

from .support import FakeDriver, make_slow_spec, make_spec
from .support.cli import cli

pytestmark = pytest.mark.anyio


async def _until(done: object, seconds: float = 60.0) -> None:
    """Poll ``done()`` until it is true (a background compile or log line), at most seconds."""
    with anyio.fail_after(seconds):
        while not done():  # type: ignore[operator]
            await anyio.sleep(0.02)


def _settled(compiler: Compiler, *, compiles: int) -> bool:
    """``compiles`` done and their jobs finished (NVRTC's count comes before the job's end, and
    a request in between would still wait for it)."""
    stats = compiler.stats()
    return stats.compiles == compiles and stats.queued + stats.in_flight + stats.waiting == 0


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_compile_a_request_waits_for_while_serving_is_counted_and_explained(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="aionvrtc")
    plain = make_spec()
    fast = KernelSpec(plain.source, name_expressions=plain.name_expressions,
                      options=("--use_fast_math",))  # fmt: skip
    async with Compiler(arch="sm_90", cache_dir=tmp_path) as compiler:
        await compiler.compile(plain)  # before serving: not watched
        with pytest.raises(ValueError, match="start_serving takes 'warn', 'error' or None"):
            compiler.start_serving("loud")  # type: ignore[arg-type]
        assert compiler.serving is None
        compiler.start_serving()
        assert compiler.serving == "warn"
        built = await compiler.compile(fast)  # warned, served all the same
        assert built.arch == "sm_90"
        await compiler.compile(fast)  # a memory hit: nothing to say
        await _until(lambda: "compiled while serving" in caplog.text)
        stats = compiler.stats()
        assert (stats.hot_compiles, stats.compiles, stats.errors) == (1, 2, 0)
    lines = [r.getMessage() for r in caplog.records if "compiled while serving" in r.getMessage()]
    assert len(lines) == 1
    assert f"compile {fast.name_expressions[0]} ({fast.name}) for sm_90" in lines[0]
    assert "options: --use_fast_math added" in lines[0]  # its explain, in words


async def test_with_error_a_request_is_refused_and_the_kernel_compiles_for_the_next(
    tmp_path: Path,
) -> None:
    spec = make_spec()
    async with Compiler(arch="sm_90", cache_dir=tmp_path) as compiler:
        compiler.start_serving("error")
        with pytest.raises(CompileOnHotPath) as refused:
            await compiler.compile(spec)
        with pytest.raises(CompileOnHotPath):  # refused too while it compiles, not joined
            await compiler.compile(spec)
        message = str(refused.value)
        assert f"{spec.name_expressions[0]} ({spec.name}) is not compiled for sm_90" in message
        assert "Compiler.warm, tropical.Batcher.warm, aionvrtc warm manifest" in message
        await _until(lambda: _settled(compiler, compiles=1))  # compiled in the background
        again = await compiler.compile(spec)
        assert again.key == compiler.key(spec)
        stats = compiler.stats()
        assert (stats.hot_compiles, stats.errors, stats.rejected) == (1, 0, 0)
    # Another process's Compiler that finds it on disk compiles nothing: no hot compile.
    async with Compiler(arch="sm_90", cache_dir=tmp_path) as other:
        other.start_serving("error")
        assert (await other.compile(spec)).key == again.key
        assert (other.stats().hot_compiles, other.stats().disk.hits) == (0, 1)


async def test_a_warm_up_waiting_with_a_refused_request_still_gets_its_kernel(
    tmp_path: Path,
) -> None:
    # The refused request's job is the one the warm-up joined: the warm-up waits on for the
    # compile that goes on, and is never refused.
    spec = make_slow_spec(depth=40)
    async with Compiler(arch="sm_90", cache_dir=tmp_path) as compiler:
        compiler.start_serving("error")
        refused: list[BaseException] = []

        async def request() -> None:
            try:
                await compiler.compile(spec)
            except CompileOnHotPath as exc:
                refused.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(request)
            await anyio.lowlevel.checkpoint()  # the request's job first; the warm-up joins it
            assert await compiler.warm([spec], arch="sm_90") == 1
        assert len(refused) == 1
        stats = compiler.stats()
        assert (stats.hot_compiles, stats.compiles, stats.errors) == (1, 1, 0)


async def test_a_request_joining_a_prefetch_that_compiles_is_a_hot_compile(
    tmp_path: Path,
) -> None:
    spec = make_slow_spec(depth=60)
    async with Compiler(arch="sm_90", cache_dir=tmp_path) as compiler:
        compiler.start_serving("error")
        assert compiler.prefetch([spec]) == 1  # a warm-up: never refused
        await _until(lambda: compiler.stats().in_flight == 1)
        with pytest.raises(CompileOnHotPath):
            await compiler.compile(spec)  # would wait for the prefetch's NVRTC
        await _until(lambda: _settled(compiler, compiles=1))
        assert (await compiler.compile(spec)).key == compiler.key(spec)
        assert compiler.stats().hot_compiles == 1


async def test_warm_and_prefetch_with_a_device_load_ahead_and_are_never_hot(
    tmp_path: Path, gpu: FakeDriver, caplog: pytest.LogCaptureFixture
) -> None:
    first, second, third = make_spec(), make_spec(), make_spec()
    manifest = tmp_path / "used.manifest"
    async with Compiler(arch="sm_90", cache_dir=tmp_path, manifest=manifest) as compiler:
        compiler.start_serving("error")
        assert await compiler.warm([first, second, first], device=0) == 2
        assert compiler.loaded(first, device=0) is not None
        assert compiler.loaded(second, device=0) is not None
        with pytest.raises(ValueError, match="warm takes arch= or device=, not both"):
            await compiler.warm([third], arch="sm_80", device=0)
        assert await compiler.warm([third, third], arch="sm_80") == 1  # compiled, not loaded
        assert compiler.loaded(third, device=0) is None
        with pytest.raises(ValueError, match="prefetch takes arch= or device=, not both"):
            compiler.prefetch([third], arch="sm_90", device=0)
        with pytest.raises(TypeError, match="prefetch takes an iterable of KernelSpecs"):
            compiler.prefetch(third, device=0)  # type: ignore[arg-type]
        assert compiler.prefetch([third, first], device=0) == 1  # first is loaded already
        assert compiler.prefetch([third], device=0) == 0  # being loaded
        await _until(lambda: compiler.loaded(third, device=0) is not None)
        stats = compiler.stats()
        assert (stats.hot_compiles, stats.compiles, stats.errors) == (0, 4, 0)
        assert len(gpu.loaded) == 3
        # A load that fails is logged, and not tried again by the next prefetch.
        gpu.fault = "CUDA_ERROR_OUT_OF_MEMORY"
        broken = make_spec()
        assert compiler.prefetch([broken], device=0) == 1
        await _until(lambda: "loading" in caplog.text and "ahead on device 0 failed" in caplog.text)
        assert compiler.prefetch([broken], device=0) == 0
        gpu.fault = None
        await compiler.forget(broken)  # forget() lets it be tried again
        assert compiler.prefetch([broken], device=0) == 1
        await _until(lambda: compiler.loaded(broken, device=0) is not None)
    # What was warmed and loaded ahead is recorded for `aionvrtc warm manifest`, as requests are.
    assert set(read_manifests([manifest]).specs) == {first, second, third, broken}


def _layout(m: int, n: int, k: int, batch: int, *, argmax: bool) -> Plan:
    """The unbound plan of a row-major product, as ``Plan.unbound`` leaves it."""
    ring, dtype = tropical.SEMIRINGS["minplus"], np.dtype("float32")
    spec, tile, rows, transposed = choose(
        ring, dtype, m, n, k, batch=batch, argmax=argmax, accumulate=False, rowmajor=True,
        tile="auto", table=None,
    )  # fmt: skip
    each = (m * n if batch > 1 else 0, n, 1)
    return Plan(
        ring, spec, None, None, None, None, (m * k if batch > 1 else 0, k, 1),
        (k * n if batch > 1 else 0, n, 1), batch, m, n, k, 0, batch > 1, tile, rows,
        transposed, dtype, each, each if argmax else None, False,
    )  # fmt: skip


def _product(layout: Plan) -> Product:
    shape = (layout.batch, layout.m, layout.n) if layout.batched else (layout.m, layout.n)
    argmax = layout.index_strides is not None
    return Product(Launch.of(layout), None, shape, layout.dtype, argmax, 0, layout)


def test_a_batch_that_changes_class_has_the_single_products_kernel_among_its_standins() -> None:
    # 64 x 256^3 fills enough 128 x 128 tiles for the "large" class; one 256^3 product, and
    # 48 of them, take the "small" tiles: the kernel the Batcher's first bursts loaded.
    batch = _layout(256, 256, 256, 64, argmax=True)
    single = _layout(256, 256, 256, 1, argmax=True)
    assert batch.spec != single.spec
    assert tropical.batch_specs(256, 256, 256, "minplus", argmax=True, max_batch=64) == [
        single.spec, batch.spec,
    ]  # fmt: skip
    others = standins(batch)
    specs = [other.spec for other in others]
    assert single.spec in specs
    assert batch.spec not in specs
    generic = [tropical.gemm_spec("minplus", "float32", argmax=True, accumulate=False,
                                  layout=layout) for layout in ("rowmajor", "strided")]  # fmt: skip
    assert specs[-2:] == generic  # the generic kernel last, either layout
    assert all(other.tile is not None for other in others[:-2])
    # Transposed operands take the generic strided kernel alone.
    strided = _layout(256, 256, 256, 1, argmax=False)
    strided = Plan(**{**{f: getattr(strided, f) for f in Plan.__dataclass_fields__},
                      "a_strides": (0, 1, 256)})  # fmt: skip
    assert [other.spec for other in standins(strided)] == [
        tropical.gemm_spec("minplus", "float32", argmax=False, accumulate=False,
                           layout="strided"),
    ]  # fmt: skip


async def test_a_product_whose_kernel_is_not_loaded_runs_on_one_that_is_meanwhile(
    tmp_path: Path, gpu: FakeDriver
) -> None:
    # The cold-layout decision with real compiles: the batch's own kernel missing, the single
    # product's loaded, the batch runs on the latter while its own loads in the background,
    # then on its own.
    batch = _product(_layout(256, 256, 256, 64, argmax=True))
    single = _layout(256, 256, 256, 1, argmax=True)
    assert batch.launch is not None
    async with Compiler(arch="sm_90", cache_dir=tmp_path) as compiler:
        compiler.start_serving("error")
        assert ready(batch, compiler) is None  # nothing loaded can stand in: fetch its own
        await compiler.warm([single.spec], device=0)
        launch, module = ready(batch, compiler) or (None, None)
        assert launch is not None
        assert launch.spec == single.spec
        assert module is compiler.loaded(single.spec, device=0)
        assert launch.grid[2] == 64  # the whole batch in one launch, on the small tiles
        assert compiler.stats().prefetched == 1  # the batch's own, queued to load
        await _until(lambda: compiler.loaded(batch.launch.spec, device=0) is not None)
        own = ready(batch, compiler)
        assert own is not None
        assert own[0] is batch.launch
        assert compiler.stats().hot_compiles == 0


async def test_warm_tropical_batched_compiles_only_what_a_batcher_launches(
    tmp_path: Path,
) -> None:
    # 64 x 256^3 moves to the large tiles; with and without argmax: four kernels, not the 63
    # of every min-plus float32 kernel. The command line compiles the same four.
    want = tropical.warm_specs(["minplus"], ["float32"], batched=[(256, 256, 256)])
    assert len(want) == 4
    assert len(tropical.warm_specs(["minplus"], ["float32"])) == 63
    with pytest.raises(ValueError, match=r"batched must list product sizes \(M, N, K\)"):
        tropical.warm_specs(batched=[])
    async with Compiler(arch="sm_90", cache_dir=tmp_path / "a") as compiler:
        assert (
            await tropical.warm(
                ["minplus"], ["float32"], compiler=compiler, batched=[(256, 256, 256)]
            )
            == 4
        )
        assert compiler.stats().compiles == 4
    data = cli(
        "warm", "tropical", "--arch", "sm_90", "--semirings", "minplus", "--dtypes", "float32",
        "--batched", "256x256x256", "--max-batch", "64", cache=tmp_path / "b",
    )  # fmt: skip
    assert (data["kernels"], data["compiled"]) == (4, 4)
