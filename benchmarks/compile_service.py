"""The compile service on the CPU (no GPU needed): latency, fan-out, event-loop lag, warm-up.

    python benchmarks/compile_service.py --machine "this CPU" [--backend asyncio|trio]

Writes benchmarks/results/compile_service-<machine slug>.{json,md}. Every comparison is made
side by side in the one run; times are medians of repeated batches.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel

import aionvrtc
from aionvrtc import Compiler, KernelSpec, _nvrtc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aionvrtc import kernel_key
from benchmarks._results import (
    COLD_NOTE,
    RESULTS,
    trivial_coroutine,
    use_fresh_nvrtc_cache,
    write,
)

# Distinct per call, ~50-300 ms to compile: the kernel's name differs, because NVRTC 13 keeps
# compiled programs in a cross-process cache on disk (~/.nv/ComputeCache) where a changed comment
# is still a hit. main() also gives this process an empty CUDA_CACHE_PATH, so that nothing an
# earlier run (or the test suite) compiled is served.
_SERIAL = iter(range(1_000_000))


def kernel(unroll: int = 24) -> KernelSpec:
    tag = f"{os.getpid()}_{next(_SERIAL)}_{time.time_ns()}"
    return KernelSpec(
        f"""
__global__ void bench_{tag}(float* x) {{
    float a = x[threadIdx.x];
    #pragma unroll
    for (int i = 0; i < {unroll}; ++i) a = sinf(a) * 1.0001f + (float)i;
    x[threadIdx.x] = a;
}}
""",
        name=f"bench_{tag}.cu",
    )


async def hot_hit(cache_dir: str) -> dict[str, float]:
    """Median over batches of the mean time of one awaited call, in nanoseconds: a memory hit
    against a trivial coroutine taking the same argument, in identical loops."""
    spec = kernel()
    calls, batches = 20_000, 21
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        await compiler.compile(spec)
        hits, trivials = [], []
        for _ in range(batches):
            started = time.perf_counter_ns()
            for _ in range(calls):
                await compiler.compile(spec)
            hits.append((time.perf_counter_ns() - started) / calls)
            started = time.perf_counter_ns()
            for _ in range(calls):
                await trivial_coroutine(spec)
            trivials.append((time.perf_counter_ns() - started) / calls)
    hit, trivial = statistics.median(hits), statistics.median(trivials)
    return {"hot_hit_ns": hit, "trivial_coroutine_ns": trivial, "ratio": hit / trivial}


async def _waiters(n: int, compiler: Compiler | None) -> tuple[float, float]:
    """Seconds for ``n`` tasks to start and block (join), then to all finish once released
    (wake): on one cold key of ``compiler``, or, with None, on a plain anyio.Event."""
    gate = threading.Event()
    event = anyio.Event()
    spec = kernel()

    async def plain() -> None:
        await event.wait()

    if compiler is not None:
        # Hold the job until the waiters are parked, so join and wake are timed apart from
        # the compile itself (which the other measures cover).
        resolve = compiler._cache.try_resolve

        def gated(spec: KernelSpec, key: str, claim: Any = None) -> Any:
            gate.wait()
            return resolve(spec, key, claim)

        compiler._cache.try_resolve = gated  # type: ignore[method-assign]
    gc.collect()
    gc.disable()
    async with anyio.create_task_group() as tg:
        started = time.perf_counter()
        for _ in range(n):
            if compiler is None:
                tg.start_soon(plain)
            else:
                tg.start_soon(compiler.compile, spec)
        # (anyio.wait_all_tasks_blocked sleeps 0.1 s whenever a task is runnable: too coarse.)
        if compiler is None:
            while event.statistics().tasks_waiting < n:
                await anyio.lowlevel.checkpoint()
        else:
            joined = compiler.stats().joined + n - 1
            while compiler.stats().joined < joined:
                await anyio.lowlevel.checkpoint()
        parked = time.perf_counter()
        if compiler is None:
            event.set()
        else:
            # The release includes one compile; it is measured and taken off below.
            before = compiler.stats().compile_seconds
            gate.set()
    finished = time.perf_counter()
    gc.enable()
    wake = finished - parked
    if compiler is not None:
        wake -= compiler.stats().compile_seconds - before
        compiler._cache.try_resolve = resolve  # type: ignore[method-assign]
    return parked - started, wake


async def joined_overhead(
    cache_dir: str, waiters: int = 10_000, rounds: int = 7
) -> dict[str, float]:
    """What each joined waiter costs beyond a task awaiting a plain anyio.Event (task start
    included in both), medians of interleaved rounds."""
    ours: list[tuple[float, float]] = []
    plain: list[tuple[float, float]] = []
    async with Compiler(arch="sm_90", cache_dir=cache_dir, disk=False) as compiler:
        await compiler.compile(kernel())  # start the worker thread
        for _ in range(rounds):
            plain.append(await _waiters(waiters, None))
            ours.append(await _waiters(waiters, compiler))

    def per(samples: list[tuple[float, float]], phase: int) -> float:
        return statistics.median(s[phase] for s in samples) / waiters * 1e6

    out = {
        "waiters": waiters,
        "join_us": per(ours, 0),
        "wake_us": per(ours, 1),
        "plain_join_us": per(plain, 0),
        "plain_wake_us": per(plain, 1),
    }
    out["per_waiter_us"] = out["join_us"] + out["wake_us"]
    out["plain_per_waiter_us"] = out["plain_join_us"] + out["plain_wake_us"]
    out["overhead_us"] = out["per_waiter_us"] - out["plain_per_waiter_us"]
    return out


async def max_lag(work: Callable[[], Awaitable[Any]]) -> dict[str, float]:
    """Largest lateness (ms) of a 1 ms ticker while ``work`` runs on the same loop."""
    lags: list[float] = []
    done = anyio.Event()

    async def ticker() -> None:
        while not done.is_set():
            before = time.perf_counter()
            await anyio.sleep(0.001)
            lags.append(time.perf_counter() - before - 0.001)

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await anyio.sleep(0.01)
        started = time.perf_counter()
        await work()
        elapsed = time.perf_counter() - started
        done.set()
    return {
        "max_lag_ms": max(lags) * 1e3,
        "p50_lag_ms": statistics.median(lags) * 1e3,
        "work_s": elapsed,
    }


async def loop_lag(cache_dir: str) -> dict[str, Any]:
    async with Compiler(arch="sm_90", cache_dir=cache_dir, disk=False) as compiler:
        ours = await max_lag(lambda: compiler.compile(kernel(unroll=48)))

    async def cupy_on_loop() -> None:
        # CuPy's NVRTC binding called straight from a coroutine, as code that compiles
        # "inline" in a handler does (cupy.RawModule compiles the same way, but needs a GPU).
        from cupy.cuda import nvrtc

        spec = kernel(unroll=48)
        program = nvrtc.createProgram(spec.source, spec.name, [], [])
        try:
            nvrtc.compileProgram(program, ["--gpu-architecture=sm_90"])
            nvrtc.getCUBIN(program)
        finally:
            nvrtc.destroyProgram(program)

    direct = await max_lag(cupy_on_loop)
    return {"aionvrtc": ours, "cupy_nvrtc_on_loop": direct}


async def warm_up(cache_dir: str, kernels: int) -> dict[str, Any]:
    out: dict[str, Any] = {"kernels": kernels}
    cpus = os.cpu_count() or 1
    for concurrency in sorted({1, cpus}):
        specs = [kernel() for _ in range(kernels)]
        async with Compiler(
            arch="sm_90", cache_dir=cache_dir, disk=False, concurrency=concurrency
        ) as compiler:
            started = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for spec in specs:
                    tg.start_soon(compiler.compile, spec)
            out[f"concurrency_{concurrency}_s"] = time.perf_counter() - started
    out["speedup"] = out["concurrency_1_s"] / out[f"concurrency_{cpus}_s"]
    out["cpus"] = cpus
    return out


def _read_and_hash(paths: list[Path]) -> list[float]:
    """Seconds to open, read and SHA-256 each file: the floor of a verified disk read."""
    import hashlib

    seconds = []
    for path in paths:
        started = time.perf_counter()
        with open(path, "rb") as file:
            hashlib.sha256(file.read()).digest()
        seconds.append(time.perf_counter() - started)
    return seconds


async def disk_hits_during_compiles(cache_dir: str, hits: int = 1000) -> dict[str, Any]:
    """Live requests that are disk hits (each a distinct key, on disk, not in memory), one at a
    time at concurrency 1 while slow compiles of other keys hold the one compile slot: their
    latency, against a plain loop that opens, reads and hashes the same files."""
    root = Path(cache_dir) / "lanes"
    async with Compiler(arch="sm_90", cache_dir=root, disk=False) as donor:
        image = await donor.compile(kernel(4))
    specs, paths = _warm_entries(root, hits, image)
    plain = _read_and_hash(paths)
    latencies: list[float] = []
    during = 0
    async with Compiler(arch="sm_90", cache_dir=root) as compiler:
        slow = [kernel(400) for _ in range(4)]

        async def compile_slowly() -> None:
            for spec in slow:
                await compiler.compile(spec)

        async with anyio.create_task_group() as group:
            group.start_soon(compile_slowly)
            while compiler.stats().in_flight == 0:  # noqa: ASYNC110 (no event marks a start)
                await anyio.sleep(0.001)
            started_all = time.perf_counter()
            for spec in specs:
                started = time.perf_counter()
                await compiler.compile(spec)
                latencies.append(time.perf_counter() - started)
                during += compiler.stats().in_flight == 1
            all_s = time.perf_counter() - started_all
        stats = compiler.stats()
    latencies.sort()
    return {
        "hits": hits,
        "hits_while_a_compile_ran": during,
        "disk_hits": stats.disk.hits,
        "p50_ms": 1e3 * latencies[len(latencies) // 2],
        "p99_ms": 1e3 * latencies[int(len(latencies) * 0.99)],
        "max_ms": 1e3 * latencies[-1],
        "all_s": all_s,
        "plain_loop_s": sum(plain),
        "ratio_to_plain": all_s / sum(plain),
    }


def _warm_entries(root: Path, count: int, image: Any) -> tuple[list[KernelSpec], list[Path]]:
    """``count`` distinct specs whose entries are on disk under ``root`` (written directly: as
    many compiles would take minutes), and the entries' paths."""
    from aionvrtc import Artifact
    from aionvrtc._store.disk import DiskTier

    specs = [kernel(4) for _ in range(count)]
    tier = DiskTier(root)
    for spec in specs:
        key = kernel_key(spec, "sm_90")
        tier.write(Artifact(key=key, kind="cubin", image=image.image, arch="sm_90",
                            nvrtc_version=image.nvrtc_version))  # fmt: skip
    return specs, [tier.path(kernel_key(spec, "sm_90")) for spec in specs]


