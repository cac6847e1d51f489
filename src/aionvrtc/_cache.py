"""KernelCache: the tiers in order (memory, disk, NVRTC) behind one blocking, thread-safe call.

The async Compiler drives the same pieces; this is the form for threads and scripts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from anyio import from_thread

from . import _nvrtc
from ._artifact import Artifact
from ._spec import KernelSpec, record_key
from ._store import DiskTier, MemoryTier
from ._target import TargetLike, as_target

if TYPE_CHECKING:
    from ._store.remote import RedisTier

__all__ = ["DEFAULT_MEMORY_LIMIT", "CacheStats", "KernelCache"]

DEFAULT_MEMORY_LIMIT = 256 << 20  # bytes (256 MiB)

logger = logging.getLogger("aionvrtc")

Origin = Literal["disk", "remote", "compile"]


@dataclass(frozen=True, slots=True)
class CacheStats:
    """A snapshot of a cache's counters since it was created."""

    requests: int
    memory_hits: int
    disk_hits: int
    compiles: int
    compile_errors: int
    compile_seconds: float  # total NVRTC time
    joined: int  # requests that waited for another thread's work on the same key
    corrupt_dropped: int  # disk entries that failed verification and were deleted
    memory_evictions: int
    disk_evictions: int
    write_failures: int
    memory_entries: int
    memory_bytes: int
    disk_writable: bool
    disk_trusted: bool  # False: the cache dir failed the ownership checks and is not used


