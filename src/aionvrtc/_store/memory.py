"""The in-memory tier: a read-through map whose readers never take a lock."""

from __future__ import annotations

import itertools
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass

from .._artifact import Artifact

__all__ = ["MemoryStats", "MemoryTier"]


@dataclass(frozen=True, slots=True)
class MemoryStats:
    """A snapshot of the memory tier."""

    hits: int
    entries: int
    bytes: int
    evictions: int
    archs: dict[str, int]  # entries by the arch they were compiled for


class MemoryTier:
    """Artifacts by key, bounded in bytes, least recently used evicted first; every operation
    is O(1).

    ``entries`` is kept in recency order, least recent first: a read moves its key to the end
    (``touch``, one C call, atomic under the GIL) and takes no lock, and an insert at the limit
    evicts from the front. Writers serialise on a lock among themselves. A read that races an
    eviction of its key finds it gone (KeyError) and is a miss. ``entries``, ``touch`` and
    ``clock`` are never rebound, so hot paths may hold them.

    The clock is the hit counter, so a hit does no other bookkeeping: every tick is taken by a
    hit or a ``hits()`` call, and the latter are counted.
    """

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"memory_limit must be >= 0 bytes, got {limit}")
        self.limit = limit
        self.entries: OrderedDict[str, Artifact] = OrderedDict()
        self.touch = self.entries.move_to_end
        self.clock = itertools.count(1)
        self._sizes: dict[str, int] = {}  # what each entry is charged (Artifact.size, once)
        self._archs: Counter[str] = Counter()  # entries by arch
        self._not_hits = 0
        self._lock = threading.Lock()
        self.bytes = 0
        self.evictions = 0

    def read(self, key: str, *, arch: str | None = None) -> Artifact | None:
        try:
            artifact = self.entries[key]
            self.touch(key)
        except KeyError:
            return None
        next(self.clock)
        return artifact

    def hits(self) -> int:
        """Reads that found their key (through ``read`` or a hot path holding the clock)."""
        with self._lock:
            self._not_hits += 1
            return next(self.clock) - self._not_hits

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def write(self, artifact: Artifact) -> bool:
        size = artifact.size
        if size > self.limit:
            return False  # it would evict everything and still not fit; disk keeps it
        key = artifact.key
        with self._lock:
            entries, sizes, archs = self.entries, self._sizes, self._archs
            self.bytes += size - sizes.get(key, 0)
            sizes[key] = size
            replaced = entries.get(key)
            if replaced is not None:
                archs[replaced.arch] -= 1
            archs[artifact.arch] += 1
            entries[key] = artifact
            entries.move_to_end(key)
            while self.bytes > self.limit:
                # One call, atomic against readers' touches. The least recent goes, and ``key``
                # last of all (it fits alone, so the loop ends before that).
                oldest, evicted = entries.popitem(last=False)
                self.bytes -= sizes.pop(oldest)
                archs[evicted.arch] -= 1
                self.evictions += 1
        return True

    def discard(self, key: str) -> bool:
        with self._lock:
            dropped = self.entries.pop(key, None)
            if dropped is None:
                return False
            self.bytes -= self._sizes.pop(key)
            self._archs[dropped.arch] -= 1
            return True

    def clear(self) -> None:
        with self._lock:
            self.entries.clear()
            self._sizes.clear()
            self._archs.clear()
            self.bytes = 0

    def stats(self) -> MemoryStats:
        with self._lock:
            entries, size = len(self.entries), self.bytes
            archs = {arch: count for arch, count in sorted(self._archs.items()) if count}
        return MemoryStats(self.hits(), entries, size, self.evictions, archs)