async def warm_keys_at_once(cache_dir: str, count: int = 1000, runs: int = 5) -> dict[str, Any]:
    """``count`` distinct disk-warm keys requested at once from a Compiler with an empty memory
    tier, against a plain loop of open, read and SHA-256 over the same files; medians of runs,
    each on a new Compiler (and a new set of keys: the page cache is warm for both)."""
    root = Path(cache_dir) / "at-once"
    async with Compiler(arch="sm_90", cache_dir=root, disk=False) as donor:
        image = await donor.compile(kernel(4))
    from aionvrtc._store.disk import DiskTier

    served, plain, tasks, verified = [], [], [], []
    for _ in range(runs):
        specs, paths = _warm_entries(root, count, image)
        plain.append(sum(_read_and_hash(paths)))
        # The floors under the goal: starting the requests' tasks alone, and the verified reads
        # alone (one thread, the tier's own read: opens level by level, checks, decode).
        started = time.perf_counter()
        async with anyio.create_task_group() as group:
            for spec in specs:
                group.start_soon(trivial_coroutine, spec)
        tasks.append(time.perf_counter() - started)
        tier = DiskTier(root)
        keys = [kernel_key(spec, "sm_90") for spec in specs]
        started = time.perf_counter()
        for key in keys:
            tier.read(key, arch="sm_90")
        verified.append(time.perf_counter() - started)
        async with Compiler(arch="sm_90", cache_dir=root) as compiler:
            started = time.perf_counter()
            async with anyio.create_task_group() as group:
                for spec in specs:
                    group.start_soon(compiler.compile, spec)
            served.append(time.perf_counter() - started)
            assert compiler.stats().disk.hits == count
    all_s, plain_s = statistics.median(served), statistics.median(plain)
    return {"keys": count, "all_s": all_s, "plain_loop_s": plain_s, "ratio": all_s / plain_s,
            "tasks_alone_s": statistics.median(tasks),
            "verified_reads_alone_s": statistics.median(verified)}  # fmt: skip


