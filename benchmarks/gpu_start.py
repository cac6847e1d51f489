"""Start-up and serving on the GPU: warm start against CuPy's RawModule, hot
`get`, lazy one-kernel compile against a 31-kernel source, event-loop lag under 64 requests.

    python benchmarks/gpu_start.py [--out DIR]

Writes gpu_start-<gpu>.{json,md}. Every comparison is measured side by side in the one run.
Every child process has an empty CUDA_CACHE_PATH of its own, and every cold compile is timed in
one, so NVRTC's cross-process cache never serves a "cold" compile.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._results import (
    COLD_NOTE,
    RESULTS,
    fresh_nvrtc_cache,
    gpu_facts,
    trivial_coroutine,
    write,
)

REPEATS = 5

SOURCE = r"""
template <typename T> struct Lowest;
template <> struct Lowest<float> {
    __device__ static float v() { return __int_as_float(0xff800000); } };
template <> struct Lowest<double> {
    __device__ static double v() { return __longlong_as_double(0xfff0000000000000LL); } };
template <> struct Lowest<int> { __device__ static int v() { return -2147483647 - 1; } };
template <> struct Lowest<long long> {
    __device__ static long long v() { return -9223372036854775807LL - 1; } };

// C[i, j] = max_k A[i, k] + B[k, j]; each thread owns a TM x TN tile of C. /*SALT*/
template <typename T, int TM, int TN>
__global__ void maxplus_tile(const T* __restrict__ A, const T* __restrict__ B,
                             T* __restrict__ C, int M, int N, int K) {
    const int row0 = (blockIdx.y * blockDim.y + threadIdx.y) * TM;
    const int col0 = (blockIdx.x * blockDim.x + threadIdx.x) * TN;
    T acc[TM][TN];
    #pragma unroll
    for (int i = 0; i < TM; ++i)
        #pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = Lowest<T>::v();
    for (int k = 0; k < K; ++k) {
        T a[TM], b[TN];
        #pragma unroll
        for (int i = 0; i < TM; ++i) a[i] = row0 + i < M ? A[(size_t)(row0 + i) * K + k] : T(0);
        #pragma unroll
        for (int j = 0; j < TN; ++j) b[j] = col0 + j < N ? B[(size_t)k * N + col0 + j] : T(0);
        #pragma unroll
        for (int i = 0; i < TM; ++i)
            #pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] = max(acc[i][j], a[i] + b[j]);
    }
    #pragma unroll
    for (int i = 0; i < TM; ++i)
        #pragma unroll
        for (int j = 0; j < TN; ++j)
            if (row0 + i < M && col0 + j < N) C[(size_t)(row0 + i) * N + col0 + j] = acc[i][j];
}
"""
TYPES = ("float", "double", "int", "long long")
TILES = ((1, 1), (1, 2), (2, 1), (2, 2), (2, 4), (4, 2), (4, 4), (4, 8))
ALL = tuple(f"maxplus_tile<{t}, {m}, {n}>" for t in TYPES for m, n in TILES)[:31]
ONE = "maxplus_tile<float, 4, 4>"


def salted(salt: str) -> str:
    return SOURCE.replace("/*SALT*/", f"/* {salt} */")


# -- warm start in fresh processes ----------------------------------------------------------

OURS = r"""
import time, json, sys
t0 = time.perf_counter()
import aionvrtc
import cupy
t_import = time.perf_counter()
cupy.cuda.runtime.free(0)
t_context = time.perf_counter()
import anyio
import numpy as np
from aionvrtc import Compiler, KernelSpec, synchronize
source, expressions, cache_dir = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
spec = KernelSpec(source, name_expressions=expressions, name="maxplus.cu")
out = {}
async def main():
    t = time.perf_counter()
    async with Compiler(cache_dir=cache_dir) as compiler:
        t_open = time.perf_counter()
        module = await compiler.get(spec)
        t_get = time.perf_counter()
        a = cupy.random.random((256, 256), dtype=cupy.float32)
        c = cupy.empty_like(a)
        t_l = time.perf_counter()
        module.get_function("maxplus_tile<float, 4, 4>")(
            (4, 4), (16, 16), (a, a, c, np.int32(256), np.int32(256), np.int32(256)))
        await synchronize()
        t_launch = time.perf_counter()
        out.update(open=t_open - t, get=t_get - t_open, launch=t_launch - t_l,
                   compiles=compiler.stats().compiles)
