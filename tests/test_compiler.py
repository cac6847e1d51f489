"""The Compiler actor under asyncio and trio: single flight, parallelism, cancellation, errors,
close, priorities, processes. Real NVRTC throughout."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import os
import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest

from aionvrtc import (
    Artifact,
    CompileError,
    Compiler,
    CompilerClosed,
    GPUOutOfMemoryError,
    KernelCache,
    KernelSpec,
    Module,
    ModuleLoadError,
    NoDeviceError,
    NvrtcError,
    QueueFull,
    _nvrtc,
    kernel_key,
)
from aionvrtc._cache import Claim
from aionvrtc._cuda_errors import cuda_status, describe
from aionvrtc._scheduler import LIVE, Stage
from aionvrtc._store.disk import DiskTier

from .support import ENTRIES, FakeDriver, driver_error, has_gpu, make_slow_spec, make_spec

_T = TypeVar("_T")

pytestmark = pytest.mark.anyio

BROKEN = "__global__ void k() { this_is_not_defined(); }"


async def test_thousand_requests_for_one_cold_key_compile_once(cache_dir: Path) -> None:
    spec = make_spec()
    results: list[Artifact] = []

    async def request() -> None:
        results.append(await compiler.compile(spec))

    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        async with anyio.create_task_group() as tg:
            for _ in range(1000):
                tg.start_soon(request)
        stats = compiler.stats()
    assert len(results) == 1000
    assert all(r is results[0] for r in results)
    assert results[0].image[:4] == b"\x7fELF"
    assert (stats.requests, stats.compiles, stats.joined, stats.memory.hits) == (1000, 1, 999, 0)
    assert (stats.errors, stats.queued, stats.in_flight) == (0, 0, 0)


async def test_memory_hit_returns_without_suspending(cache_dir: Path) -> None:
    spec = make_spec()
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        first = await compiler.compile(spec)
        coroutine = compiler.compile(spec)
        with pytest.raises(StopIteration) as done:
            coroutine.send(None)  # finishes on its first step: it never yielded to the loop
        assert done.value.value is first
        assert compiler.stats().memory.hits == 1


async def test_second_compiler_reads_the_disk(cache_dir: Path) -> None:
    spec = make_spec()
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        first = await compiler.compile(spec)
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        again = await compiler.compile(spec)
        stats = compiler.stats()
    assert again == first
    assert (stats.disk.hits, stats.compiles) == (1, 0)


# Names in an order that is not sorted: a disk hit listed them sorted, a compile as given.
UNSORTED = ("scale_{tag}<float>", "scale_{tag}<double>", "scale_{tag}<int>")


async def test_lowered_names_keep_the_specs_order_on_every_path(tmp_path: Path) -> None:
    from aionvrtc._store.bundle import write_bundle

    tag = "order"
    spec = make_spec(tag, name_expressions=[name.format(tag=tag) for name in UNSORTED])
    assert list(spec.name_expressions) != sorted(spec.name_expressions)
    cache = tmp_path / "cache"
    async with Compiler(arch="sm_90", cache_dir=cache) as compiler:
        compiled = await compiler.compile(spec)
        from_memory = await compiler.compile(spec)
    async with Compiler(arch="sm_90", cache_dir=cache) as compiler:  # a fresh process's view
        from_disk = await compiler.compile(spec)
        assert compiler.stats().disk.hits == 1
    bundle = tmp_path / "kernels.bundle"
    write_bundle(bundle, [p.read_bytes() for p in (cache / ENTRIES).glob("*/*")])
    served = []
    for layer in (cache, bundle):  # a cache-dir layer, then a bundle
        async with Compiler(arch="sm_90", disk=False, layers=[layer]) as compiler:
            served.append(await compiler.compile(spec))
            assert compiler.stats().compiles == 0
    for artifact in (compiled, from_memory, from_disk, *served):
        assert tuple(artifact.lowered_names) == spec.name_expressions


async def test_the_disk_counts_one_miss_per_cold_key(cache_dir: Path) -> None:
    # The compile's second look at the disk, under the key's lock, is no second miss.
    cold, crowd = make_spec(), make_spec()
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        await compiler.compile(cold)
        stats = compiler.stats()
        assert (stats.disk.misses, stats.disk.hits, stats.compiles) == (1, 0, 1)
        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(compiler.compile, crowd)
        stats = compiler.stats()
        assert (stats.disk.misses, stats.disk.hits, stats.compiles, stats.joined) == (2, 0, 2, 7)
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        await compiler.compile(cold)
        await compiler.compile(cold)  # from memory: the disk is not asked
        stats = compiler.stats()
    assert (stats.disk.misses, stats.disk.hits, stats.compiles, stats.memory.hits) == (0, 1, 0, 1)


def test_a_find_under_the_lock_after_a_miss_is_one_miss_and_one_hit(cache_dir: Path) -> None:
    # Another process stores the key between this one's lookup and its compile.
    spec = make_spec()
    other = KernelCache("sm_90", cache_dir=cache_dir.parent / "other").get_or_compile(spec)
    cache = KernelCache("sm_90", cache_dir=cache_dir)
    key = cache.key(spec)
    assert cache.lookup(key) is None
    assert DiskTier(cache_dir).write(other)
    found = cache.try_resolve(spec, key)
    assert not isinstance(found, Claim)
    assert found == (other, "disk")
    stats = cache.stats()
    assert (stats.disk.misses, stats.disk.hits, stats.compiles) == (1, 1, 0)


def _key_of(record: logging.LogRecord) -> str:
    """The key prefix of a "compiling"/"compiled" log record."""
    assert isinstance(record.args, tuple)
    return str(record.args[1])


def _compile_intervals(records: list[logging.LogRecord]) -> list[tuple[float, float]]:
    starts: dict[str, float] = {}
    intervals = []
    for record in records:
        key = _key_of(record) if record.msg.startswith("compil") else ""
        if record.msg.startswith("compiling "):
            starts[key] = record.created
        elif record.msg.startswith("compiled "):
            intervals.append((starts[key], record.created))
    return sorted(intervals)


@pytest.mark.parametrize("concurrency", [1, 2])
async def test_distinct_keys_compile_in_parallel_up_to_concurrency(
    cache_dir: Path, concurrency: int, caplog: pytest.LogCaptureFixture
) -> None:
    specs = [make_slow_spec() for _ in range(4)]
    caplog.set_level(logging.DEBUG, logger="aionvrtc")
    async with (
        Compiler(arch="sm_90", cache_dir=cache_dir, concurrency=concurrency) as compiler,
        anyio.create_task_group() as tg,
    ):
        for spec in specs:
            tg.start_soon(compiler.compile, spec)
    intervals = _compile_intervals(caplog.records)
    assert len(intervals) == 4
    overlapping = sum(b[0] < a[1] for a, b in itertools.pairwise(intervals))
    if concurrency == 1:
        assert overlapping == 0, intervals  # strictly one NVRTC job at a time
    else:
        assert overlapping >= 1, intervals


async def test_cancellation_storm_leaves_the_job_cached(cache_dir: Path) -> None:
    spec = make_slow_spec()
    outcomes = {"done": 0, "cancelled": 0}
    rng = random.Random(1234)
    before = len(anyio.get_running_tasks())

    async def waiter(cancel_after: float | None) -> None:
        with anyio.CancelScope() as scope:
            if cancel_after is not None:
                scope.deadline = anyio.current_time() + cancel_after
            art = await compiler.compile(spec)
            assert art.key == kernel_key(spec, "sm_90")
            outcomes["done"] += 1
        if scope.cancelled_caught:
            outcomes["cancelled"] += 1

    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        async with anyio.create_task_group() as tg:
            for index in range(300):
                cancel = rng.uniform(0.0, 0.05) if index % 3 else None
                tg.start_soon(waiter, cancel)
        # Every survivor got the artifact; the job itself was never cancelled.
        assert outcomes == {"done": 100, "cancelled": 200}
        stats = compiler.stats()
        assert (stats.compiles, stats.errors, stats.in_flight, stats.queued) == (1, 0, 0, 0)
        assert await compiler.compile(spec) is not None
        assert compiler.stats().memory.hits == 1
    assert len(anyio.get_running_tasks()) == before  # the actor and its workers are gone


async def test_all_cancelled_waiters_still_finish_and_cache_the_job(cache_dir: Path) -> None:
    spec = make_slow_spec()
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        with anyio.move_on_after(0.02):
            await compiler.compile(spec)
        assert compiler.stats().in_flight == 1
    # Closing waited for the running compile, which was written to disk.
    key = kernel_key(spec, "sm_90")
    assert (cache_dir / ENTRIES / key[:2] / key).is_file()


async def test_compile_error_fans_out_and_is_remembered(cache_dir: Path) -> None:
    broken = KernelSpec(BROKEN, name="broken.cu")
    errors: list[CompileError] = []

    async def request() -> None:
        with pytest.raises(CompileError) as info:
            await compiler.compile(broken)
        errors.append(info.value)

    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        async with anyio.create_task_group() as tg:
            for _ in range(50):
                tg.start_soon(request)
        assert len(errors) == 50
        assert len({id(e) for e in errors}) == 50  # each waiter got its own copy
        for error in errors:
            assert 'identifier "this_is_not_defined" is undefined' in error.log
            assert error.program == "broken.cu"
        stats = compiler.stats()
        assert (stats.errors, stats.compiles, stats.joined) == (50, 0, 49)
        assert compiler._cache.stats().compile_errors == 1

        with pytest.raises(CompileError, match="this_is_not_defined"):
            await compiler.compile(broken)  # fails fast: NVRTC is not asked again
        assert compiler._cache.stats().compile_errors == 1
        assert compiler.stats().errors == 51

        await compiler.forget(broken)
        with pytest.raises(CompileError):
            await compiler.compile(broken)
        assert compiler._cache.stats().compile_errors == 2
    assert not any((cache_dir / ENTRIES).glob("*/[0-9a-f]*"))  # nothing written to disk


async def test_a_failure_raised_to_requests_is_not_logged_as_well(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def gone(spec: KernelSpec, target: object) -> None:
        raise NvrtcError("NVRTC went away (injected)")

    monkeypatch.setattr(_nvrtc, "compile_program", gone)
    caplog.set_level(logging.WARNING, logger="aionvrtc")
    live, warm = make_spec(), make_spec()

    async def request() -> None:
        with pytest.raises(NvrtcError, match="injected"):
            await compiler.compile(live)

    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        async with anyio.create_task_group() as tg:
            for _ in range(3):  # one job, raised to each of the three
                tg.start_soon(request)
        await request()  # not remembered (not the program's fault): a job of its own
        assert (compiler.stats().errors, compiler.stats().joined) == (4, 2)
        assert caplog.messages == []
        # A prefetch's failure reaches no request: the log is the only place it is said.
        compiler.key(warm)  # derived now: the prefetch is queued at once
        assert compiler.prefetch([warm]) == 1
        while compiler.stats().queued or compiler.stats().in_flight:
            await anyio.sleep(0.01)
    assert caplog.messages == [
        f"job for {kernel_key(warm, 'sm_90')[:16]} failed: NVRTC went away (injected)"
    ]


async def test_close_fails_queued_jobs_and_finishes_running_ones(cache_dir: Path) -> None:
    running, queued = make_slow_spec(), [make_spec(), make_spec()]
    outcomes: dict[str, object] = {}

    async def request(name: str, spec: KernelSpec) -> None:
        try:
            outcomes[name] = await compiler.compile(spec)
        except CompilerClosed as exc:
            outcomes[name] = exc

    compiler = Compiler(arch="sm_90", cache_dir=cache_dir, concurrency=1)
    async with anyio.create_task_group() as tg:
        await compiler.__aenter__()
        tg.start_soon(request, "running", running)
        while compiler.stats().in_flight == 0:
            await anyio.sleep(0.001)
        tg.start_soon(request, "queued-0", queued[0])
        tg.start_soon(request, "queued-1", queued[1])
        while compiler.stats().queued < 2:
            await anyio.sleep(0.001)
        await compiler.aclose()
    assert isinstance(outcomes["running"], Artifact)
    for name in ("queued-0", "queued-1"):
        assert isinstance(outcomes[name], CompilerClosed)
        assert "closed before this job started" in str(outcomes[name])
    assert compiler.closed
    with pytest.raises(CompilerClosed, match="the Compiler is closed"):
        await compiler.compile(running)
    with pytest.raises(CompilerClosed):
        compiler.prefetch([make_spec()])
    await compiler.aclose()  # idempotent


async def test_aclose_of_a_compiler_never_opened_is_idempotent(cache_dir: Path) -> None:
    # The second aclose() of a Compiler closed before it opened failed an assertion.
    compiler = Compiler(cache_dir=cache_dir)
    await compiler.aclose()
    await compiler.aclose()
    assert compiler.closed
    with pytest.raises(CompilerClosed, match="the Compiler is closed"):
        await compiler.compile(make_spec())


async def test_close_from_another_task_finishes_the_running_compile(cache_dir: Path) -> None:
    # A server's shutdown handler closes the Compiler from a task of its own.
    results: list[Artifact] = []

    async def request(spec: KernelSpec) -> None:
        results.append(await compiler.compile(spec))

    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        async with anyio.create_task_group() as tg:
            tg.start_soon(request, make_slow_spec())
            while compiler.stats().in_flight == 0:
                await anyio.sleep(0.001)
            tg.start_soon(compiler.aclose)
        assert compiler.closed
        assert compiler.stats().in_flight == 0
        assert [a.kind for a in results] == ["cubin"]
        with pytest.raises(CompilerClosed, match="the Compiler is closed"):
            await compiler.compile(make_spec())
    assert compiler.closed  # and leaving the async with afterwards is clean


async def test_lifecycle_errors(cache_dir: Path) -> None:
    compiler = Compiler(arch="sm_90", cache_dir=cache_dir)
    with pytest.raises(RuntimeError, match="not open: use 'async with Compiler"):
        await compiler.compile(make_spec())
    async with compiler:
        with pytest.raises(TypeError, match="spec must be a KernelSpec, not str"):
            await compiler.compile("__global__ void k() {}")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="opened once"):
        async with compiler:
            pass
    with pytest.raises(ValueError, match="concurrency must be a positive int, got 0"):
        Compiler(arch="sm_90", concurrency=0)


async def test_a_bad_item_leaves_a_prefetch_of_the_good_ones_possible(cache_dir: Path) -> None:
    # The specs before a bad item were marked as being derived and then never derived: a
    # later prefetch of them queued nothing.
    spec = make_spec()
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        with pytest.raises(TypeError, match="prefetch takes KernelSpecs, not str"):
            compiler.prefetch([spec, "not a spec"])  # type: ignore[list-item]
        with pytest.raises(
            TypeError, match=r"an iterable of KernelSpecs \(a list, even of one\), not KernelSpec"
        ):
            compiler.prefetch(spec)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"an iterable of KernelSpecs .*, not int"):
            compiler.prefetch(5)  # type: ignore[arg-type]
        assert compiler.stats().compiles == 0
        assert compiler.prefetch([spec]) == 1
        with anyio.fail_after(120):
            while compiler.stats().compiles < 1:
                await anyio.sleep(0.01)
        assert compiler.stats().prefetched == 1


async def test_prefetch_is_overtaken_by_live_requests(
    cache_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="aionvrtc")
    warm = [make_spec() for _ in range(6)]
    live = make_spec()
    async with Compiler(arch="sm_90", cache_dir=cache_dir, concurrency=1) as compiler:
        assert compiler.prefetch(warm) == 6
        assert compiler.prefetch(warm) == 0  # already queued
        await compiler.compile(live)
        order = [_key_of(r) for r in caplog.records if r.msg.startswith("compiled ")]
        # At most the one prefetch that was already running finished before the live request.
        assert order.index(kernel_key(live, "sm_90")[:16]) <= 1
        # A live request for a prefetched key promotes its job.
        await compiler.compile(warm[-1])
        stats = compiler.stats()
        assert stats.prefetched == 6
        assert stats.joined == 1
        while compiler.stats().queued or compiler.stats().in_flight:
            await anyio.sleep(0.01)
        assert compiler.stats().compiles == 7


async def test_get_without_a_gpu_names_compile(cache_dir: Path) -> None:
    if has_gpu():
        pytest.skip("this machine has a GPU: get() is tested by the GPU tests")
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        with pytest.raises(NoDeviceError, match=r"await compiler.compile\(spec\)"):
            await compiler.get(make_spec())


async def test_loaded_is_none_without_a_loaded_module_and_never_raises(cache_dir: Path) -> None:
    spec = make_spec()
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        await compiler.compile(spec)  # compiled, not loaded: no GPU needed
        assert compiler.loaded(spec, device=0) is None
        for not_a_spec in (None, "spec", 3):
            assert compiler.loaded(not_a_spec, device=0) is None  # type: ignore[arg-type]
    assert compiler.loaded(spec, device=0) is None  # closed


@pytest.mark.gpu
async def test_loaded_is_the_module_get_returns(cache_dir: Path) -> None:
    spec = make_spec()
    async with Compiler(cache_dir=cache_dir) as compiler:
        assert compiler.loaded(spec, device=0) is None
        module = await compiler.get(spec, device=0)
        assert compiler.loaded(spec, device=0) is module
        requests = compiler.stats().requests
        assert compiler.loaded(spec, device=0) is module
        assert compiler.stats().requests == requests + 1  # served from memory, as get() is
        for not_a_spec in (None, "spec", 3):  # with device 0's modules there: still None
            assert compiler.loaded(not_a_spec, device=0) is None  # type: ignore[arg-type]
        assert compiler.loaded(spec, device=True) in (None, module)  # never raises
    assert compiler.loaded(spec, device=0) is None  # closed: nothing is served


CHILD = """
import sys, time, json
import anyio
from aionvrtc import Compiler, KernelSpec
source, cache_dir, start = sys.argv[1], sys.argv[2], float(sys.argv[3])

