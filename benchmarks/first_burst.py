"""A server's first burst at a batch size it has not launched before, from a fresh process.

    python benchmarks/first_burst.py [--requests 512] [--tasks 64] [--out DIR]

Each request is 8 dependent 256^3 min-plus squarings with argmax of its own matrix through one
``tropical.Batcher(max_batch=64)``, then one value read; ``--tasks`` tasks serve the
``--requests`` requests, each task its share one after another. A batch of 64 such products
fills enough 128 x 128 tiles to take another kernel than one product, or 48, do: the first
burst of 64 tasks asks for a kernel nothing has loaded yet.

Each scenario runs in a fresh process with an empty cache dir (and an empty CUDA_CACHE_PATH,
so that NVRTC's own cache serves nothing), which serves the burst twice: the first burst, then
the same again warm. The scenarios:

- ``probed``: one request alone first, as a readiness probe sends it (it loads the one-product
  kernel); the burst of 64 then runs on that kernel while its own loads in the background.
- ``warmed``: ``Batcher.warm(256, 256, 256, "minplus", argmax=True)`` first, which loads every
  batch size's kernel.
- ``cold``: nothing first: the burst's first batch compiles its kernel (nothing loaded can
  stand in).

Per burst: requests/s, p50 and p99 latency, and the Batcher's launches and stand-in launches.
The first requests' answers are checked against the NumPy reference. Writes
results/first_burst-<gpu>.{json,md}.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._results import COLD_NOTE, RESULTS, fresh_nvrtc_cache, gpu_facts, write

SIZE, SQUARINGS, MAX_BATCH = 256, 8, 64
SCENARIOS = ("probed", "warmed", "cold")
CHECKED = 4  # requests whose answers are checked against the reference, per burst


async def burst(
    batcher: Any, requests: int, tasks: int, seed: int, profile: Path | None = None
) -> dict[str, Any]:
    """``requests`` requests served by ``tasks`` tasks; rate, latencies and the first answers
    checked against the NumPy reference. With ``profile``, the burst runs under cProfile and
    its functions by own time are written there (its figures are then not the burst's own)."""
    import anyio
    import cupy

    import aionvrtc
    from aionvrtc import tropical

    rng = np.random.default_rng(seed)
    inputs = [rng.uniform(0, 100, (SIZE, SIZE)).astype(np.float32) for _ in range(requests)]
    on_gpu = [cupy.asarray(x) for x in inputs]
    cupy.cuda.Device().synchronize()
    pool = cupy.get_default_memory_pool()
    held = pool.total_bytes()
    latencies = [0.0] * requests
    answers: dict[int, tuple[float, int]] = {}
    before = batcher.stats()

    async def serve(first: int) -> None:
        for number in range(first, requests, tasks):
            began = time.perf_counter()
            a = on_gpu[number]
            for _ in range(SQUARINGS):
                a, index = await batcher.matmul(a, a, "minplus", argmax=True)
            await aionvrtc.synchronize()
            value, where = float(a[0, 0].get()), int(index[0, 0].get())
            latencies[number] = time.perf_counter() - began
            if number < CHECKED:
                answers[number] = (value, where)

    profiler = cProfile.Profile() if profile is not None else None
    if profiler is not None:
        profiler.enable()
    began = time.perf_counter()
    async with anyio.create_task_group() as group:
        for first in range(tasks):
            group.start_soon(serve, first)
    seconds = time.perf_counter() - began
    if profiler is not None and profile is not None:
        profiler.disable()
        with profile.open("w") as text:
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(40)
    for number, (value, where) in answers.items():
        a = inputs[number]
        for _ in range(SQUARINGS):
            a, index = tropical.reference.matmul(a, a, "minplus", argmax=True)
        if (value, where) != (float(a[0, 0]), int(index[0, 0])):
            raise AssertionError(f"request {number}: {(value, where)} on the GPU, reference "
                                 f"{(float(a[0, 0]), int(index[0, 0]))}")  # fmt: skip
    after = batcher.stats()
    ordered = sorted(latencies)
    return {
        "requests": requests,
        "seconds": seconds,
        "requests_per_second": requests / seconds,
        "p50_ms": 1e3 * ordered[len(ordered) // 2],
        "p99_ms": 1e3 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "launches": after.launches - before.launches,
        "standin_launches": after.standins - before.standins,
        "checked": len(answers),
        "pool_grown_mib": (pool.total_bytes() - held) / 2**20,
        "slowest_ms": [round(1e3 * t, 2) for t in ordered[-8:]],
    }


async def child(
    scenario: str, requests: int, tasks: int, profile: Path | None = None
) -> dict[str, Any]:
    """One fresh process's scenario: what comes before the burst, the burst, the burst again
    (each profiled into ``profile``/<scenario>-<burst>.txt where given)."""
    import aionvrtc
    from aionvrtc import tropical

    batcher = tropical.Batcher(max_batch=MAX_BATCH)
    began = time.perf_counter()
    if scenario == "probed":
        await burst(batcher, 1, 1, seed=1)
    elif scenario == "warmed":
        await batcher.warm(SIZE, SIZE, SIZE, "minplus", argmax=True)
    before = time.perf_counter() - began

    def to(name: str) -> Path | None:
        return profile / f"{scenario}-{name}.txt" if profile is not None else None

    first = await burst(batcher, requests, tasks, seed=2, profile=to("first"))
    warm = await burst(batcher, requests, tasks, seed=3, profile=to("warm"))
    stats = aionvrtc.default_compiler().stats()
    return {
        "scenario": scenario,
        "before_seconds": before,
        "first": first,
        "warm": warm,
        "compiles": stats.compiles,
        "hot_compiles": stats.hot_compiles,
    }


def run_child(
    scenario: str, requests: int, tasks: int, scratch: str, profile: Path | None
) -> dict[str, Any]:
    cache = tempfile.mkdtemp(prefix=f"{scenario}-", dir=scratch)
    env = fresh_nvrtc_cache(scratch, {**os.environ, "AIONVRTC_CACHE_DIR": cache})
    profiled = ["--profile", str(profile)] if profile is not None else []
    if profile is not None:  # which kernels the scenario asked for, in order
        env["AIONVRTC_MANIFEST"] = str(profile / f"{scenario}-manifest.jsonl")
    done = subprocess.run(
        [sys.executable, __file__, "--child", scenario, "--requests", str(requests),
         "--tasks", str(tasks), *profiled],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{scenario} failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def table(facts: dict[str, Any], results: list[dict[str, Any]]) -> str:
    rows = [
        f"# A server's first burst at a new batch size, {facts['gpu']}",
        "",
        f"{results[0]['first']['requests']} requests, each {SQUARINGS} dependent {SIZE}^3 "
        f"min-plus squarings with argmax through one `tropical.Batcher(max_batch={MAX_BATCH})`, "
        f"then one value read, from {facts['tasks']} tasks; each scenario in a fresh process "
        "with an empty cache dir, its burst served twice (first, then warm). "
        f"{facts['date']}, aionvrtc {facts['aionvrtc']}, CuPy {facts['cupy']}, NVRTC "
        f"{facts['nvrtc']}. {COLD_NOTE}",
        "",
        "| before the burst | burst | requests/s | p50 ms | p99 ms | launches | on a stand-in |"
        " first/warm rate | first/warm p99 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    said = {
        "probed": "one request (a readiness probe)",
        "warmed": "`Batcher.warm(...)`",
        "cold": "nothing",
    }
    for result in results:
        first, warm = result["first"], result["warm"]
        rate = first["requests_per_second"] / warm["requests_per_second"]
        p99 = first["p99_ms"] / warm["p99_ms"]
        for name, burst_ in (("first", first), ("warm", warm)):
            ratios = f"{rate:.2f}x | {p99:.2f}x" if name == "first" else " | "
            rows.append(
                f"| {said[result['scenario']]} ({result['before_seconds']:.2f} s) | {name} | "
                f"{burst_['requests_per_second']:,.0f} | {burst_['p50_ms']:.1f} | "
                f"{burst_['p99_ms']:.1f} | {burst_['launches']:,} | "
                f"{burst_['standin_launches']:,} | {ratios} |"
            )
    rows += [
        "",
        "Answers of the first requests of every burst matched the NumPy reference "
        "(`tropical.reference.matmul`), values and argmax.",
        "",
    ]
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--child", choices=SCENARIOS)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--profile", type=Path,
        help="a folder: each burst runs under cProfile, its top functions written there "
        "(a diagnosis: the figures are cProfile's, so no result is written)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.child:
        import anyio

        result = anyio.run(child, args.child, args.requests, args.tasks, args.profile)
        print(json.dumps(result))
        return
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        results = [
            run_child(s, args.requests, args.tasks, scratch, args.profile) for s in args.scenarios
        ]
    if args.profile is not None:
        (args.profile / "bursts.json").write_text(json.dumps(results, indent=1))
        return
    facts = {**gpu_facts(), "tasks": args.tasks}
    write(args.out, "first_burst", label=facts["gpu"], facts=facts, results=results,
          table=table(facts, results))  # fmt: skip


if __name__ == "__main__":
    main()
