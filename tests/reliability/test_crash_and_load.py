"""Crash safety, many processes on one cache dir, a hostile cache dir and a decoder fuzz (small
here; benchmarks/soak.py runs them at full size): see workloads.py. Seeds are fixed: the kills'
timing still varies from run to run, which is what the crash test is about."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aionvrtc import kernel_key

from ..support import run_python
from ..support.workloads import (
    HOSTILE_KINDS,
    crash_trials,
    decoder_fuzz,
    load_spec,
    multi_process_load,
    storm,
)


def test_writers_killed_with_sigkill_leave_only_whole_entries(tmp_path: Path) -> None:
    result = crash_trials(tmp_path / "cache", trials=25, seed=1122)
    assert result["entries"] >= 1
    assert result["entries_verified"] == result["entries"]  # no partial entry is readable
    assert result["corrupt"] == 0
    assert result["other_files"] == []  # nothing but entries, tmp files and locks
    assert result["tmp_files_after_scan"] == 0  # leftovers of dead writers are cleaned


def test_processes_on_one_cache_dir_compile_each_key_once(tmp_path: Path) -> None:
    keys = 12
    result = multi_process_load(tmp_path / "cache", processes=4, requests=60, keys=keys, seed=2211)
    print(result)
    assert result["compiles"] == keys  # across all processes
    assert (result["corrupt"], result["errors"], result["bad"]) == (0, 0, 0)
    # Every other first request of a key was a disk hit; the rest came from memory.
    assert result["disk_hits"] == 4 * keys - keys
    assert result["compiles"] + result["disk_hits"] + result["memory_hits"] == result["requests"]


@pytest.mark.anyio
async def test_ten_thousand_waiters_cancelled_and_closed_on(tmp_path: Path) -> None:
    result = await storm(10_000, kernels=40, seed=3344, cache_dir=tmp_path)
    assert result["other"] == 0, result["other_errors"]
    assert result["result"] + result["cancelled"] + result["closed"] == 10_000
    assert min(result["result"], result["cancelled"], result["closed"]) > 0, result
    assert result["in_flight_when_aclose_returned"] == 0
    assert (result["in_flight_after_close"], result["queued_after_close"]) == (0, 0)
    assert result["other_threads_after"] == []
    assert result["tasks_left"] in (0, None)  # None: trio, which lists no tasks


def test_load_specs_are_distinct_per_tag_and_salt() -> None:
    assert kernel_key(load_spec(1, "a"), "sm_90") == kernel_key(load_spec(1, "a"), "sm_90")
    assert len({kernel_key(load_spec(t, s), "sm_90") for t in range(3) for s in "ab"}) == 6


def test_a_hostile_cache_dir_costs_recompiles_never_a_failed_or_hung_request(
    tmp_path: Path,
) -> None:
    # In a child process with a timeout: a regression that blocks a worker thread in open(2)
    # (a FIFO) must fail this test, not hang the suite.
    kernels = 2 * len(HOSTILE_KINDS)
    code = (
        "import anyio, json, pathlib\n"
        "from tests.support.workloads import hostile_cache\n"
        f"root = pathlib.Path({str(tmp_path / 'cache')!r})\n"
        f"print(json.dumps(anyio.run(hostile_cache, root, {kernels}, 4455)))\n"
    )
    result = json.loads(run_python(code, timeout=180).splitlines()[-1])
    assert result["errors_seen"] == []
    assert (result["result"], result["error"]) == (kernels, 0)
    assert result["compiles"] == kernels
    # Every planted entry is dropped and counted (a FIFO at a lock path is not an entry).
    assert result["corrupt_dropped"] == kernels - result["planted"]["fifo_lock"]
    assert result["fds_leaked"] in (0, None)
    assert (result["second_pass_disk_hits"], result["second_pass_compiles"]) == (kernels, 0)


def test_the_decoder_only_accepts_or_refuses_fuzzed_entries() -> None:
    result = decoder_fuzz(20_000, seed=5566)
    outcomes = result["outcomes"]
    assert set(outcomes) <= {"accepted", "CacheCorruptError"}, outcomes
    assert outcomes["CacheCorruptError"] > 10_000  # the mutations reach the checks
    assert outcomes.get("accepted", 0) > 100  # and harmless ones still decode
