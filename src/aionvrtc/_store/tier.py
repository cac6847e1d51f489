"""The verbs every tier speaks (``Tier``), and the one lock protocol of those that make other
processes or hosts compile a key once (``Locking``): all blocking and safe from any thread (the
Compiler calls them from its lanes' worker threads).

``KernelCache.tiers`` lists the tiers behind memory in the order they are read: the disk, the
read-only layers, the remote tier. The memory tier speaks ``read``/``write``/``stats`` too, but
stands in front of the list: the hot path reads it inline, and every hit below is published to
it. What a tier stores is an Artifact, encoded and verified by the tier as it needs (memory
keeps the object, the others its checksummed encoding): a tier never compiles, and a damaged
or missing entry is a miss, never an error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from .._artifact import Artifact

__all__ = ["Hold", "LayerStats", "Locking", "Origin", "Tier", "nothing_to_let_go"]

# Where an artifact came from: a tier's ``origin``, or NVRTC.
Origin = Literal["disk", "layer", "remote", "compile"]


class Tier(Protocol):
    """A store of artifacts by key. ``stats()`` returns the tier's own frozen snapshot, which
    ``CacheStats`` and ``CompilerStats`` hold as they are.

    ``origin`` is what a hit from the tier is reported as. A ``local`` tier is on this host
    (disk, layers): local tiers are read before any network round trip, and a hit from a tier
    that is not local is kept on the local disk.
    """

    origin: Origin
    local: bool

    def read(self, key: str, *, arch: str | None = None) -> Artifact | None:
        """The verified entry for ``key`` (built for ``arch``, when given), or None."""
        ...

    def write(self, artifact: Artifact) -> bool:
        """Keep ``artifact``; False if this tier cannot (too large, read-only, full)."""
        ...

    def stats(self) -> object: ...


def nothing_to_let_go() -> None:
    """The release of a Hold that holds no lock."""


@dataclass(slots=True, kw_only=True)
class Hold:
    """A tier's answer to a request for the compile lock on one key: ``release()`` lets go of
    what it holds (``held``: the lock; else nothing, and the caller goes on without it);
    ``found`` is what the tier held for the key once the lock was taken (another process's or
    host's compile, stored while this one waited: the lock is then already let go). ``local``:
    let go without a round trip (a file lock), so it may be let go from an event loop."""

    local: bool  # said by every tier: a round trip on an event loop would stall it
    release: Callable[[], None] = nothing_to_let_go
    found: Artifact | None = None
    held: bool = False


@runtime_checkable
class Locking(Tier, Protocol):
    """A tier whose lock on a key makes the processes or hosts that share it compile the key
    once (the disk's file lock, the remote tier's fleet lock)."""

    def hold(
        self, key: str, arch: str, *, wait: bool, cancel: threading.Event | None = None
    ) -> Hold | None:
        """Take ``key``'s lock, and read the key again if another may have stored it meanwhile
        (``found``). None, with ``wait=False``, while another holds it now. A lock that cannot
        be had (the tier cannot lock, a wait timed out or was cancelled) is a Hold that holds
        nothing: the caller goes on without it, a duplicate compile at worst, never a failed
        request."""
        ...


@dataclass(frozen=True, slots=True)
class LayerStats:
    """A read-only layer's counters since it was opened.

    Attributes:
        path: The layer's path.
        kind: ``"dir"`` for a cache dir, ``"bundle"`` for a bundle file.
        hits: Lookups that served an entry from it.
        misses: Lookups that found no entry there.
        damaged: Entries that failed verification and were skipped (compiled instead).
        entries: The entries the layer holds; None: not known (a cache dir's are not
            counted).
    """

    path: str
    kind: str
    hits: int
    misses: int
    damaged: int
    entries: int | None
