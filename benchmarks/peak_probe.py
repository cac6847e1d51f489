"""Register micro-benchmarks: add+max pairs per second per type, the ceiling each tropical GEMM
is judged against in the same run (f32, f64, i32 plain, i32 with Hopper's DPX __viaddmax_s32).

    python benchmarks/peak_probe.py      (a GPU; prints pairs/s per type)

Each thread runs 16 independent chains x = max(x + d, y), y = max(y + e, x): one add and one
max per pair, enough chains to hide latency, no memory traffic.
"""

from __future__ import annotations

import json
import statistics
from typing import Any

import numpy as np

from aionvrtc import KernelSpec, compile_sync

SOURCE = r"""
template <typename T> __device__ __forceinline__ T mx(T a, T b) { return a > b ? a : b; }
__device__ __forceinline__ float mx(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double mx(double a, double b) { return fmax(a, b); }

template <typename T, bool DPX>
__global__ void probe(T* out, T d, T e, long long iterations) {
    T x[8], y[8];
    #pragma unroll
    for (int i = 0; i < 8; ++i) { x[i] = (T)(threadIdx.x + i); y[i] = (T)(blockIdx.x - i); }
    for (long long it = 0; it < iterations; ++it) {
        #pragma unroll
        for (int i = 0; i < 8; ++i) {
            if constexpr (DPX) {
                x[i] = __viaddmax_s32((int)x[i], (int)d, (int)y[i]);
                y[i] = __viaddmax_s32((int)y[i], (int)e, (int)x[i]);
            } else {
                x[i] = mx(x[i] + d, y[i]);
                y[i] = mx(y[i] + e, x[i]);
            }
        }
    }
    T s = 0;
    #pragma unroll
    for (int i = 0; i < 8; ++i) s += x[i] + y[i];
    if (s == (T)12345) out[0] = s;  // keeps the work alive; practically never stores
}
"""
CASES = {
    "f32": ("float", False, np.float32),
    "f64": ("double", False, np.float64),
    "i32": ("int", False, np.int32),
    "i32_dpx": ("int", True, np.int32),
}
PAIRS_PER_ITERATION = 16


def probe(name: str, iterations: int = 4096, repeats: int = 7) -> float:
    """Median add+max pairs per second of ``name``'s probe on the current GPU."""
    import cupy

    from aionvrtc import Module
    from aionvrtc._cuda import load

    ctype, dpx, dtype = CASES[name]
    expression = f"probe<{ctype}, {'true' if dpx else 'false'}>"
    spec = KernelSpec(SOURCE, name_expressions=(expression,), options=("-std=c++17",))
    module: Module = load(compile_sync(spec), cupy.cuda.runtime.getDevice())
    kernel = module.get_function(expression)
    sms = cupy.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    blocks, threads = sms * 8, 256
    out = cupy.zeros(1, dtype=dtype)
    args = (out, dtype(-1), dtype(1), np.int64(iterations))
    kernel((blocks,), (threads,), args)  # warm up
    samples = []
    for _ in range(repeats):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        kernel((blocks,), (threads,), args)
        stop.record()
        stop.synchronize()
        seconds = cupy.cuda.get_elapsed_time(start, stop) / 1e3
        samples.append(blocks * threads * iterations * PAIRS_PER_ITERATION / seconds)
    return float(statistics.median(samples))


def run_all() -> dict[str, Any]:
    return {name: probe(name) for name in CASES}


if __name__ == "__main__":
    results = run_all()
    print(json.dumps({k: f"{v / 1e12:.2f} T pairs/s" for k, v in results.items()}, indent=1))
