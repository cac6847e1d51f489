"""The in-memory tier: a read-through map whose readers never take a lock."""

from __future__ import annotations

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

    Copy-on-write: writers build a new dict under a lock and swap it in; a reader does one dict
    lookup on whatever dict is current and records recency with a plain attribute store, so the
    hot path (every request) never waits for a writer. Writes are rare (one per compile or
    disk hit), so copying the map, which holds at most a few thousand kernels, is cheap.
    """

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"memory_limit must be >= 0 bytes, got {limit}")
        self.limit = limit
        self._entries: dict[str, _Entry] = {}
        self._clock = itertools.count()
        self._lock = threading.Lock()
        self.bytes = 0
        self.evictions = 0

    def get(self, key: str) -> Artifact | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        entry.used = next(self._clock)
        return entry.artifact

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, artifact: Artifact) -> None:
        entry = _Entry(artifact, next(self._clock))
        if entry.size > self.limit:
            return  # it would evict everything and still not fit; the disk tier keeps it
        with self._lock:
            entries = dict(self._entries)
            old = entries.pop(artifact.key, None)
            total = self.bytes - (old.size if old else 0) + entry.size
            if total > self.limit:
                for victim in sorted(entries.values(), key=lambda e: e.used):
                    del entries[victim.artifact.key]
                    total -= victim.size
                    self.evictions += 1
                    if total <= self.limit:
                        break
            entries[artifact.key] = entry
            self._entries = entries
            self.bytes = total

    def discard(self, key: str) -> bool:
        with self._lock:
            if key not in self._entries:
                return False
            entries = dict(self._entries)
            self.bytes -= entries.pop(key).size
            self._entries = entries
            return True

    def clear(self) -> None:
        with self._lock:
            self._entries = {}
            self.bytes = 0
