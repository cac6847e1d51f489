"""The in-memory tier: a read-through map whose readers never take a lock."""

from __future__ import annotations

import heapq
import itertools
import threading

from .._artifact import Artifact

__all__ = ["MemoryTier"]


class _Entry:
    __slots__ = ("artifact", "size", "used")

    def __init__(self, artifact: Artifact, used: int) -> None:
        self.artifact = artifact
        self.size = artifact.size
        self.used = used


class MemoryTier:
    """Artifacts by key, bounded in bytes, least recently used evicted first.

    Readers never take a lock: a read is one dict lookup (atomic in CPython, and internally
    locked per dict in free-threaded builds) and records recency with a plain attribute store
    of a clock tick. Writers (one per compile or disk hit) serialise on a lock among
    themselves. ``entries`` and ``clock`` are never rebound, so hot paths may hold them.

    Eviction takes the least recent entry from a min-heap of (tick, key) pushed at each put,
    without sorting: a heap item whose entry was read since (its tick is older than the
    entry's) is pushed again with the entry's tick instead of evicting it, so each eviction
    costs O(log n) amortised and the order is exactly least recently used.

    The clock doubles as the hit counter, so a hit does no other bookkeeping: every tick is
    taken by a hit, a put or a ``hits()`` call, and the latter two are counted.
    """

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"memory_limit must be >= 0 bytes, got {limit}")
        self.limit = limit
        self.entries: dict[str, _Entry] = {}
        self.clock = itertools.count(1)
        self._ticks_not_hits = 0
        self._lock = threading.Lock()
        self._order: list[tuple[int, str]] = []  # heap of (tick when pushed, key)
        self.bytes = 0
        self.evictions = 0

    def get(self, key: str) -> Artifact | None:
        entry = self.entries.get(key)
        if entry is None:
            return None
        entry.used = next(self.clock)
        return entry.artifact

    def hits(self) -> int:
        """Reads that found their key (through ``get`` or a hot path holding the clock)."""
        with self._lock:
            now = next(self.clock)
            self._ticks_not_hits += 1
            return now - self._ticks_not_hits

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def put(self, artifact: Artifact) -> None:
        if artifact.size > self.limit:
            return  # it would evict everything and still not fit; the disk tier keeps it
        with self._lock:
            entry = _Entry(artifact, next(self.clock))
            self._ticks_not_hits += 1
            entries = self.entries
            old = entries.get(artifact.key)
            self.bytes += entry.size - (old.size if old else 0)
            entries[artifact.key] = entry
            heapq.heappush(self._order, (entry.used, artifact.key))
            if self.bytes > self.limit:
                self._evict(keep=artifact.key)
            if len(self._order) > 2 * len(entries) + 64:
                # Items of replaced or discarded entries: rebuilt, so the heap stays O(entries).
                self._order = [(e.used, k) for k, e in entries.items()]
                heapq.heapify(self._order)

    def _evict(self, keep: str) -> None:
        """Evict least recently used entries (never ``keep``) until within the limit."""
        entries, order = self.entries, self._order
        while self.bytes > self.limit and order:
            tick, key = heapq.heappop(order)
            entry = entries.get(key)
            if entry is None:
                continue  # discarded or evicted since: a leftover item
            if entry.used != tick:
                # An item from before the entry's last use (or of an entry since replaced):
                # its recency moved. The entry being put has its own item already.
                if key != keep:
                    heapq.heappush(order, (entry.used, key))
                continue
            if key == keep:  # the entry being put, the most recent: nothing older is left
                heapq.heappush(order, (tick, key))
                break
            del entries[key]
            self.bytes -= entry.size
            self.evictions += 1

    def discard(self, key: str) -> bool:
        with self._lock:
            entry = self.entries.pop(key, None)
            if entry is None:
                return False
            self.bytes -= entry.size
            return True

    def clear(self) -> None:
        with self._lock:
            self.entries.clear()
            self._order.clear()
            self.bytes = 0
