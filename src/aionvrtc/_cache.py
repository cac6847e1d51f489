"""KernelCache: the tiers in order (memory, disk, NVRTC) behind one blocking, thread-safe call.

The async Compiler drives the same pieces; this is the form for threads and scripts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import _nvrtc
from ._artifact import Artifact
from ._exceptions import NoDeviceError
from ._spec import KernelSpec, derive_key, key_parts, memo_id, part_items, record_key
from ._store import DiskStats, DiskTier, MemoryTier
from ._store.layers import open_layers
from ._store.memory import MemoryStats
from ._store.tier import Hold, LayerStats, Locking, Origin, Tier
from ._target import Target, TargetLike, as_target, resolve_target

if TYPE_CHECKING:
    from ._store.remote import RedisTier

__all__ = [
    "DEFAULT_MEMORY_LIMIT",
    "ArchStats",
    "CacheStats",
    "KernelCache",
    "kernel_key",
]

DEFAULT_MEMORY_LIMIT = 256 << 20  # bytes (256 MiB)

logger = logging.getLogger("aionvrtc")
# A debug line per lookup that missed every tier (what each part of its key held).
misses = logging.getLogger("aionvrtc.misses")

_AIMING = threading.Lock()  # see KernelCache.for_arch


@dataclass(slots=True)
class Claim:
    """The locks that compiling one key takes, as far as they are taken (see KernelCache.claim):
    ``holds``, one per locking tier in order (this host's file lock, then the fleet's), of the
    ``needed``; ``found`` is the entry another process or host stored meanwhile, if any."""

    key: str
    needed: int
    holds: list[Hold] = field(default_factory=list)
    found: tuple[Artifact, Origin] | None = None

    @property
    def ready(self) -> bool:
        return self.found is None and len(self.holds) == self.needed

    def release(self, *, local_only: bool = False) -> None:
        """Let go of the locks held, the last taken first (the fleet's, then this host's);
        idempotent. ``local_only``: only those let go without a round trip (from an event
        loop); the others stay held, for a later ``release()`` (or their expiry)."""
        holds = self.holds
        self.holds = [hold for hold in holds if local_only and not hold.local]
        # An ExitStack calls them last first, and every one of them even when one raises.
        with contextlib.ExitStack() as releases:
            for hold in holds:
                if hold.local or not local_only:
                    releases.callback(hold.release)


def kernel_key(spec: KernelSpec, arch: TargetLike | None = None) -> str:
    """The cache key (hex SHA-256) of ``spec`` compiled for ``arch`` by the NVRTC build in use:
    what the tiers store its image under.

    Derived once per spec and target, and remembered on the spec (equal specs are one object,
    see KernelSpec). The files of the include directories are digested at the spec's first key
    and that snapshot is kept for all its keys: a change to them is noticed by the next
    KernelSpec (or process), and a compile refuses to store an image of files that no longer
    match the snapshot.

    Args:
        spec: The program.
        arch: The target (``"sm_90"`` or a ``Target``); default, as for ``resolve_target``:
            ``$AIONVRTC_ARCH``, else the current GPU's.

    Returns:
        The key: 64 lowercase hex digits.

    Raises:
        TypeError: ``arch`` is neither a str nor a ``Target``.
        ValueError: ``arch`` or ``$AIONVRTC_ARCH`` is not an arch such as ``"sm_90"``, or the
            spec's include directories cannot be covered by its key (one past the size bounds,
            or an include that reaches a file outside every include directory).
        NoDeviceError: ``arch`` is None, ``$AIONVRTC_ARCH`` is unset and no GPU is usable.
        NvrtcError: CuPy or NVRTC cannot be used (the key names the exact NVRTC build), or
            this NVRTC cannot compile for ``arch`` (the message names the archs it supports),
            as a Compiler or KernelCache for it says: no entry is ever stored under such a key.
    """
    target = resolve_target(arch)
    _nvrtc.check_target(target)
    build = _nvrtc.build()
    return keyed(spec, target, build, memo_id(target.arch, build))


def keyed(spec: KernelSpec, target: Target, build: str, memo: str) -> str:
    """``spec``'s key under ``memo`` (``memo_id(target.arch, build)``), derived if new."""
    try:
        return spec._keys[memo]
    except KeyError:
        key = spec._keys[memo] = derive_key(spec, target.arch, build)
        return key


