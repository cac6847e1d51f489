"""The disk tier itself (DiskTier): tmp files of dead writers, writers in many processes, key locks
whose files are removed under their waiters, and background upkeep that lets reads in other
threads go first. More in tests/reliability (the index, locks, hostile dirs, corruption)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from aionvrtc import KernelCache
from aionvrtc._store.disk import DiskTier

from .support import ENTRIES, make_spec

WRITER = """
import sys
from aionvrtc import Artifact
from aionvrtc._store import DiskTier
tier = DiskTier(sys.argv[1])
seed = int(sys.argv[2])
bad = 0
for round in range(150):
    for k in range(6):
        key = f"{k:02x}" * 32
        art = Artifact(key=key, kind="cubin", image=b"\\x7fELF" + bytes([k]) * (2000 + 500 * k),
                       arch="sm_90", nvrtc_version="13.5", compile_seconds=seed + round)
        tier.write(art)
        got = tier.read(key, arch="sm_90")
        if got is None or got.image != art.image:
            bad += 1
print(bad, tier.corrupt, tier.write_failures)
"""


def test_stale_tmp_files_are_removed_fresh_ones_kept(cache_dir: Path) -> None:
    cache = KernelCache("sm_90", cache_dir=cache_dir)
    art = cache.get_or_compile(make_spec())
    shard = cache_dir / ENTRIES / art.key[:2]
    stale = shard / f".{art.key}.123.dead.tmp"
    fresh = shard / f".{art.key}.456.live.tmp"
    for tmp in (stale, fresh):
        tmp.write_bytes(b"partial")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    # Every walk of the shards tidies them: the maintenance after a write that took the cache
    # over its limit, `cache ls`, info and prune. A write never walks the shards.
    assert [e.key for e in DiskTier(cache_dir).survey().entries] == [art.key]
    assert not stale.exists()
    assert fresh.exists()


def test_concurrent_writers_from_processes_leave_only_valid_entries(tmp_path: Path) -> None:
    import subprocess
    import sys

    root = tmp_path / "shared"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(root), str(seed)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for seed in range(4)
    ]
    outputs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    # Every read, while three other processes replaced the same entries, saw a whole entry.
    assert outputs == [["0", "0", "0"]] * 4
    from aionvrtc._store import DiskTier

    tier = DiskTier(root)
    names = sorted(p.name for p in (root / ENTRIES).glob("*/*"))
    assert names == [f"{k:02x}" * 32 for k in range(6)]  # no tmp leftovers
    for name in names:
        assert tier.read(name) is not None
    assert tier.corrupt == 0


def test_a_waiter_on_a_removed_lock_file_locks_the_new_one(cache_dir: Path) -> None:
    # The holder removes its lock file as it lets go: a waiter that had opened that file must
    # not take it as held while another process locks the file made at the name since.
    import threading

    from aionvrtc._store.disk import DiskTier

    key = "cd" * 32
    first, second, third = (DiskTier(cache_dir) for _ in range(3))
    holding: list[str] = []
    overlaps: list[tuple[str, ...]] = []
    second_opened = threading.Event()

    def hold(name: str, tier: DiskTier, seconds: float) -> None:
        with tier.lock(key) as locked:
            assert locked
            holding.append(name)
            if len(holding) > 1:
                overlaps.append(tuple(holding))
            time.sleep(seconds)
            holding.remove(name)

    def second_takes() -> None:
        second_opened.set()
        hold("second", second, 0.2)

    with first.lock(key) as locked:
        assert locked
        waiter = threading.Thread(target=second_takes)
        waiter.start()
        assert second_opened.wait(10)
        time.sleep(0.1)  # second has opened the file and polls its lock
    # first let go and removed the file; third makes a new one and holds it for a while
    holder = threading.Thread(target=hold, args=("third", third, 0.3))
    holder.start()
    holder.join(10)
    waiter.join(10)
    assert overlaps == []  # never two holders at once


def test_background_upkeep_pauses_for_other_threads_and_foreground_work_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The maintenance thread's walk and index rebuild pause every PACE_STEPS steps, so reads in
    # the process's other threads take the GIL back at once (see _fs.paced); the same work
    # asked for in the caller's thread (evict(), the CLI) never pauses. Observed through
    # time.sleep, by thread, over a real eviction of 3,000 entries.
    from aionvrtc import Artifact
    from aionvrtc._store import _fs

    paused: list[str] = []
    sleep = time.sleep

    def recording(seconds: float) -> None:
        if seconds == _fs.PAUSE:
            paused.append(threading.current_thread().name)
        sleep(seconds)

    def artifact(n: int) -> Artifact:
        return Artifact(f"{n:064x}", "cubin", b"\x7fELF" + bytes(200), "sm_90", "13.0")

    filler = DiskTier(tmp_path, limit=1 << 40)
    for n in range(3000):
        assert filler.write(artifact(n))
    assert filler.wait_maintenance(60)
    monkeypatch.setattr(time, "sleep", recording)  # the module _fs calls it through
    size = sum(entry.size for entry in filler.scan())
    tier = DiskTier(tmp_path, limit=size)  # the next write is over the limit
    assert tier.write(artifact(3000))
    assert tier.wait_maintenance(60)
    assert tier.stats().evictions > 100
    pauses = len(paused)
    assert pauses >= 3000 // _fs.PACE_STEPS, pauses  # at least once per PACE_STEPS entries
    assert set(paused) == {"aionvrtc-disk-maintenance"}
    foreground = DiskTier(tmp_path, limit=size // 2)
    assert foreground.evict() > 100
    assert len(paused) == pauses  # the caller's own thread went on without a pause


def test_a_paced_thread_frees_large_containers_a_slice_at_a_time() -> None:
    # The last reference to 50,000 entries dropped at once holds the GIL while they are freed;
    # a paced thread empties them with pauses between slices, other threads not at all.
    from aionvrtc._store import _fs

    rows = [(f"{n:064x}", n) for n in range(3000)]
    table = dict(rows)
    _fs.let_go_of(rows)
    _fs.let_go_of(table)
    assert (len(rows), len(table)) == (3000, 3000)  # not paced: left to be freed as it is
    with _fs.paced():
        _fs.let_go_of(rows)
        _fs.let_go_of(table)
    assert (rows, table) == ([], {})


def test_the_index_is_parsed_a_slice_at_a_time_and_refused_whole_for_one_bad_record() -> None:
    from aionvrtc._store import _index

    record = b"+ %064x 7 4096 null\n"
    body = b"".join(record % n for n in range(5000))  # about 8 slices of PARSE_CHUNK
    assert len(body) > 6 * _index.PARSE_CHUNK
    slices = list(_index._parsed(body))
    assert len(slices) > 6
    assert sum(len(ops) for ops in slices if ops is not None) == 5000
    ops = _index._records_of(body)
    assert ops is not None
    assert [op[1] for op in ops[:2]] == [b"%064x" % 0, b"%064x" % 1]
    for bad in (b"+ nonsense\n", b"- %064x 7 4096 null\n" % 1):  # not a record; a - with a size
        damaged = body + bad + record % 5001
        assert _index._records_of(damaged) is None
        assert list(_index._parsed(damaged))[-1] is None  # and nothing after it
