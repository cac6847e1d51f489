"""The verbs every tier speaks: memory, disk, the read-only layers and the remote tier, all
blocking and safe from any thread (the Compiler calls them from its lanes' worker threads).

What a tier stores is an Artifact, encoded and verified by the tier as it needs (the memory
tier keeps the object, disk and remote its checksummed encoding): a tier never compiles, and a
damaged or missing entry is a miss, never an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .._artifact import Artifact

__all__ = ["LayerStats", "Tier"]


class Tier(Protocol):
    """A store of artifacts by key. ``stats()`` returns the tier's own frozen snapshot, which
    ``CacheStats`` and ``CompilerStats`` hold as they are."""

    def read(self, key: str, *, arch: str | None = None) -> Artifact | None:
        """The verified entry for ``key`` (built for ``arch``, when given), or None."""
        ...

    def write(self, artifact: Artifact) -> bool:
        """Keep ``artifact``; False if this tier cannot (too large, read-only, full)."""
        ...

    def discard(self, key: str) -> bool:
        """Drop ``key``'s entry; whether there was one."""
        ...

    def clear(self) -> object:
        """Drop every entry."""
        ...

    def stats(self) -> object: ...


@dataclass(frozen=True, slots=True)
class LayerStats:
    """A read-only layer's counters since it was opened: a cache dir (``kind`` "dir") or a
    bundle file ("bundle") at ``path``; ``damaged``: entries that failed verification and were
    skipped; ``entries``: what the layer holds."""

    path: str
    kind: str
    hits: int
    misses: int
    damaged: int
    entries: int | None  # None: not known (a cache dir's are not counted)