@dataclass(frozen=True, slots=True)
class ArchStats:
    """One target's share of a cache: the memory tier's entries for it, and its compiles.

    Attributes:
        entries: The memory tier's entries for this target, now.
        compiles: Successful NVRTC compiles for it.
        compile_errors: Compiles for it that failed.
        compile_seconds: Total NVRTC time of its successful compiles, in seconds.
    """

    entries: int
    compiles: int
    compile_errors: int
    compile_seconds: float


@dataclass(frozen=True, slots=True)
class CacheStats:
    """A snapshot of a cache's counters since it was created (every target's together), with
    each tier's own and each target's share.

    Attributes:
        requests: Memory hits and the requests memory did not serve, each counted once.
        joined: Requests that waited for another thread's work on the same key.
        compiles: Successful NVRTC compiles.
        compile_errors: Compiles that failed.
        compile_seconds: Total NVRTC time of the successful compiles, in seconds.
        memory: The memory tier's ``MemoryStats``.
        disk: The disk tier's ``DiskStats``; all zero (not writable, not trusted) for a cache
            without a disk tier.
        archs: Each target's share, ``ArchStats`` by arch such as ``"sm_90"``.
        layers: The read-only layers' ``LayerStats``, in the order they are read.
    """

    requests: int
    joined: int
    compiles: int
    compile_errors: int
    compile_seconds: float
    memory: MemoryStats
    disk: DiskStats
    archs: dict[str, ArchStats]
    layers: tuple[LayerStats, ...]


class _Count:
    """A count that every view of a cache shares, safe from any thread."""

    __slots__ = ("_lock", "value")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0

    def add(self) -> None:
        with self._lock:
            self.value += 1


