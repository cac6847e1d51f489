"""File locks that are waited for without polling: the blocking ``flock`` runs in a daemon thread,
and the caller waits for that thread with a deadline (and, if given, a cancel event). A waiter
that gives up leaves; the thread lets go of whatever it gets afterwards at once.

A flock belongs to the open file description, which a forked child shares through its copy of
the descriptor: closing a descriptor lets go of the lock only once every copy is closed. So
every lock here is let go by an explicit ``LOCK_UN`` before the close (the parent's unlock frees
it for every process, whatever its children hold), and a child closes its copies of the key
locks its parent holds (``_forget_in_child``), so that a parent that dies does not leave them
held for as long as the child lives."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from ._fs import file_id, remove_at

try:
    import fcntl
except ImportError:  # not POSIX: no cross-process locks at all (see DiskTier.locking)
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "NO_LOCK",
    "KeyLock",
    "LockFiles",
    "close_files",
    "flock_within",
    "flocked",
    "let_go",
    "unlock",
    "wait_in_thread",
]

# A waiter given a cancel event looks at it this often: threading cannot wait on two events at
# once. The thread's result wakes the waiter at once; only a cancel waits up to this long.
CANCEL_CHECK = 0.002  # seconds

T = TypeVar("T")
LockFiles = tuple[int, int]  # (the folder, the lock file), both open


class KeyLock:
    """A key's file lock. held=False: this cache cannot lock (read-only, no flock, untrusted, a
    timeout): the caller goes on unlocked.

    ``release`` is idempotent and safe from any thread; ``held`` is False once it ran.
    """

    __slots__ = ("__weakref__", "_files", "_guard", "_name", "held")

    def __init__(self, held: bool = False) -> None:
        self.held = held
        self._files: LockFiles | None = None
        self._name = ""
        self._guard = threading.Lock()

    @classmethod
    def holding(cls, files: LockFiles, name: str) -> KeyLock:
        """The lock on the file ``name`` of ``files``, which the caller holds (and hands over)."""
        lock = cls(True)
        lock._files, lock._name = files, name
        _HELD.add(lock)
        return lock

    def release(self) -> None:
        """Remove the lock file, then unlock it (see ``let_go``)."""
        with self._guard:
            files, self._files = self._files, None
            self.held = False
        _HELD.discard(self)
        if files is not None:
            let_go(files, self._name)

    def _forget(self) -> None:
        """In a forked child: close this process's copies of the files, neither removing nor
        unlocking them (the lock is the parent's), and count the lock as not held here. The
        guard is made anew: a thread of the parent may have held it, and none runs here."""
        self._guard = threading.Lock()
        files, self._files = self._files, None
        self.held = False
        for fd in files or ():
            with contextlib.suppress(OSError):
                os.close(fd)

    def __repr__(self) -> str:
        return f"KeyLock(held={self.held})"


# What a cache without a disk tier hands out: nothing to lock, nothing to release.
NO_LOCK = KeyLock()
# The key locks this process holds, for a forked child to close its copies of.
_HELD: weakref.WeakSet[KeyLock] = weakref.WeakSet()


def _forget_in_child() -> None:
    for lock in list(_HELD):
        lock._forget()
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def let_go(files: LockFiles, name: str) -> None:
    """Remove ``name`` if it is still the locked file, then unlock it, then close both. The name
    goes first, so no file is left per key (one inode per entry): a waiter that then gets the
    lock on the removed file sees that the name no longer leads to it, and locks the file made
    there since instead."""
    folder, fd = files
    try:
        with contextlib.suppress(OSError):
            remove_at(folder, name, file_id(os.fstat(fd)))
    finally:
        close_files(files)


def close_files(files: LockFiles) -> None:
    """Unlock the lock file (nothing if this open of it holds no lock), then close both."""
    folder, fd = files
    try:
        unlock(fd)
        os.close(fd)
    finally:
        os.close(folder)


def unlock(fd: int) -> None:
    """Let go of ``fd``'s flock, if it holds one. Before every close of a locked file: a
    close lets go only when no forked child holds a copy of the descriptor."""
    if fcntl is not None:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)


@contextlib.contextmanager
def flocked(fd: int, timeout: float) -> Iterator[bool]:
    """``flock_within``, for a with block: yields whether the lock is held, and unlocks it
    on the way out (see ``unlock``)."""
    held = flock_within(fd, timeout)
    try:
        yield held
    finally:
        if held:
            unlock(fd)


def flock_within(fd: int, timeout: float) -> bool:
    """Lock ``fd`` exclusively (flock), waiting at most ``timeout`` seconds: False if another
    holds it that long. Raises OSError if the file system has no flock.

    The wait locks a duplicate of ``fd`` (one open file description, so one lock): the caller
    may close ``fd`` after giving up, and the thread unlocks and closes its duplicate when it
    gets the lock later.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pass
    else:
        return True
    duplicate = os.dup(fd)

    def take(left: threading.Event) -> int:
        try:
            fcntl.flock(duplicate, fcntl.LOCK_EX)
        except BaseException:
            os.close(duplicate)
            raise
        return duplicate

    def give_back(locked: int) -> None:
        unlock(locked)
        os.close(locked)

    taken = wait_in_thread(take, timeout=timeout, cancel=None, give_back=give_back)
    if taken is None:
        return False
    os.close(taken)  # the lock belongs to the open file description, which fd still holds
    return True


def wait_in_thread(
    take: Callable[[threading.Event], T | None],
    *,
    timeout: float,
    cancel: threading.Event | None,
    give_back: Callable[[T], None],
) -> T | None:
    """``take(left)`` run in a daemon thread (a blocking flock: one that never returns must not
    keep the interpreter from exiting), waited for at most ``timeout`` seconds or until
    ``cancel`` is set: its result, or None when the wait ended first (or ``take`` gave up).

    What ``take`` gets after the waiter left goes to ``give_back`` at once; ``left`` is set when
    the waiter leaves, for ``take`` to stop between blocking steps. An exception ``take`` raises
    while it is waited for is raised here.
    """
    handoff: _Handoff[T] = _Handoff(give_back)
    threading.Thread(target=handoff.run, args=(take,), name="aionvrtc-flock", daemon=True).start()
    return handoff.wait(timeout, cancel)


class _Handoff(Generic[T]):
    """Passes ``take``'s result from the thread to the waiter, or to ``give_back`` once the
    waiter left: whichever of the two comes second (under the mutex) decides."""

    def __init__(self, give_back: Callable[[T], None]) -> None:
        self._give_back = give_back
        self._mutex = threading.Lock()
        self._done = threading.Event()
        self._left = threading.Event()
        self._result: T | None = None
        self._error: BaseException | None = None

    def run(self, take: Callable[[threading.Event], T | None]) -> None:
        result: T | None = None
        error: BaseException | None = None
        try:
            result = take(self._left)
        except BaseException as exc:  # handed to the waiter, or dropped once it left
            error = exc
        with self._mutex:
            if not self._left.is_set():
                self._result, self._error = result, error
                self._done.set()
                return
        if result is not None:
            self._give_back(result)

    def wait(self, timeout: float, cancel: threading.Event | None) -> T | None:
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                step = left if cancel is None else min(left, CANCEL_CHECK)
                if self._done.wait(max(step, 0.0)):
                    return self._outcome()
                cancelled = cancel is not None and cancel.is_set()
                if cancelled or time.monotonic() >= deadline:
                    return self._leave(keep=not cancelled)
        except BaseException:  # the waiter was interrupted: nobody will release what comes
            self._leave(keep=False)
            raise

    def _leave(self, *, keep: bool) -> T | None:
        """Stop waiting; what the thread got just before, if anything, is kept or given back."""
        with self._mutex:
            if not self._done.is_set():
                self._left.set()
                return None
        if keep:
            return self._outcome()
        if self._result is not None:
            self._give_back(self._result)
        return None

    def _outcome(self) -> T | None:
        if self._error is not None:
            raise self._error
        return self._result