anyio.run(main)
out.update(import_=t_import - t0, context=t_context - t_import)
print(json.dumps(out))
"""

CUPY = r"""
import time, json, sys
t0 = time.perf_counter()
import cupy
t_import = time.perf_counter()
cupy.cuda.runtime.free(0)
t_context = time.perf_counter()
import numpy as np
source, expressions = sys.argv[1], json.loads(sys.argv[2])
t = time.perf_counter()
module = cupy.RawModule(code=source, options=("-std=c++17",), name_expressions=expressions)
kernel = module.get_function("maxplus_tile<float, 4, 4>")
t_get = time.perf_counter()
a = cupy.random.random((256, 256), dtype=cupy.float32)
c = cupy.empty_like(a)
t_l = time.perf_counter()
kernel((4, 4), (16, 16), (a, a, c, np.int32(256), np.int32(256), np.int32(256)))
cupy.cuda.get_current_stream().synchronize()
t_launch = time.perf_counter()
print(json.dumps(dict(import_=t_import - t0, context=t_context - t_import, open=0.0,
                      get=t_get - t, launch=t_launch - t_l, compiles=-1)))
"""


def child(script: str, *args: str, env: dict[str, str]) -> dict[str, float]:
    """Run ``script`` in a fresh process: ``env`` comes from fresh_nvrtc_cache, one per call."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, check=False
    )
    if done.returncode:
        raise RuntimeError(done.stderr)
    result: dict[str, float] = json.loads(done.stdout)
    return result


def warm_start(workdir: Path) -> dict[str, Any]:
    cupy_cache = {**os.environ, "CUPY_CACHE_DIR": str(workdir / "cupy-cache")}

    def env() -> dict[str, str]:  # NVRTC's own cache empty in each process, CuPy's shared
        return fresh_nvrtc_cache(workdir, cupy_cache)

    source = salted(f"warm {time.time_ns()}")
    cases = {
        "aionvrtc, one kernel (lazy)": (OURS, [ONE], str(workdir / "ours-one")),
        "aionvrtc, 31-kernel source": (OURS, list(ALL), str(workdir / "ours-all")),
        "CuPy RawModule, 31-kernel source": (CUPY, list(ALL), ""),
    }
    results: dict[str, Any] = {}
    for name, (script, expressions, cache_dir) in cases.items():
        args = [source, json.dumps(expressions)] + ([cache_dir] if cache_dir else [])
        cold = child(script, *args, env=env())  # fills the disk cache
        runs = [child(script, *args, env=env()) for _ in range(REPEATS)]
        assert script is CUPY or all(r["compiles"] == 0 for r in runs), runs
        results[name] = {
            "cold_get_s": cold["get"],
            **{f"{k}_ms": statistics.median(r[k] for r in runs) * 1e3 for k in runs[0]},
        }
        results[name].pop("compiles_ms")
    return results


# -- measures in this process (no compile timed) -------------------------------------------


async def hot_get(workdir: Path) -> dict[str, float]:
    """Hot get() and compile() against a trivial coroutine taking the same argument, in
    identical loops, interleaved, in this process (CUDA context and CuPy loaded)."""
    from aionvrtc import Compiler, KernelSpec

    spec = KernelSpec(salted("hot"), name_expressions=[ONE])
    calls, batches = 20_000, 21
    samples: dict[str, list[float]] = {"get": [], "compile": [], "trivial": []}
    async with Compiler(cache_dir=workdir / "hot") as compiler:
        await compiler.get(spec)
        for _ in range(batches):
            started = time.perf_counter_ns()
            for _ in range(calls):
                await compiler.get(spec)
            samples["get"].append((time.perf_counter_ns() - started) / calls)
            started = time.perf_counter_ns()
            for _ in range(calls):
                await compiler.compile(spec)
            samples["compile"].append((time.perf_counter_ns() - started) / calls)
            started = time.perf_counter_ns()
            for _ in range(calls):
                await trivial_coroutine(spec)
            samples["trivial"].append((time.perf_counter_ns() - started) / calls)
    get, compile_, trivial = (statistics.median(samples[k]) for k in ("get", "compile", "trivial"))
    return {
        "hot_get_ns": get,
        "hot_compile_ns": compile_,
        "trivial_coroutine_ns": trivial,
        "ratio": get / trivial,
        "compile_ratio": compile_ / trivial,
    }


