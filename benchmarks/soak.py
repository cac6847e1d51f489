"""The reliability workloads (tests/support/workloads.py, run small by tests/reliability) at full
size, with their figures committed:

    python benchmarks/soak.py --machine "this CPU" [--trials 200] [--processes 8]
        [--requests 1000] [--keys 200] [--waiters 10000] [--hostile 400] [--fuzz 700000]

- crash safety: a writer of 0.5-4 MiB entries killed with SIGKILL at a random point, ``--trials``
  times over one cache dir; then every entry must verify and the tmp files of the dead writers
  must go at the next scan;
- load: ``--processes`` processes x ``--requests`` requests over ``--keys`` fresh kernels (real
  NVRTC) on one cache dir: each key compiled once across all, no corrupt read;
- storm: ``--waiters`` waiters on a Compiler, a third cancelled at random, the Compiler closed in
  the middle, under asyncio and under trio;
- hostile cache: ``--hostile`` fresh kernels, each with something planted at its entry's path
  (a FIFO, a directory, a symlink, crafted headers with valid checksums, garbage, a FIFO at its
  lock), and a FIFO at the cache's ``.events``: every request must succeed within the timeout,
  every planted entry be dropped and counted, no descriptor leak;
- decoder fuzz: ``--fuzz`` well-checksummed entries with crafted headers: the decoder may only
  accept one or raise CacheCorruptError.

Writes benchmarks/results/soak-<machine slug>.{json,md}; exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.workloads import (
    crash_trials,
    decoder_fuzz,
    hostile_cache,
    multi_process_load,
    storm,
)

import aionvrtc
from aionvrtc import _nvrtc
from benchmarks._results import RESULTS, write


def checks(results: dict[str, Any]) -> list[str]:
    """What failed, in words (empty: everything held)."""
    crash, load, storms = results["crash"], results["load"], results["storms"]
    hostile, fuzz = results["hostile"], results["fuzz"]
    failed = []
    if hostile["error"] or hostile["result"] != hostile["kernels"]:
        failed.append(f"hostile: {hostile['error']} failed requests ({hostile['errors_seen']})")
    planted_entries = hostile["kernels"] - hostile["planted"]["fifo_lock"]
    if hostile["compiles"] != hostile["kernels"] or hostile["corrupt_dropped"] != planted_entries:
        failed.append("hostile: a planted entry was not dropped and recompiled")
    if hostile["fds_leaked"] or hostile["second_pass_compiles"]:
        failed.append("hostile: a descriptor leaked or a rewritten entry did not read back")
    if set(fuzz["outcomes"]) - {"accepted", "CacheCorruptError"}:
        failed.append(f"decoder fuzz: {fuzz['outcomes']}")
    if crash["entries_verified"] != crash["entries"] or crash["corrupt"]:
        failed.append("crash: an entry did not verify")
    if crash["tmp_files_after_scan"] or crash["other_files"]:
        failed.append("crash: files left behind")
    if load["compiles"] != load["keys"]:
        failed.append(f"load: {load['compiles']} compiles for {load['keys']} keys")
    if load["corrupt"] or load["errors"] or load["bad"]:
        failed.append("load: corrupt reads or failed requests")
    for backend, result in storms.items():
        ended = result["result"] + result["cancelled"] + result["closed"]
        if (
            result["other"]
            or ended != result["waiters"]
            or result["other_threads_after"]
            or (result["tasks_left"])
        ):
            failed.append(f"storm ({backend}): a waiter or a thread did not end as it should")
    return failed


def markdown(facts: dict[str, Any], results: dict[str, Any], failed: list[str]) -> str:
    crash, load, storms = results["crash"], results["load"], results["storms"]
    hostile, fuzz = results["hostile"], results["fuzz"]
    lines = [
        f"# Soak on {facts['machine']}",
        "",
        f"{facts['cpus']} CPUs, Python {facts['python']}, NVRTC {facts['nvrtc']}, "
        f"aionvrtc {facts['aionvrtc']}, {facts['date']}; {facts['seconds']:.0f} s in all. "
        + ("Every check held." if not failed else "FAILED: " + "; ".join(failed)),
        "",
        "| workload | figures |",
        "| --- | --- |",
        f"| writers killed with SIGKILL | {crash['trials']} kills, "
        f"{crash['trials_that_left_a_tmp_file']} of them mid-write (a tmp file left); "
        f"{crash['entries']} entries left, {crash['entries_verified']} verify, "
        f"{crash['corrupt']} corrupt; {crash['tmp_files_left']} tmp files, "
        f"{crash['tmp_files_after_scan']} after the next scan |",
        f"| {load['processes']} processes x {load['requests'] // load['processes']} requests, "
        f"{load['keys']} kernels, one cache dir | {load['compiles']} compiles in all, "
        f"{load['disk_hits']} disk hits, {load['memory_hits']} memory hits, "
        f"{load['corrupt']} corrupt, {load['errors']} errors; {load['seconds']:.1f} s, "
        f"{load['requests_per_s']:.0f} requests/s |",
    ]
    for backend, r in storms.items():
        lines.append(
            f"| {r['waiters']} waiters, a third cancelled, closed midway ({backend}) | "
            f"{r['result']} results, {r['cancelled']} cancelled, {r['closed']} CompilerClosed, "
            f"{r['other']} other; {r['compiles']} compiles; in flight after close: "
            f"{r['in_flight_after_close']}; threads left: {len(r['other_threads_after'])}"
            + (f"; tasks left: {r['tasks_left']}" if r["tasks_left"] is not None else "")
            + " |"
        )
    planted = ", ".join(f"{count} {kind.replace('_', ' ')}" for kind, count in
                        hostile["planted"].items())  # fmt: skip
    lines.append(
        f"| {hostile['kernels']} kernels with something planted at each entry ({planted}), a "
        f"FIFO at .events; all requested at once, concurrency 1 | {hostile['result']} served, "
        f"{hostile['error']} failed; {hostile['compiles']} compiles, "
        f"{hostile['corrupt_dropped']} planted entries dropped and counted; "
        f"{hostile['seconds']:.1f} s; descriptors leaked: {hostile['fds_leaked']}; a new "
        f"KernelCache on the dir then read {hostile['second_pass_disk_hits']} from disk |"
    )
    outcomes = ", ".join(f"{count} {name}" for name, count in sorted(fuzz["outcomes"].items()))
    lines.append(
        f"| decoder fuzz: {fuzz['inputs']} well-checksummed entries with crafted headers | "
        f"{outcomes} |"
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--machine", required=True, help="a name for this machine")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--waiters", type=int, default=10_000)
    parser.add_argument("--hostile", type=int, default=400)
    parser.add_argument("--fuzz", type=int, default=700_000)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        crash = crash_trials(root / "crash", args.trials, seed)
        print("crash:", crash, flush=True)
        load = multi_process_load(root / "load", args.processes, args.requests, args.keys, seed)
        print("load:", load, flush=True)
        storms = {
            backend: anyio.run(storm, args.waiters, 40, seed, root / backend, backend=backend)
            for backend in ("asyncio", "trio")
        }
        print("storms:", storms, flush=True)
        hostile = anyio.run(hostile_cache, root / "hostile", args.hostile, seed)
        print("hostile:", hostile, flush=True)
    fuzz = decoder_fuzz(args.fuzz, seed)
    print("fuzz:", fuzz, flush=True)
    results = {"crash": crash, "load": load, "storms": storms, "hostile": hostile, "fuzz": fuzz}
    failed = checks(results)
    facts = {
        "machine": args.machine,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "nvrtc": _nvrtc.version_string(),
        "aionvrtc": aionvrtc.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "seed": seed,
        "seconds": time.perf_counter() - started,
    }
    write(
        args.out,
        "soak",
        label=args.machine,
        facts=facts,
        results={**results, "failed": failed},
        table=markdown(facts, results, failed),
    )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
