"""What a process restart costs with a cold and with a warm kernel cache.

    python examples/warm_start.py [--arch sm_90] [--semirings maxplus minplus] [--dtypes float32]

Starts a fresh Python process three times, each opening a Compiler on one cache dir and asking
for the tropical kernels of the named semirings and dtypes, as a server would at start-up: once
on an empty cache (every kernel compiled by NVRTC), then twice warm (every kernel read from
disk). Prints each start's time to ready and what served it. No GPU is needed: the kernels are
compiled for ``--arch`` (default: this machine's GPU, else sm_90).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from aionvrtc import NoDeviceError, Target

# A server's start-up: open a Compiler, get every kernel it will serve, report.
SERVER = r"""
import json, os, sys, time
started = time.perf_counter()
import anyio
from aionvrtc import Compiler, tropical

arch, semirings, dtypes = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")

async def main():
    specs = tropical.all_specs(semirings, dtypes)
    async with Compiler(arch=arch, concurrency=os.cpu_count() or 1) as compiler:
        async with anyio.create_task_group() as group:
            for spec in specs:
                group.start_soon(compiler.compile, spec)
        s = compiler.stats()
    print(json.dumps({"kernels": len(specs), "compiles": s.compiles, "disk_hits": s.disk_hits,
                      "seconds": time.perf_counter() - started}))

anyio.run(main)
"""


def start(arch: str, semirings: list[str], dtypes: list[str], cache_dir: str) -> dict[str, float]:
    env = {**os.environ, "AIONVRTC_CACHE_DIR": cache_dir}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", SERVER, arch, ",".join(semirings), ",".join(dtypes)],
        capture_output=True, text=True, env=env, check=True, timeout=1800,
    )  # fmt: skip
    result: dict[str, float] = json.loads(done.stdout)
    result["process_seconds"] = time.perf_counter() - started
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arch", default=None)
    parser.add_argument("--semirings", nargs="+", default=["maxplus"])
    parser.add_argument("--dtypes", nargs="+", default=["float32"])
    args = parser.parse_args()
    try:
        arch = args.arch or Target.current().arch
    except NoDeviceError:
        arch = "sm_90"
    with tempfile.TemporaryDirectory() as cache_dir:
        runs = [start(arch, args.semirings, args.dtypes, cache_dir) for _ in range(3)]
    for label, run in zip(("cold", "warm", "warm"), runs, strict=True):
        print(
            f"{label} start: {run['kernels']:.0f} kernels for {arch} ready in "
            f"{run['process_seconds']:.2f} s ({run['compiles']:.0f} compiled, "
            f"{run['disk_hits']:.0f} from the disk cache)"
        )
    cold, warm = runs[0]["process_seconds"], min(r["process_seconds"] for r in runs[1:])
    print(f"a warm cache makes the restart {cold / warm:.1f}x faster ({cold - warm:.2f} s saved)")


if __name__ == "__main__":
    main()
