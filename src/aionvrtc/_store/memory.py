"""The in-memory tier: a read-through map whose readers never take a lock."""

from __future__ import annotations

import itertools
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass

from .._artifact import Artifact

__all__ = ["Entry", "MemoryStats", "MemoryTier"]


@dataclass(frozen=True, slots=True)
class MemoryStats:
    """A snapshot of the memory tier.

    Attributes:
        hits: Reads that found their key: the requests served from memory, ``Compiler.get``'s
            loaded modules included.
        entries: The artifacts held now.
        bytes: The bytes they are charged now (``Artifact.size`` each).
        evictions: Artifacts evicted to stay within the memory limit.
        archs: The entries by the arch they were compiled for (archs with none left out).
    """

    hits: int
    entries: int
    bytes: int
    evictions: int
    archs: dict[str, int]


class Entry:
    """An artifact in the memory tier. ``used`` is the clock tick of its last hit since it was
    placed at the back of the ring, 0 if none: a hit stores a tick there, and that one store
    is its hit count and its recency."""

    __slots__ = ("artifact", "used")

    def __init__(self, artifact: Artifact) -> None:
        self.artifact = artifact
        self.used = 0


class MemoryTier:
    """Artifacts by key, bounded in bytes, evicted by second chance (CLOCK, the page caches'
    approximation of least recently used); every operation is O(1), an eviction amortised.

    ``entries`` is a ring in the order entries were placed, oldest first. A read stores the
    clock's next tick in its entry's ``used`` and takes no lock. An insert at the limit takes
    entries from the front: one hit since it was placed goes to the back with ``used`` reset
    (its second chance), one not hit is evicted. So an entry read since the ring last came
    round is kept over one that was not, as least recently used would keep it, at the cost of
    one attribute store per hit (a reordering of the ring per hit cost hot paths a fifth more).
    Writers serialise on a lock among themselves. ``entries`` and ``clock`` are never rebound,
    so hot paths may hold them.

    The clock is the hit counter, so a hit does no other bookkeeping: every tick is taken by a
    hit or a ``hits()`` call, and the latter are counted.
    """

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"memory_limit must be >= 0 bytes, got {limit}")
        self.limit = limit
        self.entries: OrderedDict[str, Entry] = OrderedDict()
        self.clock = itertools.count(1)
        self._sizes: dict[str, int] = {}  # what each entry is charged (Artifact.size, once)
        self._archs: Counter[str] = Counter()  # entries by arch
        self._not_hits = 0
        self._lock = threading.Lock()
        self.bytes = 0
        self.evictions = 0

    def read(self, key: str, *, arch: str | None = None) -> Artifact | None:
        entry = self.entries.get(key)
        if entry is None:
            return None
        entry.used = next(self.clock)
        return entry.artifact

    def hits(self) -> int:
        """Reads that found their key (through ``read`` or a hot path holding the clock)."""
        with self._lock:
            self._not_hits += 1
            return next(self.clock) - self._not_hits

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def artifacts(self) -> list[Artifact]:
        """The artifacts held now, oldest placed first (a copy: writers may go on)."""
        with self._lock:
            return [entry.artifact for entry in self.entries.values()]

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
                archs[replaced.artifact.arch] -= 1
            archs[artifact.arch] += 1
            # Each change below is one call, atomic against readers, and a key that stays is
            # never out of the map, not even for an instant (a reader would take it for a miss).
            entries[key] = Entry(artifact)
            entries.move_to_end(key)
            while self.bytes > self.limit:
                # ``key`` itself never goes: it fits alone, so the loop ends before only it is
                # left.
                oldest = next(iter(entries))
                entry = entries[oldest]
                if entry.used or oldest == key:
                    entry.used = 0  # a second chance: placed again at the back
                    entries.move_to_end(oldest)
                    continue
                del entries[oldest]
                self.bytes -= sizes.pop(oldest)
                archs[entry.artifact.arch] -= 1
                self.evictions += 1
        return True

    def discard(self, key: str) -> bool:
        with self._lock:
            dropped = self.entries.pop(key, None)
            if dropped is None:
                return False
            self.bytes -= self._sizes.pop(key)
            self._archs[dropped.artifact.arch] -= 1
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
