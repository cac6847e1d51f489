"""The disk tier's index: how many entries a cache dir holds and how many bytes, and each entry's
header summary, in one file (``<version folder>/.index``) that every process appends to after
a write or a removal, and that any process can rebuild from the shards.

Layout:

    header   64 bytes: magic, layout, end of the records, records, entries, bytes, time of the
             last rebuild (0: never), generation (random, made with the file), CRC-32 of those
    records  from byte 64 to the header's end of the records, one line each:
             "+ <key> <inode> <size> <summary JSON or null>\\n"   written, or found by a rebuild
             "- <key>\\n"                                          removed

The header's entries and bytes are running totals: a write learns whether the cache is over
its limit from 64 bytes, however many entries there are. Replayed in order, the records give
each entry's inode, size and summary: what ``aionvrtc cache ls`` shows without opening 50,000
files. An append holds an exclusive flock of the file and writes the record at the end of the
records, then the header: a process killed between the two leaves a record past the end, which
the next append overwrites. A rebuild writes a new file and renames it over this one. Every
lock is let go by an explicit unlock, never by closing the file: a forked child's copy of the
descriptor would keep it held for as long as the child lives.

The index is advice: entries are read and verified from their own files, and a process killed
between an entry's rename and its record, a disk full, a lock not had in time, or an entry
removed or changed by hand leave totals that are off until the next rebuild (a walk of the
shards: an eviction, a listing, a prune, or ``Totals.due``). Anything that does not parse is
an index to rebuild, never an error.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import struct
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ._fs import FILE_FLAGS, breathe, closing, paced_total, remove_at, same_file, unpaced
from ._locks import flocked

__all__ = [
    "INDEX_NAME",
    "INDEX_TMP_PREFIX",
    "Index",
    "Mark",
    "Record",
    "Snapshot",
    "Totals",
    "summaries",
    "summary",
    "summary_fields",
]

INDEX_NAME = ".index"
INDEX_TMP_PREFIX = f"{INDEX_NAME}."  # then "<pid>.<hex>.tmp": a rebuild's new file
_MAGIC = b"AIONVIDX"
_LAYOUT = 2  # 2: the generation was added
_HEADER = struct.Struct(
    ">8sHHQQQQdQ"
)  # magic, layout, unused, end, records, entries, bytes, rebuilt, generation
_CRC = struct.Struct(">I")
HEADER_SIZE = 64  # bytes: the header (60) and its CRC (4)
# Bounds on what is read, so that a damaged or planted index costs a rebuild, never memory. A
# record takes about 250 bytes: 50,000 entries take 12 MiB, and records of removed and replaced
# entries are dropped when they outnumber the live ones (COMPACT_SLACK).
MAX_INDEX_BYTES = 256 << 20  # bytes
MAX_SUMMARY = 16 << 10  # bytes of summary JSON per record; longer: null (ls reads the entry)
COMPACT_SLACK = 4096  # records beyond twice the entries before the index is rewritten
REBUILD_AFTER = 24 * 3600.0  # seconds: totals drift (see above) for at most this long
# How long an append waits for another's: appends hold the lock for microseconds, a rebuild's
# swap for about a millisecond. One that waits longer skips its record (the totals drift).
LOCK_WAIT = 1.0  # seconds
PARSE_CHUNK = 32 << 10  # bytes of records parsed, checked and replayed at a time (0.2 ms)

_LINE = re.compile(rb"^([+-]) ([0-9a-f]{64})(?: ([0-9]{1,20}) ([0-9]{1,20}) ([^\n]+))?$", re.M)

# Opens the index file (in the version folder, flags, mode to create it with or 0): the open
# descriptor and its fstat, or None when there is none or something else is at its name. The
# disk tier's, so the hardening of every file of the cache applies (no link, no FIFO, trust).
Opener = Callable[[int, int, int], tuple[int, os.stat_result] | None]


# What the index knows of one entry: its file's inode and size (to tell a record that is out of
# date) and the summary of its header (JSON bytes, or b"null": not known). A plain tuple: the
# garbage collector stops tracking a tuple of plain values (never a NamedTuple), and its passes
# over the 50,000 records of an index would cost more than reading them.
Record = tuple[int, int, bytes]


@dataclass(frozen=True, slots=True)
class Totals:
    """The index header."""

    entries: int
    bytes: int
    records: int
    end: int  # where the records end (and the next one goes)
    rebuilt: float  # time.time() of the last rebuild from the shards; 0: never
    # Random, drawn when the file is made and kept by its appends: which index file this is.
    # (st_dev, st_ino) alone is not enough: ext4 gives a removed file's inode number to the
    # next file made, so a rebuild's Mark could match an index made since.
    generation: int

    def due(self, now: float) -> bool:
        """Whether the index should be rebuilt: never was, long ago (or in the future: a clock
        or a file that is off), or its records are mostly of entries removed or replaced."""
        fresh = self.rebuilt > 0 and 0 <= now - self.rebuilt <= REBUILD_AFTER
        return not fresh or self.records > 2 * self.entries + COMPACT_SLACK


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The index as one read of it found it: the header and the records replayed."""

    totals: Totals
    records: dict[str, Record]


