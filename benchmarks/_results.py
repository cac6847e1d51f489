"""What the benchmark scripts share: the machine's facts, the trivial coroutine that latency is
measured against, and writing results (JSON + markdown) under benchmarks/results/."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


async def trivial_coroutine(x: Any) -> Any:
    """The yardstick of hot-path latency: awaiting a coroutine that returns its argument."""
    return x


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