async def main():
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        time.sleep(max(0.0, start - time.time()))
        await compiler.compile(KernelSpec(source))
        s = compiler.stats()
        print(json.dumps({"compiles": s.compiles, "disk_hits": s.disk.hits}))

anyio.run(main)
"""


def test_processes_cold_on_one_key_compile_it_once(cache_dir: Path) -> None:
    import json

    source = make_slow_spec().source
    start = time.time() + 2.0  # every child has imported and opened its Compiler by then
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, source, str(cache_dir), str(start)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    results = [json.loads(child.communicate(timeout=120)[0]) for child in children]
    assert all(child.returncode == 0 for child in children)
    assert sum(r["compiles"] for r in results) == 1, results
    assert sum(r["disk_hits"] for r in results) == 3, results


def test_blocking_facade_serves_threads(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import aionvrtc

    monkeypatch.setenv("AIONVRTC_ARCH", "sm_90")
    monkeypatch.setenv("AIONVRTC_CACHE_DIR", str(cache_dir))
    spec = make_slow_spec()
    results: list[Artifact] = []
    try:
        compiler = aionvrtc.default_compiler()
        assert aionvrtc.default_compiler() is compiler
        assert compiler.target.arch == "sm_90"
        threads = [
            threading.Thread(target=lambda: results.append(aionvrtc.compile_sync(spec)))
            for _ in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(results) == 8
        assert all(r is results[0] for r in results)
        stats = compiler.stats()
        assert (stats.compiles, stats.requests) == (1, 8)
        assert stats.joined + stats.memory.hits == 7
        with pytest.raises(CompileError, match="this_is_not_defined"):
            aionvrtc.compile_sync(KernelSpec(BROKEN))
        if not has_gpu():
            with pytest.raises(NoDeviceError, match="compile"):
                aionvrtc.get_sync(spec)
    finally:
        aionvrtc.close_default_compiler()
    assert compiler.closed
    with pytest.raises(CompilerClosed):
        compiler.compile_sync(spec)


async def test_compile_sync_from_a_worker_thread_of_the_loop(cache_dir: Path) -> None:
    spec = make_spec()
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        art = await anyio.to_thread.run_sync(compiler.compile_sync, spec)
        assert art is await compiler.compile(spec)


async def test_records_through_the_compiler(cache_dir: Path) -> None:
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        assert await compiler.load_record("tiles") is None
        assert await compiler.save_record("tiles", b"[1, 2]") is True
        assert await compiler.load_record("tiles") == b"[1, 2]"
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as later:
        assert await later.load_record("tiles") == b"[1, 2]"
        assert later.stats().requests == 0  # records are not kernel requests


async def test_a_disk_hit_is_served_while_another_key_compiles(cache_dir: Path) -> None:
    # Issue 16's head-of-line blocking: at concurrency=1 a live disk hit waited for whatever
    # NVRTC was doing (a 7 s compile: 7.4 s). Its lookup now runs in the I/O lane.
    from aionvrtc import KernelCache

    warm = make_spec()
    KernelCache("sm_90", cache_dir=cache_dir).get_or_compile(warm)  # on disk, not in memory
    slow = make_slow_spec(depth=120)  # over a second of NVRTC
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        async with anyio.create_task_group() as group:
            group.start_soon(compiler.compile, slow)
            with anyio.fail_after(30):
                while compiler.stats().in_flight == 0:
                    await anyio.sleep(0.001)
            artifact = await compiler.compile(warm)
            during = compiler.stats()
        after = compiler.stats()
    assert artifact.key == kernel_key(warm, "sm_90")
    # Served from disk while the slow compile still held the only compile slot.
    assert (during.in_flight, during.compiles, during.disk.hits) == (1, 0, 1)
    assert (after.compiles, after.in_flight) == (1, 0)


async def test_a_cold_live_request_takes_a_slot_of_its_own_while_prefetches_compile(
    cache_dir: Path,
) -> None:
    # At concurrency=1 a cold live request waited for the prefetched compile holding the only
    # slot (NVRTC cannot be interrupted): up to twice one compile. Prefetched jobs now take
    # only the slots live work leaves free, and a live job takes one of its own.
    warm = [make_slow_spec(depth=120) for _ in range(3)]  # over a second of NVRTC each
    live = make_spec()
    async with Compiler(arch="sm_90", cache_dir=cache_dir, concurrency=1) as compiler:
        assert compiler.prefetch(warm) == 3
        with anyio.fail_after(30):
            while compiler.stats().in_flight == 0:
                await anyio.sleep(0.001)
        await anyio.sleep(0.05)  # the other two looked up and queued by now
        before = compiler.stats()
        artifact = await compiler.compile(live)
        during = compiler.stats()
    assert artifact.key == kernel_key(live, "sm_90")
    # One prefetched compile at a time, as concurrency says; the others wait for a slot.
    assert (before.in_flight, before.queued, before.compiles) == (1, 2, 0)
    # The live compile ran beside it and finished while the prefetched one still ran.
    assert (during.compiles, during.in_flight, during.queued) == (1, 1, 2)


async def test_aclose_under_a_deadline_from_the_opener_cancels_what_is_left(
    cache_dir: Path,
) -> None:
    # Issue 16: aclose() from the opening task inside fail_after(...) raised RuntimeError on
    # asyncio and corrupted trio's cancel-scope stack.
    outcomes: list[object] = []

    async def request(spec: KernelSpec) -> None:
        try:
            outcomes.append(await compiler.compile(spec))
        except CompilerClosed as exc:
            outcomes.append(exc)

    compiler = Compiler(arch="sm_90", cache_dir=cache_dir)
    await compiler.__aenter__()
    async with anyio.create_task_group() as group:
        group.start_soon(request, make_slow_spec(depth=120))
        with anyio.fail_after(30):
            while compiler.stats().in_flight == 0:
                await anyio.sleep(0.001)
        started = time.monotonic()
        with pytest.raises(TimeoutError), anyio.fail_after(0.05):
            await compiler.aclose()
        assert time.monotonic() - started < 1.0  # did not wait for the compile
    with anyio.fail_after(5):
        await compiler.aclose()  # returns once the actor has stopped
    assert compiler.closed
    assert len(outcomes) == 1
    assert isinstance(outcomes[0], CompilerClosed)
    assert "cancelled while compiling" in str(outcomes[0])
    # And the trio/asyncio scope stack is intact: more scopes work as usual.
    with anyio.move_on_after(0.01) as scope:
        await anyio.sleep(1)
    assert scope.cancelled_caught


async def test_aclose_from_a_nested_scope_or_any_task_waits_for_running_compiles(
    cache_dir: Path,
) -> None:
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        async with anyio.create_task_group() as group:
            group.start_soon(compiler.compile, make_slow_spec())
            with anyio.fail_after(30):
                while compiler.stats().in_flight == 0:
                    await anyio.sleep(0.001)
            async with anyio.create_task_group():  # the opener, one task group deeper
                with anyio.CancelScope():
                    await compiler.aclose()
        assert compiler.closed
        assert compiler.stats().compiles == 1  # the running compile finished and was kept
    # An opener that never uses async with: opened and closed from two other tasks.
    other = Compiler(arch="sm_90", cache_dir=cache_dir)
    async with anyio.create_task_group() as group:
        group.start_soon(other.__aenter__)
    assert not other.closed
    async with anyio.create_task_group() as group:
        group.start_soon(other.aclose)
    assert other.closed


async def test_a_job_waiting_for_another_process_lock_holds_no_compile_slot(
    cache_dir: Path,
) -> None:
    # Issue 16: a job whose key another process was compiling polled that lock inside the one
    # compile slot, so unrelated cold keys waited (up to the 300 s lock timeout).
    from aionvrtc import KernelCache
    from aionvrtc._store import DiskTier

    held, other = make_spec(), make_spec()
    other_process = DiskTier(cache_dir)  # its own open file: to flock, another process
    lock = other_process.try_lock(kernel_key(held, "sm_90"))
    assert lock is not None
    assert lock.held
    async with Compiler(arch="sm_90", cache_dir=cache_dir, concurrency=1) as compiler:
        async with anyio.create_task_group() as group:
            waiter: list[Artifact] = []

            async def wait_for_held() -> None:
                waiter.append(await compiler.compile(held))

            group.start_soon(wait_for_held)
            with anyio.fail_after(10):
                while compiler.stats().waiting == 0:
                    await anyio.sleep(0.001)
                await compiler.compile(other)  # compiled while the first job waits
            during = compiler.stats()
            # The other process stores the kernel and lets go: the waiter reads it from disk.
            stored = KernelCache("sm_90", cache_dir=cache_dir, disk=False).get_or_compile(held)
            assert other_process.write(stored)
            lock.release()
        after = compiler.stats()
    assert (during.waiting, during.in_flight, during.compiles) == (1, 0, 1)
    assert waiter[0].image == stored.image
    assert (after.compiles, after.waiting, after.disk.hits) == (1, 0, 1)
    assert not [p for p in os.listdir(cache_dir / ENTRIES / stored.key[:2]) if p.endswith(".lock")]


async def test_closing_while_starting_or_while_a_key_is_derived_closes_cleanly(
    cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Review of issue 16: aclose() during __aenter__ returned at once and the Compiler opened
    # afterwards; a request whose key was derived in a thread while the Compiler closed got an
    # AssertionError and left its job in the in-flight map.
    from aionvrtc import _includes

    compiler = Compiler(arch="sm_90", cache_dir=cache_dir)
    host = compiler._host

    async def slow_host(*args: object) -> None:
        await anyio.sleep(0.05)  # opening takes a while
        await host(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(compiler, "_host", slow_host)
    async with anyio.create_task_group() as group:
        group.start_soon(compiler.__aenter__)
        while compiler._state.value == "new":  # until opening has started (not finished)
            await anyio.lowlevel.checkpoint()
        assert compiler._state.value == "starting"
        await compiler.aclose()
    assert compiler.closed
    with pytest.raises(CompilerClosed):
        await compiler.compile(make_spec())

    (tmp_path / "a.cuh").write_text("#define X 1\n")
    real = _includes.host_files
    gate = threading.Event()

    def slow(*args: Any, **kwargs: Any) -> _includes.HostFiles:
        gate.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(_includes, "host_files", slow)
    spec = KernelSpec('#include "a.cuh"\n__global__ void k() {}', options=(f"-I{tmp_path}",))
    raised: list[BaseException] = []

    async def request() -> None:
        try:
            await other.compile(spec)
        except Exception as exc:
            raised.append(exc)

    async with (
        Compiler(arch="sm_90", cache_dir=cache_dir) as other,
        anyio.create_task_group() as group,
    ):
        group.start_soon(request)
        await anyio.sleep(0.05)  # the key is being derived in a worker thread
        await other.aclose()
        gate.set()
    assert len(raised) == 1
    assert isinstance(raised[0], CompilerClosed)
    assert other._scheduler.inflight == {}


def test_a_failed_claim_lets_go_of_the_file_lock(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aionvrtc import KernelCache
    from aionvrtc._store import DiskTier

    cache = KernelCache("sm_90", cache_dir=cache_dir)
    key = cache.key(make_spec())

    def broken(key: str, *, arch: str | None = None, again: bool = False) -> None:
        raise OSError("injected: the disk re-check failed")

    assert cache.disk is not None
    monkeypatch.setattr(cache.disk, "read", broken)  # read again once the lock is taken
    with pytest.raises(OSError, match="injected"):
        cache.claim(key, wait=False)
    lock = DiskTier(cache_dir).try_lock(key)  # another process can take it at once
    assert lock is not None
    assert lock.held
    lock.release()


# -- loading on the GPU: faults injected at CuPy's boundary ----------------------------------


async def cached(spec: KernelSpec, cache_dir: Path) -> tuple[Artifact, Path]:
    """``spec`` compiled for sm_90 by a Compiler of its own, and its disk entry: the good kernel
    that a server finds in its cache when it starts."""
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        artifact = await compiler.compile(spec)
    return artifact, cache_dir / ENTRIES / artifact.key[:2] / artifact.key


def loading(spec: KernelSpec, artifact: Artifact) -> str:
    """How a load error's message starts for ``spec``'s kernel on the fake GPU."""
    return (
        f"loading {spec.name_expressions[0]} (cubin for sm_90, key {artifact.key[:16]}...) on "
        "device 0 failed: "
    )


async def every(count: int, call: Callable[[], Awaitable[_T]]) -> list[_T | Exception]:
    """``call()`` in ``count`` tasks at once: each one's result or error."""
    outcomes: list[_T | Exception] = []

    async def one() -> None:
        try:
            outcomes.append(await call())
        except Exception as exc:
            outcomes.append(exc)

    async with anyio.create_task_group() as tg:
        for _ in range(count):
            tg.start_soon(one)
    return outcomes


