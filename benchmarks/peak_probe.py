"""Register micro-benchmarks: add+max pairs per second per type, the ceiling each tropical GEMM
is judged against in the same run (f32, f64, i32 plain, i32 with Hopper's DPX __viaddmax_s32).

    python benchmarks/peak_probe.py      (a GPU; prints pairs/s per type)

Each thread runs the GEMM's inner step on 64 independent accumulators held in registers: one
add and one max per pair (one instruction with DPX), no memory traffic.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

from aionvrtc import KernelSpec, compile_sync
from aionvrtc.tropical.tuning import timed

SOURCE = r"""
// The GEMM's inner step with operands in registers: acc[i][j] = max(acc[i][j], a[i] + b[j]),
// 64 independent accumulators per thread: one add and one max per pair (one instruction with
// DPX). After each round a[i] takes the value of an accumulator, so no sum is loop-invariant
// and the compiler cannot hoist the adds out of the loop (it did, when a and b were fixed:
// the earlier probe timed the max alone). The copies are register renames in unrolled code.
__device__ __forceinline__ float mx(float acc, float s) { return fmaxf(acc, s); }
// Doubles: a compare and a select, as the GEMM's fast step (fmax adds NaN handling).
__device__ __forceinline__ double mx(double acc, double s) { return s > acc ? s : acc; }
__device__ __forceinline__ int mx(int acc, int s) { return max(acc, s); }

template <typename T, bool DPX>
__global__ void probe(T* out, T d, T e, long long iterations) {
    T a[8], b[8], acc[8][8];
    #pragma unroll
    for (int i = 0; i < 8; ++i) { a[i] = (T)(threadIdx.x + i) * d; b[i] = (T)(blockIdx.x - i) * e; }
    #pragma unroll
    for (int i = 0; i < 8; ++i)
        #pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = (T)(i - j);
    // Unrolled so that the loop's own instructions stop counting.
    #pragma unroll 8
    for (long long it = 0; it < iterations; ++it) {
        #pragma unroll
        for (int i = 0; i < 8; ++i)
            #pragma unroll
            for (int j = 0; j < 8; ++j) {
                if constexpr (DPX) {
                    acc[i][j] = __viaddmax_s32((int)a[i], (int)b[j], (int)acc[i][j]);
                } else {
                    acc[i][j] = mx(acc[i][j], a[i] + b[j]);
                }
            }
        #pragma unroll
        for (int i = 0; i < 8; ++i) a[i] = acc[i][7 - i];
    }
    T s = 0;
    #pragma unroll
    for (int i = 0; i < 8; ++i)
        #pragma unroll
        for (int j = 0; j < 8; ++j) s += acc[i][j];
    if (s == (T)12345) out[0] = s;  // keeps the work alive; practically never stores
}
"""
CASES = {
    "f32": ("float", False, np.float32),
    "f64": ("double", False, np.float64),
    "i32": ("int", False, np.int32),
    "i32_dpx": ("int", True, np.int32),
}
PAIRS_PER_ITERATION = 64


def kernel(name: str) -> tuple[Any, Any]:
    """``name``'s probe kernel loaded on the current GPU, and its NumPy type."""
    import cupy

    from aionvrtc._cuda import load

    ctype, dpx, dtype = CASES[name]
    expression = f"probe<{ctype}, {'true' if dpx else 'false'}>"
    spec = KernelSpec(SOURCE, name_expressions=(expression,), options=("-std=c++17",))
    module = load(compile_sync(spec), cupy.cuda.runtime.getDevice())
    return module.get_function(expression), dtype


def launch(name: str, iterations: int) -> tuple[Callable[[], object], int]:
    """One launch of ``name``'s probe filling the current GPU (4 blocks of 256 threads per SM),
    and the add+max pairs it does."""
    import cupy

    function, dtype = kernel(name)
    sms = cupy.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    blocks, threads = sms * 4, 256
    out = cupy.zeros(1, dtype=dtype)
    args = (out, dtype(-1), dtype(1), np.int64(iterations))
    pairs = blocks * threads * iterations * PAIRS_PER_ITERATION
    return (lambda: function((blocks,), (threads,), args)), pairs


def probe(name: str, iterations: int = 4096, repeats: int = 7) -> float:
    """Median add+max pairs per second of ``name``'s probe on the current GPU."""
    call, pairs = launch(name, iterations)
    return pairs / timed(call, repeats, graph=False)


def run_all() -> dict[str, Any]:
    return {name: probe(name) for name in CASES}


if __name__ == "__main__":
    results = run_all()
    print(json.dumps({k: f"{v / 1e12:.2f} T pairs/s" for k, v in results.items()}, indent=1))