async def _all_at_once(
    call: Callable[[KernelSpec], Coroutine[Any, Any, Any]], specs: list[KernelSpec]
) -> None:
    """``call(spec)`` for every spec, each in a task of its own, all started at once."""
    async with anyio.create_task_group() as group:
        for spec in specs:
            group.start_soon(call, spec)


async def burst_lag(cache_dir: str, count: int = 1000, runs: int = 3) -> dict[str, Any]:
    """The event loop while ``count`` disk-warm keys are requested at once (memory empty): the
    largest lateness of a 1 ms ticker, worst of ``runs`` (each on a new Compiler and new keys),
    against the same while as many tasks that await a trivial coroutine are spawned."""
    root = Path(cache_dir) / "burst"
    async with Compiler(arch="sm_90", cache_dir=root, disk=False) as donor:
        image = await donor.compile(kernel(4))
    ours, bare = [], []
    for _ in range(runs):
        specs, _ = _warm_entries(root, count, image)
        spawn = functools.partial(_all_at_once, trivial_coroutine, specs)
        bare.append((await max_lag(spawn))["max_lag_ms"])
        async with Compiler(arch="sm_90", cache_dir=root) as compiler:
            burst = functools.partial(_all_at_once, compiler.compile, specs)
            ours.append((await max_lag(burst))["max_lag_ms"])
    return {"keys": count, "runs": runs, "max_lag_ms": max(ours),
            "bare_spawn_max_lag_ms": max(bare), "ratio": max(ours) / max(bare)}  # fmt: skip


