"""The disk tier: one self-verifying file per entry, written atomically, shared by processes.

Layout: ``<root>/v<FORMAT_VERSION>/<key[:2]>/<key>``, and in the version folder the index
(``.index``: the entries' total size and header summaries, see ``_index``) and the event log
(``.events``). Other format versions live in sibling folders and are never read as current
entries. Every operation here is blocking and meant to run whole in one worker-thread hop.

No request lists a folder: a write learns from the index's 64-byte header whether the cache is
over its limit, and the work that walks every shard (eviction down to the low-water mark, and
rebuilding the index when it is missing, damaged, stale or mostly dead records) runs in one
background daemon thread per tier (``_maintenance``). Recency is each entry's mtime, refreshed
by a read.

Nothing in the cache dir can fail or hang a request: files are opened without blocking (a FIFO)
and without following links, checked with fstat before they are read, and every operation below
the cache root works relative to an open folder, so a folder swapped for a link is never
followed. An entry is code that runs on the GPU, so entries are read only from a tree that
nobody else can write, as ssh does for ``~/.ssh`` (see ``Policy``).
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import logging
import operator
import os
import re
import secrets
import stat
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast

from .. import _config
from .._artifact import _KEY, Artifact, decode, encode, read_header
from .._config import ENV_CACHE_DIR, ENV_DISK_LIMIT, ENV_SHARED_CACHE
from .._exceptions import CacheCorruptError
from .._spec import FORMAT_VERSION
from ._fs import (
    ASIDE,
    DIR_FLAGS,
    FILE_FLAGS,
    breathe,
    closing,
    file_id,
    kind_of,
    paced,
    read_up_to,
    remove_at,
    same_file,
)
from ._fs import stat_or_none as _stat
from ._index import (
    INDEX_NAME,
    INDEX_TMP_PREFIX,
    Index,
    Record,
    Snapshot,
    Totals,
    summary,
    summary_fields,
)
from ._index import summaries as parse_summaries
from ._locks import NO_LOCK, KeyLock, LockFiles, close_files, let_go, unlock, wait_in_thread
from ._trust import Policy

try:
    import fcntl
except ImportError:  # not POSIX: no cross-process single flight
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "EVENT_KINDS",
    "NO_LOCK",
    "PROBE_KEY",
    "Damage",
    "DiskStats",
    "DiskTier",
    "EntryInfo",
    "KeyLock",
    "Listing",
    "Policy",
    "Pruned",
    "Survey",
    "default_cache_dir",
    "default_disk_limit",
    "default_shared_cache",
]

logger = logging.getLogger("aionvrtc")

DEFAULT_DISK_LIMIT = 1 << 30  # bytes (1 GiB)
# Eviction frees down to this fraction of the limit, so a full cache is not walked again on the
# next write.
LOW_WATER = 0.9
# A tmp file this old belongs to a writer that died: a write takes milliseconds.
STALE_TMP_SECONDS = 300.0
# Entries larger than this are refused on read before being loaded into memory.
MAX_ENTRY_BYTES = 256 << 20  # bytes (256 MiB)
# How long a process waits for another's compile of the same key before compiling itself: long
# enough for any real kernel, short enough that a stopped process cannot wedge the others.
LOCK_TIMEOUT = 300.0  # seconds
_LOCK_SUFFIX = ".lock"
# A maintenance pass that could not put the index in order or the cache under its limit (a full
# disk, entries that cannot be removed) is not tried again for this long: each pass walks every
# shard.
MAINTENANCE_BACKOFF = 60.0  # seconds
# Corrupt entries dropped, evictions and prunes, appended by every process as "<time> <kind>
# <count>" lines (O_APPEND writes of one short line are atomic), so that `aionvrtc cache info`
# can report them for the cache dir, not for one process. Only its tail is read: the file grows
# by one short line per event and is never rotated.
_EVENTS = ".events"
_EVENTS_TAIL = 4 << 20  # bytes (4 MiB: about 150,000 events)
EVENT_KINDS = ("corrupt", "evicted", "pruned")

_VERSION = f"v{FORMAT_VERSION}"
_SHARD = re.compile(r"[0-9a-f]{2}")
_TMP_SUFFIX = ".tmp"
# `aionvrtc doctor` writes this entry and takes its lock (no content hashes to it), then removes
# both; one per process, so that two doctors do not wait for each other.
PROBE_KEY = f"{os.getpid():064x}"
_ROOT_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
# Errors that say the file system takes no writes at all, whichever folder they come from.
_FILE_SYSTEM_REFUSES = {errno.EROFS, errno.ENOSPC, errno.EDQUOT}
_DENIED = {errno.EACCES, errno.EPERM}
# The fix for a tree that is not this user's to change.
_OWN_CACHE_DIR = f"use a cache dir of your own ({ENV_CACHE_DIR}=/a/folder/you/own)"

# An entry found by a walk of the shards: key, size, mtime (last used), st_dev, st_ino. A plain
# tuple of plain values, which the garbage collector stops tracking: a walk finds 50,000.
_Found = tuple[str, int, float, int, int]
_LAST_USED = operator.itemgetter(2)
SORT_RUN = 4096  # entries sorted in one call (see _least_recent)


def default_cache_dir() -> Path:
    """``$AIONVRTC_CACHE_DIR`` if set, else the platform's user cache dir for aionvrtc."""
    configured = _config.text(ENV_CACHE_DIR)
    if configured:
        return Path(configured).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("aionvrtc", appauthor=False))


def default_disk_limit() -> int:
    """``$AIONVRTC_DISK_LIMIT`` ("2G", "500MiB", bytes) if set, else 1 GiB."""
    return _config.size(ENV_DISK_LIMIT, DEFAULT_DISK_LIMIT)


def default_shared_cache() -> bool:
    """``$AIONVRTC_SHARED_CACHE`` (1/0, true/false, yes/no, on/off), else False."""
    return _config.flag(ENV_SHARED_CACHE)


@dataclass(frozen=True, slots=True)
class EntryInfo:
    """One entry as the file system sees it; ``last_used`` is its mtime (hits refresh it)."""

    key: str
    size: int
    last_used: float
    directory: Path  # the version folder it is in

    @property
    def path(self) -> Path:
        # Made when asked for: a Path costs more than the rest of a listing's row.
        return self.directory / self.key[:2] / self.key