def recompiles(caplog: pytest.LogCaptureFixture) -> int:
    return sum("dropping it and compiling again" in r.getMessage() for r in caplog.records)


async def test_out_of_memory_on_load_keeps_the_cached_kernel_and_compiles_nothing(
    cache_dir: Path, gpu: FakeDriver, caplog: pytest.LogCaptureFixture
) -> None:
    spec = make_spec()
    good, entry = await cached(spec, cache_dir)
    stored = entry.read_bytes()
    gpu.fault = "CUDA_ERROR_OUT_OF_MEMORY"  # a busy inference server's GPU
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        outcomes = await every(8, lambda: compiler.get(spec))
        for error in outcomes:
            assert type(error) is GPUOutOfMemoryError
            assert error.status == "CUDA_ERROR_OUT_OF_MEMORY"
            assert str(error) == loading(spec, good) + (
                "out of GPU memory (CUDA_ERROR_OUT_OF_MEMORY); the cached kernel is kept; free "
                "GPU memory and retry"
            )
            assert isinstance(error.__cause__, RuntimeError)  # CuPy's CUDADriverError
            assert cuda_status(error.__cause__) == "CUDA_ERROR_OUT_OF_MEMORY"
        # Kept on disk, byte for byte, and in memory; nothing compiled, dropped or logged as such.
        stats = compiler.stats()
        assert (stats.compiles, stats.disk.hits) == (0, 1)
        assert entry.read_bytes() == stored
        assert good.key in compiler._memory
        assert (gpu.tries, gpu.loaded, recompiles(caplog)) == (8, [], 0)
        # Memory is free again: the same request loads the cached kernel, compiling nothing.
        gpu.fault = None
        module = await compiler.get(spec)
        assert module.artifact.image == good.image
        assert gpu.loaded == [good.image]
        assert await compiler.get(spec) is module
        assert (compiler.stats().compiles, gpu.tries) == (0, 9)
    assert entry.read_bytes() == stored


