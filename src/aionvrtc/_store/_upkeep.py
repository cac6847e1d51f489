"""The disk tier's upkeep: eviction, prune and clear, the index rebuilt, the maintenance
thread and the event log."""

from __future__ import annotations

import contextlib
import heapq
import os
import threading
import time
from collections.abc import Callable

from ._fs import (
    breathe,
    closing,
    let_go_of,
    paced,
    paced_total,
    read_up_to,
    remove_at,
)
from ._index import (
    Record,
    Totals,
)
from ._locks import unlock

try:
    import fcntl
except ImportError:  # not POSIX: no cross-process single flight
    fcntl = None  # type: ignore[assignment]
from ._disk_base import (
    _EVENTS,
    _EVENTS_TAIL,
    _LAST_USED,
    _VERSION,
    EVENT_KINDS,
    LOW_WATER,
    MAINTENANCE_BACKOFF,
    SORT_RUN,
    Pruned,
    _Damaged,
    _Found,
    _lock_name,
    _out_of_date,
    _RootError,
    _Swept,
    logger,
)
from ._survey import Surveying
from ._trust import Damage
from ._upkeep_child import AWAY_ENTRIES, maintain_in_child


def _bytes(found: list[_Found]) -> int:
    return paced_total(entry[1] for entry in found)


def _least_recent(
    found: list[_Found], total: int, max_bytes: int | None, cutoff: float | None
) -> list[_Found]:
    """Least recently used first: entries last used before ``cutoff``, then as many as it
    takes to bring ``total`` (the bytes of ``found``) to ``max_bytes``."""
    victims = []
    # Sorted a slice at a time and merged lazily: one sort of 50,000 entries holds the GIL for
    # about 9 ms, which a read in another thread would wait, and the merge stops at the last
    # victim (an eviction takes a tenth of the entries).
    runs = []
    for start in range(0, len(found), SORT_RUN):
        runs.append(sorted(found[start : start + SORT_RUN], key=_LAST_USED))
        breathe(0)
    for entry in heapq.merge(*runs, key=_LAST_USED):
        stale = cutoff is not None and entry[2] < cutoff
        if not stale and (max_bytes is None or total <= max_bytes):
            break  # the rest are newer: neither stale nor needed to make room
        victims.append(entry)
        total -= entry[1]
    return victims