@dataclass(frozen=True, slots=True)
class Damage:
    """Something in the cache dir (or a bundle) that is not used: where, what is wrong, a fix
    that works."""

    path: Path
    problem: str  # reads after "<path> is"
    fix: str

    def __str__(self) -> str:
        return f"{self.path} is {self.problem}; fix: {self.fix}"


@dataclass(frozen=True, slots=True)
class Survey:
    """What a walk of the cache dir found: entries, and damaged items that it skipped."""

    entries: tuple[EntryInfo, ...]
    damaged: tuple[Damage, ...]


@dataclass(frozen=True, slots=True)
class Listing:
    """A survey with what each entry's header says, most recently used first, in columns (no
    object per entry: a listing holds 50,000, and the garbage collector's passes over that
    many cost more than the listing): entry ``i`` is ``keys[i]``, of ``sizes[i]`` bytes, last
    used at ``last_used[i]`` (its mtime), and ``headers[i]`` is the summary of its header
    (``kind``, ``arch``, ``nvrtc_version``, ``created``, ``names`` joined by NUL: untrusted
    values, as the entry holds them) or why it cannot be read."""

    directory: Path  # the version folder: entry i is at directory / keys[i][:2] / keys[i]
    keys: tuple[str, ...]
    sizes: tuple[int, ...]
    last_used: tuple[float, ...]
    headers: tuple[dict[str, Any] | str, ...]
    damaged: tuple[Damage, ...]


@dataclass(frozen=True, slots=True)
class Pruned:
    """What a prune removed, what it left (entries, bytes), and damaged items it skipped."""

    removed: tuple[EntryInfo, ...]
    entries: int
    bytes: int
    damaged: tuple[Damage, ...]


@dataclass(frozen=True, slots=True)
class DiskStats:
    """A disk tier's counters since it was created (this process's), and the cache dir's size
    as its index said at this tier's last write, removal or rebuild (None: not known yet).

    ``misses`` counts lookups that found no entry: requests that join one in flight for the
    same key share its lookup, so one cold request, or many at once for one key, is one miss.
    The second look that a compile takes under the key's lock is not another miss; if it finds
    the entry (another process compiled it meanwhile), that is a hit: ``hits`` counts the
    lookups that served an entry from disk. ``DiskStats()``, all zero and neither writable nor
    trusted, is what a cache without a disk tier reports (as ``RemoteStats()`` is for one
    without a remote tier)."""

    hits: int = 0
    misses: int = 0
    writes: int = 0
    corrupt_dropped: int = 0  # entries that failed verification and were deleted
    evictions: int = 0
    write_failures: int = 0
    read_failures: int = 0
    writable: bool = False
    trusted: bool = False  # False: the cache dir failed the ownership checks and is not used
    entries: int | None = None
    bytes: int | None = None


@dataclass(frozen=True, slots=True)
class _Swept:
    """What a walk of the shards (``DiskTier._sweep``) kept and removed, and the index it left
    (None: not rebuilt)."""

    kept: list[_Found]
    removed: list[_Found]
    index: Totals | None


class _Damaged(Exception):
    """A folder or file that is not what the cache made (``info``: what was found, if known)."""

    def __init__(self, damage: Damage, info: os.stat_result | None = None) -> None:
        super().__init__(str(damage))
        self.damage = damage
        self.info = info


