"""Sustained throughput with the clock it ran at: the peak probe and tropical GEMMs, each run
back to back for a while (so both reach the power state a long job sees), with the SM clock and
board power sampled through NVML meanwhile.

    python benchmarks/sustained.py            (a GPU; prints one row per workload)
    python benchmarks/sustained.py --ncu      (one launch of each kernel class, for Nsight Compute)

A short probe can run at a higher clock than a GEMM that runs for seconds; quoting the GEMM
against the probe at the same clock separates the kernel's efficiency from the board's power
limit. Calls are launched one by one from Python, as a service would: the rates of kernels of a
few microseconds (the batched and tall rows) include that overhead; tropical_gemm.py times the
kernels alone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aionvrtc import tropical
from aionvrtc.tropical.tuning import random_operands as random
from benchmarks import peak_probe


class ClockSampler:
    """SM clock (MHz) and board power (W) of GPU 0, sampled every ``period`` s in a thread."""

    def __init__(self, period: float = 0.005) -> None:
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self._period = period
        self._stop = threading.Event()
        self.clocks: list[int] = []
        self.watts: list[float] = []
        self.reasons = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        nvml, handle = self._nvml, self._handle
        while not self._stop.is_set():
            self.clocks.append(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
            self.watts.append(nvml.nvmlDeviceGetPowerUsage(handle) / 1e3)
            self.reasons |= nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
            time.sleep(self._period)

    def __enter__(self) -> ClockSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def sustained(call: Callable[[], object], work: float, seconds: float = 1.5) -> dict[str, Any]:
    """Run ``call`` (``work`` pairs each) back to back for about ``seconds``; the median rate of
    the second half's calls, and the median clock and power over that half."""
    import cupy

    call()
    cupy.cuda.Device().synchronize()
    samples: list[float] = []
    with ClockSampler() as sampler:
        began = time.perf_counter()
        half = None
        while time.perf_counter() - began < seconds:
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            call()
            stop.record()
            stop.synchronize()
            if half is None and time.perf_counter() - began > seconds / 2:
                half = len(sampler.clocks)
            if half is not None:
                samples.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    tail = slice(half or 0, None)
    return {
        "pairs_per_s": work / statistics.median(samples),
        "calls": len(samples),
        "sm_mhz": statistics.median(sampler.clocks[tail]),
        "watts": statistics.median(sampler.watts[tail]),
        "clock_event_reasons": sampler.reasons,
    }


def probe_call(name: str, milliseconds: float) -> tuple[Callable[[], object], float]:
    """The peak probe's launch sized to run about ``milliseconds``."""
    import cupy

    rate = 16e12 if name != "f64" else 2e12
    threads = cupy.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"] * 4 * 256
    iterations = int(rate * milliseconds / 1e3 / (threads * peak_probe.PAIRS_PER_ITERATION))
    call, pairs = peak_probe.launch(name, iterations // 8 * 8)
    return call, float(pairs)


def gemm_call(
    ring: str, dtype: Any, m: int, n: int, k: int, *, argmax: bool = False, batch: int = 0
) -> tuple[Callable[[], object], float]:
    import cupy

    lead = (batch,) if batch else ()
    a, b = random((*lead, m, k), dtype, ring), random((*lead, k, n), dtype, ring)
    out = cupy.empty((*lead, m, n), dtype)
    target: Any = (out, cupy.empty(out.shape, cupy.int32)) if argmax else out
    work = float(max(batch, 1) * m * n * k)
    return (lambda: tropical.matmul_sync(a, b, ring, argmax=argmax, out=target)), work


WORKLOADS: dict[str, Callable[[], tuple[Callable[[], object], float]]] = {
    "probe f32 2 ms": lambda: probe_call("f32", 2),
    "probe f32 60 ms": lambda: probe_call("f32", 60),
    "probe i32_dpx 60 ms": lambda: probe_call("i32_dpx", 60),
    "maxplus f32 8192": lambda: gemm_call("maxplus", np.float32, 8192, 8192, 8192),
    "maxplus i32 8192": lambda: gemm_call("maxplus", np.int32, 8192, 8192, 8192),
    "maxplus f32 4096 argmax": lambda: gemm_call(
        "maxplus", np.float32, 4096, 4096, 4096, argmax=True
    ),
    "batched 1024 x 64^3 f32": lambda: gemm_call("maxplus", np.float32, 64, 64, 64, batch=1024),
    "tall 2^20 x 16 x 16 f32": lambda: gemm_call("maxplus", np.float32, 1 << 20, 16, 16),
    "tall 2^20 x 64 x 64 f32": lambda: gemm_call("maxplus", np.float32, 1 << 20, 64, 64),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ncu", action="store_true", help="one launch of each, for ncu")
    parser.add_argument("--seconds", type=float, default=1.5)
    args = parser.parse_args()
    calls = {name: make() for name, make in WORKLOADS.items()}
    if args.ncu:
        for call, _ in calls.values():
            call()
        return
    print("| workload | T pairs/s | SM MHz | W | clock event reasons | calls |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, (call, work) in calls.items():
        row = sustained(call, work, args.seconds)
        print(
            f"| {name} | {row['pairs_per_s'] / 1e12:.2f} | {row['sm_mhz']:.0f} | "
            f"{row['watts']:.0f} | {row['clock_event_reasons']:#x} | {row['calls']} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
