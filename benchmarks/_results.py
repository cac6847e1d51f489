"""What the benchmark scripts share: the machine's facts, the trivial coroutine that latency is
measured against, cold compiles kept cold, and writing results (JSON + markdown) under
benchmarks/results/."""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"

# NVRTC 13 keeps the programs it compiled in a cache of its own on disk, which every process of
# the user shares (~/.nv/ComputeCache; on the H200, 999 ms cold, then 256 ms in a second
# process), and a changed comment is still a hit. So a cold compile is timed in a process whose
# CUDA_CACHE_PATH is a new, empty folder, and every table with one says so in these words:
COLD_NOTE = (
    "Cold compiles ran in processes whose CUDA_CACHE_PATH was a new empty folder, so NVRTC's "
    "own cross-process cache (~/.nv/ComputeCache) served none of them."
)


def fresh_nvrtc_cache(under: Path | str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's environment) for a new process whose NVRTC cache is a
    new, empty folder under ``under``: one call per process."""
    folder = tempfile.mkdtemp(prefix="cuda-cache-", dir=under)
    return {**(os.environ if env is None else env), "CUDA_CACHE_PATH": folder}


def use_fresh_nvrtc_cache(under: Path | str) -> None:
    """Point this process's NVRTC cache at a new, empty folder under ``under``: for a script
    that compiles in its own process. Call it before anything loads NVRTC."""
    from aionvrtc import _nvrtc

    if _nvrtc._binding.cache_info().currsize:
        raise RuntimeError("NVRTC is loaded already: CUDA_CACHE_PATH must be set before")
    os.environ.update(fresh_nvrtc_cache(under, env={}))


async def trivial_coroutine(x: Any) -> Any:
    """The yardstick of hot-path latency: awaiting a coroutine that returns its argument."""
    return x


def median_s(call: Any, repeats: int) -> float:
    """Median seconds of ``call`` (which returns once the GPU's work is done)."""
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def gpu_facts() -> dict[str, Any]:
    """GPU 0, its driver and runtime, and the versions that produced a result."""
    import cupy

    import aionvrtc
    from aionvrtc import _nvrtc

    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    return {
        "gpu": name.decode() if isinstance(name, bytes) else str(name),
        "driver": cupy.cuda.runtime.driverGetVersion(),
        "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
        "cupy": cupy.__version__,
        "nvrtc": _nvrtc.version_string(),
        "aionvrtc": aionvrtc.__version__,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"),
    }


def write(out: Path, name: str, *, label: str, facts: Any, results: Any, table: str) -> None:
    """<out>/<name>-<label slug>.json and .md, and the table on stdout."""
    slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}-{slug}.json").write_text(
        json.dumps({"facts": facts, "results": results}, indent=2) + "\n"
    )
    (out / f"{name}-{slug}.md").write_text(table)
    sys.stdout.write(table)
