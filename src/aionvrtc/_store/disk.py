"""The disk tier: one self-verifying file per entry, written atomically, shared by processes.

Layout: ``<root>/v<FORMAT_VERSION>/<key[:2]>/<key>``, and in the version folder the index
(``.index``: the entries' total size and header summaries, see ``_index``) and the event log
(``.events``). Other format versions live in sibling folders and are never read as current
entries. Every operation here is blocking and meant to run whole in one worker-thread hop.

No request lists a folder: a write learns from the index's 64-byte header whether the cache is
over its limit, and the work that walks every shard (eviction down to the low-water mark, and
rebuilding the index when it is missing, damaged, stale or mostly dead records) runs in one
background daemon thread per tier (``_maintenance``), and from 10,000 entries on in a child
process that thread waits for (``_upkeep_child``), sharing no GIL with the requests. Recency is
each entry's mtime, refreshed by a read.

Nothing in the cache dir can fail or hang a request: files are opened without blocking (a FIFO)
and without following links, checked with fstat before they are read, and every operation below
the cache root works relative to an open folder, so a folder swapped for a link is never
followed. An entry is code that runs on the GPU, so entries are read only from a tree that
nobody else can write, as ssh does for ``~/.ssh`` (see ``Policy``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import threading
import time
from collections.abc import Iterator

from .._artifact import Artifact, decode, encode
from .._config import ENV_CACHE_DIR
from .._exceptions import CacheCorruptError
from ._fs import (
    FILE_FLAGS,
    closing,
    file_id,
    read_up_to,
    remove_at,
    same_file,
)
from ._fs import stat_or_none as _stat
from ._index import (
    summary,
)
from ._locks import NO_LOCK, KeyLock, LockFiles, close_files, let_go, wait_in_thread
from ._trust import Damage, Policy
from .tier import Hold, Origin

try:
    import fcntl
except ImportError:  # not POSIX: no cross-process single flight
    fcntl = None  # type: ignore[assignment]
from ._disk_base import (
    _DENIED,
    _FILE_SYSTEM_REFUSES,
    _TMP_SUFFIX,
    _VERSION,
    EVENT_KINDS,
    LOCK_TIMEOUT,
    LOW_WATER,
    MAX_ENTRY_BYTES,
    PROBE_KEY,
    STALE_TMP_SECONDS,
    DiskStats,
    EntryInfo,
    Listing,
    Pruned,
    Survey,
    _check_key,
    _Damaged,
    _header_of,
    _lock_name,
    _owner_mode,
    _RootError,
    default_cache_dir,
    default_disk_limit,
    default_shared_cache,
    logger,
)
from ._upkeep import Upkeep

__all__ = [
    "EVENT_KINDS",
    "LOW_WATER",
    "MAX_ENTRY_BYTES",
    "NO_LOCK",
    "PROBE_KEY",
    "STALE_TMP_SECONDS",
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


class DiskTier(Upkeep):
    """Entries on disk, bounded in bytes with least-recently-used eviction. Thread-safe.

    ``shared_cache`` (default ``$AIONVRTC_SHARED_CACHE``, else False) trusts a tree that a group
    shares and makes new folders and files group-writable; see ``Policy``.
    """

    origin: Origin = "disk"
    local = True

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

    def hold(
        self, key: str, arch: str, *, wait: bool, cancel: threading.Event | None = None
    ) -> Hold | None:
        """The key's file lock (``wait_lock``, or with ``wait=False`` ``try_lock``), then the
        entry read again (``again``), so processes on this host compile a key once: see
        ``tier.Locking``."""
        lock = self.wait_lock(key, cancel=cancel) if wait else self.try_lock(key)
        if lock is None:
            return None
        try:
            found = self.read(key, arch=arch, again=True)  # written while we waited?
        except BaseException:
            lock.release()
            raise
        if found is not None:
            lock.release()
        return Hold(release=lock.release, found=found, held=lock.held and found is None, local=True)

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