async def cold_during_prefetch(
    cache_dir: str, prefetched: int = 8, live: int = 4, alone: int = 3
) -> dict[str, Any]:
    """Cold live requests, one at a time, made while ``prefetched`` kernels are prefetched into
    a Compiler of concurrency 1, against a cold compile of the same size alone (median of
    ``alone``), and the floor under it: two such compiles at once (in two Compilers), the slower
    of the pair, as a live compile beside a prefetched one runs."""
    solo: list[float] = []
    pairs: list[float] = []

    async def timed(into: list[float]) -> None:
        async with Compiler(arch="sm_90", cache_dir=cache_dir, disk=False) as compiler:
            started = time.perf_counter()
            await compiler.compile(kernel())
            into.append(time.perf_counter() - started)

    for _ in range(alone):
        await timed(solo)
        pair: list[float] = []
        async with anyio.create_task_group() as group:
            group.start_soon(timed, pair)
            group.start_soon(timed, pair)
        pairs.append(max(pair))
    took = []
    async with Compiler(arch="sm_90", cache_dir=cache_dir, disk=False) as compiler:
        compiler.prefetch([kernel() for _ in range(prefetched)])
        for _ in range(live):
            await anyio.sleep(0.1)  # a prefetched compile is running now
            started = time.perf_counter()
            await compiler.compile(kernel())
            took.append(time.perf_counter() - started)
    one = statistics.median(solo)
    return {"prefetched": prefetched, "live": live, "one_compile_s": one,
            "live_p50_s": statistics.median(took), "live_max_s": max(took),
            "max_ratio": max(took) / one, "pair_slower_s": statistics.median(pairs),
            "pair_ratio": statistics.median(pairs) / one}  # fmt: skip


async def equal_spec_hit(cache_dir: str, size: int = 34_000) -> dict[str, Any]:
    """A memory hit with a KernelSpec built anew for each request from the same source string
    (construction included), against a hit with the one spec object; a ``size``-byte source."""
    source = kernel().source + "// " + "x" * size
    options = ("-std=c++17", "--use_fast_math")
    spec = KernelSpec(source, options=options)
    calls, batches = 20_000, 11
    same, built = [], []
    async with Compiler(arch="sm_90", cache_dir=cache_dir, disk=False) as compiler:
        await compiler.compile(spec)
        for _ in range(batches):
            started = time.perf_counter_ns()
            for _ in range(calls):
                await compiler.compile(spec)
            same.append((time.perf_counter_ns() - started) / calls)
            started = time.perf_counter_ns()
            for _ in range(calls):
                await compiler.compile(KernelSpec(source, options=options))
            built.append((time.perf_counter_ns() - started) / calls)
    same_ns, built_ns = statistics.median(same), statistics.median(built)
    return {"source_bytes": len(source), "same_object_ns": same_ns, "new_equal_spec_ns": built_ns,
            "ratio": built_ns / same_ns}  # fmt: skip


