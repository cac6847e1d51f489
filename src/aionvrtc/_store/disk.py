"""The disk tier: one self-verifying file per entry, written atomically, shared by processes.

Layout: ``<root>/v<FORMAT_VERSION>/<key[:2]>/<key>``. Other format versions live in sibling
folders and are never read as current entries. Every operation here is blocking and meant to run
whole in one worker-thread hop.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._artifact import Artifact, decode, encode, read_header
from .._exceptions import CacheCorruptError
from .._spec import FORMAT_VERSION
from .._units import parse_size

try:
    import fcntl
except ImportError:  # not POSIX: no cross-process single flight
    fcntl = None  # type: ignore[assignment]

__all__ = ["EVENT_KINDS", "DiskTier", "EntryInfo", "default_cache_dir", "default_disk_limit"]

logger = logging.getLogger("aionvrtc")

ENV_CACHE_DIR = "AIONVRTC_CACHE_DIR"
ENV_DISK_LIMIT = "AIONVRTC_DISK_LIMIT"
DEFAULT_DISK_LIMIT = 1 << 30  # bytes (1 GiB)
# Eviction frees down to this fraction of the limit, so a full cache is not rescanned on every
# write.
LOW_WATER = 0.9
# A tmp file this old belongs to a writer that died: a write takes milliseconds.
STALE_TMP_SECONDS = 300.0
# Entries larger than this are refused on read before being loaded into memory.
MAX_ENTRY_BYTES = 256 << 20  # bytes (256 MiB)
# How long a process waits for another's compile of the same key before compiling itself: long
# enough for any real kernel, short enough that a stopped process cannot wedge the others.
LOCK_TIMEOUT = 300.0  # seconds
_LOCK_SUFFIX = ".lock"
# Corrupt entries dropped, evictions and prunes, appended by every process as "<time> <kind>
# <count>" lines (O_APPEND writes of one short line are atomic), so that `aionvrtc cache info`
# can report them for the cache dir, not for one process.
_EVENTS = ".events"
EVENT_KINDS = ("corrupt", "evicted", "pruned")

_KEY = re.compile(r"[0-9a-f]{64}")
_TMP_SUFFIX = ".tmp"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# Errors that say the cache cannot be written at all: stop trying, keep serving.
_UNWRITABLE = {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT}


def default_cache_dir() -> Path:
    """``$AIONVRTC_CACHE_DIR`` if set, else the platform's user cache dir for aionvrtc."""
    configured = os.environ.get(ENV_CACHE_DIR)
    if configured:
        return Path(configured).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("aionvrtc", appauthor=False))


def default_disk_limit() -> int:
    """``$AIONVRTC_DISK_LIMIT`` ("2G", "500MiB", bytes) if set, else 1 GiB."""
    configured = os.environ.get(ENV_DISK_LIMIT)
    if not configured:
        return DEFAULT_DISK_LIMIT
    try:
        return parse_size(configured)
    except ValueError as exc:
        raise ValueError(f"${ENV_DISK_LIMIT}: {exc}") from None


@dataclass(frozen=True, slots=True)
class EntryInfo:
    """One entry as the file system sees it; ``last_used`` is its mtime (hits refresh it)."""

    key: str
    path: Path
    size: int
    last_used: float