class _RootError(Exception):
    """An OSError at the cache root or version folder, or in making a folder: it concerns
    every shard."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


# Every live tier, for a forked child to reset (DiskTier._after_fork_in_child).
_TIERS: weakref.WeakSet[DiskTier] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for tier in list(_TIERS):
        tier._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class DiskTier:
    """Entries on disk, bounded in bytes with least-recently-used eviction. Thread-safe.

    ``shared_cache`` (default ``$AIONVRTC_SHARED_CACHE``, else False) trusts a tree that a group
    shares and makes new folders and files group-writable; see ``Policy``.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        limit: int | None = None,
        shared_cache: bool | None = None,
        read_only: bool = False,
    ) -> None:
        if limit is None:
            limit = default_disk_limit()
        if limit < 0:
            raise ValueError(f"disk_limit must be >= 0 bytes, got {limit}")
        if shared_cache is None:
            shared_cache = default_shared_cache()
        self.root = Path(root) if root is not None else default_cache_dir()
        self.dir = self.root / _VERSION
        self._root = os.fspath(self.root)
        self.limit = limit
        self.policy = Policy.current(shared_cache)
        # A read-only layer (see _store.layers): read and verified as any cache dir, never
        # written, and nothing in it removed or touched, a damaged entry included.
        self.read_only = read_only
        self.writable = not read_only
        self.locking = True  # cross-process file locks; off if the file system has none
        # Guards the counters, the warnings given and the maintenance state: held for a few
        # bytecodes, never across I/O, so a read never waits behind a walk of the shards.
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self.hits = 0
        self.misses = 0
        self.writes = 0
        self.corrupt = 0
        self.evictions = 0
        self.write_failures = 0
        self.read_failures = 0
        self._index = Index(self._open_index, self.policy.lock_mode)
        self._known: Totals | None = None  # the index's header at this tier's last use of it
        self._maintainer: threading.Thread | None = None  # at most one per tier runs
        self._again = False  # asked for while it ran: it makes one more pass
        self._idle = threading.Event()
        self._idle.set()
        self._walking = threading.Lock()  # held by a walk that removes entries (_sweep)
        self._quiet_until = 0.0  # time.monotonic() before which no pass starts (a failed one)
        # The version folder that a maintenance pass holds the maintenance lock of, open.
        self._maintaining: int | None = None
        _TIERS.add(self)
        # Why the cache dir is not trusted (then it is neither read nor written), or None.
        self.trust_problem: Damage | None = None
        self._distrust(self.check_tree())
        with contextlib.suppress(_RootError):  # opening checks the dir and its version folder
            version = self._open(_VERSION)
            if version is not None:
                os.close(version)

    @property
    def trusted(self) -> bool:
        return self.trust_problem is None

    def path(self, key: str) -> Path:
        _check_key(key)
        return self.dir / key[:2] / key

    def stats(self) -> DiskStats:
        """A snapshot of the counters; reads no file."""
        known = self._known
        with self._lock:
            return DiskStats(
                hits=self.hits,
                misses=self.misses,
                writes=self.writes,
                corrupt_dropped=self.corrupt,
                evictions=self.evictions,
                write_failures=self.write_failures,
                read_failures=self.read_failures,
                writable=self.writable,
                trusted=self.trusted,
                entries=known.entries if known is not None else None,
                bytes=known.bytes if known is not None else None,
            )

    # -- trust -------------------------------------------------------------------------------

    def check_tree(self) -> Damage | None:
        """What makes the cache dir untrusted among the folders above it (by the path given
        and by the real path), or None. The dir and its version folder are checked each time
        they are opened (``_open``)."""
        found = self.policy.unsafe_ancestor(self.root)  # missing folders: made at first write
        if found is None:
            return None
        folder, info, problem = found
        return Damage(
            folder, problem, self.policy.fix(folder, info, ancestor=True, instead=_OWN_CACHE_DIR)
        )

    def _shard_fix(self, path: Path, info: os.stat_result | None) -> str:
        if info is not None and stat.S_ISDIR(info.st_mode) and info.st_uid == self.policy.uid:
            fix = f"chmod {self.policy.dir_mode:o} {path}"
            if self.policy.shared and info.st_gid not in self.policy.groups:  # g+w: ours
                fix = f"chgrp {os.getegid()} {path} && {fix}"
            return fix
        return f"rm -r {path} (as its owner or root); it is made again when needed"

    def _distrust(self, damage: Damage | None) -> None:
        """Stop reading and writing this cache dir, with one warning saying why."""
        if damage is None:
            return
        self.trust_problem = damage
        self.writable = False
        self._warn_once(
            "trust",
            f"not using the disk cache at {self.root}: {damage.path} is {damage.problem}, so "
            "others could plant kernels that this process would run; kernels are compiled and "
            f"kept in memory. Fix: {damage.fix}",
        )

    # -- opening folders and files -------------------------------------------------------------

    def _open(
        self, *names: str, make: bool = False, check: bool = True, parent: int | None = None
    ) -> int | None:
        """The folder ``<root>/<names>`` (version folder, shard), opened level by level, each
        relative to the one above without following a link (only the root may be one), made
        first when ``make``, fstat-checked against the policy when ``check``; ``parent``: the
        open folder above the last name. None if one is missing or the tree is not trusted.

        The root and version folder concern every shard: an OSError there or in a mkdir
        raises _RootError; damage there distrusts the tree (unchecked: raises _Damaged). A
        damaged or untrusted shard raises _Damaged; any other OSError is raised as it is.
        """
        if parent is None and check and self.trust_problem is not None:
            return None
        fd = parent
        for level in range(len(names) if parent is not None else 0, len(names) + 1):
            try:
                opened = self._open_level(fd, names[:level], make=make, check=check)
            except OSError as exc:
                if level < 2:
                    raise _RootError(exc) from exc
                raise
            finally:
                if fd is not None and fd != parent:
                    os.close(fd)
            fd = opened
            if fd is None:
                return None
        return fd

    def _open_level(
        self, dir_fd: int | None, names: tuple[str, ...], *, make: bool, check: bool
    ) -> int | None:
        """One step of ``_open``: the root by its path (no ``names``), else ``names[-1]`` in
        the folder ``dir_fd``."""
        level = len(names)  # 0: the root, 1: the version folder, 2: a shard
        made = False
        if make:
            try:
                if level:
                    made = self._make_dir(names[-1], dir_fd)
                else:
                    self._make_root()
            except OSError as exc:  # the folder above refuses: every shard would
                raise _RootError(exc) from exc
            if check and self.trust_problem is not None:
                return None  # a folder above the root, made or changed meanwhile
        try:
            name, flags = (names[-1], DIR_FLAGS) if level else (self._root, _ROOT_FLAGS)
            fd = os.open(name, flags, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            info = _stat(names[-1], dir_fd=dir_fd) if level else None
            path = self.root.joinpath(*names)
            if level and exc.errno in (errno.ELOOP, errno.ENOTDIR):
                what = kind_of(info) if info is not None else "not a folder"
                damage = Damage(path, f"{what}, not a folder", f"rm {path}")
            elif level == 2 and isinstance(exc, PermissionError):
                denied = f"not readable by this user ({exc.strerror}{_owner_mode(info)})"
                damage = Damage(path, denied, self._shard_fix(path, info))
            else:
                raise
        else:
            try:
                info = os.fstat(fd)
                problem = self.policy.problem(info) if check else None
                if problem is None and make and level == 1:
                    self._check_writable(fd)
            except BaseException:
                os.close(fd)
                raise
            if problem is None:
                if made and level == 1:  # empty: its index starts empty, never walked to be made
                    self._index.create(fd)
                return fd
            os.close(fd)
            path = self.root.joinpath(*names)
            if level < 2:
                fix = self.policy.fix(path, info, instead=_OWN_CACHE_DIR)
            else:
                fix = self._shard_fix(path, info)
            damage = Damage(path, problem, fix)
        if level < 2 and check:
            self._distrust(damage)
            return None
        raise _Damaged(damage, info)

    def _check_writable(self, version: int) -> None:
        """Raise unless this user can write in the version folder: a read-only mount, or a
        cache that root baked into an image, is read and never written."""
        if os.fstatvfs(version).f_flag & getattr(os, "ST_RDONLY", 1):
            raise OSError(errno.EROFS, "it is on a read-only file system", str(self.dir))
        if os.access not in os.supports_dir_fd or os.access not in os.supports_effective_ids:
            return  # the writes themselves will say
        if not os.access(".", os.W_OK, dir_fd=version, effective_ids=True):
            info = os.fstat(version)
            raise PermissionError(
                errno.EACCES,
                f"this user (uid {self.policy.uid}) cannot write to it (owner uid "
                f"{info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o})",
                str(self.dir),
            )

    def _make_root(self) -> None:
        """Make the cache root and any missing folder above it, one level at a time so every
        folder made here gets this tier's mode; then check the tree again (a folder above that
        appeared since the first check)."""
        missing = []
        folder = Path(os.path.abspath(self.root))
        while not os.path.lexists(folder) and folder != folder.parent:
            missing.append(folder)
            folder = folder.parent
        for folder in reversed(missing):
            self._make_dir(str(folder))
        if missing:
            self._distrust(self.check_tree())

    def _make_dir(self, name: str, dir_fd: int | None = None) -> bool:
        """Make folder ``name`` with this tier's mode, set with fchmod so that the umask cannot
        strip a shared folder's group bits; an existing one is left as it is. Whether it was
        made here."""
        try:
            os.mkdir(name, self.policy.dir_mode, dir_fd=dir_fd)
        except FileExistsError:
            return False
        with contextlib.suppress(OSError), closing(os.open(name, DIR_FLAGS, dir_fd=dir_fd)) as fd:
            os.fchmod(fd, self.policy.dir_mode)
        return True

    def _open_file(
        self, dir_fd: int, name: str, shard: str, flags: int = os.O_RDONLY, *, create: int = 0
    ) -> tuple[int, os.stat_result]:
        """Open a file of the cache (an entry, a lock, the event log) in ``dir_fd`` (the folder
        of ``shard``, or "": the version folder) without blocking on a FIFO or following a
        link, and check with fstat, before anything reads it, that it is a regular file this
        user may trust. ``create``: the mode of a new file (0: never make one); set with
        fchmod, so that the umask cannot strip a shared file's group bits.

        Raises _Damaged (the fd closed) for anything else at the name; FileNotFoundError.
        """
        fd = None
        if create:
            try:
                fd = os.open(
                    name, flags | os.O_CREAT | os.O_EXCL | FILE_FLAGS, create, dir_fd=dir_fd
                )
            except FileExistsError:
                pass
            except OSError as exc:
                _raise_if_not_a_file(exc, dir_fd, name, self.dir / shard / name)
                raise
            else:
                with contextlib.suppress(OSError):
                    os.fchmod(fd, create)
        if fd is None:
            try:
                fd = os.open(name, flags | FILE_FLAGS, dir_fd=dir_fd)
            except OSError as exc:
                _raise_if_not_a_file(exc, dir_fd, name, self.dir / shard / name)
                raise
        try:
            info = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        problem = self.policy.file_problem(info)
        if problem is not None:
            os.close(fd)
            raise _Damaged(_removable(self.dir / shard / name, problem), info)
        return fd, info

    def _open_index(
        self, version: int, flags: int, create: int
    ) -> tuple[int, os.stat_result] | None:
        """The index file, opened as every file of the cache is; None when there is none, or
        something else (a FIFO, a link, a folder, a file not trusted) that a rebuild replaces."""
        try:
            return self._open_file(version, INDEX_NAME, "", flags, create=create)
        except (FileNotFoundError, _Damaged):
            return None

    # -- reading ---------------------------------------------------------------------------

    def read(self, key: str, *, arch: str | None = None, again: bool = False) -> Artifact | None:
        """The verified entry for ``key``, or None. A bad entry is deleted and counted; a
        damaged shard or an untrusted tree is a miss. ``again``: the look a compile takes under
        the key's lock after a miss; a find is a hit, finding nothing is not a second miss."""
        _check_key(key)
        artifact = None
        try:
            version = self._open(_VERSION)
            if version is not None:
                with closing(version):
                    shard = self._open(_VERSION, key[:2], parent=version)
                    if shard is not None:
                        with closing(shard):
                            artifact = self._read_entry(version, shard, key, arch)
        except _Damaged as exc:
            self._warn_shard(exc.damage)
        except (_RootError, OSError) as exc:
            self._count("read_failures")
            error = exc.error if isinstance(exc, _RootError) else exc
            self._warn_once(
                f"read:{error.errno}",
                f"cannot read the disk cache at {self.path(key)}: {exc}; the kernel is compiled "
                "instead",
            )
        if artifact is not None or not again:
            self._count("misses" if artifact is None else "hits")
        return artifact

    def _read_entry(self, version: int, shard: int, key: str, arch: str | None) -> Artifact | None:
        try:
            fd, info = self._open_file(shard, key, key[:2])
        except FileNotFoundError:
            return None
        except _Damaged as exc:
            self._drop(version, shard, key, exc.info, exc.damage.problem)
            return None
        try:
            if info.st_size > MAX_ENTRY_BYTES:
                raise CacheCorruptError(f"corrupt cache entry: {info.st_size} bytes")
            data = read_up_to(fd, MAX_ENTRY_BYTES + 1, info.st_size)
            if len(data) > MAX_ENTRY_BYTES:
                raise CacheCorruptError("corrupt cache entry: grew while it was read")
            artifact = decode(data, expected_key=key, expected_arch=arch)
        except CacheCorruptError as exc:
            self._drop(version, shard, key, info, str(exc))
            return None
        else:
            # Recency for LRU eviction; a read-only cache just keeps its order.
            if not self.read_only:
                with contextlib.suppress(OSError):
                    os.utime(fd)
        finally:
            os.close(fd)
        return artifact

    def _drop(
        self, version: int, shard: int, key: str, opened: os.stat_result | None, reason: str
    ) -> None:
        self._count("corrupt")
        if self.read_only:
            logger.warning(
                "skipping damaged entry %s of a read-only cache: %s", self.path(key), reason
            )
            return
        self._log_event("corrupt", 1)
        logger.warning("dropping disk cache entry %s: %s", self.path(key), reason)
        gone = remove_at(shard, key, file_id(opened) if opened is not None else None)
        if gone is not None and stat.S_ISREG(gone.st_mode) and self.writable:
            self._removed(self._index.remove(version, [(key, gone.st_size)]))

    # -- writing ---------------------------------------------------------------------------

    def write(self, artifact: Artifact) -> bool:
        """Store ``artifact`` atomically. False (and one warning) if the disk cannot take it.

        Costs the same at any number of entries: the index's header says whether the cache is
        now over its limit, and eviction then runs in the background (``_maintain_soon``)."""
        if not self.writable:
            return False
        data = encode(artifact)
        if len(data) > self.limit:
            return False
        key = artifact.key
        try:
            version = self._open(_VERSION, make=True)
            if version is None:
                return False  # the tree was found untrusted (or removed) just now
            with closing(version):
                shard = self._open(_VERSION, key[:2], make=True, parent=version)
                if shard is None:
                    return False
                with closing(shard):
                    ino, replaced = self._write_entry(shard, key, data)
                self._count("writes")
                record = (ino, len(data), summary(_header_of(artifact)))
                self._written(self._index.add(version, key, record, replaced))
        except (_Damaged, _RootError, OSError) as exc:
            self._write_failed(exc, key, count=True)
            return False
        return True

    def _write_entry(self, shard: int, key: str, data: bytes) -> tuple[int, int | None]:
        """Write a tmp file, fsync it and rename it over the entry: a reader sees the old
        entry or the new one, never part of one. The new entry's inode, and the size of the
        entry it replaced (None: none)."""
        tmp = f".{key}.{os.getpid()}.{secrets.token_hex(4)}{_TMP_SUFFIX}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | FILE_FLAGS
        fd = os.open(tmp, flags, self.policy.entry_mode, dir_fd=shard)
        try:
            with os.fdopen(fd, "wb") as file:
                os.fchmod(fd, self.policy.entry_mode)
                file.write(data)
                file.flush()
                os.fsync(fd)
                ino = os.fstat(fd).st_ino
            old = _stat(key, dir_fd=shard)
            os.replace(tmp, key, src_dir_fd=shard, dst_dir_fd=shard)
        except BaseException:
            remove_at(shard, tmp, None)
            raise
        return ino, old.st_size if old is not None and stat.S_ISREG(old.st_mode) else None

    def _write_failed(self, exc: BaseException, key: str, *, count: bool) -> None:
        """A write (or lock file) that failed. The tier stops writing only when the cache
        root or version folder refuses, or the file system does (read-only, full): a shard's
        problem stays with that shard. ``count``: a failed write (a lock file that failed
        is counted only when writing stops, as the write is then not tried)."""
        if isinstance(exc, OSError) and exc.errno in _DENIED:
            path = self.dir / key[:2]
            info = _stat(path, follow=False)
            problem = f"not writable by this user ({exc.strerror}{_owner_mode(info)})"
            exc = _Damaged(Damage(path, problem, self._shard_fix(path, info)), info)
        if isinstance(exc, _Damaged):
            if count:
                self._count("write_failures")
            self._warn_shard(exc.damage)
            return
        error = exc.error if isinstance(exc, _RootError) else exc
        assert isinstance(error, OSError)
        if isinstance(exc, _RootError) or error.errno in _FILE_SYSTEM_REFUSES:
            self._count("write_failures")
            self.writable = False
            if error.errno in (errno.ENOSPC, errno.EDQUOT):
                fix = f"free space on its disk, or point {ENV_CACHE_DIR} at another folder"
            else:
                fix = f"to keep new kernels, point {ENV_CACHE_DIR} at a folder you can write"
            self._warn_once(
                "write",
                f"disk cache at {self.dir} is not writable ({error}); writing disabled, "
                "kernels are still compiled and served from memory (entries already there "
                f"are still read). Fix: {fix}",
            )
            return
        if count:
            self._count("write_failures")
        self._warn_once(
            f"write:{error.errno}",
            f"cannot write to the disk cache at {self.dir / key[:2]} ({error}); the kernel is "
            "kept in memory",
        )

    def _warn_shard(self, damage: Damage) -> None:
        self._warn_once(
            f"shard:{damage.path}",
            f"disk cache folder {damage.path} is {damage.problem}: kernels whose keys start "
            f"with {damage.path.name} are compiled and kept in memory, the rest of the cache "
            f"works. Fix: {damage.fix}",
        )

    # -- cross-process single flight --------------------------------------------------------
    #
    # A key's lock file lives only while held: its holder removes it before letting go, so no
    # file is left per key. A process that then gets the lock on the removed file sees that
    # its name no longer leads to it, and locks the file there now instead.

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[bool]:
        """Hold the per-key file lock (``wait_lock``), so processes on this host compile a key
        once. Yields whether the lock is held; without working locks (or a writable cache) it
        yields False and the caller goes on unlocked: a duplicate compile, never a failed
        request."""
        held = self.wait_lock(key)
        try:
            yield held.held
        finally:
            held.release()

    def try_lock(self, key: str) -> KeyLock | None:
        """The key's lock if nobody holds it now; never blocks. None: another process (or
        another open of this cache dir) holds it now. ``held=False``: this cache cannot lock."""
        _check_key(key)
        taken = self._lock_now(key)
        if isinstance(taken, KeyLock):
            return taken
        close_files(taken)
        return None

    def wait_lock(
        self, key: str, *, timeout: float = LOCK_TIMEOUT, cancel: threading.Event | None = None
    ) -> KeyLock:
        """The key's lock, once whoever holds it lets go. The blocking flock runs in a daemon
        thread, so it is taken as soon as the holder lets go (no polling) and a holder that
        never does cannot keep the interpreter from exiting; this thread waits for it. After
        ``timeout`` seconds (with a warning), or once ``cancel`` is set, it returns unheld
        (``held=False``: go on unlocked), and a lock the thread gets later is let go at once.
        """
        _check_key(key)
        if cancel is not None and cancel.is_set():
            return KeyLock()
        taken = self._lock_now(key)
        if isinstance(taken, KeyLock):
            return taken
        name = _lock_name(key)

        def take(left: threading.Event) -> LockFiles | None:
            files: LockFiles | None = taken
            while files is not None:
                try:
                    fcntl.flock(files[1], fcntl.LOCK_EX)
                    if same_file(files[1], files[0], name):
                        return files
                except BaseException:
                    close_files(files)
                    raise
                close_files(files)  # the holder removed it as it let go: lock the file there now
                files = None if left.is_set() else self._open_lock(key)
            return None

        started = time.monotonic()
        try:
            files = wait_in_thread(
                take, timeout=timeout, cancel=cancel, give_back=lambda f: let_go(f, name)
            )
        except OSError as exc:
            self._no_locks(exc)
            return KeyLock()
        if files is not None:
            return KeyLock.holding(files, name)
        if not (cancel is not None and cancel.is_set()) and time.monotonic() - started >= timeout:
            logger.warning(
                "waited %.0f s for another process to compile %s; compiling here", timeout, key[:16]
            )
        return KeyLock()

    def _lock_now(self, key: str) -> KeyLock | LockFiles:
        """The key's lock if it is free (held), a KeyLock that is not held if this cache
        cannot lock, or the open lock files when another holds the lock."""
        name = _lock_name(key)
        while True:
            files = self._open_lock(key)
            if files is None:
                return KeyLock()
            try:
                fcntl.flock(files[1], fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return files
            except OSError as exc:
                close_files(files)
                self._no_locks(exc)
                return KeyLock()
            if same_file(files[1], files[0], name):
                return KeyLock.holding(files, name)
            close_files(files)  # the holder removed it as it let go: lock the file there now

    def _no_locks(self, exc: OSError) -> None:
        self.locking = False
        self._warn_once(
            "locking",
            f"file locks do not work on {self.dir} ({exc}); going on without, so processes "
            "sharing this cache may compile the same kernel more than once",
        )

    def _open_lock(self, key: str) -> LockFiles | None:
        """The key's shard folder and its lock file (made if missing), both open; or None."""
        if not (self.locking and self.writable and fcntl is not None):
            return None
        name = _lock_name(key)
        try:
            shard = self._open(_VERSION, key[:2], make=True)
            if shard is None:
                return None
            try:
                fd, _ = self._open_file(
                    shard, name, key[:2], os.O_RDWR, create=self.policy.lock_mode
                )
            except _Damaged as exc:  # not a lock file: removed, and this compile unlocked
                logger.warning("removing %s: it is %s", exc.damage.path, exc.damage.problem)
                remove_at(shard, name, file_id(exc.info) if exc.info is not None else None)
                os.close(shard)
                return None
            except BaseException:
                os.close(shard)
                raise
            else:
                return shard, fd
        except (_Damaged, _RootError, OSError) as exc:
            self._write_failed(exc, key, count=False)
            return None

    # -- walking the shards ------------------------------------------------------------------

    def scan(self) -> list[EntryInfo]:
        """Every current entry, and removal of tmp files left by writers that died."""
        return list(self.survey().entries)

    def survey(self) -> Survey:
        """Every current entry, and every damaged item skipped: a shard that is a link, not
        a folder, unreadable or untrusted; anything but a trusted regular file at a key's name;
        a folder at a tmp file's name, and what a request set aside. Removes tmp files left by
        writers that died, never a folder. Works on an untrusted tree too (it lists and
        removes, never loads)."""
        damaged: list[Damage] = []
        found: list[_Found] = []
        version = self._open_version(damaged)
        if version is not None:
            with closing(version):
                found = self._walk(version, damaged)
        return Survey(tuple(self._info(entry) for entry in found), tuple(damaged))

    def listing(self, *, summaries: bool = True) -> Listing:
        """``survey`` with what each entry's header says, most recently used first, for
        ``aionvrtc cache ls`` and ``info``: one walk of the shards, the summaries from the
        index. An entry the index does
        not know is read, and the index then rebuilt from this walk (if this user can write
        it). ``summaries=False``: an entry the index holds a summary for gets an empty one
        (whether each header can be read is all that is asked)."""
        damaged: list[Damage] = []
        version = self._open_version(damaged)
        if version is None:
            return Listing(self.dir, (), (), (), (), tuple(damaged))
        with closing(version):
            mark = self._index.start(version) if self.writable else None
            found = self._walk(version, damaged)
            found.sort(key=_LAST_USED, reverse=True)
            snapshot = self._index.read(version) if self.trusted else None
            records, read = self._records(version, found, snapshot)
            if mark is not None and (read or _out_of_date(snapshot, records)):
                self._known = self._index.install(version, mark, dict(records)) or self._known
            elif snapshot is not None:
                self._known = snapshot.totals
            keys = tuple(entry[0] for entry in found)
            raw = [records[key][2] for key in keys]
            parsed = (
                parse_summaries(raw) if summaries else [{} if r != b"null" else None for r in raw]
            )
            headers = tuple(
                header if header is not None else self._summary_of_entry(version, key)
                for key, header in zip(keys, parsed, strict=True)
            )
        sizes = tuple(entry[1] for entry in found)
        last_used = tuple(entry[2] for entry in found)
        return Listing(self.dir, keys, sizes, last_used, headers, tuple(damaged))

    def describe(self, entry: EntryInfo) -> dict[str, Any] | str:
        """The header of ``entry`` (key, kind, arch, NVRTC version, names, created), read
        without the image and not verified; else what stops it being read. Never raises."""
        try:
            shard = self._open(_VERSION, entry.key[:2], check=False)
            if shard is None:
                return "removed"
            with closing(shard):
                return self._header_at(shard, entry.key)
        except _Damaged as exc:
            return exc.damage.problem
        except (_RootError, OSError) as exc:
            return str(exc) or type(exc).__name__

    def _header_at(self, shard: int, key: str) -> dict[str, Any] | str:
        """``describe`` of the entry ``key`` in the open folder ``shard``."""
        try:
            fd, info = self._open_file(shard, key, key[:2])
            with closing(fd):
                return read_header(cast(BinaryIO, _Reader(fd, info.st_size)))
        except _Damaged as exc:
            return exc.damage.problem
        except (CacheCorruptError, OSError, ValueError, RecursionError) as exc:
            return str(exc) or type(exc).__name__

    def _summary_of_entry(self, version: int, key: str) -> dict[str, Any] | str:
        """The summary of an entry whose record has none, from the entry (one that the index
        found unreadable, or whose names are too long to keep): or what stops it being read."""
        try:
            shard = self._open(_VERSION, key[:2], check=False, parent=version)
        except (_Damaged, OSError) as exc:
            return exc.damage.problem if isinstance(exc, _Damaged) else str(exc)
        if shard is None:
            return "removed"
        with closing(shard):
            header = self._header_at(shard, key)
        return summary_fields(header) if isinstance(header, dict) else header

    def _open_version(self, damaged: list[Damage]) -> int | None:
        """The version folder, open without the trust check (a walk lists, and removes from,
        an untrusted tree too, never loading from it); None if missing or damaged (the damage
        added to ``damaged``)."""
        try:
            return self._open(_VERSION, check=False)
        except _Damaged as exc:
            damaged.append(exc.damage)
        except _RootError:
            pass
        return None

    def _walk(self, version: int, damaged: list[Damage]) -> list[_Found]:
        """Every entry in the trusted shards of ``version``, and what is damaged (see
        ``survey``); tmp files left by writers that died are removed."""
        found: list[_Found] = []
        file_problem = self.policy.file_problem
        stale_before = time.time() - STALE_TMP_SECONDS
        for shard, name in self._shards(version, damaged, stale_before):
            try:
                with os.scandir(shard) as listing:
                    files = list(listing)
            except OSError as exc:
                folder = self.dir / name
                fix = self._shard_fix(folder, None)
                damaged.append(Damage(folder, f"not listable ({exc.strerror})", fix))
                continue
            for step, file in enumerate(files):
                breathe(step)
                key = file.name
                if len(key) == 64 and key.startswith(name) and _KEY.fullmatch(key):
                    try:
                        info = file.stat(follow_symlinks=False)
                    except OSError:
                        continue  # removed meanwhile
                    problem = file_problem(info)
                    if problem is None:
                        found.append((key, info.st_size, info.st_mtime, info.st_dev, info.st_ino))
                    else:
                        damaged.append(_removable(self.dir / name / key, problem))
                elif key.endswith(_TMP_SUFFIX) or ASIDE in key:
                    self._odd_item(shard, name, key, stale_before, damaged)
        return found

    def _odd_item(
        self, folder: int, name: str, item: str, stale_before: float, damaged: list[Damage]
    ) -> None:
        """A tmp file or an item set aside in the shard ``name`` (or "": the version folder):
        a tmp file left by a writer that died is removed; a folder at a tmp name, and what was
        set aside, are reported, never removed (that could take as long as the tree is big)."""
        info = _stat(item, dir_fd=folder)
        if info is None:
            return
        path = self.dir / name / item
        if not item.endswith(_TMP_SUFFIX):
            where = "an entry or lock" if name else "the index"
            damaged.append(
                _removable(path, f"{kind_of(info)} set aside: it was found where {where} belongs")
            )
        elif stat.S_ISDIR(info.st_mode):
            damaged.append(_removable(path, f"{kind_of(info)}, not a regular file"))
        elif info.st_mtime < stale_before:
            remove_at(folder, item, file_id(info))

    def _shards(
        self, version: int, damaged: list[Damage], stale_before: float
    ) -> Iterator[tuple[int, str]]:
        """Each trusted shard folder of ``version``, open, and its name; what is damaged on
        the way is added to ``damaged``. The version folder's own tmp files (a rebuilt index
        that a process did not finish) are tidied as a shard's are."""
        try:
            names = os.listdir(version)
        except OSError:
            names = []
        for item in names:
            if item.startswith(INDEX_TMP_PREFIX) and (item.endswith(_TMP_SUFFIX) or ASIDE in item):
                self._odd_item(version, "", item, stale_before, damaged)
        for name in sorted(n for n in names if _SHARD.fullmatch(n)):
            try:
                shard = self._open(_VERSION, name, parent=version)
            except _Damaged as exc:
                damaged.append(exc.damage)
                continue
            except OSError:
                continue  # removed by a concurrent clear
            if shard is not None:
                with closing(shard):
                    yield shard, name

    def _named_shards(self, version: int, names: Iterable[str]) -> Iterator[tuple[int, str]]:
        """The shards ``names`` of ``version``, each open, and its name; those missing or
        damaged are left out (a walk reports them). No listing: the names are known."""
        for name in sorted(names):
            try:
                shard = self._open(_VERSION, name, check=False, parent=version)
            except (_Damaged, OSError):
                continue
            if shard is not None:
                with closing(shard):
                    yield shard, name

    def _records(
        self, version: int, found: list[_Found], snapshot: Snapshot | None
    ) -> tuple[dict[str, Record], int]:
        """Index records for ``found``: the index's own where it has one for the same file
        (inode and size), else from the entry's header, read now; and how many were read."""
        known = snapshot.records if snapshot is not None else {}
        records: dict[str, Record] = {}
        unknown: dict[str, list[_Found]] = {}
        for step, entry in enumerate(found):
            breathe(step)
            key, size, _, _, ino = entry
            record = known.get(key)
            if record is not None and record[0] == ino and record[1] == size:
                records[key] = record
            else:
                records[key] = (ino, size, b"null")
                unknown.setdefault(key[:2], []).append(entry)
        if unknown:
            for shard, name in self._named_shards(version, unknown):
                for key, size, _, _, ino in unknown[name]:
                    header = self._header_at(shard, key)
                    if isinstance(header, dict):
                        records[key] = (ino, size, summary(header))
        return records, sum(map(len, unknown.values()))

    def _info(self, entry: _Found) -> EntryInfo:
        return EntryInfo(entry[0], entry[1], entry[2], self.dir)

    # -- size management ---------------------------------------------------------------------
    #
    # A write adds its entry to the index and reads the new totals from it; when they are over
    # the limit (or the index must be rebuilt) a background thread walks the shards once,
    # evicts down to the low-water mark and rebuilds the index from the same walk. Explicit
    # eviction, pruning and clearing walk once, in the caller's thread.

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

    def _maintain_safely(self) -> bool:
        try:
            return self._maintain()
        except Exception:  # a bug: told once, never the traceback of a dying thread
            if self._first("maintenance"):
                logger.warning(
                    "maintenance of the disk cache at %s failed; entries are still read and "
                    "written", self.dir, exc_info=True,
                )  # fmt: skip
            return False

    def _maintain(self) -> bool:
        """One pass: nothing if the index is in order and the cache within its limit, else an
        eviction (which rebuilds the index). False if it could not bring the cache within its
        limit or leave an index that parses."""
        try:
            version = self._open(_VERSION)
        except (_Damaged, _RootError):
            return False
        if version is None:
            return True  # removed, or found untrusted: nothing to keep in order
        with closing(version):
            if not self._due(self._index.totals(version)) or not _flock_now(version):
                return True  # in order, or another process (or tier) is at it now
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
            return left <= self.limit and self._index.totals(version) is not None

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

    def discard(self, key: str) -> bool:
        _check_key(key)
        version = self._open_version([])
        if version is None:
            return False
        with closing(version):
            try:
                shard = self._open(_VERSION, key[:2], check=False, parent=version)
            except (_Damaged, OSError):
                return False
            if shard is None:
                return False
            with closing(shard):
                gone = remove_at(shard, key, None)
            if gone is not None and stat.S_ISREG(gone.st_mode) and self.writable:
                self._removed(self._index.remove(version, [(key, gone.st_size)]))
        return gone is not None

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
        with self._walking:
            mark = self._index.start(version) if self.writable else None
            found = self._walk(version, damaged)
            removed = self._remove_found(version, choose(found))
            gone = {entry[0] for entry in removed}
            kept = [e for step, e in enumerate(found) if e[0] not in gone and _kept(step)]
            index = None
            if mark is not None:
                snapshot = self._index.read(version)
                records, read = self._records(version, kept, snapshot)
                if removed or read or _out_of_date(snapshot, records):
                    index = self._index.install(version, mark, records)
                elif snapshot is not None:
                    index = snapshot.totals  # in order: nothing to rebuild
            if index is None and removed and self.writable:  # another rebuild came first
                index = self._index.remove(version, [(entry[0], entry[1]) for entry in removed])
            if index is not None:
                self._known = index
            if removed and event is not None:
                self._log_event(event, len(removed))
            return _Swept(kept, removed, index)

    def _remove_found(self, version: int, victims: list[_Found]) -> list[_Found]:
        """Remove ``victims`` (each only if it is still the file found) and their lock files,
        opening each shard once; those removed."""
        shards: dict[str, list[_Found]] = {}
        for entry in victims:
            shards.setdefault(entry[0][:2], []).append(entry)
        removed: list[_Found] = []
        for shard, name in self._named_shards(version, shards):
            for entry in shards[name]:
                key, _, _, dev, ino = entry
                if remove_at(shard, key, (dev, ino)) is not None:
                    removed.append(entry)
                remove_at(shard, _lock_name(key), None)
        return removed

    # -- events shared by the processes that use this cache dir ------------------------------

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

    # -- for `aionvrtc doctor` -----------------------------------------------------------------

    def probe_write(self) -> str | None:
        """Make the cache folders (with this tier's modes) and write the probe entry as a
        write does, then remove it, its lock file and its shard folder if that is left empty;
        None if that worked, else what failed."""
        try:
            version = self._open(_VERSION, make=True)
            if version is None:
                return f"not trusted: {self.trust_problem}" if self.trust_problem else "removed"
            with closing(version):
                shard = self._open(_VERSION, PROBE_KEY[:2], make=True, parent=version)
                if shard is None:
                    raise FileNotFoundError(errno.ENOENT, "removed while in use")
                with closing(shard):
                    self._write_entry(shard, PROBE_KEY, b"probe")
                    os.unlink(PROBE_KEY, dir_fd=shard)
                    remove_at(shard, _lock_name(PROBE_KEY), None)  # doctor's lock
                with contextlib.suppress(OSError):  # a shard holding entries stays
                    os.rmdir(PROBE_KEY[:2], dir_fd=version)
        except _Damaged as exc:
            return str(exc.damage)
        except (_RootError, OSError) as exc:
            error = exc.error if isinstance(exc, _RootError) else exc
            return error.strerror or str(error)
        return None

    # -- bookkeeping -----------------------------------------------------------------------

    def _count(self, counter: str) -> None:
        with self._lock:
            setattr(self, counter, getattr(self, counter) + 1)

    def _first(self, topic: str) -> bool:
        """Whether ``topic`` comes up for the first time in this tier (for one warning)."""
        with self._lock:
            if topic in self._warned:
                return False
            self._warned.add(topic)
            return True

    def _warn_once(self, topic: str, message: str) -> None:
        if self._first(topic):
            logger.warning(message)


class _Reader:
    """An open entry as a file for ``read_header``: a read never asks for (or allocates) more
    than the file held when it was opened, whatever length a crafted header claims."""

    def __init__(self, fd: int, size: int) -> None:
        self._fd = fd
        self._left = size

    def read(self, n: int = -1) -> bytes:
        n = self._left if n < 0 else min(n, self._left)
        data = read_up_to(self._fd, n, n)
        self._left -= len(data)
        return data


def _check_key(key: str) -> None:
    if not _KEY.fullmatch(key):
        raise ValueError(f"not a cache key (64 lowercase hex digits): {key!r}")


def _lock_name(key: str) -> str:
    return f".{key}{_LOCK_SUFFIX}"


def _header_of(artifact: Artifact) -> dict[str, Any]:
    """The header fields of ``artifact`` that its index record summarises."""
    return {
        "kind": artifact.kind,
        "arch": artifact.arch,
        "nvrtc_version": artifact.nvrtc_version,
        "created": artifact.created,
        "lowered_names": artifact.lowered_names,
    }


def _bytes(found: list[_Found]) -> int:
    """The bytes of ``found``: a sum that pauses in a paced thread (see _fs.paced)."""
    total = 0
    for step, entry in enumerate(found):
        breathe(step)
        total += entry[1]
    return total


def _kept(step: int) -> bool:
    breathe(step)
    return True


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


def _out_of_date(snapshot: Snapshot | None, records: dict[str, Record]) -> bool:
    """Whether the index read as ``snapshot`` differs from ``records`` (a walk's, every one
    of them found in it) or is due a rebuild."""
    if snapshot is None or snapshot.totals.due(time.time()):
        return True
    totals = snapshot.totals
    size = sum(record[1] for record in records.values())
    return len(snapshot.records) != len(records) or (totals.entries, totals.bytes) != (
        len(records), size,
    )  # fmt: skip


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


def _removable(path: Path, problem: str) -> Damage:
    """Damage whose fix is to remove it: an item in a shard that the cache does not use."""
    return Damage(path, problem, f"rm -r {path}")


def _raise_if_not_a_file(exc: OSError, dir_fd: int, name: str, path: Path) -> None:
    """Raise _Damaged when an open failed because something else is at the name: a link
    (O_NOFOLLOW), a folder (opened for writing), a FIFO or socket (no reader, non-blocking)."""
    if exc.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
        return
    info = _stat(name, dir_fd=dir_fd)
    what = kind_of(info) if info is not None else "not a regular file"
    raise _Damaged(_removable(path, f"{what}, not a regular file"), info) from exc


def _owner_mode(info: os.stat_result | None) -> str:
    if info is None:
        return ""
    return f"; owner uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o}"