class KernelCache:
    """Artifacts for one target: memory tier, then disk tier, then the read-only ``layers``,
    then the remote tier, then NVRTC.

    Blocking and thread-safe: threads asking for the same key at once share one compile.
    ``for_arch(arch)`` is the same cache for another target (one cache serves several GPUs).
    Unlike a ``Compiler`` it remembers no failure: each request for a spec that NVRTC
    rejected compiles it again.

    Args:
        arch: The target (``"sm_90"`` or a ``Target``); default: ``$AIONVRTC_ARCH``, else the
            current GPU's (``resolve_target``).
        cache_dir: The disk tier's folder; default: ``$AIONVRTC_CACHE_DIR``, else the user
            cache dir (``default_cache_dir``).
        memory_limit: Bytes the memory tier holds (default 256 MiB); past it, entries not hit
            lately are evicted.
        disk_limit: Bytes the disk tier holds; default: ``$AIONVRTC_DISK_LIMIT``, else 1 GiB.
            Past it, the least recently used entries are evicted in the background.
        disk: False for no disk tier: kernels are kept in memory only, and records
            (``put_record``) are not kept.
        shared_cache: True trusts a cache dir that a group shares (and makes new folders and
            files group-writable); default: ``$AIONVRTC_SHARED_CACHE``, else False: the disk
            tier reads only a cache dir that nobody but this user (or root) can write.
        remote: A ``RedisTier`` that a fleet of hosts shares, read after the layers and written
            after each compile; default: none (the environment is not read here, as a
            ``Compiler`` reads it).
        layers: Cache dirs and bundle files that are read and never written; default:
            ``$AIONVRTC_CACHE_LAYERS`` (paths separated by ``os.pathsep``). One that cannot be
            opened, or that others could change, is left out with a warning.
        target_required: False (the Compiler's: ``compile(arch=...)`` needs no GPU) lets a
            cache without a GPU and with no arch named have no target of its own:
            ``no_target`` is then the NoDeviceError that saying none raised, and only
            ``for_arch`` views serve (the cache itself has no ``target``).

    Raises:
        NoDeviceError: No arch is named, ``$AIONVRTC_ARCH`` is unset and no GPU is usable
            (unless ``target_required=False``).
        NvrtcError: CuPy or NVRTC cannot be used, or this NVRTC cannot compile for the target
            (the message names the archs it supports).
        ValueError: ``arch`` or ``$AIONVRTC_ARCH`` is not an arch such as ``"sm_90"``;
            ``memory_limit`` or ``disk_limit`` is negative; or ``$AIONVRTC_DISK_LIMIT`` or
            ``$AIONVRTC_SHARED_CACHE`` is malformed (the message names the variable).
        TypeError: ``arch`` is neither a str nor a ``Target``, or ``layers`` is one path
            rather than a list of them.
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
        remote: RedisTier | None = None,
        layers: Iterable[str | os.PathLike[str]] | None = None,
        target_required: bool = True,
    ) -> None:
        target: Target | None = None
        self.no_target: NoDeviceError | None = None
        try:
            target = resolve_target(arch)
        except NoDeviceError as exc:
            if target_required:
                raise
            self.no_target = exc
        self.memory = MemoryTier(memory_limit)
        self.disk: DiskTier | None = (
            DiskTier(cache_dir, limit=disk_limit, shared_cache=shared_cache) if disk else None
        )
        # Read-only cache dirs and bundles, read after the disk, before the remote tier.
        self.layers = open_layers(
            layers, shared_cache=shared_cache, secret=remote.secret if remote is not None else None
        )
        # Keys dropped (forget, a refused image) that the layers or the remote tier may still
        # hold: from now on they are compiled, as dropping them promised, not served from there.
        self._shadowed: set[str] = set()
        # Requests that memory did not serve, get_or_compile's and a Compiler's (``missed``),
        # every target's: requests are the memory tier's hits and these, counted once each.
        self._misses = _Count()
        # The fleet's tier: blocking, as the others, and safe from any thread.
        self.remote = remote
        # The tiers behind memory, in the order they are read: the local ones (the disk, then
        # the layers), then the fleet's. A compile takes the lock of each that has one, in the
        # same order (this host's processes, then the fleet's hosts).
        self.tiers: tuple[Tier, ...] = (
            *((self.disk,) if self.disk is not None else ()),
            *self.layers,
            *((remote,) if remote is not None else ()),
        )
        self._locking = tuple(tier for tier in self.tiers if isinstance(tier, Locking))
        self._build = _nvrtc.build()
        # This cache for each target it serves, this one included (shared by them all).
        self._views: dict[str, KernelCache] = {}
        if target is not None:
            self._aim(target)

    def _aim(self, target: Target) -> None:
        """Make this the cache's view for ``target``: its keys, its locks and counters.
        NvrtcError, naming the archs NVRTC supports and the extra that has ``target``, when
        this NVRTC cannot compile for it: said when the cache or view is made, not by a
        compile."""
        _nvrtc.check_target(target)
        self.target = target
        # The memo key under which specs keep their key for this target and NVRTC build.
        self.memo = memo_id(target.arch, self._build)
        self._lock = threading.Lock()
        self._inflight: dict[str, Future[Artifact]] = {}
        self._joined = 0
        self._compiles = 0
        self._compile_errors = 0
        self._compile_seconds = 0.0
        self._views[target.arch] = self

    def for_arch(self, arch: TargetLike) -> KernelCache:
        """This cache (the same tiers, entries and stats) for target ``arch``: what a Compiler
        uses for each GPU it serves.

        Args:
            arch: The target (``"sm_90"`` or a ``Target``).

        Returns:
            The cache's view for ``arch``: the same object for the same arch, this one for its
            own.

        Raises:
            TypeError: ``arch`` is neither a str nor a ``Target``.
            ValueError: ``arch`` is not an arch such as ``"sm_90"``.
            NvrtcError: This NVRTC cannot compile for ``arch`` (the message names the archs it
                supports).
        """
        target = as_target(arch)
        view = self._views.get(target.arch)
        if view is None:
            fresh = object.__new__(KernelCache)
            fresh.__dict__.update(self.__dict__)  # the tiers, and the shared _views
            with _AIMING:  # two threads aiming at one arch at once keep one view
                view = self._views.get(target.arch)
                if view is None:
                    view = fresh
                    view._aim(target)
        return view

    def key(self, spec: KernelSpec) -> str:
        """``spec``'s cache key for this cache's target (see ``kernel_key``).

        Blocking the first time for a spec with include directories, whose files it digests.

        Args:
            spec: The program.

        Returns:
            The key: 64 lowercase hex digits.

        Raises:
            ValueError: The spec's include directories cannot be covered by its key (one past
                the size bounds, or an include that reaches a file outside every include
                directory).
        """
        return keyed(spec, self.target, self._build, self.memo)

    def known_key(self, spec: KernelSpec) -> str | None:
        """``spec``'s key for this cache's target if it was derived already, else None (never
        derives: for callers that must not read include directories' files here). The hot
        paths of the Compiler read the same memo, ``spec._keys[memo]``, inline.

        Args:
            spec: The program.

        Returns:
            The key, or None if it was not derived yet (``key`` derives it).

        Raises:
            Nothing: it reads what was derived before, and no file.
        """
        return spec._keys.get(self.memo)

    def get_or_compile(self, spec: KernelSpec) -> Artifact:
        """The artifact for ``spec``: from memory, else disk, else compiled (and stored).

        The layers and the remote tier are read after the disk, before NVRTC. Blocking;
        threads asking for the same key at once share one compile, and its error.

        Args:
            spec: The program to compile.

        Returns:
            The ``Artifact``: the image (a cubin, or PTX for a GPU newer than this NVRTC), its
            lowered names and NVRTC's log.

        Raises:
            ValueError: The spec's include directories cannot be covered by its key (see
                ``key``).
            CompileError: NVRTC rejected the program; its log is in ``log`` and the message.
            NvrtcError: The temporary folder cannot be used safely (``TMPDIR``), or the files
                of the spec's include directories changed since its key was derived.
        """
        key = self.key(spec)
        artifact = self.memory.read(key)
        if artifact is not None:
            return artifact
        self._misses.add()
        with self._lock:
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

    def lookup(
        self, key: str, *, local: bool = True, remote: bool = True
    ) -> tuple[Artifact, Origin] | None:
        """The tiers in order (the ``local`` ones: disk and layers; then the ``remote`` ones,
        unless turned off here), the first hit published to memory; None if none has ``key``.
        Never compiles and never waits on a lock: the Compiler's I/O lane, which serves a hit
        while compiles run. Blocking.

        A remote hit is kept on the local disk too. Memory is not read here: ``get_or_compile``
        reads it first.

        Args:
            key: The cache key (``key(spec)``).
            local: False skips the local tiers (disk and layers).
            remote: False skips the remote tier.

        Returns:
            The artifact and the tier it came from (``"disk"``, ``"layer"`` or ``"remote"``),
            or None.

        Raises:
            ValueError: ``key`` is not a cache key (64 lowercase hex digits) and the disk tier
                or a cache-dir layer reads it.
        """
        arch = self.target.arch
        for tier in self.tiers:
            if (local if tier.local else remote) and self._serves(tier, key):
                cached = tier.read(key, arch=arch)
                if cached is not None:
                    return self._publish(tier, cached), tier.origin
        return None

    def _serves(self, tier: Tier, key: str) -> bool:
        """Whether ``tier`` may serve ``key``: not one this cache dropped (``drop``), unless it
        is the disk, from which the drop removed it."""
        return tier is self.disk or key not in self._shadowed

    def _publish(self, tier: Tier, artifact: Artifact) -> Artifact:
        """A hit from ``tier`` put in memory, and kept on the local disk when it came from
        another host (a layer's is served in place)."""
        if not tier.local and self.disk is not None:
            self.disk.write(artifact)
        self.memory.write(artifact)
        return artifact

    def resolve(self, spec: KernelSpec, key: str) -> tuple[Artifact, Origin]:
        """The tiers (``lookup``), then NVRTC (writing the result to disk and remote);
        publishes to memory. Blocking.

        The compile runs under the locking tiers' locks with each checked again once its lock
        is taken, so processes cold on the same kernel compile it once and the others read it
        from disk; across hosts, the remote tier's lock does the same.

        Args:
            spec: The program.
            key: Its key for this cache's target (``key(spec)``).

        Returns:
            The artifact and where it came from: ``"disk"``, ``"layer"``, ``"remote"`` or
            ``"compile"``.

        Raises:
            ValueError: ``key`` is not a cache key (64 lowercase hex digits), with a disk tier
                or a cache-dir layer.
            CompileError: NVRTC rejected the program.
            NvrtcError: The temporary folder cannot be used safely (``TMPDIR``), or the files
                of the spec's include directories changed since its key was derived.
        """
        found = self.lookup(key)
        if found is not None:
            return found
        claim = self.claim(key)
        if claim.found is not None:
            return claim.found
        return self.build(spec, claim), "compile"

    def try_resolve(
        self, spec: KernelSpec, key: str, claim: Claim | None = None
    ) -> tuple[Artifact, Origin] | Claim:
        """The Compiler's compile lane, after a lookup missed: the key's locks taken without
        waiting (or those ``claim`` holds), as ``claim`` takes them, then NVRTC. Returns the
        claim instead when another process or host holds a lock now: wait for it with
        ``claim(..., claim=that)``, which holds no compile slot, then call this again.

        Args:
            spec: The program.
            key: Its key for this cache's target (``key(spec)``).
            claim: The claim an earlier call returned, once waited for; default: none yet.

        Returns:
            The artifact and where it came from (``"compile"``, or the tier another process or
            host stored it in meanwhile), or the unready claim to wait for.

        Raises:
            ValueError: ``key`` is not a cache key (64 lowercase hex digits), with a disk tier.
            CompileError: NVRTC rejected the program.
            NvrtcError: The temporary folder cannot be used safely (``TMPDIR``), or the files
                of the spec's include directories changed since its key was derived.
        """
        if claim is None or not claim.ready:
            claim = self.claim(key, wait=False, claim=claim)
            if claim.found is not None:
                return claim.found
            if not claim.ready:
                return claim
        return self.build(spec, claim), "compile"

    def claim(
        self,
        key: str,
        *,
        wait: bool = True,
        cancel: threading.Event | None = None,
        claim: Claim | None = None,
    ) -> Claim:
        """Take the locks for compiling ``key`` (or go on taking those ``claim`` lacks): each
        locking tier's in order (this host's file lock, then the fleet's), the tier read again
        under its lock where another may have stored the key meanwhile. The claim comes back
        ``found`` when another process or host stored the key meanwhile (kept on this host's
        disk, its locks let go), ``ready`` to compile, or, with ``wait=False``, neither:
        another holds a lock now, and ``claim(..., wait=True, claim=that)`` waits for it (the
        Compiler waits outside its compile lane). Blocking. A lock that cannot be had (no file
        locks on this file system, a wait that timed out) is skipped: a duplicate compile at
        worst, never a failure.

        Args:
            key: The cache key to compile (``key(spec)``).
            wait: False takes only the locks that are free now.
            cancel: Set, it ends a wait for a lock early (going on without it).
            claim: A claim returned unready, whose missing locks to take; default: a new one.

        Returns:
            The claim: ``found``, ``ready``, or (only with ``wait=False``) neither. Pass a
            ready one to ``build`` (or ``try_resolve``), which lets go of its locks.

        Raises:
            ValueError: ``key`` is not a cache key (64 lowercase hex digits), with a disk tier.
        """
        claim = claim if claim is not None else Claim(key, len(self._locking))
        arch = self.target.arch
        try:
            for tier in self._locking[len(claim.holds) :]:
                hold = tier.hold(key, arch, wait=wait, cancel=cancel)
                if hold is None:
                    return claim  # another process or host compiles it now (our locks kept)
                claim.holds.append(hold)
                if hold.found is not None and self._serves(tier, key):
                    # Kept on the disk before this host's lock is let go: a process waiting
                    # for it then finds the entry there, and does not compile it again.
                    claim.found = (self._publish(tier, hold.found), tier.origin)
                    claim.release()
                    return claim
        except BaseException:
            claim.release()  # what was taken before the failure
            raise
        return claim

    def build(self, spec: KernelSpec, claim: Claim) -> Artifact:
        """Compile ``claim``'s key (its locks ``ready``), write it to every tier that takes
        writes (disk, remote), publish it to memory; the locks are let go whatever happens.

        Args:
            spec: The program whose key ``claim`` holds.
            claim: A ``ready`` claim from ``claim`` for the spec's key.

        Returns:
            The new ``Artifact``.

        Raises:
            CompileError: NVRTC rejected the program.
            NvrtcError: The temporary folder cannot be used safely (``TMPDIR``), or the files
                of the spec's include directories changed since its key was derived.
        """
        try:
            artifact = self._compile(spec, claim.key)
            for tier in self.tiers:
                tier.write(artifact)
        finally:
            claim.release()
        self.memory.write(artifact)
        return artifact

    def _compile(self, spec: KernelSpec, key: str) -> Artifact:
        logger.debug("compiling %s (%s) for %s", spec.name, key[:16], self.target.arch)
        parts = key_parts(spec, self.target.arch, _nvrtc.build())
        # Off by default: a line to compare with another process's (Compiler.explain compares
        # with the tiers' entries).
        misses.debug("miss %s %s: %s", spec.name, key[:16],
                     ", ".join(f"{part}={value}" for part, value in parts.items()))  # fmt: skip
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
            parts=parts,
            part_items=part_items(spec),
        )

    def record(self, name: str) -> bytes | None:
        """The data last stored under ``name`` for this target (see put_record), or None.
        Records live on disk only: a cache without one keeps none.

        Args:
            name: The record's name.

        Returns:
            The data, or None: nothing stored under ``name`` for this target, no disk tier,
            or an entry that failed verification (and was dropped).

        Raises:
            Nothing: a record that is missing, damaged or cannot be read is None.
        """
        if self.disk is None:
            return None
        artifact = self.disk.read(record_key(name, self.target), arch=self.target.arch)
        return artifact.image if artifact is not None and artifact.kind == "data" else None

    def put_record(self, name: str, data: bytes) -> bool:
        """Keep ``data`` under ``name`` beside the kernels (written atomically, verified on
        read, evicted with them).

        Args:
            name: The record's name; a record stored under it before for this target is
                replaced.
            data: The bytes to keep.

        Returns:
            True once it is stored; False if there is no disk tier or it cannot take it (not
            trusted, read-only, full, or the data is over its limit).

        Raises:
            TypeError: ``data`` is not bytes-like (``bytes(data)`` fails: a str, say), with a
                disk tier.
        """
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

    def forget(self, spec: KernelSpec) -> list[str]:
        """Drop ``spec``'s entries (for every target this cache serves) from memory and disk,
        so the next request compiles it (and reads its include directories' files anew).

        As ``drop`` does, its entries in the layers and the remote tier are not served again.

        Args:
            spec: The program to drop.

        Returns:
            The keys dropped, one per target this cache serves.

        Raises:
            ValueError: The spec's include directories cannot be covered by its key (see
                ``key``), for a spec whose keys were never derived.
        """
        keys = [view.key(spec) for view in list(self._views.values())]
        for key in keys:
            self.drop(key)
        spec._reread_host_files()
        return keys

    def close(self) -> None:
        """Let go of the layers' files (a bundle's memory map); they are misses from now on."""
        for layer in self.layers:
            layer.close()

    def drop(self, key: str) -> None:
        """Drop ``key``'s entry from memory and disk, and stop reading it from the layers and
        the remote tier, which may hold the same image: the next compile replaces the remote
        one (a layer is never written).

        Args:
            key: The cache key to drop.

        Raises:
            ValueError: ``key`` is not a cache key (64 lowercase hex digits), with a disk tier.
        """
        self.memory.discard(key)
        if self.disk is not None:
            self.disk.discard(key)
        self._shadowed.add(key)

    def clear(self) -> None:
        """Empty the memory tier and this format version's disk entries."""
        self.memory.clear()
        if self.disk is not None:
            self.disk.clear()

    def stats(self) -> CacheStats:
        """The whole cache's counters: every target's together, and each one's in ``archs``.

        Returns:
            A ``CacheStats`` snapshot; taking it reads no file.
        """
        memory = self.memory.stats()
        disk = self.disk.stats() if self.disk is not None else DiskStats()
        views = list(self._views.values())
        counts = [view._counts() for view in views]
        archs = {
            view.target.arch: ArchStats(memory.archs.get(view.target.arch, 0), *count[1:])
            for view, count in zip(views, counts, strict=True)
        }
        for arch, entries in memory.archs.items():  # entries of a target no view served
            archs.setdefault(arch, ArchStats(entries, 0, 0, 0.0))
        return CacheStats(
            requests=memory.hits + self._misses.value,
            joined=sum(count[0] for count in counts),
            compiles=sum(count[1] for count in counts),
            compile_errors=sum(count[2] for count in counts),
            compile_seconds=sum(count[3] for count in counts),
            memory=memory,
            disk=disk,
            archs=dict(sorted(archs.items())),
            layers=tuple(layer.stats() for layer in self.layers),
        )

    def missed(self) -> None:
        """Count a request that the memory tier did not serve (see ``stats().requests``)."""
        self._misses.add()

    def _counts(self) -> tuple[int, int, int, float]:
        with self._lock:
            return (
                self._joined,
                self._compiles,
                self._compile_errors,
                self._compile_seconds,
            )
