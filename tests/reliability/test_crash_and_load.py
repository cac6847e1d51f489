"""Crash safety and many processes on one cache dir (small here; benchmarks/soak.py runs them at
full size): see workloads.py."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from .workloads import crash_trials, load_spec, multi_process_load, storm


def test_writers_killed_with_sigkill_leave_only_whole_entries(tmp_path: Path) -> None:
    result = crash_trials(tmp_path / "cache", trials=25, seed=random.randrange(1 << 30))
    assert result["entries"] >= 1
    assert result["entries_verified"] == result["entries"]  # no partial entry is readable
    assert result["corrupt"] == 0
    assert result["other_files"] == []  # nothing but entries, tmp files and locks
    assert result["tmp_files_after_scan"] == 0  # leftovers of dead writers are cleaned


def test_processes_on_one_cache_dir_compile_each_key_once(tmp_path: Path) -> None:
    keys = 12
    result = multi_process_load(
        tmp_path / "cache", processes=4, requests=60, keys=keys, seed=random.randrange(1 << 20)
    )
    print(result)
    assert result["compiles"] == keys  # across all processes
    assert (result["corrupt"], result["errors"], result["bad"]) == (0, 0, 0)
    # Every other first request of a key was a disk hit; the rest came from memory.
    assert result["disk_hits"] == 4 * keys - keys
    assert result["compiles"] + result["disk_hits"] + result["memory_hits"] == result["requests"]


@pytest.mark.anyio
async def test_ten_thousand_waiters_cancelled_and_closed_on(tmp_path: Path) -> None:
    result = await storm(10_000, kernels=40, seed=random.randrange(1 << 30), cache_dir=tmp_path)
    assert result["other"] == 0, result["other_errors"]
    assert result["result"] + result["cancelled"] + result["closed"] == 10_000
    assert min(result["result"], result["cancelled"], result["closed"]) > 0, result
    assert result["in_flight_when_aclose_returned"] == 0
    assert (result["in_flight_after_close"], result["queued_after_close"]) == (0, 0)
    assert result["other_threads_after"] == []
    assert result["tasks_left"] in (0, None)  # None: trio, which lists no tasks


def test_load_specs_are_distinct_per_tag_and_salt() -> None:
    assert load_spec(1, "a").key("sm_90") == load_spec(1, "a").key("sm_90")
    assert len({load_spec(t, s).key("sm_90") for t in range(3) for s in "ab"}) == 6
