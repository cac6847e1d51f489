"""File operations relative to an open folder that the disk tier, its index and its locks share:
never following a link, never blocking on a FIFO, never removing a tree inside a request."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = [
    "ASIDE",
    "DIR_FLAGS",
    "FILE_FLAGS",
    "FileId",
    "breathe",
    "closing",
    "file_id",
    "kind_of",
    "let_go_of",
    "paced",
    "paced_total",
    "read_up_to",
    "remove_at",
    "same_file",
    "stat_or_none",
    "unpaced",
]

# Python work between two pauses of a paced thread, in loop steps (about a millisecond), and the
# pause: long enough for a thread waiting on the GIL to wake and take it.
PACE_STEPS = 512
PAUSE = 100e-6  # seconds
_pace = threading.local()


@contextlib.contextmanager
def paced() -> Iterator[None]:
    """Within it, ``breathe()`` in this thread lets other threads run: the background upkeep
    of a cache dir (a walk of 50,000 entries, the index rebuilt) is a second of Python that
    would otherwise give up the GIL only when the interpreter forces it, every 5 ms. A read in
    another thread gives the GIL up at each of its eight or so system calls and then waits up
    to that long to take it back: 40 ms a read. Work in the caller's own thread is not paced."""
    _pace.on = True
    try:
        yield
    finally:
        _pace.on = False


@contextlib.contextmanager
def unpaced() -> Iterator[None]:
    """Within it, ``breathe()`` does not pause, paced thread or not: for work that holds a lock
    other processes wait on (the index's), which must be let go as soon as it can be."""
    was = getattr(_pace, "on", False)
    _pace.on = False
    try:
        yield
    finally:
        _pace.on = was


def paced_total(sizes: Iterable[int]) -> int:
    """The sum of ``sizes``, breathing at each step (see ``paced``): a walk's 50,000 entries."""
    total = 0
    for step, size in enumerate(sizes):
        breathe(step)
        total += size
    return total


def let_go_of(items: list[Any] | dict[Any, Any]) -> None:
    """Empty ``items`` in a paced thread a slice at a time, breathing between: the last
    reference to 50,000 entries dropped at once holds the GIL while they are freed (about 3 ms).
    Elsewhere it is left to be freed as it is."""
    if not getattr(_pace, "on", False):
        return
    if isinstance(items, dict):
        for step in range(len(items)):
            breathe(step)
            items.popitem()
    else:
        while items:
            del items[-PACE_STEPS:]
            breathe(0)


def breathe(step: int) -> None:
    """Called at each ``step`` of a long loop: every PACE_STEPS steps of a paced thread, pause."""
    if not step % PACE_STEPS and getattr(_pace, "on", False):
        time.sleep(PAUSE)


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_NOCTTY = getattr(os, "O_NOCTTY", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
# Every file of the cache is opened with these: a FIFO does not block the open (or a later read),
# a link planted at the name is refused (ELOOP) rather than followed, a terminal does not become
# the process's controlling one.
FILE_FLAGS = _NONBLOCK | _NOFOLLOW | _NOCTTY | _CLOEXEC
DIR_FLAGS = os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC
# A folder found at an entry's or lock's name is renamed ".<name>.damaged-<hex>" in its folder:
# removing it could take as long as the tree in it is deep or large, inside a request.
ASIDE = ".damaged-"
# Reads go in steps of at most this much, so a file that grows while it is read cannot make
# one read call allocate more.
_READ_STEP = 16 << 20  # bytes (16 MiB)


FileId = tuple[int, int]  # st_dev, st_ino: which file a name leads to


def file_id(info: os.stat_result) -> FileId:
    return info.st_dev, info.st_ino


def remove_at(dir_fd: int, name: str, expected: FileId | None) -> os.stat_result | None:
    """Remove ``name`` in the folder ``dir_fd`` unless it is no longer the file ``expected``
    (another process may have put a good entry there meanwhile); what was removed, or None. A
    folder is renamed aside in the same folder instead, for survey to report: this runs inside
    requests, and removing a folder takes as long as the tree in it is deep or large."""
    try:
        now = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if expected is not None and file_id(now) != expected:
            return None
        if stat.S_ISDIR(now.st_mode):
            aside = f".{name.lstrip('.')}{ASIDE}{secrets.token_hex(4)}"
            os.rename(name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        else:
            os.unlink(name, dir_fd=dir_fd)
    except OSError:  # all that stat, rename and unlink raise
        return None
    return now


def same_file(fd: int, dir_fd: int, name: str) -> bool:
    """Whether ``name`` in the folder ``dir_fd`` is still the file open as ``fd``."""
    now = stat_or_none(name, dir_fd=dir_fd)
    return now is not None and file_id(now) == file_id(os.fstat(fd))


def stat_or_none(
    path: str | os.PathLike[str], *, dir_fd: int | None = None, follow: bool = False
) -> os.stat_result | None:
    try:
        return os.stat(path, dir_fd=dir_fd, follow_symlinks=follow)
    except OSError:
        return None


def read_up_to(fd: int, limit: int, expected: int) -> bytes:
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


def kind_of(info: os.stat_result) -> str:
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


@contextlib.contextmanager
def closing(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)