class KernelCache:
    """Artifacts for one target: memory tier, then disk tier, then NVRTC.

    Thread-safe: threads asking for the same key at once share one compile. The disk tier
    reads only a cache dir that nobody but this user (or root) can write; ``shared_cache=True``
    (default: ``$AIONVRTC_SHARED_CACHE``) trusts one that a group shares instead.
    """

    def __init__(
        self,
        arch: TargetLike | None = None,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        memory_limit: int = DEFAULT_MEMORY_LIMIT,
        disk_limit: int | None = None,
        disk: bool = True,
        shared_cache: bool | None = None,
    ) -> None:
        self.target = as_target(arch)
        self.memory = MemoryTier(memory_limit)
        self.disk: DiskTier | None = (
            DiskTier(cache_dir, limit=disk_limit, shared_cache=shared_cache) if disk else None
        )
        # The Compiler's RedisTier, if any (its calls need the Compiler's event loop).
        self.remote: RedisTier | None = None
        self._lock = threading.Lock()
        self._inflight: dict[str, Future[Artifact]] = {}
        self._requests = 0
        self._joined = 0
        self._compiles = 0
        self._compile_errors = 0
        self._compile_seconds = 0.0

    def key(self, spec: KernelSpec) -> str:
        return spec.key(self.target)

    def get_or_compile(self, spec: KernelSpec) -> Artifact:
        """The artifact for ``spec``: from memory, else disk, else compiled (and stored)."""
        key = spec.key(self.target)
        artifact = self.memory.get(key)
        with self._lock:
            self._requests += 1
            if artifact is not None:
                return artifact
            shared = self._inflight.get(key)
            if shared is None:
                mine: Future[Artifact] = Future()
                self._inflight[key] = mine
            else:
                self._joined += 1
        if shared is not None:
            return shared.result()
        try:
            artifact, _ = self.resolve(spec, key)
        except BaseException as exc:
            mine.set_exception(exc)
            raise
        else:
            mine.set_result(artifact)
            return artifact
        finally:
            with self._lock:
                del self._inflight[key]
            # Nobody else may be waiting: retrieve the exception so it is not logged as lost.
            if mine.done() and not mine.cancelled():
                mine.exception()

    def lookup(self, key: str) -> tuple[Artifact, Origin] | None:
        """Disk, then the remote tier, published to memory; None if neither has ``key``. Never
        compiles and never waits on a lock: the Compiler's I/O lane, which serves a hit while
        compiles run. Blocking; with a remote tier, from a worker thread of its event loop."""
        cached = self._from_disk(key)
        if cached is not None:
            return cached, "disk"
        if self.remote is not None:
            cached = from_thread.run(self.remote.fetch, key, self.target.arch)
            if cached is not None:
                return self._keep(cached), "remote"
        return None

    def resolve(
        self, spec: KernelSpec, key: str, *, looked_up: bool = False
    ) -> tuple[Artifact, Origin]:
        """Disk, then the remote tier (``lookup``, unless ``looked_up`` says a lookup just
        missed), then NVRTC (writing the result to disk and remote); publishes to memory.
        Blocking; with a remote tier, it must run in a worker thread of the event loop that
        owns the tier (the Compiler's).

        The compile runs under the key's file lock with the disk checked again inside it, so
        processes cold on the same kernel compile it once and the others read it from disk;
        across hosts, the remote tier's lock does the same.
        """
        disk, remote, arch = self.disk, self.remote, self.target.arch
        found = None if looked_up else self.lookup(key)
        if found is not None:
            return found
        with disk.lock(key) if disk is not None else contextlib.nullcontext(False):
            cached = self._from_disk(key)  # written while we waited?
            if cached is not None:
                return cached, "disk"
            token = None
            if remote is not None:
                token, cached = from_thread.run(remote.claim, key, arch)
                if cached is not None:  # another host compiled it while this one waited
                    return self._keep(cached), "remote"
            try:
                artifact = self._compile(spec, key)
                if disk is not None:
                    disk.write(artifact)
                if remote is not None:
                    from_thread.run(remote.store, artifact)
            finally:
                if token is not None:
                    assert remote is not None
                    from_thread.run(remote.release, key, token)
        self.memory.put(artifact)
        return artifact, "compile"

    def _from_disk(self, key: str) -> Artifact | None:
        """The disk's verified entry for ``key``, published to memory, or None."""
        cached = self.disk.read(key, arch=self.target.arch) if self.disk is not None else None
        if cached is not None:
            self.memory.put(cached)
        return cached

    def _keep(self, artifact: Artifact) -> Artifact:
        """A remote hit: written to the local disk and memory."""
        if self.disk is not None:
            self.disk.write(artifact)
        self.memory.put(artifact)
        return artifact

    def _compile(self, spec: KernelSpec, key: str) -> Artifact:
        logger.debug("compiling %s (%s) for %s", spec.name, key[:16], self.target.arch)
        try:
            result = _nvrtc.compile_program(spec, self.target)
        except BaseException as exc:
            with self._lock:
                self._compile_errors += 1
            first_line = f"{exc}".split("\n")[0]
            logger.info("compile of %s (%s) failed: %s", spec.name, key[:16], first_line)
            raise
        with self._lock:
            self._compiles += 1
            self._compile_seconds += result.seconds
        logger.info(
            "compiled %s (%s) for %s in %.3f s",
            spec.name,
            key[:16],
            self.target.arch,
            result.seconds,
        )
        return Artifact(
            key=key,
            kind=result.kind,
            image=result.image,
            arch=self.target.arch,
            nvrtc_version=_nvrtc.version_string(),
            lowered_names=result.lowered_names,
            compile_seconds=result.seconds,
            log=result.log,
        )

    def record(self, name: str) -> bytes | None:
        """The data last stored under ``name`` for this target (see put_record), or None.
        Records live on disk only: a cache without one keeps none."""
        if self.disk is None:
            return None
        artifact = self.disk.read(record_key(name, self.target), arch=self.target.arch)
        return artifact.image if artifact is not None and artifact.kind == "data" else None

    def put_record(self, name: str, data: bytes) -> bool:
        """Keep ``data`` under ``name`` beside the kernels (written atomically, verified on
        read, evicted with them). False if there is no disk or it cannot take it."""
        if self.disk is None:
            return False
        artifact = Artifact(
            key=record_key(name, self.target),
            kind="data",
            image=bytes(data),
            arch=self.target.arch,
            nvrtc_version=_nvrtc.version_string(),
        )
        return self.disk.write(artifact)

    def forget(self, spec: KernelSpec) -> None:
        """Drop ``spec``'s entry from memory and disk, so the next request compiles it (and
        reads its include directories' files anew)."""
        key = spec.key(self.target)
        self.memory.discard(key)
        if self.disk is not None:
            self.disk.discard(key)
        spec._reread_host_files()

    def clear(self) -> None:
        """Empty the memory tier and this format version's disk entries."""
        self.memory.clear()
        if self.disk is not None:
            self.disk.clear()

    def stats(self) -> CacheStats:
        disk = self.disk
        with self._lock:
            return CacheStats(
                requests=self._requests,
                memory_hits=self.memory.hits(),
                disk_hits=disk.hits if disk else 0,
                compiles=self._compiles,
                compile_errors=self._compile_errors,
                compile_seconds=self._compile_seconds,
                joined=self._joined,
                corrupt_dropped=disk.corrupt if disk else 0,
                memory_evictions=self.memory.evictions,
                disk_evictions=disk.evictions if disk else 0,
                write_failures=disk.write_failures if disk else 0,
                memory_entries=len(self.memory),
                memory_bytes=self.memory.bytes,
                disk_writable=disk.writable if disk else False,
                disk_trusted=disk.trusted if disk else False,
            )