# -- cold compiles, each in a fresh process ------------------------------------------------

COLD = r"""
import json, sys, time
import anyio
from aionvrtc import Compiler, KernelSpec
source, expressions = sys.argv[1], json.loads(sys.argv[2])
async def main():
    async with Compiler(disk=False) as compiler:  # NVRTC loaded, the GPU's arch detected
        started = time.perf_counter()
        await compiler.compile(KernelSpec(source, name_expressions=expressions))
        print(json.dumps({"seconds": time.perf_counter() - started,
                          "compiles": compiler.stats().compiles}))
anyio.run(main)
"""


def cold_first_use(workdir: Path) -> dict[str, float]:
    """The first use of one kernel alone against the 31-kernel source: each compile in a fresh
    process with an empty NVRTC cache, medians of 3."""
    one: list[float] = []
    everything: list[float] = []
    for round_ in range(3):
        salt = f"cold {round_} {time.time_ns()}"
        for expressions, samples in (([ONE], one), (list(ALL), everything)):
            label = "one" if len(expressions) == 1 else "all"
            source = salted(f"{salt} {label}")
            run = child(COLD, source, json.dumps(expressions), env=fresh_nvrtc_cache(workdir))
            assert run["compiles"] == 1, run
            samples.append(run["seconds"])
    first, total = statistics.median(one), statistics.median(everything)
    return {"one_kernel_s": first, "all_31_s": total, "ratio": total / first}


