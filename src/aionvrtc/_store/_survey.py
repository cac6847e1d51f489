"""The disk tier's survey: walking a cache dir and describing its entries."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO, cast

from .._artifact import _KEY, read_header
from .._exceptions import CacheCorruptError
from ._disk_base import (
    _LAST_USED,
    _SHARD,
    _TMP_SUFFIX,
    _VERSION,
    STALE_TMP_SECONDS,
    DiskBase,
    EntryInfo,
    Listing,
    Survey,
    _Damaged,
    _Found,
    _out_of_date,
    _Reader,
    _removable,
    _RootError,
)
from ._fs import (
    ASIDE,
    breathe,
    closing,
    file_id,
    kind_of,
    remove_at,
)
from ._fs import stat_or_none as _stat
from ._index import (
    INDEX_TMP_PREFIX,
    Record,
    Snapshot,
    summary,
    summary_fields,
)
from ._index import summaries as parse_summaries
from ._trust import Damage


class Surveying(DiskBase):
    """Listing a cache dir: one walk of its shards, entries with what their headers or the
    index say, and what is damaged (``aionvrtc cache ls`` and ``info`` read this)."""

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

    def headers_named(self, names: frozenset[str]) -> Iterator[tuple[str, dict[str, Any] | str]]:
        """The whole headers of the kernel entries that share a name expression with
        ``names`` (with no names: of the entries that have none either), most recently used
        first: each entry's key and its header, or why it cannot be read. One walk, then one
        read per such entry.

        Args:
            names: Name expressions.

        Yields:
            (key, header or what stops it being read) per matching entry.
        """
        listing = self.listing()
        for at, key in enumerate(listing.keys):
            summary = listing.headers[at]
            if not isinstance(summary, dict) or summary.get("kind") == "data":
                continue  # unreadable, or a record
            held = frozenset(str(summary.get("names", "")).split("\0")) - {""}
            if not names.isdisjoint(held) if names else not held:
                sized = EntryInfo(key, listing.sizes[at], listing.last_used[at], self.dir)
                yield key, self.describe(sized)

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
