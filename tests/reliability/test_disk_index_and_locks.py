"""The disk tier at scale: no request walks the shards (the index says how big the cache is),
eviction runs in the background down to the low-water mark, the index survives killed writers,
garbage, other processes and `cache clear`; and the per-key lock is waited for without polling,
held by a real flock in another process.

Real files, real processes, real flock. Calls are observed, never faked: os.scandir and
os.listdir are wrapped to count (or, once, to hold) the real calls. No timing is asserted:
timeouts only turn a hang into a failure (benchmarks/disk_tier.py measures)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from aionvrtc import Artifact
from aionvrtc._artifact import encode
from aionvrtc._cli import main
from aionvrtc._store import NO_LOCK, DiskStats, DiskTier, KeyLock
from aionvrtc._store import _index as index_module
from aionvrtc._store import _upkeep as upkeep_module
from aionvrtc._store import _upkeep_child as upkeep_child_module
from aionvrtc._store._index import HEADER_SIZE, INDEX_NAME
from aionvrtc._store.disk import LOW_WATER

from ..support import ENTRIES, ROOT, run_python
from ..support.disk import KEY, artifact, header, on_disk

HANG = 60  # seconds: only a hang takes this long


def fill(tier: DiskTier, count: int, start: int = 0) -> list[Artifact]:
    arts = [artifact(n) for n in range(start, start + count)]
    for art in arts:
        assert tier.write(art)
    assert tier.wait_maintenance(HANG)
    return arts


class Listings:
    """Counts os.scandir and os.listdir calls, per thread: the real calls, wrapped."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: dict[str, int] = {}
        self.gate: threading.Event | None = None  # set: calls from other threads wait for it
        for name in ("scandir", "listdir"):
            monkeypatch.setattr(os, name, self._wrap(getattr(os, name)))

    def _wrap(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            thread = threading.current_thread()
            self.calls[thread.name] = self.calls.get(thread.name, 0) + 1
            if self.gate is not None and thread is not threading.main_thread():
                self.gate.wait(HANG)
            return real(*args, **kwargs)

        return counted

    def here(self) -> int:
        return self.calls.get(threading.current_thread().name, 0)

    def elsewhere(self) -> int:
        return sum(self.calls.values()) - self.here()


@pytest.fixture
def listings(monkeypatch: pytest.MonkeyPatch) -> Listings:
    return Listings(monkeypatch)


# -- no request walks the shards ---------------------------------------------------------------


def test_requests_never_list_a_folder_and_eviction_runs_behind_them(
    tmp_path: Path, listings: Listings
) -> None:
    root = tmp_path / "cache"
    new = [1000 + n for n in range(15)]
    # Room for all but the last write: that one takes the cache over its limit.
    limit = sum(len(encode(artifact(n))) for n in [*range(290), *new[:-1]])
    arts = fill(DiskTier(root, limit=limit), 290)
    listings.calls.clear()
    # A new process's first write, its reads, and the write that takes it over the limit: the
    # old code walked every shard on the first write, inside the request.
    tier = DiskTier(root, limit=limit)
    assert tier.write(artifact(new[0]))
    assert tier.read(arts[0].key, arch="sm_90") == arts[0]
    assert tier.read(artifact(2000).key) is None
    for n in new[1:]:
        assert tier.write(artifact(n))
    assert listings.here() == 0
    assert tier.wait_maintenance(HANG)
    assert listings.elsewhere() > 0  # the maintenance thread walked the shards, once
    count, size = on_disk(root)
    assert size <= LOW_WATER * limit < size + len(encode(arts[0]))  # down to the low water
    stats = tier.stats()
    assert stats.evictions == 305 - count
    assert (stats.entries, stats.bytes) == (count, size)
    assert tier.events()["evicted"] == stats.evictions
    lines = (root / ENTRIES / ".events").read_text().split()
    assert lines[1::3] == ["evicted"]  # one batch
    # Least recently used first: the entry read above and the newest writes stayed.
    kept = {p.name for p in (root / ENTRIES).glob("*/*")}
    assert arts[0].key in kept
    assert {artifact(n).key for n in new} <= kept


def _evict_past_limit(root: Path) -> tuple[DiskTier, list[Artifact]]:
    """A tier whose last write takes a cache of 290 entries and 15 new ones over its limit,
    the eviction that follows done; the tier and the first 290 entries."""
    new = [1000 + n for n in range(15)]
    limit = sum(len(encode(artifact(n))) for n in [*range(290), *new[:-1]])
    arts = fill(DiskTier(root, limit=limit), 290)
    tier = DiskTier(root, limit=limit)
    assert tier.read(arts[0].key, arch="sm_90") == arts[0]
    for n in new:
        assert tier.write(artifact(n))
    assert tier.wait_maintenance(HANG)
    return tier, arts


def _evicted_down_to_the_low_water(tier: DiskTier, arts: list[Artifact]) -> None:
    count, size = on_disk(tier.root)
    assert size <= LOW_WATER * tier.limit < size + len(encode(arts[0]))
    stats = tier.stats()
    assert stats.evictions == 305 - count
    assert (stats.entries, stats.bytes) == (count, size)
    assert tier.events()["evicted"] == stats.evictions
    assert arts[0].key in {p.name for p in (tier.root / ENTRIES).glob("*/*")}  # read: kept


@pytest.fixture
def away(monkeypatch: pytest.MonkeyPatch) -> None:
    """Passes from 200 entries on in a child process, and no failure remembered from another
    test (a process stops trying the child path once it failed)."""
    monkeypatch.setattr(upkeep_module, "AWAY_ENTRIES", 200)
    monkeypatch.setattr(upkeep_child_module, "_broken", [])


def interpreter(tmp_path: Path, name: str, then: str) -> tuple[Path, Path]:
    """A program called ``name`` that appends its arguments to a file (returned), then does
    ``then``: what sys.executable is made to be, to see the children started."""
    runs = tmp_path / "runs"
    program = tmp_path / name
    program.write_text(f'#!/bin/sh\necho "$@" >> {runs}\n{then}\n')
    program.chmod(0o755)
    return program, runs


def test_a_large_cache_is_maintained_in_a_child_process(
    tmp_path: Path, listings: Listings, monkeypatch: pytest.MonkeyPatch, away: None
) -> None:
    # From AWAY_ENTRIES on, the pass shares no GIL with this process's reads: no thread of
    # this process lists a folder, and the eviction, its count and the index are as if it had.
    program, runs = interpreter(tmp_path, "python3", f'exec {sys.executable} "$@"')
    monkeypatch.setattr(sys, "executable", str(program))
    tier, arts = _evict_past_limit(tmp_path / "cache")
    assert listings.calls.get("aionvrtc-disk-maintenance", 0) == 0
    assert listings.here() == 0
    _evicted_down_to_the_low_water(tier, arts)
    (started,) = runs.read_text().splitlines()  # one child, isolated, for this version
    assert started.startswith("-I -c import sys; root = ")
    assert started.endswith(f" {tmp_path / 'cache'} {tier.limit} 0 {ENTRIES}")


def test_no_child_is_started_while_another_process_maintains_the_dir(
    tmp_path: Path, listings: Listings, monkeypatch: pytest.MonkeyPatch, away: None
) -> None:
    program, runs = interpreter(tmp_path, "python3", f'exec {sys.executable} "$@"')
    monkeypatch.setattr(sys, "executable", str(program))
    root = tmp_path / "cache"
    fill(DiskTier(root, limit=1 << 40), 290)
    version = os.open(root / ENTRIES, os.O_RDONLY)
    fcntl.flock(version, fcntl.LOCK_EX)  # another process's pass (an open file of its own)
    try:
        tier = DiskTier(root, limit=on_disk(root)[1] - 1)
        for n in range(5):  # each write over the limit asks for a pass
            assert tier.write(artifact(1000 + n))
            assert tier.wait_maintenance(HANG)
    finally:
        os.close(version)
    assert not runs.exists()
    assert tier.stats().evictions == 0
    assert tier.write(artifact(2000))  # let go: this write's pass is made, in a child
    assert tier.wait_maintenance(HANG)
    assert len(runs.read_text().splitlines()) == 1
    assert tier.stats().evictions > 0
    assert listings.calls.get("aionvrtc-disk-maintenance", 0) == 0


@pytest.mark.parametrize(
    "fault", ["frozen", "not python", "not executable", "missing", "no answer"]
)
def test_where_no_child_process_can_make_the_pass_this_process_does(
    tmp_path: Path,
    listings: Listings,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    away: None,
    fault: str,
) -> None:
    # It notes that it ran, then exits at once with status 1 and nothing said.
    name = "uwsgi" if fault == "not python" else "python3"
    program, runs = interpreter(tmp_path, name, "exit 1")
    if fault == "frozen":  # a PyInstaller application: sys.executable is the application
        monkeypatch.setattr(sys, "frozen", True, raising=False)
    elif fault == "not executable":
        program.chmod(0o644)
    elif fault == "missing":
        program.unlink()
    monkeypatch.setattr(sys, "executable", str(program))
    with caplog.at_level(logging.WARNING, logger="aionvrtc"):
        tier, arts = _evict_past_limit(tmp_path / "cache")
        assert listings.calls["aionvrtc-disk-maintenance"] > 0  # the walk was made here
        _evicted_down_to_the_low_water(tier, arts)
        # Once failed, the process does not try again: the next pass is made here too.
        walks = listings.calls["aionvrtc-disk-maintenance"]
        for n in range(40):
            assert tier.write(artifact(5000 + n))
        assert tier.wait_maintenance(HANG)
        assert listings.calls["aionvrtc-disk-maintenance"] > walks
    said = [r.getMessage() for r in caplog.records]
    gave_up = "the disk cache's maintenance runs in this process from now on, not in a child "
    if fault == "no answer":
        assert runs.read_text().count("\n") == 1
        assert said == [f"{gave_up}process: {program} ended with status 1 and no answer"]
    elif fault in ("not executable", "missing"):
        assert not runs.exists()
        (message,) = said
        assert message.startswith(f"{gave_up}process: cannot start {program}: [Errno ")
    else:  # never started: an embedding server is not run by its name
        assert not runs.exists()
        assert said == []


def test_a_read_never_waits_behind_a_walk(tmp_path: Path, listings: Listings) -> None:
    # The old code held the tier's lock for a whole eviction scan, and every read took it to
    # count a hit: a read stalled for as long as the scan.
    tier = DiskTier(tmp_path / "cache", limit=1 << 30)
    arts = fill(tier, 20)
    listings.gate = threading.Event()  # walks in other threads stop in os.listdir
    walker = threading.Thread(target=tier.evict, name="walker")
    walker.start()
    done: list[object] = []

    def request() -> None:
        done.append(tier.read(arts[3].key, arch="sm_90"))
        done.append(tier.stats())

    reader = threading.Thread(target=request)
    reader.start()
    reader.join(HANG / 2)
    stuck = reader.is_alive()
    listings.gate.set()
    walker.join(HANG)
    reader.join(HANG)
    assert not stuck
    assert listings.calls["walker"] > 0  # the walk was under way, held in its listing
    assert done[0] == arts[3]
    assert isinstance(done[1], DiskStats)
    assert done[1].hits == 1


def test_stats_snapshot_the_counters_and_the_index(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path / "cache")
    assert tier.stats() == DiskStats(
        hits=0, misses=0, writes=0, corrupt_dropped=0, evictions=0, write_failures=0,
        read_failures=0, writable=True, trusted=True, entries=None, bytes=None,
    )  # fmt: skip
    arts = fill(tier, 3)
    assert tier.read(arts[0].key) == arts[0]
    assert tier.read(artifact(99).key) is None
    path = tier.path(arts[1].key)
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    assert tier.read(arts[1].key) is None  # dropped: its removal is indexed too
    stats = tier.stats()
    count, size = on_disk(tmp_path / "cache")
    assert stats == DiskStats(
        hits=1, misses=2, writes=3, corrupt_dropped=1, evictions=0, write_failures=0,
        read_failures=0, writable=True, trusted=True, entries=count, bytes=size,
    )  # fmt: skip
    assert (tier.hits, tier.corrupt, tier.writes) == (1, 1, 3)  # the attributes still count
    assert count == 2


# -- the index ----------------------------------------------------------------------------------

WRITER = r"""
import sys
from tests.support.disk import artifact
from aionvrtc._store.disk import DiskTier

tier = DiskTier(sys.argv[1])
n = int(sys.argv[2])
while True:
    tier.write(artifact(n))
    if n % 7 == 0:
        tier.discard(artifact(n - 3).key)
    print(n, flush=True)
    n += 1
"""


def test_the_index_survives_writers_killed_with_sigkill(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    fill(DiskTier(root), 50)
    rng = random.Random(4711)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    kills = 12
    for trial in range(kills):
        child = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(root), str(100 + 1000 * trial)],
            stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env,
        )  # fmt: skip
        assert child.stdout is not None
        for _ in range(rng.randrange(1, 40)):
            child.stdout.readline()
        child.send_signal(signal.SIGKILL)
        child.wait(HANG)
    totals = header(root)
    count, size = on_disk(root)
    assert totals is not None  # whole, never torn: the header is written after its record
    # A kill between a file's change and its record leaves the totals one entry off at most.
    assert count - kills <= totals.entries <= count + kills
    # A listing (or any rebuild) puts them right, and knows every entry's header.
    tier = DiskTier(root)
    listing = tier.listing()
    assert len(listing.keys) == count
    assert list(listing.last_used) == sorted(listing.last_used, reverse=True)
    assert all(isinstance(h, dict) and h["arch"] == "sm_90" for h in listing.headers)
    totals = header(root)
    assert totals is not None
    assert (totals.entries, totals.bytes) == (count, size)
    assert (tier.stats().entries, tier.stats().bytes) == (count, size)


