"""What every part of the disk tier stands on: its constants and records (entries, damage,
listings, stats), and ``DiskBase``, a cache dir opened safely (trust checked, links never
followed, FIFOs never blocking), its counters and warnings. ``_survey``, ``_upkeep`` and
``disk`` build the tier on it."""

from __future__ import annotations

import contextlib
import errno
import logging
import operator
import os
import re
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import _config
from .._artifact import _KEY, Artifact
from .._config import ENV_CACHE_DIR, ENV_DISK_LIMIT, ENV_SHARED_CACHE
from .._spec import FORMAT_VERSION
from ._fork import reset_in_forked_child
from ._fs import (
    DIR_FLAGS,
    FILE_FLAGS,
    closing,
    kind_of,
    read_up_to,
)
from ._fs import stat_or_none as _stat
from ._index import (
    INDEX_NAME,
    Index,
    Record,
    Snapshot,
    Totals,
)
from ._trust import Damage, Policy, route

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
    """``$AIONVRTC_CACHE_DIR`` if set, else the platform's user cache dir for aionvrtc.

    Returns:
        The folder (``~`` expanded), such as ``~/.cache/aionvrtc`` on Linux. It may not exist
        yet: the disk tier makes it at its first write.
    """
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

    Requests that join one in flight for the same key share its lookup, so one cold request,
    or many at once for one key, is one miss. The second look that a compile takes under the
    key's lock is not another miss; if it finds the entry (another process compiled it
    meanwhile), that is a hit. ``DiskStats()``, all zero and neither writable nor trusted, is
    what a cache without a disk tier reports (as ``RemoteStats()`` is for one without a remote
    tier).

    Attributes:
        hits: Lookups that served an entry from disk.
        misses: Lookups that found no entry.
        writes: Entries written.
        corrupt_dropped: Entries that failed verification and were deleted.
        evictions: Entries this tier evicted to keep the cache dir within its limit.
        write_failures: Writes that failed (the kernel is then kept in memory only).
        read_failures: Lookups that failed on an I/O error (the kernel is then compiled).
        writable: Whether the tier takes writes: False once the file system refused them
            (read-only, full).
        trusted: False: the cache dir failed the ownership checks and is not used.
        entries: The entries in the cache dir (every process's), as its index said; None: not
            known yet.
        bytes: Their total size in bytes, as its index said; None: not known yet.
    """

    hits: int = 0
    misses: int = 0
    writes: int = 0
    corrupt_dropped: int = 0
    evictions: int = 0
    write_failures: int = 0
    read_failures: int = 0
    writable: bool = False
    trusted: bool = False
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


class DiskBase:
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
        reset_in_forked_child(self)  # see _after_fork_in_child
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

    def check_tree(self) -> Damage | None:
        """What makes the cache dir untrusted on the way to it (a folder others can rename in,
        a link others own, through every link it resolves through), or None. The dir and its
        version folder are checked each time they are opened (``_open``)."""
        # Missing folders: made at first write, by this tier.
        return self.policy.route_problem(route(self.root), instead=_OWN_CACHE_DIR)

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

    def _warn_shard(self, damage: Damage) -> None:
        self._warn_once(
            f"shard:{damage.path}",
            f"disk cache folder {damage.path} is {damage.problem}: kernels whose keys start "
            f"with {damage.path.name} are compiled and kept in memory, the rest of the cache "
            f"works. Fix: {damage.fix}",
        )

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

    def _after_fork_in_child(self) -> None:
        """What a forked child resets of this tier (the upkeep's state): nothing here."""