def _flock_now(fd: int) -> bool:
    """Take the maintenance lock, a flock of the open version folder ``fd``, if nobody holds
    it; True as well where folders cannot be locked (passes may then overlap: they duplicate
    work, nothing worse). Let go with ``unlock``, never by closing ``fd`` (see ``_locks``)."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return True
    return True


class Upkeep(Surveying):
    """Keeping a cache dir in order: eviction to the low-water mark, pruning, clearing, the
    index rebuilt from a walk, the background maintenance thread and the event log that
    every process appends to."""

    def wait_maintenance(self, timeout: float | None = None) -> bool:
        """Wait until the background maintenance (eviction, an index rebuild) started so far is
        over; False if it still runs after ``timeout`` seconds."""
        return self._idle.wait(timeout)

    def _written(self, totals: Totals | None) -> None:
        """After a write's record: keep the index's totals, and maintain if they say so."""
        if totals is not None:
            self._known = totals
        if self._due(totals):
            self._maintain_soon()

    def _removed(self, totals: Totals | None) -> None:
        """After a removal's record: keep the index's totals. A removal never takes the cache
        over its limit, and an index that must be rebuilt waits for the next write."""
        if totals is not None:
            self._known = totals

    def _due(self, totals: Totals | None) -> bool:
        """Whether a maintenance pass is due: the cache is over its limit, or the index is
        missing, damaged or due a rebuild (``Totals.due``)."""
        return totals is None or totals.bytes > self.limit or totals.due(time.time())

    def _maintain_soon(self) -> None:
        """Start the maintenance thread; if it runs, it makes one more pass when done. Not
        for MAINTENANCE_BACKOFF after a pass that failed."""
        with self._lock:
            if self._maintainer is not None and self._maintainer.is_alive():
                self._again = True
                return
            if not self.writable or time.monotonic() < self._quiet_until:
                return
            self._again = False
            self._idle.clear()
            self._maintainer = threading.Thread(
                target=self._maintenance, name="aionvrtc-disk-maintenance", daemon=True
            )
            thread = self._maintainer
        try:
            thread.start()
        except RuntimeError:  # the interpreter is shutting down: a later process will do it
            self._pass_done(ok=True)

    def _maintenance(self) -> None:
        with paced():  # reads in the process's other threads go first (see _fs.paced)
            while self._pass_done(self._maintain_safely()):
                pass

    def _pass_done(self, ok: bool) -> bool:
        """Whether to make another pass (asked for during this one); if not, the thread ends."""
        with self._lock:
            if ok and self._again:
                self._again = False
                return True
            if not ok:
                self._quiet_until = time.monotonic() + MAINTENANCE_BACKOFF
            self._maintainer = None
            self._idle.set()
            return False

    def maintain_here(self) -> bool:
        """One maintenance pass in this process, whatever the dir's size (the child process's
        pass, see _upkeep_pass): whether it left the dir in order."""
        return self._maintain_safely(here=True)

    def _maintain_safely(self, *, here: bool = False) -> bool:
        try:
            return self._maintain(here=here)
        except Exception:  # a bug: told once, never the traceback of a dying thread
            if self._first("maintenance"):
                logger.warning(
                    "maintenance of the disk cache at %s failed; entries are still read and "
                    "written", self.dir, exc_info=True,
                )  # fmt: skip
            return False

    def _maintain(self, *, here: bool = False) -> bool:
        """One pass: nothing if the index is in order and the cache within its limit, else an
        eviction (which rebuilds the index). False if it could not bring the cache within its
        limit or leave an index that parses. From AWAY_ENTRIES on, the pass runs in a child
        process (see _upkeep_child) unless ``here``."""
        try:
            version = self._open(_VERSION)
        except (_Damaged, _RootError):
            return False
        if version is None:
            return True  # removed, or found untrusted: nothing to keep in order
        with closing(version):
            totals = self._index.totals(version)
            if not self._due(totals):
                return True
            if not _flock_now(version):
                return True  # another process (or tier) is at it now
            if not here and totals is not None and totals.entries >= AWAY_ENTRIES:
                unlock(version)  # the child takes it (another process may first: it then waits)
                done = self._maintain_in_child(version)
                if done is not None:
                    return done
                if not self._due(self._index.totals(version)) or not _flock_now(version):
                    return True  # the child did it, or another process is at it
            self._maintaining = version
            try:
                swept = self._evict_in(version)
            finally:
                # Let go before the close: the lock belongs to the open file description,
                # and a child forked during the pass shares it (see _after_fork_in_child).
                self._maintaining = None
                unlock(version)
            # Writes made meanwhile may make another pass due: they ask for it (_again).
            left = _bytes(swept.kept)
            let_go_of(swept.kept)
            return left <= self.limit and self._index.totals(version) is not None

    def _maintain_in_child(self, version: int) -> bool | None:
        """The pass made by a child process; None if it could not be (make it here)."""
        with self._walking:  # an eviction or prune asked for here walks after it, as after ours
            done = maintain_in_child(self.root, self.limit, self.policy.shared)
        if done is None:
            return None
        ok, evicted = done
        totals = self._index.totals(version)
        with self._lock:
            self.evictions += evicted
        if totals is not None:
            self._known = totals
        # Nothing evicted and still over the limit (another process took the lock between
        # ours and the child's): failed, so the next pass waits MAINTENANCE_BACKOFF rather
        # than starting a child at each write.
        over = totals is None or (not evicted and totals.bytes > self.limit)
        return ok and not over

    def _after_fork_in_child(self) -> None:
        """In a forked child, where none of the parent's threads runs: no maintenance runs
        and no walk holds ``_walking``, whatever the parent was doing (else every
        ``wait_maintenance``, eviction, prune and clear here would wait forever). The child's
        copy of a version folder whose maintenance lock the parent holds is closed: the
        parent's pass lets go of the lock, and a parent that dies must not leave it held for
        as long as the child lives."""
        self._lock = threading.Lock()
        self._walking = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        self._maintainer = None
        self._again = False
        version, self._maintaining = self._maintaining, None
        if version is not None:
            with contextlib.suppress(OSError):
                os.close(version)  # never unlocked: the lock is the parent's

    def evict(self) -> int:
        """Remove least recently used entries until the total is under the low-water mark, if
        it is over the limit; now, in this thread. The index is rebuilt from the same walk."""
        version = self._open_version([])
        if version is None:
            return 0
        with closing(version):
            return len(self._evict_in(version).removed)

    def _evict_in(self, version: int) -> _Swept:
        swept = self._sweep(version, [], self._over_limit, event="evicted")
        with self._lock:
            self.evictions += len(swept.removed)
        return swept

    def _over_limit(self, found: list[_Found]) -> list[_Found]:
        total = _bytes(found)
        if total <= self.limit:
            return []
        return _least_recent(found, total, int(self.limit * LOW_WATER), None)

    def prune(self, *, max_bytes: int | None = None, older_than: float | None = None) -> int:
        """Remove entries unused for ``older_than`` seconds, then least recently used ones until
        at most ``max_bytes`` remain. Safe while other processes use the cache: a reader holding
        an entry open keeps its data, and a later request recompiles it."""
        return len(self.prune_report(max_bytes=max_bytes, older_than=older_than).removed)

    def prune_report(
        self, *, max_bytes: int | None = None, older_than: float | None = None
    ) -> Pruned:
        """``prune``, saying what it removed and what it left, from one walk of the shards."""
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        if older_than is not None and older_than < 0:
            raise ValueError(f"older_than must be >= 0 seconds, got {older_than}")
        cutoff = time.time() - older_than if older_than is not None else None

        def choose(found: list[_Found]) -> list[_Found]:
            total = _bytes(found)
            return _least_recent(found, total, max_bytes, cutoff)

        damaged: list[Damage] = []
        version = self._open_version(damaged)
        if version is None:
            return Pruned((), 0, 0, tuple(damaged))
        with closing(version):
            swept = self._sweep(version, damaged, choose, event="pruned")
        return Pruned(
            tuple(self._info(entry) for entry in swept.removed),
            len(swept.kept),
            _bytes(swept.kept),
            tuple(damaged),
        )

    def clear(self) -> int:
        """Remove every entry of this format version; safe while other processes use it."""
        version = self._open_version([])
        if version is None:
            return 0
        with closing(version):
            return len(self._sweep(version, [], lambda found: found, event=None).removed)

    def _sweep(
        self,
        version: int,
        damaged: list[Damage],
        choose: Callable[[list[_Found]], list[_Found]],
        *,
        event: str | None,
    ) -> _Swept:
        """One walk of the shards: the entries ``choose`` picks are removed (with their lock
        files) and logged as ``event``, and the index is rebuilt from what is left unless it
        holds just that already. One at a time in a tier: an eviction the caller asks for
        walks after the background one, not beside it."""
        spent: list[dict[str, Record]] = []  # freed once _walking is let go (see let_go_of)
        with self._walking:
            mark = self._index.start(version) if self.writable else None
            found = self._walk(version, damaged)
            removed = self._remove_found(version, choose(found))
            gone = {entry[0] for entry in removed}
            kept = found
            if gone:
                kept = []
                for step, entry in enumerate(found):
                    breathe(step)
                    if entry[0] not in gone:
                        kept.append(entry)
            index = None
            if mark is not None:
                snapshot = self._index.read(version)
                records, read = self._records(version, kept, snapshot)
                if removed or read or _out_of_date(snapshot, records):
                    index = self._index.install(version, mark, records)
                elif snapshot is not None:
                    index = snapshot.totals  # in order: nothing to rebuild
                spent.append(records)
                if snapshot is not None:
                    spent.append(snapshot.records)
            if index is None and removed and self.writable:  # another rebuild came first
                index = self._index.remove(version, [(entry[0], entry[1]) for entry in removed])
            if index is not None:
                self._known = index
            if removed and event is not None:
                self._log_event(event, len(removed))
        for records in spent:
            let_go_of(records)
        return _Swept(kept, removed, index)

    def _remove_found(self, version: int, victims: list[_Found]) -> list[_Found]:
        """Remove ``victims`` (each only if it is still the file found) and their lock files,
        opening each shard once; those removed."""
        shards: dict[str, list[_Found]] = {}
        for entry in victims:
            shards.setdefault(entry[0][:2], []).append(entry)
        removed: list[_Found] = []
        for shard, name in self._named_shards(version, shards):
            for step, entry in enumerate(shards[name]):
                breathe(step)
                key, _, _, dev, ino = entry
                if remove_at(shard, key, (dev, ino)) is not None:
                    removed.append(entry)
                remove_at(shard, _lock_name(key), None)
        return removed

    def _log_event(self, kind: str, count: int) -> None:
        line = f"{time.time():.3f} {kind} {count}\n".encode()
        try:
            version = self._open(_VERSION, check=False)
            if version is None:
                return
            with closing(version):
                mode = self.policy.lock_mode
                flags = os.O_WRONLY | os.O_APPEND
                fd, _ = self._open_file(version, _EVENTS, "", flags, create=mode)
            with closing(fd):
                os.write(fd, line)
        except (_Damaged, _RootError, OSError):
            return  # a read-only or damaged cache dir: the counters here still count

    def events(self) -> dict[str, int]:
        """Totals of each event kind that any process logged in this cache dir (in the last
        few MiB of its event log)."""
        totals = dict.fromkeys(EVENT_KINDS, 0)
        try:
            version = self._open(_VERSION, check=False)
            if version is None:
                return totals
            with closing(version):
                fd, info = self._open_file(version, _EVENTS, "")
            with closing(fd):
                start = max(0, info.st_size - _EVENTS_TAIL)
                os.lseek(fd, start, os.SEEK_SET)
                lines = read_up_to(fd, _EVENTS_TAIL, info.st_size - start).splitlines()
        except (_Damaged, _RootError, OSError):
            return totals
        for raw in lines[1:] if start else lines:  # the first line of a tail may be cut
            parts = raw.split()
            if len(parts) == 3 and parts[1].decode(errors="replace") in totals:
                with contextlib.suppress(ValueError):
                    totals[parts[1].decode()] += int(parts[2])
        return totals