def _garbage(kind: str, path: Path) -> None:
    good = path.read_bytes()
    if kind == "random bytes":
        path.write_bytes(random.Random(3).randbytes(5000))
    elif kind == "truncated":
        path.write_bytes(good[: HEADER_SIZE + 30])
    elif kind == "records that are not":
        path.write_bytes(good[:HEADER_SIZE] + b"x" * (len(good) - HEADER_SIZE))
    elif kind == "an end far past the file":
        path.write_bytes(good[:HEADER_SIZE])
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "a folder":
        path.unlink()
        path.mkdir()
        (path / "inside").write_bytes(b"x")
    elif kind == "a symbolic link":
        path.unlink()
        (path.parent.parent / "elsewhere").write_bytes(good)
        path.symlink_to(path.parent.parent / "elsewhere")


GARBAGE = ["random bytes", "truncated", "records that are not", "an end far past the file"]
GARBAGE += ["empty", "a folder", "a symbolic link"]


@pytest.mark.parametrize("kind", GARBAGE)
def test_a_garbage_index_is_rebuilt_and_fails_no_request(
    tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "cache"
    tier = DiskTier(root)
    arts = fill(tier, 30)
    _garbage(kind, root / ENTRIES / INDEX_NAME)
    tier = DiskTier(root)
    with caplog.at_level(logging.WARNING, logger="aionvrtc"):
        assert tier.read(arts[5].key, arch="sm_90") == arts[5]
        assert tier.write(artifact(500))
        assert tier.wait_maintenance(HANG)
    assert [r.getMessage() for r in caplog.records] == []
    count, size = on_disk(root)
    assert count == 31
    totals = header(root)
    assert totals is not None
    assert (totals.entries, totals.bytes) == (count, size)
    assert totals.rebuilt > 0
    if kind == "a symbolic link":
        assert (root / "elsewhere").read_bytes()  # replaced, never followed
    listing = tier.listing()
    assert all(isinstance(h, dict) for h in listing.headers)
    aside = [(d.path.name.startswith(".index.damaged-"), d.problem) for d in listing.damaged]
    problem = "a folder set aside: it was found where the index belongs"
    assert aside == ([(True, problem)] if kind == "a folder" else [])


def test_a_fifo_at_the_index_blocks_no_request(tmp_path: Path) -> None:
    # In a child with a timeout: on a regression the open(2) of the FIFO blocks forever.
    root = tmp_path / "cache"
    arts = fill(DiskTier(root), 5)
    (root / ENTRIES / INDEX_NAME).unlink()
    os.mkfifo(root / ENTRIES / INDEX_NAME)
    out = run_python(
        "import json, sys\n"
        "from aionvrtc._store.disk import DiskTier\n"
        "from tests.support.disk import artifact\n"
        f"tier = DiskTier({str(root)!r})\n"
        f"hit = tier.read({arts[0].key!r}) is not None\n"
        "wrote = tier.write(artifact(77))\n"
        "tier.wait_maintenance(60)\n"
        "listed = len(tier.listing().keys)\n"
        "print(json.dumps([hit, wrote, listed, tier.stats().entries]))\n",
        timeout=HANG,
    )
    assert json.loads(out) == [True, True, 6, 6]
    assert (root / ENTRIES / INDEX_NAME).is_file()


REMOVER = """
import sys
from aionvrtc._store.disk import DiskTier
from tests.support.disk import artifact
tier = DiskTier(sys.argv[1])
for n in range(0, 40, 4):
    tier.discard(artifact(n).key)
print(tier.prune(older_than=0.0 if sys.argv[2] == "all" else 1e9))
"""


def test_removals_by_another_process_reach_the_index(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    tier = DiskTier(root)
    fill(tier, 40)
    assert tier.stats().entries == 40
    run_python(f"import sys; sys.argv = ['-', {str(root)!r}, 'some']\n" + REMOVER)
    assert tier.write(artifact(100))
    assert tier.stats().entries == on_disk(root)[0] == 31
    assert tier.stats().bytes == on_disk(root)[1]
    run_python(f"import sys; sys.argv = ['-', {str(root)!r}, 'all']\n" + REMOVER)
    assert tier.write(artifact(101))
    assert (tier.stats().entries, on_disk(root)[0]) == (1, 1)


def test_cache_clear_empties_the_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "cache"
    tier = DiskTier(root)
    fill(tier, 25)
    assert main(["cache", "clear", "--json", "--cache-dir", str(root)]) == 0
    assert json.loads(capsys.readouterr().out)["removed"] == 25
    totals = header(root)
    assert totals is not None
    assert (totals.entries, totals.bytes) == (0, 0)
    assert tier.write(artifact(1))
    assert tier.stats().entries == 1
    assert tier.stats().bytes == on_disk(root)[1]


def test_the_index_stays_bounded_under_rewrites(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each write appends a record; records of entries replaced or removed are dropped by a
    # background rewrite once they outnumber the live ones.
    monkeypatch.setattr(index_module, "COMPACT_SLACK", 20)
    root = tmp_path / "cache"
    tier = DiskTier(root)
    fill(tier, 5)
    for _ in range(30):
        for n in range(5):
            assert tier.write(artifact(n))
    assert tier.wait_maintenance(HANG)
    totals = header(root)
    assert totals is not None
    assert totals.entries == 5
    assert totals.records <= 2 * 5 + 20 + 1
    assert (root / ENTRIES / INDEX_NAME).stat().st_size < 40 * 400


# -- the CLI walks once and reads the headers from the index ------------------------------------


def test_prune_and_ls_walk_the_shards_once_and_open_no_entry(
    tmp_path: Path, listings: Listings, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    root = tmp_path / "cache"
    fill(DiskTier(root), 200)
    shards = len([p for p in (root / ENTRIES).iterdir() if p.is_dir()])
    opened: list[str] = []
    real_open = os.open

    def counted_open(path: Any, *args: Any, **kwargs: Any) -> int:
        opened.append(os.fsdecode(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", counted_open)
    listings.calls.clear()
    assert main(["cache", "ls", "--json", "--cache-dir", str(root)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 200
    assert sorted(rows[0]) == sorted(
        ["key", "kind", "arch", "nvrtc_version", "size", "last_used", "last_used_unix",
         "created", "names"]
    )  # fmt: skip
    assert {r["names"][0] for r in rows} == {f"k_{n}<float>" for n in range(200)}
    assert [p for p in opened if len(Path(p).name) == 64] == []  # headers from the index
    assert listings.here() <= shards + 1
    listings.calls.clear()
    assert main(["cache", "prune", "--max-size", "0", "--json", "--cache-dir", str(root)]) == 0
    pruned = json.loads(capsys.readouterr().out)
    assert (pruned["removed"], pruned["entries"], pruned["bytes"]) == (200, 0, 0)
    assert pruned["bytes_before"] == sum(r["size"] for r in rows)
    assert listings.here() <= shards + 1  # it was three walks: survey, prune, survey
    assert on_disk(root) == (0, 0)


def test_ls_rebuilds_a_lost_index_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "cache"
    fill(DiskTier(root), 30)
    (root / ENTRIES / INDEX_NAME).unlink()
    for _ in range(2):
        assert main(["cache", "ls", "--json", "--cache-dir", str(root)]) == 0
        rows = json.loads(capsys.readouterr().out)
        assert {r["arch"] for r in rows} == {"sm_90"}
        assert len(rows) == 30
        totals = header(root)
        assert totals is not None
        assert totals.entries == 30


# -- the per-key lock ---------------------------------------------------------------------------

HOLDER = r"""
import sys
from aionvrtc._store.disk import DiskTier
lock = DiskTier(sys.argv[1]).wait_lock(sys.argv[2])
print("held" if lock.held else "not held", flush=True)
sys.stdin.readline()
lock.release()
print("released", flush=True)
sys.stdin.readline()
"""


@contextlib.contextmanager
def holder(root: Path, key: str = KEY) -> Iterator[subprocess.Popen[str]]:
    """Another process that holds ``key``'s lock until a line is written to it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(root), key], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env,
    )  # fmt: skip
    assert child.stdout is not None
    try:
        assert child.stdout.readline() == "held\n"
        yield child
    finally:
        with contextlib.suppress(OSError, ValueError):
            assert child.stdin is not None
            child.stdin.write("\n\n")
            child.stdin.close()
        child.wait(HANG)


def let_go(child: subprocess.Popen[str]) -> None:
    assert child.stdin is not None
    assert child.stdout is not None
    child.stdin.write("\n")
    child.stdin.flush()
    assert child.stdout.readline() == "released\n"


def lock_files(root: Path) -> list[str]:
    return [p.name for p in (root / ENTRIES).glob("*/.*.lock")]


def test_try_lock_is_none_while_another_process_holds_the_lock(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    tier = DiskTier(root)
    with holder(root) as child:
        assert tier.try_lock(KEY) is None
        assert lock_files(root) == [f".{KEY}.lock"]
        let_go(child)
        lock = tier.try_lock(KEY)
        assert lock is not None
        assert lock.held
        lock.release()
        lock.release()  # idempotent
        assert not lock.held
    assert lock_files(root) == []


def test_wait_lock_holds_the_lock_once_the_holder_lets_go(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    tier = DiskTier(root)
    got: list[KeyLock] = []
    with holder(root) as child:
        waiter = threading.Thread(target=lambda: got.append(tier.wait_lock(KEY, timeout=HANG)))
        waiter.start()
        waiter.join(0.3)
        assert got == []  # still waiting: the other process holds it
        let_go(child)
        waiter.join(HANG)
        [lock] = got
        assert lock.held
        assert tier.try_lock(KEY) is None  # held here now, by another open of the file
        assert lock_files(root) == [f".{KEY}.lock"]
        lock.release()
    assert lock_files(root) == []  # no file per key is left behind
    with tier.lock(KEY) as held:  # the context manager of KernelCache is built on them
        assert held
    assert lock_files(root) == []


def test_wait_lock_with_cancel_set_returns_unheld_and_gives_back_what_it_gets(
    tmp_path: Path,
) -> None:
    root = tmp_path / "cache"
    tier = DiskTier(root)
    cancel = threading.Event()
    got: list[KeyLock] = []
    with holder(root) as child:
        waiter = threading.Thread(target=lambda: got.append(tier.wait_lock(KEY, cancel=cancel)))
        waiter.start()
        waiter.join(0.3)
        assert got == []
        cancel.set()
        waiter.join(HANG)
        assert [lock.held for lock in got] == [False]
        let_go(child)
    # The abandoned flock got the lock after the holder let go, and let go of it at once:
    # another open of the cache dir takes it (it would time out, unheld, if it were kept).
    other = DiskTier(root).wait_lock(KEY, timeout=HANG)
    assert other.held
    other.release()
    assert lock_files(root) == []
    assert tier.wait_lock(KEY, cancel=cancel).held is False  # already cancelled: no wait
    assert all(t.daemon for t in threading.enumerate() if t.name == "aionvrtc-flock")


def test_wait_lock_times_out_unheld_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "cache"
    with holder(root), caplog.at_level(logging.WARNING, logger="aionvrtc"):
        assert DiskTier(root).wait_lock(KEY, timeout=0.2).held is False
    assert [r.getMessage() for r in caplog.records] == [
        f"waited 0 s for another process to compile {KEY[:16]}; compiling here"
    ]


def test_a_lock_never_let_go_does_not_keep_a_waiting_process_alive(tmp_path: Path) -> None:
    # The waiting flock runs in a daemon thread: after the waiter gave up, the interpreter
    # exits although that flock never returns.
    root = tmp_path / "cache"
    with holder(root):
        out = run_python(
            "import threading\n"
            "from aionvrtc._store.disk import DiskTier\n"
            f"tier = DiskTier({str(root)!r})\n"
            f"print(tier.wait_lock({KEY!r}, timeout=0.3).held)\n"
            "cancel = threading.Event()\n"
            "threading.Timer(0.2, cancel.set).start()\n"
            f"print(tier.wait_lock({KEY!r}, cancel=cancel).held)\n",
            timeout=HANG,
        )
    assert out.split() == ["False", "False"]


def test_a_cache_that_cannot_lock_hands_out_unheld_locks(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.mkdir(mode=0o777)
    root.chmod(0o777)  # others can write it: not trusted, so neither read nor written
    tier = DiskTier(root)
    assert not tier.trusted
    for lock in (tier.try_lock(KEY), tier.wait_lock(KEY)):
        assert lock is not None
        assert lock.held is False
        lock.release()
    assert NO_LOCK.held is False
    NO_LOCK.release()
    assert not (root / ENTRIES).exists()


# -- the index file is known by its generation, and read again under its lock ------------------


def test_a_rebuild_never_installs_over_another_index_at_the_same_inode(tmp_path: Path) -> None:
    # ext4 gives a removed file's inode number to the next file made: the index a rebuild
    # marked can be replaced (and removed) by another rebuild and a later index get its
    # inode. Here the marked file is rewritten in place as another index: the same
    # (st_dev, st_ino), another file.
    root = tmp_path / "cache"
    tier = DiskTier(root)
    fill(tier, 5)
    fill(DiskTier(tmp_path / "other"), 2)
    path = root / ENTRIES / INDEX_NAME
    version = os.open(root / ENTRIES, os.O_RDONLY | os.O_DIRECTORY)
    try:
        mark = tier._index.start(version)
        snapshot = tier._index.read(version)
        assert mark is not None
        assert snapshot is not None
        inode = path.stat().st_ino
        path.write_bytes((tmp_path / "other" / ENTRIES / INDEX_NAME).read_bytes())
        assert path.stat().st_ino == inode
        before = header(root)
        assert tier._index.install(version, mark, dict(snapshot.records)) is None
    finally:
        os.close(version)
    assert header(root) == before  # left as it is: the next rebuild puts it right
    assert before is not None
    assert before.entries == 2


def test_a_header_read_mid_write_does_not_throw_the_index_away(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An append writes its record, then the header: a read without the lock that overlaps the
    # header write can see part of it and fail its CRC. The header is made to fail it while
    # this test holds the index's lock, as an append does, and put back before letting go.
    root = tmp_path / "cache"
    tier = DiskTier(root)
    fill(tier, 30)
    path = root / ENTRIES / INDEX_NAME
    good = path.read_bytes()
    inode = path.stat().st_ino
    locking = threading.Event()
    real_flock = fcntl.flock

    def observed(fd: int, operation: int) -> None:
        if threading.current_thread().name == "rebuild":
            locking.set()  # the rebuild's start takes the lock (or waits for it)
        real_flock(fd, operation)

    appending = os.open(path, os.O_RDWR)
    version = os.open(root / ENTRIES, os.O_RDONLY | os.O_DIRECTORY)
    try:
        real_flock(appending, fcntl.LOCK_EX)
        os.pwrite(appending, bytes([good[20] ^ 0xFF]), 20)
        monkeypatch.setattr(fcntl, "flock", observed)
        marks: list[object] = []
        rebuild = threading.Thread(
            target=lambda: marks.append(tier._index.start(version)), name="rebuild"
        )
        rebuild.start()
        while rebuild.is_alive() and not locking.wait(0.01):
            pass
        os.pwrite(appending, good[:HEADER_SIZE], 0)  # the append's header write is done
        real_flock(appending, fcntl.LOCK_UN)
        rebuild.join(HANG)
        snapshot = tier._index.read(version)
    finally:
        os.close(appending)
        os.close(version)
    assert path.stat().st_ino == inode  # the index was kept, not replaced by an empty one
    [mark] = marks
    assert isinstance(mark, index_module.Mark)
    assert mark.file[1] == inode
    assert snapshot is not None
    assert len(snapshot.records) == 30


# -- fork: a child never keeps a lock of its parent's, and starts with a working tier -----------

# For a process that forks: start_pass writes that take a cache of 30,000 bytes (7 entries)
# over its limit, and the background pass then stops in its walk of the shards (holding the
# maintenance lock) until go_on is set; children forked from it are not held. fork_waiting
# forks a child that runs ``body``, then waits until the parent lets it go (let_go) or dies.
HELD_PASS = r"""
import fcntl, json, os, sys, threading, time
from pathlib import Path
from aionvrtc._spec import FORMAT_VERSION
from aionvrtc._store.disk import DiskTier
from tests.support.disk import KEY, artifact, header, on_disk

parent = os.getpid()
inside, go_on = threading.Event(), threading.Event()
walk = DiskTier._walk


def held_walk(self, version, damaged):
    if os.getpid() == parent and threading.current_thread().name == "aionvrtc-disk-maintenance":
        inside.set()
        go_on.wait(60)
    return walk(self, version, damaged)


DiskTier._walk = held_walk


def start_pass(tier):
    for n in range(12):
        assert tier.write(artifact(n))
    assert inside.wait(60)


def fork_waiting(body=lambda: None):
    stay = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(stay[1])  # so that the read ends when the parent dies
            body()
            os.read(stay[0], 1)
        finally:
            os._exit(0)
    os.close(stay[0])

    def let_go():
        os.close(stay[1])
        os.waitpid(pid, 0)

    return let_go


def flock_free(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True
"""


def forking(root: Path, body: str) -> str:
    """A script of HELD_PASS, then ``body``, with ``root`` the cache dir."""
    return HELD_PASS + f"root = Path({str(root)!r})\n" + body


FORK_DURING_A_PASS = r"""
tier = DiskTier(root, limit=30_000)
start_pass(tier)
report = os.pipe()


def in_child():  # the child then lives on, holding its copies of the parent's descriptors
    idle = tier.wait_maintenance(5)
    evicted = threading.Event()

    def evict():
        tier.evict()
        evicted.set()

    threading.Thread(target=evict, daemon=True).start()
    os.write(report[1], json.dumps([idle, evicted.wait(5)]).encode())


let_go = fork_waiting(in_child)
try:
    child = json.loads(os.read(report[0], 100))
    go_on.set()
    passed = tier.wait_maintenance(60)
    free = flock_free(root / f"v{FORMAT_VERSION}")
    other = DiskTier(root, limit=30_000)  # another open of the cache dir goes over the limit
    for n in range(100, 112):
        other.write(artifact(n))
    other.wait_maintenance(60)
    within = on_disk(root)[1] <= 30_000
finally:
    let_go()
print(json.dumps([child, passed, free, within]))
"""


def test_a_fork_during_maintenance_leaves_no_lock_held_and_the_child_a_working_tier(
    tmp_path: Path,
) -> None:
    # The child shares the open version folder whose flock is the maintenance lock: a close
    # by the parent let go of it only once the child exited too, so no process on the host
    # could maintain the cache (it grew past its limit). And the child's tier was left with
    # a walk that never ends: wait_maintenance, evict, prune and clear hung.
    root = tmp_path / "cache"
    out = run_python(forking(root, FORK_DURING_A_PASS), timeout=HANG)
    child, passed, free, within = json.loads(out)
    assert child == [True, True]  # the child waits for no pass and walks itself
    assert passed
    assert free  # let go by the parent while the child lives
    assert within  # so another process maintains the cache


FORK_DURING_AN_APPEND = r"""
from aionvrtc._store import _index

tier = DiskTier(root)
assert tier.write(artifact(0))
pwrite_all = _index._pwrite_all


def held_pwrite(fd, data, offset):  # the append stops while it holds the index's lock
    if os.getpid() == parent and threading.current_thread().name == "appender":
        inside.set()
        go_on.wait(60)
    pwrite_all(fd, data, offset)


_index._pwrite_all = held_pwrite
appender = threading.Thread(target=tier.write, args=(artifact(1),), name="appender")
appender.start()
assert inside.wait(60)
let_go = fork_waiting()
try:
    go_on.set()
    appender.join(60)
    free = flock_free(root / f"v{FORMAT_VERSION}" / ".index")
    assert DiskTier(root).write(artifact(2))  # another open of the cache dir: its record is kept
    entries = header(root).entries
finally:
    let_go()
print(json.dumps([free, entries]))
"""


def test_a_fork_during_an_append_leaves_the_index_lock_free(tmp_path: Path) -> None:
    # The child shares the index file open by an append that holds its flock: closing it did
    # not let go while the child lived, and every other write waited LOCK_WAIT and skipped its
    # record.
    root = tmp_path / "cache"
    out = run_python(forking(root, FORK_DURING_AN_APPEND), timeout=HANG)
    assert json.loads(out) == [True, 3]


FORK_HOLDING_A_KEY_LOCK = r"""
lock = DiskTier(root).try_lock(KEY)
assert lock is not None and lock.held
report = os.pipe()


def in_child():
    held = lock.held
    lock.release()
    os.write(report[1], json.dumps(held).encode())


let_go = fork_waiting(in_child)
try:
    held_in_child = json.loads(os.read(report[0], 100))
    still_held = DiskTier(root).try_lock(KEY) is None
    files = [p.name for p in root.glob(f"v{FORMAT_VERSION}/*/.*.lock")]
    lock.release()  # while the child lives
    after = DiskTier(root).try_lock(KEY)
    free = after is not None and after.held
    if after is not None:
        after.release()
finally:
    let_go()
print(json.dumps([held_in_child, still_held, files, free]))
"""


def test_a_key_lock_stays_the_parent_s_in_a_forked_child(tmp_path: Path) -> None:
    # A child leaving `with tier.lock(key)` (forked inside it) released the parent's lock:
    # removed its file and unlocked it while the parent compiled. The parent's own release
    # must free it for everyone while the child lives.
    root = tmp_path / "cache"
    out = run_python(forking(root, FORK_HOLDING_A_KEY_LOCK), timeout=HANG)
    assert json.loads(out) == [False, True, [f".{KEY}.lock"], True]


FORK_THEN_DIE = r"""
tier = DiskTier(root, limit=30_000)
lock = tier.try_lock(KEY)
assert lock is not None and lock.held
start_pass(tier)
if os.fork() == 0:
    # Said by the child: its after-fork handlers have run by the time fork() returns here
    # (said by the parent, the parent could be killed before they had run).
    print(os.getpid(), flush=True)
    time.sleep(60)
    os._exit(0)
time.sleep(60)
"""


def test_a_parent_killed_after_a_fork_leaves_no_lock_held_by_the_child(tmp_path: Path) -> None:
    # A process holding a key lock (a compile) and the maintenance lock (a pass) forks, then
    # is killed: its child must not keep either held for as long as it lives.
    root = tmp_path / "cache"
    code = forking(root, FORK_THEN_DIE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    parent = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        parent.send_signal(signal.SIGKILL)
        parent.wait(HANG)
        lock = DiskTier(root).try_lock(KEY)
        assert lock is not None
        assert lock.held
        lock.release()
        version = os.open(root / ENTRIES, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(version, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if it is held
        finally:
            os.close(version)
    finally:
        os.kill(child, signal.SIGKILL)
        parent.stdout.close()


def test_a_header_read_while_an_append_lands_is_read_whole(tmp_path: Path) -> None:
    # totals() and read() take no lock: an append landing between their open and their read
    # of the header (records first, then the header) must not make a good index look damaged,
    # or maintenance backs off and the index grows without a rewrite (seen under load).
    root = tmp_path / "cache"
    tier = DiskTier(root)
    fill(tier, 2)
    index = tier._index
    opener = index._open
    version = os.open(root / ENTRIES, os.O_RDONLY | os.O_DIRECTORY)
    appended: list[str] = []
    try:

        def open_then_append(*args: Any) -> Any:
            opened = opener(*args)
            if args[1] == os.O_RDONLY:  # a reader's open: a writer appends right after it
                key = f"{len(appended):064x}"
                appended.append(key)
                assert index.add(version, key, (100 + len(appended), 1, b"null"), None)
            return opened

        index._open = open_then_append
        totals = index.totals(version)
        assert totals is not None
        assert totals.entries == 3
        snapshot = index.read(version)
        assert snapshot is not None
        assert snapshot.totals.entries == 4
    finally:
        os.close(version)


def test_a_rebuild_counts_what_was_written_and_removed_while_it_ran(tmp_path: Path) -> None:
    # The rebuild sums its records' bytes before it takes the index's lock; under the lock it
    # adds only what the records appended since its start change: an entry written, one
    # removed, and one written again at another size.
    root = tmp_path / "cache"
    tier = DiskTier(root, limit=1 << 40)
    fill(tier, 4)
    version = os.open(root / ENTRIES, os.O_RDONLY | os.O_DIRECTORY)
    try:
        mark = tier._index.start(version)
        assert mark is not None
        snapshot = tier._index.read(version)
        assert snapshot is not None
        records = dict(snapshot.records)  # what the rebuild's walk found
        assert tier.write(artifact(4))
        assert tier.discard(artifact(0).key)
        assert tier.discard(artifact(1).key)
        assert tier.write(artifact(1, size=9000))
        totals = tier._index.install(version, mark, records)
        after = tier._index.read(version)
    finally:
        os.close(version)
    assert totals is not None
    assert after is not None
    sizes = {key: record[1] for key, record in after.records.items()}
    assert sorted(sizes) == sorted(artifact(n).key for n in (1, 2, 3, 4))
    assert (totals.entries, totals.bytes) == (4, sum(sizes.values()))
    assert (totals.entries, totals.bytes) == on_disk(root)