class DiskTier:
    """Entries on disk, bounded in bytes with least-recently-used eviction. Thread-safe."""

    def __init__(
        self, root: str | os.PathLike[str] | None = None, *, limit: int | None = None
    ) -> None:
        if limit is None:
            limit = default_disk_limit()
        if limit < 0:
            raise ValueError(f"disk_limit must be >= 0 bytes, got {limit}")
        self.root = Path(root) if root is not None else default_cache_dir()
        self.dir = self.root / f"v{FORMAT_VERSION}"
        self.limit = limit
        self.writable = True
        self.locking = True  # cross-process file locks; off if the file system has none
        self._lock = threading.Lock()
        self._approx_bytes: int | None = None  # unknown until the first scan
        self._warned: set[str] = set()
        self.hits = 0
        self.misses = 0
        self.writes = 0
        self.corrupt = 0
        self.evictions = 0
        self.write_failures = 0
        self.read_failures = 0

    def path(self, key: str) -> Path:
        if not _KEY.fullmatch(key):
            raise ValueError(f"not a cache key (64 lowercase hex digits): {key!r}")
        return self.dir / key[:2] / key

    # -- reading ---------------------------------------------------------------------------

    def read(self, key: str, *, arch: str | None = None) -> Artifact | None:
        """The verified entry for ``key``, or None. A bad entry is deleted and counted."""
        path = self.path(key)
        try:
            fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
        except FileNotFoundError:
            self._count("misses")
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a planted symlink: never follow it
                self._drop(path, None, "entry is a symbolic link")
            else:
                self._count("read_failures")
                self._warn_once(f"read:{exc.errno}", f"cannot read the disk cache at {path}: {exc}")
            self._count("misses")
            return None
        with os.fdopen(fd, "rb") as file:
            info = os.fstat(fd)
            try:
                if not stat.S_ISREG(info.st_mode):
                    raise CacheCorruptError("corrupt cache entry: not a regular file")
                if info.st_size > MAX_ENTRY_BYTES:
                    raise CacheCorruptError(f"corrupt cache entry: {info.st_size} bytes")
                artifact = decode(file.read(), expected_key=key, expected_arch=arch)
            except CacheCorruptError as exc:
                self._drop(path, info, str(exc))
                self._count("misses")
                return None
            except OSError as exc:
                self._count("read_failures")
                self._warn_once(f"read:{exc.errno}", f"cannot read the disk cache at {path}: {exc}")
                self._count("misses")
                return None
            # Recency for LRU eviction; a read-only cache just keeps its order.
            with contextlib.suppress(OSError):
                os.utime(fd)
        self._count("hits")
        return artifact

    def _drop(self, path: Path, opened: os.stat_result | None, reason: str) -> None:
        self._count("corrupt")
        self._log_event("corrupt", 1)
        logger.warning("dropping disk cache entry %s: %s", path, reason)
        try:
            if opened is not None:
                # Another process may have replaced the bad entry with a good one meanwhile.
                now = os.stat(path, follow_symlinks=False)
                if (now.st_ino, now.st_dev) != (opened.st_ino, opened.st_dev):
                    return
            path.unlink()
        except OSError:
            pass

    # -- writing ---------------------------------------------------------------------------

    def write(self, artifact: Artifact) -> bool:
        """Store ``artifact`` atomically. False (and one warning) if the disk cannot take it."""
        if not self.writable:
            return False
        data = encode(artifact)
        if len(data) > self.limit:
            return False
        path = self.path(artifact.key)
        try:
            self._make_dirs(path.parent)
            tmp = path.parent / f".{artifact.key}.{os.getpid()}.{secrets.token_hex(4)}{_TMP_SUFFIX}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600)
            try:
                with os.fdopen(fd, "wb") as file:
                    file.write(data)
                    file.flush()
                    os.fsync(file.fileno())
                os.replace(tmp, path)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
        except OSError as exc:
            self._write_failed(exc)
            return False
        with self._lock:
            self.writes += 1
            if self._approx_bytes is not None:
                self._approx_bytes += len(data)
            over = self._approx_bytes is None or self._approx_bytes > self.limit
        if over:
            self.evict()
        return True

    def _make_dirs(self, shard: Path) -> None:
        # Created one level at a time so every folder we make is 0700, not just the last one.
        for folder in (self.root, self.dir, shard):
            with contextlib.suppress(FileExistsError):
                folder.mkdir(mode=0o700, parents=folder is self.root)

    def _write_failed(self, exc: OSError) -> None:
        self._count("write_failures")
        if exc.errno in _UNWRITABLE:
            self.writable = False
            self._warn_once(
                "write",
                f"disk cache at {self.dir} is not writable ({exc}); "
                "writing disabled, kernels are still compiled and served from memory",
            )
        else:
            self._warn_once(f"write:{exc.errno}", f"cannot write to the disk cache ({exc})")

    # -- cross-process single flight --------------------------------------------------------

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[bool]:
        """Hold the per-key file lock, so processes on this host compile a key once.

        Yields whether the lock is held; without working locks (or a writable cache) it yields
        False and the caller goes on unlocked: a duplicate compile, never a failed request.
        """
        fd = self._open_lock(key)
        if fd is None:
            yield False
            return
        try:
            locked = self._acquire(fd, key)
            try:
                yield locked
            finally:
                if locked:
                    fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _open_lock(self, key: str) -> int | None:
        if not (self.locking and self.writable and fcntl is not None):
            return None
        path = self.path(key)
        try:
            self._make_dirs(path.parent)
            flags = os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC
            return os.open(path.with_name(f".{key}{_LOCK_SUFFIX}"), flags, 0o600)
        except OSError as exc:
            self._write_failed(exc)  # the same cause will stop the write: one warning for both
            return None

    def _acquire(self, fd: int, key: str) -> bool:
        assert fcntl is not None
        deadline = time.monotonic() + LOCK_TIMEOUT
        delay = 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                # Another process is compiling this key; poll (a blocking flock could not be
                # abandoned) with a backoff that keeps the wait short for quick compiles.
                if time.monotonic() > deadline:
                    logger.warning(
                        "waited %.0f s for another process to compile %s; compiling here",
                        LOCK_TIMEOUT,
                        key[:16],
                    )
                    return False
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
            except OSError as exc:
                self.locking = False
                self._warn_once(
                    "locking",
                    f"file locks do not work on {self.dir} ({exc}); going on without, so "
                    "processes sharing this cache may compile the same kernel more than once",
                )
                return False
            else:
                return True

    # -- size management -------------------------------------------------------------------

    def scan(self) -> list[EntryInfo]:
        """Every current entry, and removal of tmp files left by writers that died."""
        entries: list[EntryInfo] = []
        stale_before = time.time() - STALE_TMP_SECONDS
        try:
            shards = [s for s in os.scandir(self.dir) if s.is_dir(follow_symlinks=False)]
        except OSError:
            return entries
        for shard in shards:
            try:
                files = list(os.scandir(shard.path))
            except OSError:
                continue  # removed by a concurrent clear
            for file in files:
                try:
                    info = file.stat(follow_symlinks=False)
                except OSError:
                    continue
                if file.name.endswith(_TMP_SUFFIX):
                    if info.st_mtime < stale_before:
                        _unlink(file.path)
                elif _KEY.fullmatch(file.name) and stat.S_ISREG(info.st_mode):
                    entry = EntryInfo(file.name, Path(file.path), info.st_size, info.st_mtime)
                    entries.append(entry)
        return entries

    def evict(self) -> int:
        """Remove least recently used entries until the total is under the low-water mark."""
        with self._lock:
            entries = self.scan()
            over = sum(e.size for e in entries) > self.limit
            removed = self._remove(entries, int(self.limit * LOW_WATER) if over else None, None)
            self.evictions += removed
        if removed:
            self._log_event("evicted", removed)
        return removed

    def prune(self, *, max_bytes: int | None = None, older_than: float | None = None) -> int:
        """Remove entries unused for ``older_than`` seconds, then least recently used ones until
        at most ``max_bytes`` remain. Safe while other processes use the cache: a reader holding
        an entry open keeps its data, and a later request recompiles it."""
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        if older_than is not None and older_than < 0:
            raise ValueError(f"older_than must be >= 0 seconds, got {older_than}")
        cutoff = time.time() - older_than if older_than is not None else None
        with self._lock:
            removed = self._remove(self.scan(), max_bytes, cutoff)
        if removed:
            self._log_event("pruned", removed)
        return removed

    def _remove(self, entries: list[EntryInfo], max_bytes: int | None, cutoff: float | None) -> int:
        """Least recently used first: entries last used before ``cutoff``, then as many as it
        takes to bring the total to ``max_bytes``. Called with the lock held."""
        total = sum(e.size for e in entries)
        removed = 0
        for entry in sorted(entries, key=lambda e: e.last_used):
            stale = cutoff is not None and entry.last_used < cutoff
            if not stale and (max_bytes is None or total <= max_bytes):
                break  # the rest are newer: neither stale nor needed to make room
            if _unlink(entry.path):
                removed += 1
                _unlink(entry.path.with_name(f".{entry.key}{_LOCK_SUFFIX}"))
            total -= entry.size
        self._approx_bytes = total
        return removed

    def describe(self, entry: EntryInfo) -> dict[str, Any] | None:
        """The header of ``entry`` (key, kind, arch, NVRTC version, names, created), read
        without the image and not verified; None if it is unreadable or not an entry."""
        try:
            fd = os.open(entry.path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as file:
            try:
                return read_header(file)
            except (CacheCorruptError, OSError):
                return None

    # -- events shared by the processes that use this cache dir ------------------------------

    def _log_event(self, kind: str, count: int) -> None:
        line = f"{time.time():.3f} {kind} {count}\n".encode()
        try:
            fd = os.open(
                self.dir / _EVENTS,
                os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW | _CLOEXEC,
                0o600,
            )
        except OSError:
            return  # a read-only or missing cache dir: the counters here still count
        try:
            os.write(fd, line)
        except OSError:
            pass
        finally:
            os.close(fd)

    def events(self) -> dict[str, int]:
        """Totals of each event kind that any process logged in this cache dir."""
        totals = dict.fromkeys(EVENT_KINDS, 0)
        try:
            fd = os.open(self.dir / _EVENTS, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
        except OSError:
            return totals
        with os.fdopen(fd, "rb") as file:
            for raw in file.read(MAX_ENTRY_BYTES).splitlines():
                parts = raw.split()
                if len(parts) == 3 and parts[1].decode(errors="replace") in totals:
                    with contextlib.suppress(ValueError):
                        totals[parts[1].decode()] += int(parts[2])
        return totals

    def discard(self, key: str) -> bool:
        return _unlink(self.path(key))

    def clear(self) -> int:
        """Remove every entry of this format version; safe while other processes use it."""
        removed = 0
        for entry in self.scan():
            removed += _unlink(entry.path)
            _unlink(entry.path.with_name(f".{entry.key}{_LOCK_SUFFIX}"))
        with self._lock:
            self._approx_bytes = 0
        return removed

    # -- bookkeeping -----------------------------------------------------------------------

    def _count(self, counter: str) -> None:
        with self._lock:
            setattr(self, counter, getattr(self, counter) + 1)

    def _warn_once(self, topic: str, message: str) -> None:
        with self._lock:
            if topic in self._warned:
                return
            self._warned.add(topic)
        logger.warning(message)


def _unlink(path: str | os.PathLike[str]) -> bool:
    try:
        os.unlink(path)
    except OSError:
        return False
    return True