def check_correct(module: Any) -> float:
    """The 4x4-tiled f32 kernel against NumPy on fresh random inputs (odd sizes)."""
    import cupy

    rng = np.random.default_rng()
    m, n, k = 123, 77, 301
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = cupy.full((m, n), np.nan, dtype=cupy.float32)
    grid = ((n + 63) // 64, (m + 63) // 64)
    module.get_function(ONE)(
        grid, (16, 16), (cupy.asarray(a), cupy.asarray(b), c, np.int32(m), np.int32(n), np.int32(k))
    )
    want = (a[:, :, None].astype(np.float64) + b[None, :, :]).max(axis=1)
    return float(np.abs(cupy.asnumpy(c) - want).max())


async def loop_lag(workdir: Path, requests: int = 64) -> dict[str, Any]:
    import cupy

    from aionvrtc import Compiler, KernelSpec, synchronize

    spec = KernelSpec(salted("lag"), name_expressions=[ONE])
    size = 1024
    out: dict[str, Any] = {"requests": requests, "size": size}
    async with Compiler(cache_dir=workdir / "lag") as compiler:
        module = await compiler.get(spec)
        out["max_abs_error"] = check_correct(module)
        a = cupy.random.random((size, size), dtype=cupy.float32)
        for mode in ("synchronize", "blocking stream.synchronize()"):
            lags: list[float] = []
            done = anyio.Event()

            async def ticker(done: anyio.Event = done, lags: list[float] = lags) -> None:
                while not done.is_set():
                    before = time.perf_counter()
                    await anyio.sleep(0.001)
                    lags.append(time.perf_counter() - before - 0.001)

            async def request(mode: str = mode) -> None:
                module = await compiler.get(spec)
                stream = cupy.cuda.Stream(non_blocking=True)
                c = cupy.empty((size, size), dtype=cupy.float32)
                with stream:
                    module.get_function(ONE)(
                        (size // 64, size // 64),
                        (16, 16),
                        (a, a, c, np.int32(size), np.int32(size), np.int32(size)),
                    )
                if mode == "synchronize":
                    await synchronize(stream)
                else:
                    stream.synchronize()

            started = time.perf_counter()
            async with anyio.create_task_group() as tg:
                tg.start_soon(ticker)
                async with anyio.create_task_group() as requests_group:
                    for _ in range(requests):
                        requests_group.start_soon(request)
                done.set()
            out[mode] = {
                "wall_s": time.perf_counter() - started,
                "max_lag_ms": max(lags) * 1e3 if lags else float("nan"),
                "ticks": len(lags),
            }
    return out


def table(f: dict[str, Any], r: dict[str, Any]) -> str:
    rows = [
        f"# GPU start-up and serving on {f['gpu']}",
        "",
        f"Driver {f['driver']}, CUDA runtime {f['cuda_runtime']}, CuPy {f['cupy']}, "
        f"NVRTC {f['nvrtc']}, aionvrtc {f['aionvrtc']}, Python {f['python']}, {f['date']}. "
        f"Medians of {REPEATS} fresh processes (warm start) or of repeated batches.",
        "",
        "## Warm start: a fresh process, disk cache warm (ms)",
        "",
        "| path | import (with CuPy) | CUDA context | open Compiler | get | first launch "
        "| cold get (s) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, w in r["warm_start"].items():
        rows.append(
            f"| {name} | {w['import__ms']:.1f} | {w['context_ms']:.1f} | {w['open_ms']:.1f} | "
            f"{w['get_ms']:.2f} | {w['launch_ms']:.2f} | {w['cold_get_s']:.2f} |"
        )
    hot, cold, lag = r["hot_get"], r["cold_first_use"], r["loop_lag"]
    rows += [
        "",
        f"Cold get: the first process, on an empty disk cache. {COLD_NOTE}",
        "",
        "## Serving",
        "",
        "| measure | value |",
        "| --- | --- |",
        f"| hot `await compiler.get(spec)` (module memoised) | {hot['hot_get_ns']:.0f} ns "
        f"({hot['ratio']:.2f}x a trivial coroutine, {hot['trivial_coroutine_ns']:.0f} ns) |",
        f"| hot `await compiler.compile(spec)` in the same process | "
        f"{hot['hot_compile_ns']:.0f} ns ({hot['compile_ratio']:.2f}x) |",
        f"| cold first use, a fresh process each: one kernel alone vs the 31-kernel source | "
        f"{cold['one_kernel_s']:.2f} s vs {cold['all_31_s']:.2f} s ({cold['ratio']:.1f}x) |",
        f"| event-loop lag, {lag['requests']} requests each launching a {lag['size']}^3 "
        f"max-plus and awaiting `synchronize` | max {lag['synchronize']['max_lag_ms']:.2f} ms, "
        f"all done in {lag['synchronize']['wall_s'] * 1e3:.1f} ms |",
        f"| the same with a blocking `stream.synchronize()` on the loop | max "
        f"{lag['blocking stream.synchronize()']['max_lag_ms']:.2f} ms, all done in "
        f"{lag['blocking stream.synchronize()']['wall_s'] * 1e3:.1f} ms |",
        "",
        f"Correctness before speed: the 4x4-tiled f32 max-plus kernel against NumPy (float64) "
        f"on fresh random 123x301 @ 301x77 inputs: max abs error {lag['max_abs_error']:.2e}.",
        "",
    ]
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    f = gpu_facts()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        results: dict[str, Any] = {"warm_start": warm_start(work)}
        results["hot_get"] = anyio.run(hot_get, work)
        results["cold_first_use"] = cold_first_use(work)
        results["loop_lag"] = anyio.run(loop_lag, work)
    assert results["loop_lag"]["max_abs_error"] < 1e-5, results["loop_lag"]
    write(args.out, "gpu_start", label=f["gpu"], facts=f, results=results, table=table(f, results))


if __name__ == "__main__":
    main()