@dataclass(frozen=True, slots=True)
class Mark:
    """Where a rebuild began: which index file, and where its records ended. The records after
    that are the writes and removals made during the rebuild, applied over its result."""

    file: tuple[int, int]  # st_dev, st_ino
    generation: int  # of its header (see Totals.generation)
    end: int

    @classmethod
    def of(cls, info: os.stat_result, totals: Totals) -> Mark:
        return cls((info.st_dev, info.st_ino), totals.generation, totals.end)


def summary_fields(header: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of an entry's header that listings show, its untrusted values as they are
    (the reader checks them): ``lowered_names`` becomes ``names``, the sorted names joined by
    NUL (which no name expression can hold: NVRTC takes C strings). One string, not a list: a
    dict of plain values is left alone by the garbage collector, and a listing holds 50,000."""
    names = header.get("lowered_names")
    return {
        "kind": header.get("kind"),
        "arch": header.get("arch"),
        "nvrtc_version": header.get("nvrtc_version"),
        "created": header.get("created"),
        "names": "\0".join(sorted(map(str, names))) if isinstance(names, Mapping) else "",
    }


def summary(header: Mapping[str, Any]) -> bytes:
    """``summary_fields`` as a record's JSON; b"null" if too long to keep."""
    text = json.dumps(summary_fields(header), separators=(",", ":")).encode()
    return text if len(text) <= MAX_SUMMARY else b"null"


def summaries(raw: list[bytes]) -> list[dict[str, Any] | None]:
    """Records' summaries parsed (None: null or not an object), all in one parse when they all
    are well formed: one call instead of 50,000."""
    try:
        parsed = json.loads(b"[" + b",".join(raw) + b"]")
    except (ValueError, RecursionError):
        parsed = None
    if not isinstance(parsed, list) or len(parsed) != len(raw):  # a record holding "1,2"
        parsed = [_one_summary(text) for text in raw]
    return [item if isinstance(item, dict) else None for item in parsed]


def _one_summary(text: bytes) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def added(key: str, record: Record) -> bytes:
    return b"+ %s %d %d %s\n" % (key.encode(), *record)


def removed(key: str) -> bytes:
    return b"- %s\n" % key.encode()


class Index:
    """The index of one version folder. Blocking; every method takes the open version folder
    and never raises OSError: a missing, damaged or busy index comes back as None, and the
    caller rebuilds it (``start``, then ``install``)."""

    def __init__(self, opener: Opener, mode: int) -> None:
        self._open = opener
        self._mode = mode  # of the file: every user of the cache writes it

    def create(self, version: int) -> None:
        """An empty index for a version folder made just now (nothing in it to rebuild from);
        nothing if there is one already."""
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | FILE_FLAGS
        try:
            with closing(os.open(INDEX_NAME, flags, self._mode, dir_fd=version)) as fd:
                os.fchmod(fd, self._mode)
                _pwrite_all(fd, _pack(_empty(time.time())), 0)
        except OSError:
            return

    def totals(self, version: int) -> Totals | None:
        """The header alone: a few syscalls, however many entries there are."""
        try:
            opened = self._open(version, os.O_RDONLY, 0)
            if opened is None:
                return None
            with closing(opened[0]) as fd:
                return _unpack(os.pread(fd, HEADER_SIZE, 0), _size_after(fd))
        except OSError:
            return None

    def add(self, version: int, key: str, record: Record, replaced: int | None) -> Totals | None:
        """Record a write of ``key`` (``replaced``: the size of the entry it replaced)."""
        size = record[1]
        entries, size = (1, size) if replaced is None else (0, size - replaced)
        return self._append(version, added(key, record), 1, entries, size)

    def remove(self, version: int, gone: Iterable[tuple[str, int]]) -> Totals | None:
        """Record the removal of entries (key, size)."""
        keys, sizes = [], 0
        for key, size in gone:
            keys.append(removed(key))
            sizes += size
        if not keys:
            return self.totals(version)
        return self._append(version, b"".join(keys), len(keys), -len(keys), -sizes)

    def _append(
        self, version: int, lines: bytes, count: int, entries: int, size: int
    ) -> Totals | None:
        try:
            for _ in range(3):  # a rebuild may swap the file while this waits for its lock
                opened = self._open(version, os.O_RDWR, 0)
                if opened is None:
                    return None
                with closing(opened[0]) as fd, flocked(fd, LOCK_WAIT) as held:
                    if not held:
                        return None
                    if not same_file(fd, version, INDEX_NAME):
                        continue
                    totals = _unpack(os.pread(fd, HEADER_SIZE, 0), os.fstat(fd).st_size)
                    if totals is None or totals.end + len(lines) > MAX_INDEX_BYTES:
                        return None
                    _pwrite_all(fd, lines, totals.end)
                    totals = Totals(
                        max(0, totals.entries + entries), max(0, totals.bytes + size),
                        totals.records + count, totals.end + len(lines), totals.rebuilt,
                        totals.generation,
                    )  # fmt: skip
                    _pwrite_all(fd, _pack(totals), 0)
                    return totals
        except OSError:
            return None
        return None

    def read(self, version: int) -> Snapshot | None:
        """The index replayed, read without its lock: records before the header's end never
        change, and a rebuild renames a new file over this one."""
        try:
            opened = self._open(version, os.O_RDONLY, 0)
            if opened is None:
                return None
            with closing(opened[0]) as fd:
                totals = _unpack(os.pread(fd, HEADER_SIZE, 0), _size_after(fd))
                if totals is None:
                    return None
                body = _pread_all(fd, totals.end - HEADER_SIZE, HEADER_SIZE)
        except OSError:
            return None
        if len(body) != totals.end - HEADER_SIZE:
            return None
        records: dict[str, Record] = {}
        for ops in _parsed(body):  # a slice at a time: no list of every record is made
            if ops is None:
                return None
            _replay(ops, records)
        return Snapshot(totals, records)

    def start(self, version: int) -> Mark | None:
        """Where a rebuild starts; a fresh, empty index is made first when there is none that
        parses, so that writes made during the rebuild are recorded somewhere. None (nothing
        changed) if the index is busy for longer than LOCK_WAIT."""
        try:
            for _ in range(3):  # a rebuild may swap the file while this waits for its lock
                opened = self._open(version, os.O_RDONLY, 0)
                if opened is None:
                    return self._fresh(version)  # none, or something else at its name
                with closing(opened[0]) as fd:
                    totals = _unpack(os.pread(fd, HEADER_SIZE, 0), opened[1].st_size)
                    if totals is not None:
                        return Mark.of(opened[1], totals)
                    # Read again under the lock before throwing the index away: a read that
                    # overlaps an append's header write may see part of it and fail the CRC.
                    with flocked(fd, LOCK_WAIT) as held:
                        if not held:
                            return None
                        if not same_file(fd, version, INDEX_NAME):
                            continue
                        info = os.fstat(fd)
                        totals = _unpack(os.pread(fd, HEADER_SIZE, 0), info.st_size)
                        if totals is not None:
                            return Mark.of(info, totals)
                        return self._fresh(version)  # locked: no append is lost to the swap
        except OSError:
            return None
        return None

    def _fresh(self, version: int) -> Mark:
        """Swap in an empty index, never rebuilt; where a rebuild starts from it."""
        fresh = _empty(0.0)
        file = self._swap_in(version, lambda fd: _pwrite_all(fd, _pack(fresh), 0))
        return Mark(file, fresh.generation, fresh.end)

    def install(self, version: int, mark: Mark, records: dict[str, Record]) -> Totals | None:
        """Replace the index with ``records`` (a rebuild's; updated in place) and the records
        appended to it since ``mark``. None, and nothing changed, if the index is no longer the
        one marked (another rebuild came first) or is busy for longer than LOCK_WAIT."""
        # Grown a line at a time: a join makes a list of every line, and copying then freeing it
        # holds the GIL for milliseconds in one go.
        body = bytearray()
        for line in _lines(records):
            body += line
        # Summed here, paced: under the lock below only the records appended since are added.
        size = paced_total(record[1] for record in records.values())
        try:
            opened = self._open(version, os.O_RDWR, 0)
            if opened is None:
                return None
            info = opened[1]
            with closing(opened[0]) as fd:
                if (info.st_dev, info.st_ino) != mark.file:
                    return None
                with flocked(fd, LOCK_WAIT) as held:  # held until the new file is in place
                    if not held:
                        return None
                    with unpaced():  # appends from every process wait for this lock
                        return self._install_locked(version, fd, mark, records, body, size=size)
        except OSError:
            return None

    def _install_locked(
        self,
        version: int,
        fd: int,
        mark: Mark,
        records: dict[str, Record],
        body: bytearray,
        *,
        size: int,
    ) -> Totals | None:
        """``install``, holding the lock of the index open as ``fd``; ``size``: the bytes of
        ``records``. Nothing here walks every record: it holds the lock (and, as the
        maintenance thread may, the GIL) for as little as it can."""
        totals = _unpack(os.pread(fd, HEADER_SIZE, 0), os.fstat(fd).st_size)
        if totals is None or totals.generation != mark.generation:
            return None  # another index at the same inode (see Totals.generation)
        if not same_file(fd, version, INDEX_NAME):
            return None
        tail = _pread_all(fd, max(0, totals.end - mark.end), mark.end)
        ops = _records_of(tail)
        if ops is None:
            ops, tail = [], b""  # not records: dropped (the rebuild saw most of them)
        lines = len(records) + len(ops)
        size += _replay(ops, records)
        end = HEADER_SIZE + len(body) + len(tail)
        if end > MAX_INDEX_BYTES:
            return None
        rebuilt = Totals(len(records), size, lines, end, time.time(), _generation())

        def fill(new: int) -> None:
            # In three writes, not one of the three joined: a copy of megabytes holds the GIL.
            _pwrite_all(new, _pack(rebuilt), 0)
            _pwrite_all(new, body, HEADER_SIZE)
            _pwrite_all(new, tail, HEADER_SIZE + len(body))

        self._swap_in(version, fill)
        return rebuilt

    def _swap_in(self, version: int, fill: Callable[[int], None]) -> tuple[int, int]:
        """Write a new index file (``fill`` writes it) and rename it over the index; its
        (st_dev, st_ino). Something else at the name (a folder) is set aside first."""
        tmp = f"{INDEX_TMP_PREFIX}{os.getpid()}.{secrets.token_hex(4)}.tmp"
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | FILE_FLAGS
        try:
            with closing(os.open(tmp, flags, self._mode, dir_fd=version)) as fd:
                os.fchmod(fd, self._mode)  # the umask must not strip a shared file's group bits
                fill(fd)
                info = os.fstat(fd)
            try:
                os.replace(tmp, INDEX_NAME, src_dir_fd=version, dst_dir_fd=version)
            except IsADirectoryError:
                remove_at(version, INDEX_NAME, None)
                os.replace(tmp, INDEX_NAME, src_dir_fd=version, dst_dir_fd=version)
        except BaseException:
            remove_at(version, tmp, None)
            raise
        return info.st_dev, info.st_ino


_Op = tuple[bytes, bytes, bytes, bytes, bytes]  # "+" or "-", key, inode, size, summary


def _parsed(body: bytes) -> Iterator[list[_Op] | None]:
    """The records of ``body``, a slice of about PARSE_CHUNK bytes at a time, each checked;
    None, and nothing after it, for a slice that is not all records. A slice at a time, so a
    paced consumer can pause between them (``_replay`` does at its first step): one
    ``findall`` over 50,000 records holds the GIL for 40 ms, and freeing the list it makes
    about 5 ms more."""
    if body and not body.endswith(b"\n"):
        yield None
        return
    start = 0
    while start < len(body):
        end = body.find(b"\n", start + PARSE_CHUNK) + 1 or len(body)
        ops: list[_Op] = _LINE.findall(body, start, end)
        if len(ops) != body.count(b"\n", start, end):
            yield None
            return
        for op, _, _, size, _ in ops:
            if (op == b"+") != bool(size):
                yield None
                return
        yield ops
        start = end


def _records_of(body: bytes) -> list[_Op] | None:
    """The records of ``body``, checked; None if anything in it is not a record."""
    ops: list[_Op] = []
    for chunk in _parsed(body):
        if chunk is None:
            return None
        ops += chunk
    return ops


def _lines(records: dict[str, Record]) -> Iterator[bytes]:
    for step, (key, record) in enumerate(records.items()):
        breathe(step)
        yield added(key, record)


def _replay(ops: list[_Op], records: dict[str, Record]) -> int:
    """Apply ``ops`` to ``records``; by how many bytes their total changed."""
    change = 0
    for step, (_, raw, ino, size, text) in enumerate(ops):
        breathe(step)
        key = raw.decode()
        old = records.get(key)
        if old is not None:
            change -= old[1]
        if size:
            records[key] = (int(ino), int(size), text)
            change += int(size)
        elif old is not None:
            del records[key]
    return change


def _generation() -> int:
    return secrets.randbits(64)


def _empty(rebuilt: float) -> Totals:
    """The header of a new index file that holds no records."""
    return Totals(0, 0, 0, HEADER_SIZE, rebuilt, _generation())


def _pack(totals: Totals) -> bytes:
    head = _HEADER.pack(
        _MAGIC, _LAYOUT, 0, totals.end, totals.records, totals.entries, totals.bytes,
        totals.rebuilt, totals.generation,
    )  # fmt: skip
    return (head + _CRC.pack(zlib.crc32(head))).ljust(HEADER_SIZE, b"\0")


def _unpack(data: bytes, file_size: int) -> Totals | None:
    """The header ``data`` holds, or None if it is not one. ``file_size``: the file's, which
    its records must fit in (a header that says otherwise would have a read allocate, or an
    append write a hole of, up to MAX_INDEX_BYTES)."""
    if len(data) < HEADER_SIZE:
        return None
    head = data[: _HEADER.size]
    if _CRC.unpack_from(data, _HEADER.size)[0] != zlib.crc32(head):
        return None
    magic, layout, _, end, records, entries, size, rebuilt, generation = _HEADER.unpack(head)
    if magic != _MAGIC or layout != _LAYOUT or not math.isfinite(rebuilt):
        return None
    if not HEADER_SIZE <= end <= min(MAX_INDEX_BYTES, file_size):
        return None
    return Totals(entries, size, records, end, rebuilt, generation)


def _size_after(fd: int) -> int:
    """The file's size, asked after its header was read (unlocked): an append writes its
    records before the header that counts them, so this size covers what that header says. (The
    size when the file was opened may not: an append in between makes a good header look
    damaged, and maintenance would then back off.)"""
    return os.fstat(fd).st_size


def _pwrite_all(fd: int, data: bytes | bytearray, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        if written <= 0:
            raise OSError(f"wrote nothing at {offset}")
        view, offset = view[written:], offset + written


def _pread_all(fd: int, size: int, offset: int) -> bytes:
    parts = []
    while size > 0:
        chunk = os.pread(fd, size, offset)
        if not chunk:
            break
        parts.append(chunk)
        size -= len(chunk)
        offset += len(chunk)
    return b"".join(parts)
