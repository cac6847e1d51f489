"""The disk tier: one self-verifying file per entry, written atomically, shared by processes.

Layout: ``<root>/v<FORMAT_VERSION>/<key[:2]>/<key>``. Other format versions live in sibling
folders and are never read as current entries. Every operation here is blocking and meant to run
whole in one worker-thread hop.

Nothing in the cache dir can fail or hang a request: files are opened without blocking (a FIFO)
and without following links, checked with fstat before they are read, and every operation below
the cache root works relative to an open folder, so a folder swapped for a link is never
followed. An entry is code that runs on the GPU, so entries are read only from a tree that
nobody else can write, as ssh does for ``~/.ssh`` (see ``Policy``).
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
from collections.abc import Container, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast

from .._artifact import _KEY, Artifact, decode, encode, read_header
from .._exceptions import CacheCorruptError
from .._spec import FORMAT_VERSION
from .._units import env_flag, parse_size

try:
    import fcntl
except ImportError:  # not POSIX: no cross-process single flight
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "EVENT_KINDS",
    "PROBE_KEY",
    "Damage",
    "DiskTier",
    "EntryInfo",
    "Policy",
    "Survey",
    "default_cache_dir",
    "default_disk_limit",
    "default_shared_cache",
]

logger = logging.getLogger("aionvrtc")

ENV_CACHE_DIR = "AIONVRTC_CACHE_DIR"
ENV_DISK_LIMIT = "AIONVRTC_DISK_LIMIT"
ENV_SHARED_CACHE = "AIONVRTC_SHARED_CACHE"
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
LOCK_POLL = 0.002  # seconds between looks at a held key lock, at most (was 50 ms: 49 ms late)
_LOCK_SUFFIX = ".lock"
# Corrupt entries dropped, evictions and prunes, appended by every process as "<time> <kind>
# <count>" lines (O_APPEND writes of one short line are atomic), so that `aionvrtc cache info`
# can report them for the cache dir, not for one process. Only its tail is read: the file grows
# by one short line per event and is never rotated.
_EVENTS = ".events"
_EVENTS_TAIL = 4 << 20  # bytes (4 MiB: about 150,000 events)
EVENT_KINDS = ("corrupt", "evicted", "pruned")
# Reads go in steps of at most this much, so a file that grows while it is read cannot make
# one read call allocate more.
_READ_STEP = 16 << 20  # bytes (16 MiB)

_VERSION = f"v{FORMAT_VERSION}"
_SHARD = re.compile(r"[0-9a-f]{2}")
_TMP_SUFFIX = ".tmp"
# A folder found at an entry's or lock's name is renamed ".<name>.damaged-<hex>" in its shard:
# removing it could take as long as the tree in it is deep or large, inside a request.
_ASIDE = ".damaged-"
# `aionvrtc doctor` writes this entry and takes its lock (no content hashes to it), then removes
# both; one per process, so that two doctors do not wait for each other.
PROBE_KEY = f"{os.getpid():064x}"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_NOCTTY = getattr(os, "O_NOCTTY", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
# Every file of the cache is opened with these: a FIFO does not block the open (or a later read),
# a link planted at the name is refused (ELOOP) rather than followed, a terminal does not become
# the process's controlling one.
_FILE_FLAGS = _NONBLOCK | _NOFOLLOW | _NOCTTY | _CLOEXEC
_DIR_FLAGS = os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC
_ROOT_FLAGS = os.O_RDONLY | _DIRECTORY | _CLOEXEC  # the root may be a link: ~/.cache elsewhere
# Errors that say the file system takes no writes at all, whichever folder they come from.
_FILE_SYSTEM_REFUSES = {errno.EROFS, errno.ENOSPC, errno.EDQUOT}
_DENIED = {errno.EACCES, errno.EPERM}


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


def default_shared_cache() -> bool:
    """``$AIONVRTC_SHARED_CACHE`` (1/0, true/false, yes/no, on/off), else False."""
    return env_flag(ENV_SHARED_CACHE)


@dataclass(frozen=True, slots=True)
class EntryInfo:
    """One entry as the file system sees it; ``last_used`` is its mtime (hits refresh it)."""

    key: str
    path: Path
    size: int
    last_used: float


@dataclass(frozen=True, slots=True)
class Damage:
    """Something in the cache dir that is not used: where, what is wrong, a fix that works."""

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
class Policy:
    """Whom the cache trusts and the modes it creates.

    Private (the default), ssh's rule for ``~/.ssh``: a folder or file is trusted when this user
    (euid) or root owns it (root: a cache baked into an image) and neither group nor others can
    write it. Shared (an explicit opt-in): owned by this user, root or any user of a group this
    user is in, writable by that group but never by others; folders are made setgid, so files
    take the folder's group.
    """

    shared: bool
    uid: int
    groups: frozenset[int]

    @classmethod
    def current(cls, shared: bool) -> Policy:
        return cls(shared, os.geteuid(), frozenset((os.getegid(), *os.getgroups())))

    @property
    def dir_mode(self) -> int:
        return 0o2770 if self.shared else 0o700

    @property
    def entry_mode(self) -> int:
        return 0o640 if self.shared else 0o600

    @property
    def lock_mode(self) -> int:  # lock and event files: every user of the cache writes them
        return 0o660 if self.shared else 0o600

    def _ours(self, info: os.stat_result) -> bool:
        return info.st_uid in (self.uid, 0) or (self.shared and info.st_gid in self.groups)

    def _owner_problem(self, info: os.stat_result) -> str:
        mode = stat.S_IMODE(info.st_mode)
        return (
            f"owned by uid {info.st_uid} (mode {mode:04o}), not by this user (uid {self.uid}) "
            "or root"
        )

    def problem(self, info: os.stat_result) -> str | None:
        """Why a folder or file of the cache tree is not trusted (after "is"), or None."""
        mode = stat.S_IMODE(info.st_mode)
        if not self._ours(info):
            return self._owner_problem(info)
        if mode & 0o002:
            return f"writable by others (owner uid {info.st_uid}, mode {mode:04o})"
        if mode & 0o020 and not (self.shared and info.st_gid in self.groups):
            return f"writable by group {info.st_gid} (owner uid {info.st_uid}, mode {mode:04o})"
        return None

    def file_problem(self, info: os.stat_result) -> str | None:
        """Why a file of the cache (an entry, a lock, the event log) is not used, or None."""
        if not stat.S_ISREG(info.st_mode):
            return f"{_kind(info)}, not a regular file"
        return self.problem(info)

    def ancestor_problem(self, info: os.stat_result) -> str | None:
        """Why a folder above the cache dir lets others replace it (after "is"), or None: a
        folder that others can write without the sticky bit (as /tmp has) lets them rename
        what is inside."""
        mode = stat.S_IMODE(info.st_mode)
        if not self._ours(info):
            return self._owner_problem(info)
        if mode & 0o002 and not mode & stat.S_ISVTX:
            return f"writable by others without the sticky bit (mode {mode:04o})"
        return None


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

    # -- trust -------------------------------------------------------------------------------

    def check_tree(self) -> Damage | None:
        """What makes the cache dir untrusted among the folders above it (by the path given
        and by the real path), or None. The dir and its version folder are checked each time
        they are opened (``_open``)."""
        given = Path(os.path.abspath(self.root))
        real = Path(os.path.realpath(self.root))
        for folder in sorted({*given.parents, *real.parents}, key=lambda p: len(p.parts)):
            info = _stat(folder, follow=True)
            if info is None:
                continue  # made by this tier when it first writes
            problem = self.policy.ancestor_problem(info)
            if problem is not None:
                return Damage(folder, problem, self._tree_fix(folder, info, ancestor=True))
        return None

    def _tree_fix(self, path: Path, info: os.stat_result, *, ancestor: bool = False) -> str:
        """A fix that works for an untrusted folder of the tree: chmod (or chgrp) when it is
        ours, else a cache dir of one's own, or the shared opt-in where that would trust it."""
        mode = stat.S_IMODE(info.st_mode)
        if info.st_uid == self.policy.uid:
            foreign = info.st_gid not in self.policy.groups
            if self.policy.shared and not ancestor and mode & 0o020 and foreign:
                # chmod o-w leaves a group this user is not in able to write
                if mode & 0o002:
                    return f"chmod go-w {path}"
                return f"chgrp {os.getegid()} {path}, or chmod g-w {path}"
            bits = "o-w" if self.policy.shared or ancestor else "go-w"
            fix = f"chmod {bits} {path}"
            if not self.policy.shared and not ancestor and mode & 0o020 and not mode & 0o002:
                fix += f", or share it with group {info.st_gid}: {ENV_SHARED_CACHE}=1"
            return fix
        fix = f"use a cache dir of your own ({ENV_CACHE_DIR}=/a/folder/you/own)"
        if not self.policy.shared and info.st_gid in self.policy.groups and not mode & 0o002:
            fix += (
                f", or, if you trust every user of group {info.st_gid}, opt in to a shared "
                f"cache: {ENV_SHARED_CACHE}=1 (shared_cache=True)"
            )
        return fix

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
        if make:
            try:
                if level:
                    self._make_dir(names[-1], dir_fd)
                else:
                    self._make_root()
            except OSError as exc:  # the folder above refuses: every shard would
                raise _RootError(exc) from exc
            if check and self.trust_problem is not None:
                return None  # a folder above the root, made or changed meanwhile
        try:
            name, flags = (names[-1], _DIR_FLAGS) if level else (self._root, _ROOT_FLAGS)
            fd = os.open(name, flags, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            info = _stat(names[-1], dir_fd=dir_fd) if level else None
            path = self.root.joinpath(*names)
            if level and exc.errno in (errno.ELOOP, errno.ENOTDIR):
                what = _kind(info) if info is not None else "not a folder"
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
                return fd
            os.close(fd)
            path = self.root.joinpath(*names)
            fix = self._tree_fix(path, info) if level < 2 else self._shard_fix(path, info)
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

    def _make_dir(self, name: str, dir_fd: int | None = None) -> None:
        """Make folder ``name`` with this tier's mode, set with fchmod so that the umask cannot
        strip a shared folder's group bits; an existing one is left as it is."""
        try:
            os.mkdir(name, self.policy.dir_mode, dir_fd=dir_fd)
        except FileExistsError:
            return
        with contextlib.suppress(OSError), _closing(os.open(name, _DIR_FLAGS, dir_fd=dir_fd)) as fd:
            os.fchmod(fd, self.policy.dir_mode)

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
                    name, flags | os.O_CREAT | os.O_EXCL | _FILE_FLAGS, create, dir_fd=dir_fd
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
                fd = os.open(name, flags | _FILE_FLAGS, dir_fd=dir_fd)
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

    # -- reading ---------------------------------------------------------------------------

    def read(self, key: str, *, arch: str | None = None) -> Artifact | None:
        """The verified entry for ``key``, or None. A bad entry is deleted and counted; a
        damaged shard or an untrusted tree is a miss."""
        _check_key(key)
        artifact = None
        try:
            shard = self._open(_VERSION, key[:2])
            if shard is not None:
                try:
                    artifact = self._read_entry(shard, key, arch)
                finally:
                    os.close(shard)
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
        self._count("misses" if artifact is None else "hits")
        return artifact

    def _read_entry(self, shard: int, key: str, arch: str | None) -> Artifact | None:
        try:
            fd, info = self._open_file(shard, key, key[:2])
        except FileNotFoundError:
            return None
        except _Damaged as exc:
            self._drop(shard, key, exc.info, exc.damage.problem)
            return None
        try:
            if info.st_size > MAX_ENTRY_BYTES:
                raise CacheCorruptError(f"corrupt cache entry: {info.st_size} bytes")
            data = _read_up_to(fd, MAX_ENTRY_BYTES + 1, info.st_size)
            if len(data) > MAX_ENTRY_BYTES:
                raise CacheCorruptError("corrupt cache entry: grew while it was read")
            artifact = decode(data, expected_key=key, expected_arch=arch)
        except CacheCorruptError as exc:
            self._drop(shard, key, info, str(exc))
            return None
        else:
            # Recency for LRU eviction; a read-only cache just keeps its order.
            with contextlib.suppress(OSError):
                os.utime(fd)
        finally:
            os.close(fd)
        return artifact

    def _drop(self, shard: int, key: str, opened: os.stat_result | None, reason: str) -> None:
        self._count("corrupt")
        self._log_event("corrupt", 1)
        logger.warning("dropping disk cache entry %s: %s", self.path(key), reason)
        _remove_at(shard, key, opened)

    # -- writing ---------------------------------------------------------------------------

    def write(self, artifact: Artifact) -> bool:
        """Store ``artifact`` atomically. False (and one warning) if the disk cannot take it."""
        if not self.writable:
            return False
        data = encode(artifact)
        if len(data) > self.limit:
            return False
        try:
            shard = self._open(_VERSION, artifact.key[:2], make=True)
            if shard is None:
                return False  # the tree was found untrusted (or removed) just now
            with _closing(shard):
                self._write_entry(shard, artifact.key, data)
        except (_Damaged, _RootError, OSError) as exc:
            self._write_failed(exc, artifact.key, count=True)
            return False
        with self._lock:
            self.writes += 1
            if self._approx_bytes is not None:
                self._approx_bytes += len(data)
            over = self._approx_bytes is None or self._approx_bytes > self.limit
        if over:
            self.evict()
        return True

    def _write_entry(self, shard: int, key: str, data: bytes) -> None:
        """Write a tmp file, fsync it and rename it over the entry: a reader sees the old
        entry or the new one, never part of one."""
        tmp = f".{key}.{os.getpid()}.{secrets.token_hex(4)}{_TMP_SUFFIX}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FILE_FLAGS
        fd = os.open(tmp, flags, self.policy.entry_mode, dir_fd=shard)
        try:
            with os.fdopen(fd, "wb") as file:
                os.fchmod(fd, self.policy.entry_mode)
                file.write(data)
                file.flush()
                os.fsync(fd)
            os.replace(tmp, key, src_dir_fd=shard, dst_dir_fd=shard)
        except BaseException:
            _remove_at(shard, tmp, None)
            raise

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

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[bool]:
        """Hold the per-key file lock, so processes on this host compile a key once.

        Yields whether the lock is held; without working locks (or a writable cache) it yields
        False and the caller goes on unlocked: a duplicate compile, never a failed request.

        The lock file lives only while held: its holder removes it before letting go, so no
        file is left per key. A waiter that then gets the lock on the removed file sees that
        its name no longer leads to it, and locks the file there now instead.
        """
        deadline = time.monotonic() + LOCK_TIMEOUT
        name = f".{key}{_LOCK_SUFFIX}"
        while True:
            opened = self._open_lock(key)
            if opened is None:
                yield False
                return
            shard, fd = opened
            try:
                locked = self._acquire(fd, key, deadline)
                current = locked and _same_file(fd, shard, name)
                if locked and not current:
                    continue  # the holder removed the file as it let go: lock the new one
                try:
                    yield locked
                finally:
                    if locked:
                        _remove_at(shard, name, os.fstat(fd))
                        fcntl.flock(fd, fcntl.LOCK_UN)
                return
            finally:
                os.close(fd)
                os.close(shard)

    def _open_lock(self, key: str) -> tuple[int, int] | None:
        """The key's shard folder and its lock file (made if missing), both open; or None."""
        if not (self.locking and self.writable and fcntl is not None):
            return None
        name = f".{key}{_LOCK_SUFFIX}"
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
                _remove_at(shard, name, exc.info)
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

    def _acquire(self, fd: int, key: str, deadline: float) -> bool:
        assert fcntl is not None
        delay = 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                # Another process is compiling this key; poll (a blocking flock could not be
                # abandoned) with a backoff capped at LOCK_POLL: the kernel arrives at most
                # that late after the other's release, for one flock call per poll.
                if time.monotonic() > deadline:
                    logger.warning(
                        "waited %.0f s for another process to compile %s; compiling here",
                        LOCK_TIMEOUT,
                        key[:16],
                    )
                    return False
                time.sleep(delay)
                delay = min(delay * 2, LOCK_POLL)
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
        return list(self.survey().entries)

    def survey(self) -> Survey:
        """Every current entry, and every damaged item skipped: a shard that is a link, not
        a folder, unreadable or untrusted; anything but a trusted regular file at a key's name;
        a folder at a tmp file's name, and what a request set aside. Removes tmp files left by
        writers that died, never a folder. Works on an untrusted tree too (it lists and
        removes, never loads)."""
        entries: list[EntryInfo] = []
        damaged: list[Damage] = []
        stale_before = time.time() - STALE_TMP_SECONDS
        for shard, name in self._shards(damaged):
            folder = self.dir / name
            try:
                with os.scandir(shard) as listing:
                    files = list(listing)
            except OSError as exc:
                fix = self._shard_fix(folder, None)
                damaged.append(Damage(folder, f"not listable ({exc.strerror})", fix))
                continue
            for file in files:
                try:
                    info = file.stat(follow_symlinks=False)
                except OSError:
                    continue
                path = folder / file.name
                if file.name.endswith(_TMP_SUFFIX):
                    if stat.S_ISDIR(info.st_mode):
                        damaged.append(_removable(path, f"{_kind(info)}, not a regular file"))
                    elif info.st_mtime < stale_before:
                        _remove_at(shard, file.name, info)
                elif _ASIDE in file.name:
                    aside = f"{_kind(info)} set aside: it was found where an entry or lock belongs"
                    damaged.append(_removable(path, aside))
                elif _KEY.fullmatch(file.name) and file.name[:2] == name:
                    problem = self.policy.file_problem(info)
                    if problem is None:
                        entries.append(EntryInfo(file.name, path, info.st_size, info.st_mtime))
                    else:
                        damaged.append(_removable(path, problem))
        return Survey(tuple(entries), tuple(damaged))

    def _shards(
        self, damaged: list[Damage], only: Container[str] | None = None, *, check: bool = True
    ) -> Iterator[tuple[int, str]]:
        """Each shard folder (of those named ``only``; trusted ones when ``check``), open, and
        its name; what is damaged on the way is added to ``damaged``. The cache root and
        version folder are not checked: an untrusted tree is listed (and cleared) too."""
        try:
            version = self._open(_VERSION, check=False)
        except _Damaged as exc:
            damaged.append(exc.damage)
            return
        except _RootError:
            return
        if version is None:
            return
        with _closing(version):
            try:
                names = sorted(n for n in os.listdir(version) if _SHARD.fullmatch(n))
            except OSError:
                names = []
            for name in names if only is None else (n for n in names if n in only):
                try:
                    shard = self._open(_VERSION, name, check=check, parent=version)
                except _Damaged as exc:
                    damaged.append(exc.damage)
                    continue
                except OSError:
                    continue  # removed by a concurrent clear
                if shard is not None:
                    with _closing(shard):
                        yield shard, name

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
        victims = []
        for entry in sorted(entries, key=lambda e: e.last_used):
            stale = cutoff is not None and entry.last_used < cutoff
            if not stale and (max_bytes is None or total <= max_bytes):
                break  # the rest are newer: neither stale nor needed to make room
            victims.append(entry.key)
            total -= entry.size
        self._approx_bytes = total
        return self._remove_keys(victims, locks=True)

    def _remove_keys(self, keys: list[str], *, locks: bool) -> int:
        """Remove the entries of ``keys`` (and their lock files), opening each shard once; how
        many entries went."""
        shards: dict[str, list[str]] = {}
        for key in keys:
            shards.setdefault(key[:2], []).append(key)
        removed = 0
        for shard, name in self._shards([], only=shards, check=False):
            for key in shards[name]:
                removed += _remove_at(shard, key, None)
                if locks:
                    _remove_at(shard, f".{key}{_LOCK_SUFFIX}", None)
        return removed

    def describe(self, entry: EntryInfo) -> dict[str, Any] | str:
        """The header of ``entry`` (key, kind, arch, NVRTC version, names, created), read
        without the image and not verified; else what stops it being read. Never raises."""
        try:
            shard = self._open(_VERSION, entry.key[:2], check=False)
            if shard is None:
                return "removed"
            with _closing(shard):
                fd, info = self._open_file(shard, entry.key, entry.key[:2])
                with _closing(fd):
                    return read_header(cast(BinaryIO, _Reader(fd, info.st_size)))
        except _Damaged as exc:
            return exc.damage.problem
        except (_RootError, CacheCorruptError, OSError, ValueError, RecursionError) as exc:
            return str(exc) or type(exc).__name__

    # -- events shared by the processes that use this cache dir ------------------------------

    def _log_event(self, kind: str, count: int) -> None:
        line = f"{time.time():.3f} {kind} {count}\n".encode()
        try:
            version = self._open(_VERSION, check=False)
            if version is None:
                return
            with _closing(version):
                mode = self.policy.lock_mode
                flags = os.O_WRONLY | os.O_APPEND
                fd, _ = self._open_file(version, _EVENTS, "", flags, create=mode)
            with _closing(fd):
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
            with _closing(version):
                fd, info = self._open_file(version, _EVENTS, "")
            with _closing(fd):
                start = max(0, info.st_size - _EVENTS_TAIL)
                os.lseek(fd, start, os.SEEK_SET)
                lines = _read_up_to(fd, _EVENTS_TAIL, info.st_size - start).splitlines()
        except (_Damaged, _RootError, OSError):
            return totals
        for raw in lines[1:] if start else lines:  # the first line of a tail may be cut
            parts = raw.split()
            if len(parts) == 3 and parts[1].decode(errors="replace") in totals:
                with contextlib.suppress(ValueError):
                    totals[parts[1].decode()] += int(parts[2])
        return totals

    def discard(self, key: str) -> bool:
        _check_key(key)
        return self._remove_keys([key], locks=False) > 0

    def clear(self) -> int:
        """Remove every entry of this format version; safe while other processes use it."""
        removed = self._remove_keys([e.key for e in self.scan()], locks=True)
        with self._lock:
            self._approx_bytes = 0
        return removed

    # -- for `aionvrtc doctor` -----------------------------------------------------------------

    def probe_write(self) -> str | None:
        """Make the cache folders (with this tier's modes) and write the probe entry as a
        write does, then remove it, its lock file and its shard folder if that is left empty;
        None if that worked, else what failed."""
        try:
            version = self._open(_VERSION, make=True)
            if version is None:
                return f"not trusted: {self.trust_problem}" if self.trust_problem else "removed"
            with _closing(version):
                shard = self._open(_VERSION, PROBE_KEY[:2], make=True, parent=version)
                if shard is None:
                    raise FileNotFoundError(errno.ENOENT, "removed while in use")
                with _closing(shard):
                    self._write_entry(shard, PROBE_KEY, b"probe")
                    os.unlink(PROBE_KEY, dir_fd=shard)
                    _remove_at(shard, f".{PROBE_KEY}{_LOCK_SUFFIX}", None)  # doctor's lock
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

    def _warn_once(self, topic: str, message: str) -> None:
        with self._lock:
            if topic in self._warned:
                return
            self._warned.add(topic)
        logger.warning(message)


class _Reader:
    """An open entry as a file for ``read_header``: a read never asks for (or allocates) more
    than the file held when it was opened, whatever length a crafted header claims."""

    def __init__(self, fd: int, size: int) -> None:
        self._fd = fd
        self._left = size

    def read(self, n: int = -1) -> bytes:
        n = self._left if n < 0 else min(n, self._left)
        data = _read_up_to(self._fd, n, n)
        self._left -= len(data)
        return data


def _check_key(key: str) -> None:
    if not _KEY.fullmatch(key):
        raise ValueError(f"not a cache key (64 lowercase hex digits): {key!r}")


def _removable(path: Path, problem: str) -> Damage:
    """Damage whose fix is to remove it: an item in a shard that the cache does not use."""
    return Damage(path, problem, f"rm -r {path}")


def _read_up_to(fd: int, limit: int, expected: int) -> bytes:
    """At most ``limit`` bytes of ``fd``, up to its end, in bounded steps (``expected``: the
    size fstat gave, so a whole file usually takes one read call)."""
    step = min(max(expected + 1, 1 << 16), _READ_STEP)
    parts = []
    left = limit
    while left > 0:
        chunk = os.read(fd, min(left, step))
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _raise_if_not_a_file(exc: OSError, dir_fd: int, name: str, path: Path) -> None:
    """Raise _Damaged when an open failed because something else is at the name: a link
    (O_NOFOLLOW), a folder (opened for writing), a FIFO or socket (no reader, non-blocking)."""
    if exc.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
        return
    info = _stat(name, dir_fd=dir_fd)
    what = _kind(info) if info is not None else "not a regular file"
    raise _Damaged(_removable(path, f"{what}, not a regular file"), info) from exc


def _remove_at(dir_fd: int, name: str, expected: os.stat_result | None) -> bool:
    """Remove ``name`` in the folder ``dir_fd`` unless it is no longer what was ``expected``
    (another process may have put a good entry there meanwhile). A folder is renamed aside in
    the same folder instead, for survey to report: this runs inside requests, and removing a
    folder takes as long as the tree in it is deep or large."""
    try:
        now = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if expected is not None and (now.st_ino, now.st_dev) != (expected.st_ino, expected.st_dev):
            return False
        if stat.S_ISDIR(now.st_mode):
            aside = f".{name.lstrip('.')}{_ASIDE}{secrets.token_hex(4)}"
            os.rename(name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        else:
            os.unlink(name, dir_fd=dir_fd)
    except OSError:  # all that stat, rename and unlink raise
        return False
    return True


def _same_file(fd: int, dir_fd: int, name: str) -> bool:
    """Whether ``name`` in the folder ``dir_fd`` is still the file open as ``fd``."""
    now = _stat(name, dir_fd=dir_fd)
    opened = os.fstat(fd)
    return now is not None and (now.st_ino, now.st_dev) == (opened.st_ino, opened.st_dev)


def _stat(
    path: str | os.PathLike[str], *, dir_fd: int | None = None, follow: bool = False
) -> os.stat_result | None:
    try:
        return os.stat(path, dir_fd=dir_fd, follow_symlinks=follow)
    except OSError:
        return None


def _kind(info: os.stat_result) -> str:
    mode = info.st_mode
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "a device"


def _owner_mode(info: os.stat_result | None) -> str:
    if info is None:
        return ""
    return f"; owner uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o}"


@contextlib.contextmanager
def _closing(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)