@pytest.mark.parametrize(
    ("status", "fix"),
    [
        ("CUDA_ERROR_ILLEGAL_ADDRESS", "restart the process"),
        ("CUDA_ERROR_INVALID_CONTEXT", "or restart the process"),
        ("CUDA_ERROR_NOT_INITIALIZED", "check the GPU and its driver (nvidia-smi)"),
        ("CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "an NVRTC no newer than the driver"),
        ("CUDA_ERROR_JIT_COMPILER_NOT_FOUND", "(a cubin needs no JIT)"),
    ],
)
async def test_a_load_that_fails_but_not_for_the_image_keeps_it_and_compiles_nothing(
    cache_dir: Path, gpu: FakeDriver, caplog: pytest.LogCaptureFixture, status: str, fix: str
) -> None:
    spec = make_spec()
    good, entry = await cached(spec, cache_dir)
    stored = entry.read_bytes()
    gpu.fault = status
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        for _ in range(3):  # a retry meets the same fault, and changes nothing either
            with pytest.raises(ModuleLoadError) as info:
                await compiler.get(spec)
            assert type(info.value) is ModuleLoadError
            assert info.value.status == status
            message = str(info.value)
            assert message.startswith(loading(spec, good))
            assert f"({status}); the cached kernel is kept; " in message
            assert message.endswith(fix)
        assert compiler.stats().compiles == 0
        assert good.key in compiler._memory
        assert entry.read_bytes() == stored
        assert (gpu.tries, recompiles(caplog)) == (3, 0)


@pytest.mark.parametrize(
    "status", ["CUDA_ERROR_INVALID_IMAGE", "CUDA_ERROR_NO_BINARY_FOR_GPU", "CUDA_ERROR_INVALID_PTX"]
)
async def test_an_image_the_driver_refuses_is_dropped_and_compiled_again_once(
    cache_dir: Path, gpu: FakeDriver, caplog: pytest.LogCaptureFixture, status: str
) -> None:
    from aionvrtc._artifact import encode

    spec = make_spec()
    good, entry = await cached(spec, cache_dir)
    # A well-formed entry (its checksum right) holding an image the driver refuses: a damaged
    # or foreign image stored under the right key.
    bad = dataclasses.replace(good, image=b"\x7fELF" + bytes(range(256)) * 4)
    entry.write_bytes(encode(bad))
    gpu.refused[bad.image] = status
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        outcomes = await every(16, lambda: compiler.get(spec))
        modules = [m for m in outcomes if isinstance(m, Module)]
        assert len(modules) == 16, outcomes
        fresh = modules[0].artifact
        assert fresh.image != bad.image
        assert all(m.artifact is fresh for m in modules)
        # Every request met the refused image; one replaced it, the others loaded its image.
        assert compiler.stats().compiles == 1
        assert recompiles(caplog) == 1
        assert (gpu.tries, gpu.loaded) == (32, [fresh.image] * 16)
        assert entry.read_bytes() == encode(fresh)  # the disk holds the new image
        module = await compiler.get(spec)  # loaded: served from memory
        assert module.artifact is fresh
        assert (compiler.stats().compiles, gpu.tries) == (1, 32)


def refused_again(message: str) -> str:
    """``message`` with its numbers of seconds as N."""
    return re.sub(r"\d+ s\b", "N s", message)


async def test_a_second_refusal_within_the_window_raises_instead_of_compiling_again(
    cache_dir: Path, gpu: FakeDriver, caplog: pytest.LogCaptureFixture
) -> None:
    spec = make_spec()
    good, entry = await cached(spec, cache_dir)
    gpu.fault = "CUDA_ERROR_INVALID_IMAGE"  # every image, the replacement's too
    refusal = describe(driver_error("CUDA_ERROR_INVALID_IMAGE"))
    expected = loading(spec, good) + (
        f"the driver refused the image as invalid ({refusal}); it was dropped and replaced N s "
        "ago after the same refusal, so it is kept now and not replaced again for N s "
        "(compiling it again would make the same image; `await compiler.forget(spec)` retries "
        "at once)"
    )
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        with pytest.raises(ModuleLoadError) as info:
            await compiler.get(spec)
        assert type(info.value) is ModuleLoadError
        assert info.value.status == "CUDA_ERROR_INVALID_IMAGE"
        assert refused_again(str(info.value)) == expected
        assert isinstance(info.value.__cause__, RuntimeError)
        assert cuda_status(info.value.__cause__) == "CUDA_ERROR_INVALID_IMAGE"
        assert (compiler.stats().compiles, gpu.tries) == (1, 2)  # the cached image, the new one
        # A storm of requests: each raises at once; none compiles or drops the new entry.
        outcomes = await every(16, lambda: compiler.get(spec))
        assert all(type(e) is ModuleLoadError for e in outcomes), outcomes
        assert {refused_again(str(e)) for e in outcomes} == {expected}
        assert (compiler.stats().compiles, gpu.tries, recompiles(caplog)) == (1, 18, 1)
        assert good.key in compiler._memory
        assert entry.exists()


async def test_after_the_window_or_forget_a_refused_image_is_replaced_again(
    cache_dir: Path, gpu: FakeDriver
) -> None:
    from aionvrtc._modules import REFUSAL_WINDOW

    spec = make_spec()
    gpu.fault = "CUDA_ERROR_INVALID_IMAGE"
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        assert compiler._loaded.refusal_window == REFUSAL_WINDOW == 3600.0

        async def compiles_after_a_refusal() -> int:
            with pytest.raises(ModuleLoadError, match="refused the image as invalid"):
                await compiler.get(spec)
            return compiler.stats().compiles

        assert await compiles_after_a_refusal() == 2  # cold: compiled, refused, compiled again
        assert await compiles_after_a_refusal() == 2
        compiler._loaded.refusal_window = 0.0  # the window has passed: replaced once more
        assert await compiles_after_a_refusal() == 3
        compiler._loaded.refusal_window = REFUSAL_WINDOW
        assert await compiles_after_a_refusal() == 3
        await compiler.forget(spec)  # at once: compiled (forgotten), refused, compiled again
        assert await compiles_after_a_refusal() == 5
        assert await compiles_after_a_refusal() == 5
        gpu.fault = None  # the driver takes it now: loaded as cached
        module = await compiler.get(spec)
        assert gpu.loaded == [module.artifact.image]
        assert compiler.stats().compiles == 5


async def test_blocking_and_tropical_callers_raise_the_same_load_errors(
    cache_dir: Path, gpu: FakeDriver
) -> None:
    from aionvrtc.tropical.products._launching import module, module_sync

    spec = make_spec()
    good, _ = await cached(spec, cache_dir)
    gpu.fault = "CUDA_ERROR_OUT_OF_MEMORY"
    expected = loading(spec, good) + (
        "out of GPU memory (CUDA_ERROR_OUT_OF_MEMORY); the cached kernel is kept; free GPU "
        "memory and retry"
    )
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        calls: list[Callable[[], Awaitable[Module]]] = [
            lambda: compiler.get(spec),
            lambda: anyio.to_thread.run_sync(functools.partial(compiler.get_sync, spec)),
            lambda: module(spec, 0, compiler),
            lambda: anyio.to_thread.run_sync(module_sync, spec, 0, compiler),
        ]
        for call in calls:
            with pytest.raises(GPUOutOfMemoryError) as info:
                await call()
            assert str(info.value) == expected
        assert compiler.stats().compiles == 0
        gpu.fault = None
        loaded = await anyio.to_thread.run_sync(module_sync, spec, 0, compiler)
        assert loaded.artifact.image == good.image
        assert compiler.stats().compiles == 0


def test_the_process_wide_compiler_raises_the_same_load_errors(
    cache_dir: Path, gpu: FakeDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    import aionvrtc

    monkeypatch.setenv("AIONVRTC_ARCH", "sm_90")
    monkeypatch.setenv("AIONVRTC_CACHE_DIR", str(cache_dir))
    spec = make_spec()
    gpu.fault = "CUDA_ERROR_OUT_OF_MEMORY"
    try:
        with pytest.raises(GPUOutOfMemoryError, match=r"the cached kernel is kept; free GPU"):
            aionvrtc.get_sync(spec)
        compiler = aionvrtc.default_compiler()
        assert compiler.stats().compiles == 1  # cold: compiled once, then kept
        gpu.fault = None
        assert aionvrtc.get_sync(spec).artifact.image == gpu.loaded[0]
        assert compiler.stats().compiles == 1
    finally:
        aionvrtc.close_default_compiler()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_past_max_queued_a_request_is_refused_at_once(tmp_path: Path) -> None:
    # One compile slot busy, two kernels queued behind it: a request for a fourth is refused
    # at once, naming the bound and the fixes; one joining a queued kernel is not; once the
    # queue drains the refused kernel is served.
    with pytest.raises(ValueError, match="max_queued must be a positive int or None, got 0"):
        Compiler(arch="sm_90", cache_dir=tmp_path / "x", max_queued=0)
    specs = [make_slow_spec(depth=60) for _ in range(4)]
    async with Compiler(arch="sm_90", cache_dir=tmp_path, max_queued=2) as compiler:
        results: dict[int, object] = {}

        async def request(n: int) -> None:
            results[n] = await compiler.compile(specs[n])

        async with anyio.create_task_group() as tg:
            for n in range(3):
                tg.start_soon(request, n)
                await anyio.sleep(0.05)  # in order: the first takes the slot
            with anyio.fail_after(2):  # refused at once, not after the compiles
                while compiler.stats().queued < 2:
                    await anyio.sleep(0.01)
                with pytest.raises(QueueFull) as refused:
                    await compiler.compile(specs[3])
            assert "2 kernels are waiting to be looked up or compiled (max_queued=2, 1 compile" in (
                str(refused.value)
            )
            assert "Compile the kernels a service uses ahead" in str(refused.value)
            tg.start_soon(request, 2)  # joins the queued job of specs[2]: not refused
        stats = compiler.stats()
        assert sorted(results) == [0, 1, 2]
        assert (stats.rejected, stats.errors, stats.compiles) == (1, 0, 3)
        assert stats.joined == 1
        # Four requests went to a job (the fourth joined one); the refused one is counted as
        # rejected alone, not as a request that memory missed.
        assert (stats.requests, stats.memory.hits) == (4, 0)
        built = await compiler.compile(specs[3])  # room again
        assert built.arch == "sm_90"
        assert (compiler.stats().compiles, compiler.stats().requests) == (4, 5)


def _waiting_live(compiler: Compiler) -> int:
    """What max_queued bounds, by its definition: a walk of every job in flight."""
    unstarted = (Stage.LOOKUP, Stage.READING, Stage.QUEUED)
    jobs = compiler._scheduler.inflight.values()
    return sum(job.priority == LIVE and job.stage in unstarted for job in jobs)


@pytest.mark.anyio
async def test_the_queue_bound_keeps_its_count_through_hits_failures_and_cancellations(
    tmp_path: Path,
) -> None:
    # max_queued is checked against a count kept as jobs enter and leave the queue (not a walk
    # of every job in flight per request): after disk hits, compile errors, remembered
    # failures, requests cancelled while their jobs ran on, a prefetch promoted by a request
    # and a closing that failed queued jobs, the count is the walk's, and the bound refuses
    # the fourth live kernel waiting behind three, no sooner, no later.
    cache = tmp_path / "cache"
    on_disk = [make_spec() for _ in range(3)]
    async with Compiler(arch="sm_90", cache_dir=cache) as compiler:
        for spec in on_disk:
            await compiler.compile(spec)
    bad = [KernelSpec(f"__global__ void f() {{ not_defined_{n}; }}") for n in range(3)]

    async def each(requests: Sequence[Callable[[], Awaitable[object]]]) -> list[str]:
        outcomes: list[str] = []

        async def one(request: Callable[[], Awaitable[object]]) -> None:
            try:
                await request()
                outcomes.append("served")
            except CompileError:
                outcomes.append("CompileError")

        async with anyio.create_task_group() as group:
            for request in requests:
                group.start_soon(one, request)
        return sorted(outcomes)

    async def settled(compiler: Compiler) -> None:
        with anyio.fail_after(60):
            while compiler._scheduler.inflight:
                await anyio.sleep(0.01)

    async with Compiler(arch="sm_90", cache_dir=cache, max_queued=3, concurrency=1) as compiler:
        scheduler = compiler._scheduler
        hits = [functools.partial(compiler.compile, spec) for spec in on_disk]
        assert await each(hits) == ["served"] * 3
        failing = [functools.partial(compiler.compile, spec) for spec in bad]
        assert await each(failing) == ["CompileError"] * 3
        assert await each(failing) == ["CompileError"] * 3  # remembered: never in flight
        for spec in [make_slow_spec(depth=60) for _ in range(3)]:
            with anyio.move_on_after(0.05):  # the request leaves; its job runs on
                await compiler.compile(spec)
        assert scheduler.live_queued() == _waiting_live(compiler)
        await settled(compiler)
        assert scheduler.live_queued() == _waiting_live(compiler) == 0
        # One slot busy, a prefetch queued behind it, then asked for live: promoted, counted.
        running, prefetched = make_slow_spec(depth=60), make_slow_spec(depth=60)
        compiler.key(prefetched)
        async with anyio.create_task_group() as group:
            group.start_soon(compiler.compile, running)
            with anyio.fail_after(10):
                while compiler.stats().in_flight < 1:
                    await anyio.sleep(0.01)
            assert compiler.prefetch([prefetched]) == 1
            assert scheduler.live_queued() == _waiting_live(compiler) == 0  # not live
            group.start_soon(compiler.compile, prefetched)
            queued = [make_slow_spec(depth=60) for _ in range(2)]
            for spec in queued:
                group.start_soon(compiler.compile, spec)
            with anyio.fail_after(10):
                while scheduler.live_queued() < 3:
                    await anyio.sleep(0.01)
            assert _waiting_live(compiler) == 3
            with pytest.raises(QueueFull, match="max_queued=3"):
                await compiler.compile(make_slow_spec(depth=60))
        assert scheduler.live_queued() == _waiting_live(compiler) == 0
        stats = compiler.stats()
        assert (stats.rejected, stats.errors, stats.compiles) == (1, 6, 7)
    # Closing with live jobs queued fails them, and takes them off the count.
    closed: list[str] = []
    compiler = Compiler(arch="sm_90", cache_dir=cache, concurrency=1)
    scheduler = compiler._scheduler

    async def request(spec: KernelSpec) -> None:
        try:
            await compiler.compile(spec)
            closed.append("served")
        except CompilerClosed:
            closed.append("CompilerClosed")

    # The requests' task group outlives the Compiler: they wait on through its closing.
    async with anyio.create_task_group() as group, compiler:
        for _ in range(3):
            group.start_soon(request, make_slow_spec(depth=60))
        with anyio.fail_after(10):
            while scheduler.live_queued() < 2 or compiler.stats().in_flight < 1:
                await anyio.sleep(0.01)
    assert sorted(closed) == ["CompilerClosed", "CompilerClosed", "served"]
    assert scheduler.live_queued() == _waiting_live(compiler) == 0


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_prefetches_are_neither_refused_nor_in_the_way_of_requests(tmp_path: Path) -> None:
    # A warm-up of many kernels queues them all, and live requests are bounded by the live
    # jobs alone: with one place, a live compile running (live requests overtake the warm-up)
    # and one waiting behind it, the next is refused, whatever the prefetches queued.
    slow = [make_slow_spec(depth=60) for _ in range(7)]
    async with Compiler(arch="sm_90", cache_dir=tmp_path, max_queued=1, concurrency=1) as compiler:
        for spec in slow:
            compiler.key(spec)  # derived now: each prefetch is queued at once
        assert compiler.prefetch(slow[:4]) == 4  # past the bound: all queued
        async with anyio.create_task_group() as tg:
            with anyio.fail_after(10):
                while compiler.stats().in_flight < 1:  # a prefetch holds the one slot
                    await anyio.sleep(0.01)
            tg.start_soon(compiler.compile, slow[4])  # live: runs beside the prefetch
            with anyio.fail_after(10):
                while compiler.stats().in_flight < 2:
                    await anyio.sleep(0.01)
            tg.start_soon(compiler.compile, slow[5])  # live: waits, holding the one place
            with anyio.fail_after(2):
                while compiler._scheduler.live_queued() < 1:  # the queue's state
                    await anyio.sleep(0.01)
                with pytest.raises(QueueFull, match="max_queued=1"):
                    await compiler.compile(slow[6])
        stats = compiler.stats()
        assert (stats.prefetched, stats.rejected, stats.errors) == (4, 1, 0)
        assert stats.compiles >= 2  # both live requests served; prefetches may still run