def blocking_hot_path(cache_dir: str) -> dict[str, Any]:
    """``compile_sync`` on a memory hit from a plain thread (the Compiler's loop runs in
    another, as default_compiler() runs it), against a call through the loop's portal."""
    spec = kernel()
    calls, batches = 20_000, 11
    with anyio.from_thread.start_blocking_portal() as portal:
        compiler = portal.call(Compiler(arch="sm_90", cache_dir=cache_dir, disk=False).__aenter__)
        compiler._portal = portal
        try:
            portal.call(compiler.compile, spec)
            direct, hops = [], []
            for _ in range(batches):
                started = time.perf_counter_ns()
                for _ in range(calls):
                    compiler.compile_sync(spec)
                direct.append((time.perf_counter_ns() - started) / calls)
            for _ in range(batches):
                started = time.perf_counter_ns()
                for _ in range(calls // 20):
                    portal.call(compiler.compile, spec)
                hops.append((time.perf_counter_ns() - started) / (calls // 20))
        finally:
            portal.call(compiler.aclose)
    return {"compile_sync_ns": statistics.median(direct), "portal_call_ns": statistics.median(hops)}


def memory_inserts(sizes: tuple[int, ...] = (1_000, 10_000, 100_000)) -> dict[str, Any]:
    """Microseconds per insert into a full memory tier of ``n`` entries (each insert evicts
    one), after a random read of every entry has mixed up their recency."""
    import random

    from aionvrtc import Artifact
    from aionvrtc._store.memory import MemoryTier

    def artifact(i: int) -> Artifact:
        return Artifact(key=f"{i:064x}", kind="cubin", image=b"x" * 100, arch="sm_90",
                        nvrtc_version="13")  # fmt: skip

    out: dict[str, Any] = {}
    for n in sizes:
        tier = MemoryTier(artifact(0).size * n)
        for i in range(n):
            tier.write(artifact(i))
        rng = random.Random(16)
        for _ in range(n):
            tier.read(f"{rng.randrange(n):064x}")
        runs = []
        for run in range(5):
            fresh = [artifact(n * (run + 2) + i) for i in range(10_000)]
            started = time.perf_counter()
            for item in fresh:
                tier.write(item)
            runs.append((time.perf_counter() - started) / len(fresh))
        assert len(tier) == n
        out[str(n)] = 1e6 * statistics.median(runs)
    return out


def lock_handoff(cache_dir: str, rounds: int = 50) -> dict[str, Any]:
    """How late a process waiting on another's key lock takes it after its release: two
    DiskTiers (two open file descriptions, as two processes would have), one holding the lock
    for 50 ms while the other waits."""
    from aionvrtc._store.disk import DiskTier

    key = "ab" * 32
    holder, waiter = DiskTier(Path(cache_dir) / "locks"), DiskTier(Path(cache_dir) / "locks")
    late: list[float] = []
    for _ in range(rounds):
        taken: list[float] = []
        with holder.lock(key):
            thread = threading.Thread(target=_take, args=(waiter, key, taken))
            thread.start()
            time.sleep(0.05)
            at = time.perf_counter()  # the lock is released as the block ends
        thread.join()
        late.append(taken[0] - at)
    late.sort()
    return {"rounds": rounds, "p50_ms": 1e3 * late[len(late) // 2], "max_ms": 1e3 * late[-1]}


def _take(tier: Any, key: str, taken: list[float]) -> None:
    with tier.lock(key) as locked:
        assert locked
        taken.append(time.perf_counter())


def machine_facts(name: str, backend: str) -> dict[str, Any]:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if "model name" in line)
    except (OSError, StopIteration):
        pass
    import anyio as anyio_module

    return {
        "machine": name,
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "backend": backend,
        "aionvrtc": aionvrtc.__version__,
        "anyio": getattr(anyio_module, "__version__", "?"),
        "nvrtc": _nvrtc.version_string(),
        "date": time.strftime("%Y-%m-%d"),
    }


async def run_all(kernels: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as cache_dir:
        return {
            "hot_hit": await hot_hit(cache_dir),
            "joined": await joined_overhead(cache_dir),
            "loop_lag": await loop_lag(cache_dir),
            "warm_up": await warm_up(cache_dir, kernels),
            "lanes": await disk_hits_during_compiles(cache_dir),
            "at_once": await warm_keys_at_once(cache_dir),
            "burst": await burst_lag(cache_dir),
            "prefetching": await cold_during_prefetch(cache_dir),
            "equal_spec": await equal_spec_hit(cache_dir),
            "blocking": blocking_hot_path(cache_dir),
            "memory_inserts": memory_inserts(),
            "lock_handoff": lock_handoff(cache_dir),
        }


def _rows(results: dict[str, Any]) -> list[str]:
    """The table's rows for one checkout's results, as "| measure | value |" lines."""
    hot, joined, lag, warm, lanes, handoff = (
        results[k] for k in ("hot_hit", "joined", "loop_lag", "warm_up", "lanes", "lock_handoff")
    )
    at_once, equal, blocking, inserts = (
        results[k] for k in ("at_once", "equal_spec", "blocking", "memory_inserts")
    )
    burst, pre = results["burst"], results["prefetching"]
    cpus = warm["cpus"]
    return [
        f"| hot hit `await compiler.compile(spec)` | {hot['hot_hit_ns']:.0f} ns "
        f"({hot['ratio']:.2f}x a trivial coroutine, {hot['trivial_coroutine_ns']:.0f} ns) |",
        f"| joined waiter, {joined['waiters']} on one cold key: overhead over a task awaiting "
        f"a plain anyio.Event | {joined['overhead_us']:.2f} us each "
        f"({joined['per_waiter_us']:.1f} us against {joined['plain_per_waiter_us']:.1f} us, "
        "task start included in both) |",
        f"| event-loop lag during a cold compile, aionvrtc | "
        f"max {lag['aionvrtc']['max_lag_ms']:.2f} ms (compile {lag['aionvrtc']['work_s']:.2f} s) |",
        f"| event-loop lag, CuPy's NVRTC binding called on the loop | "
        f"max {lag['cupy_nvrtc_on_loop']['max_lag_ms']:.1f} ms "
        f"(compile {lag['cupy_nvrtc_on_loop']['work_s']:.2f} s) |",
        f"| cold warm-up of {warm['kernels']} distinct kernels | "
        f"{warm['concurrency_1_s']:.2f} s at concurrency 1, "
        f"{warm[f'concurrency_{cpus}_s']:.2f} s at {cpus} ({warm['speedup']:.2f}x) |",
        f"| {lanes['hits']} live disk hits, one at a time, concurrency 1, while other keys "
        f"compile ({lanes['hits_while_a_compile_ran']} of them with a compile running) | "
        f"p50 {lanes['p50_ms']:.2f} ms, p99 {lanes['p99_ms']:.2f} ms, max "
        f"{lanes['max_ms']:.2f} ms |",
        f"| the same {lanes['hits']} disk hits in all, against a plain loop of open, read and "
        f"SHA-256 over the same files | {lanes['all_s']:.3f} s against "
        f"{lanes['plain_loop_s']:.3f} s ({lanes['ratio_to_plain']:.1f}x) |",
        f"| {at_once['keys']} disk-warm keys requested at once (memory empty), against a plain "
        f"loop of open, read and SHA-256 over the same files | {at_once['all_s']:.3f} s against "
        f"{at_once['plain_loop_s']:.3f} s ({at_once['ratio']:.2f}x) |",
        f"| ... its floors: starting {at_once['keys']} tasks that await a trivial coroutine; "
        f"the tier's verified reads of the same keys in one thread | "
        f"{at_once['tasks_alone_s']:.3f} s "
        f"({at_once['tasks_alone_s'] / at_once['plain_loop_s']:.2f}x the plain loop); "
        f"{at_once['verified_reads_alone_s']:.3f} s "
        f"({at_once['verified_reads_alone_s'] / at_once['plain_loop_s']:.2f}x) |",
        f"| the event loop while {burst['keys']} disk-warm keys are requested at once: the "
        f"largest lateness of a 1 ms ticker, worst of {burst['runs']} | "
        f"{burst['max_lag_ms']:.1f} ms (a bare spawn of as many tasks: "
        f"{burst['bare_spawn_max_lag_ms']:.1f} ms; {burst['ratio']:.2f}x) |",
        f"| {pre['live']} cold live requests, one at a time, while {pre['prefetched']} "
        "prefetched kernels compile (concurrency 1) | "
        f"p50 {pre['live_p50_s']:.2f} s, max {pre['live_max_s']:.2f} s; one compile alone "
        f"{pre['one_compile_s']:.2f} s (max {pre['max_ratio']:.2f}x); its floor, two compiles "
        f"at once, the slower: {pre['pair_slower_s']:.2f} s ({pre['pair_ratio']:.2f}x) |",
        f"| hit with a new but equal KernelSpec per request ({equal['source_bytes']} B source, "
        f"construction included), against a hit with the same object | "
        f"{equal['new_equal_spec_ns']:.0f} ns against {equal['same_object_ns']:.0f} ns "
        f"({equal['ratio']:.2f}x) |",
        f"| `compile_sync` memory hit from a plain thread | {blocking['compile_sync_ns']:.0f} ns "
        f"(a call through the loop's portal: {blocking['portal_call_ns'] / 1e3:.0f} us) |",
        "| memory tier insert at the limit (evicting one), 1k / 10k / 100k entries | "
        + " / ".join(f"{inserts[n]:.2f} us" for n in ("1000", "10000", "100000"))
        + " |",
        f"| a key lock taken after another holder's release, {handoff['rounds']} times | "
        f"p50 {handoff['p50_ms']:.2f} ms, max {handoff['max_ms']:.2f} ms late |",
    ]


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split(" | ")]


def table(
    facts: dict[str, Any], results: dict[str, Any], before: dict[str, Any] | None = None
) -> str:
    """The markdown table; with ``before`` (another checkout's results from the same run), a
    column of its values beside this one's."""
    lines = [
        f"# Compile service on {facts['machine']}",
        "",
        f"{facts['cpu']}, {facts['cpus']} CPUs, Python {facts['python']}, {facts['backend']}, "
        f"NVRTC {facts['nvrtc']}, aionvrtc {facts['aionvrtc']}, {facts['date']}. {COLD_NOTE}",
        "",
    ]
    now = [_cells(row) for row in _rows(results)]
    if before is None:
        lines += ["| measure | value |", "| --- | --- |"]
        lines += [f"| {m} | {v} |" for m, v in now]
    else:
        lines[-1:] = [
            "",
            f"before: {facts['before']}, measured first in the same run (a child process).",
            "",
        ]
        lines += ["| measure | value | before |", "| --- | --- | --- |"]
        then = [_cells(row) for row in _rows(before)]
        lines += [f"| {m} | {v} | {old[1]} |" for (m, v), old in zip(now, then, strict=True)]
    lines += [
        "",
        f"Garbage collector: {'on' if facts['gc_enabled'] else 'off'} (off only inside the "
        "joined-waiter measure, for both sides).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--machine", required=True, help="a name for this machine")
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    parser.add_argument("--kernels", type=int, default=16)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--baseline", type=Path, default=None,
        help="another checkout's src, measured first in a child process of this run",
    )  # fmt: skip
    parser.add_argument("--results-to", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    before = None
    if args.baseline is not None:
        before = _baseline(args)
    with tempfile.TemporaryDirectory() as scratch:
        use_fresh_nvrtc_cache(scratch)  # before machine_facts, which loads NVRTC
        facts = machine_facts(args.machine, args.backend)
        facts["cuda_cache_path"] = "a new empty folder"
        facts["gc_enabled"] = gc.isenabled()
        facts["before"] = str(args.baseline) if args.baseline is not None else None
        results = anyio.run(run_all, args.kernels, backend=args.backend)
    if args.results_to is not None:  # the child of a --baseline run
        args.results_to.write_text(json.dumps(results), encoding="utf-8")
        return
    label = f"{args.machine}-{args.backend}"
    write(
        args.out,
        "compile_service",
        label=label,
        facts=facts,
        results={"now": results, "before": before} if before is not None else results,
        table=table(facts, results, before),
    )


def _baseline(args: argparse.Namespace) -> dict[str, Any]:
    """The same measures of the checkout at ``args.baseline``, in a child process that
    imports aionvrtc from there."""
    with tempfile.TemporaryDirectory() as scratch:
        found = Path(scratch) / "before.json"
        subprocess.run(
            [sys.executable, __file__, "--machine", args.machine, "--backend", args.backend,
             "--kernels", str(args.kernels), "--results-to", str(found)],
            env={**os.environ, "PYTHONPATH": str(args.baseline.resolve())}, check=True,
        )  # fmt: skip
        before: dict[str, Any] = json.loads(found.read_text(encoding="utf-8"))
    return before


if __name__ == "__main__":
    main()
