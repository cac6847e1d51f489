"""What a process restart costs with a cold and with a warm kernel cache.

    python examples/warm_start.py [--arch sm_90] [--semirings maxplus minplus] [--dtypes float32]

Starts a fresh Python process three times, each opening a Compiler on one cache dir and asking
for the tropical kernels of the named semirings and dtypes, as a server would at start-up: once
on an empty cache (every kernel compiled by NVRTC), then twice warm (every kernel read from
disk). Prints each start's time to ready and what served it. No GPU is needed: the kernels are
compiled for ``--arch`` (default: ``$AIONVRTC_ARCH``, else this machine's GPU, else sm_90). Each
start has an empty NVRTC cache of its own (``CUDA_CACHE_PATH``), so a cold start compiles.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from aionvrtc import resolve_target

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
    print(json.dumps({"kernels": len(specs), "compiles": s.compiles, "disk_hits": s.disk.hits,
                      "seconds": time.perf_counter() - started}))

anyio.run(main)
"""


def start(
    arch: str, semirings: list[str], dtypes: list[str], cache_dir: str, scratch: str
) -> dict[str, float]:
    # NVRTC 13 keeps compiled programs in a cache of its own on disk, shared by processes
    # (~/.nv/ComputeCache): an empty one per process, so that a cold start compiles for real.
    nvrtc_cache = tempfile.mkdtemp(prefix="nvrtc-cache-", dir=scratch)
    env = {**os.environ, "AIONVRTC_CACHE_DIR": cache_dir, "CUDA_CACHE_PATH": nvrtc_cache}
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
    # --arch, else $AIONVRTC_ARCH, else this GPU's; sm_90 on a machine without one.
    arch = resolve_target(args.arch, default="sm_90").arch
    with tempfile.TemporaryDirectory() as cache_dir, tempfile.TemporaryDirectory() as scratch:
        runs = [start(arch, args.semirings, args.dtypes, cache_dir, scratch) for _ in range(3)]
    for label, run in zip(("cold", "warm", "warm"), runs, strict=True):
        print(
            f"{label} start: {run['kernels']:.0f} kernels for {arch} ready in "
            f"{run['process_seconds']:.2f} s ({run['compiles']:.0f} compiled, "
            f"{run['disk_hits']:.0f} from the disk cache)"
        )
    cold, warm = runs[0]["process_seconds"], min(r["process_seconds"] for r in runs[1:])
    print(f"a warm cache makes the restart {cold / warm:.1f}x faster ({cold - warm:.2f} s saved)")
    print(
        "(each start a fresh process with an empty CUDA_CACHE_PATH: NVRTC's own cache served none)"
    )


if __name__ == "__main__":
    main()
