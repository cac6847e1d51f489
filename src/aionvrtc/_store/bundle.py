"""Bundles: many cache entries in one file, to ship a warm cache (``aionvrtc cache export``) and
to read it in place (``BundleTier``) or add it to a cache dir (``aionvrtc cache import``).

Bundle layout (all integers big-endian):

    magic  b"AIONVRTC-BUNDLE1"   16 bytes
    index length L               u64, then the index: canonical JSON (sorted keys, separators
                                 "," and ":", UTF-8) {"entries": [{"key", "arch", "kind",
                                 "nvrtc_version", "offset", "size", "sha256"}, ...] sorted by
                                 key, "format_version": the entries' FORMAT_VERSION,
                                 "signed": bool}; an offset counts from the data section
    index digest                 SHA-256 over magic, length and index, 32 bytes
    signature                    HMAC-SHA256(secret, b"aionvrtc-bundle:1\\0" + index digest),
                                 or 32 zero bytes when unsigned, 32 bytes
    data section                 the entries (the bytes a disk entry holds, see _artifact), in
                                 index order, each right after the one before, nothing after

The index names each entry's SHA-256 and the signature covers the index digest, so one HMAC
vouches for every byte of the file. The secret is the remote tier's (``$AIONVRTC_REMOTE_SECRET``),
and the domain prefix keeps a bundle signature from ever passing for a remote entry's or lock's.

Writing is reproducible: the same set of entries gives the same bytes whatever their order (no
time or path is recorded), so a bundle's SHA-256 names its content. Reading checks every length,
offset and field before using it, so a damaged or crafted file is refused with a BundleError
saying what is wrong, never read out of bounds or made to allocate more than its own size.

A bundle is code that runs on the GPU: read in place or imported, it is first held to a cache
dir's rules of trust (``_distrusted``), so a file that others could have planted is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import mmap
import os
import re
import secrets
import stat
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from .. import _config
from .._artifact import _KEY, Artifact, _bounded_int, decode, encode
from .._config import ENV_REMOTE_SECRET
from .._exceptions import BundleError, CacheCorruptError
from .._spec import FORMAT_VERSION
from ._fs import file_id, kind_of
from ._trust import Damage, Policy, route
from .disk import MAX_ENTRY_BYTES, default_shared_cache
from .tier import LayerStats, Origin

__all__ = [
    "MAGIC",
    "BundleEntry",
    "BundleInfo",
    "BundleTier",
    "environment_secret",
    "verify_bundle",
    "write_bundle",
]

logger = logging.getLogger("aionvrtc")

MAGIC = b"AIONVRTC-BUNDLE1"
SIGN_DOMAIN = b"aionvrtc-bundle:1\0"
_LENGTH = struct.Struct(">Q")
_DIGEST_LEN = 32
_SIGNATURE_LEN = 32
_UNSIGNED = bytes(_SIGNATURE_LEN)
_INDEX_AT = len(MAGIC) + _LENGTH.size
_MIN_SIZE = _INDEX_AT + _DIGEST_LEN + _SIGNATURE_LEN  # and an index of at least "{}"
# bytes of the index, read into memory whole: about 200 bytes an entry, so room for 300,000.
MAX_INDEX_BYTES = 64 << 20
_FIELDS = frozenset(("key", "arch", "kind", "nvrtc_version", "offset", "size", "sha256"))
_TOP = frozenset(("entries", "format_version", "signed"))
_KINDS = ("cubin", "ptx", "data")
_MAX_TEXT = 256  # characters of arch and nvrtc_version, as an entry's header allows
_SHA256 = re.compile(r"[0-9a-f]{64}")
# Bundles are made to be copied to other machines and users: readable by all, as umask allows.
_FILE_MODE = 0o644
# The fix for a bundle whose file or folders are not this user's to change.
_OWN_COPY = "copy it, if you trust where it came from, into a folder of your own"
_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)  # a FIFO at the path does not hang the open
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


@dataclass(frozen=True, slots=True)
class BundleEntry:
    """One entry as the index lists it; ``offset`` counts from the data section."""

    key: str
    arch: str
    kind: str
    nvrtc_version: str
    offset: int
    size: int
    sha256: str


@dataclass(frozen=True, slots=True)
class BundleInfo:
    """What ``write_bundle`` wrote: entries, the file's size and SHA-256, the archs (sorted)."""

    path: Path
    entries: int
    bytes: int
    archs: tuple[str, ...]
    signed: bool
    sha256: str


def environment_secret() -> bytes | None:
    """``$AIONVRTC_REMOTE_SECRET`` as bytes, or None when it is unset or empty."""
    return _config.raw(ENV_REMOTE_SECRET)


def _as_secret(secret: bytes | str | None) -> bytes | None:
    if secret is None:
        return None
    if not secret:
        raise ValueError("secret is empty: pass a long random value, or None")
    return secret.encode() if isinstance(secret, str) else bytes(secret)


def _sign(secret: bytes, digest: bytes) -> bytes:
    return hmac.new(secret, SIGN_DOMAIN + digest, hashlib.sha256).digest()


def _short(key: str) -> str:
    return f"{key[:16]}..."


# -- writing ---------------------------------------------------------------------------------


def write_bundle(
    path: str | os.PathLike[str],
    entries: Iterable[bytes],
    *,
    secret: bytes | str | None = None,
) -> BundleInfo:
    """Write ``entries`` (encoded entries, as a disk entry holds them; each is verified) to a
    bundle at ``path``, atomically (a tmp file in the same folder, fsync, rename), signed with
    ``secret`` when given. The same set of entries gives the same bytes in any order; an entry
    given twice is kept once. Raises CacheCorruptError for an entry that does not verify,
    ValueError for one that no bundle can hold, OSError if ``path`` cannot be written."""
    key_secret = _as_secret(secret)
    chosen: dict[str, tuple[Artifact, bytes]] = {}
    for given in entries:
        data = bytes(given)
        artifact = decode(data)
        key = artifact.key
        if len(data) > MAX_ENTRY_BYTES:
            raise ValueError(
                f"entry {_short(key)} is {len(data)} bytes (at most {MAX_ENTRY_BYTES})"
            )
        if encode(artifact) != data:  # an importer re-encodes: it must get these very bytes
            raise ValueError(f"entry {_short(key)} is not encoded as this aionvrtc encodes it")
        seen = chosen.get(key)
        if seen is not None and seen[1] != data:
            raise ValueError(f"two different entries hold key {_short(key)}: give one")
        chosen[key] = (artifact, data)
    ordered = [chosen[key] for key in sorted(chosen)]
    rows, offset = [], 0
    for artifact, data in ordered:
        rows.append({
            "key": artifact.key, "arch": artifact.arch, "kind": artifact.kind,
            "nvrtc_version": artifact.nvrtc_version, "offset": offset, "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        })  # fmt: skip
        offset += len(data)
    index = json.dumps(
        {"entries": rows, "format_version": FORMAT_VERSION, "signed": key_secret is not None},
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    if len(index) > MAX_INDEX_BYTES:
        raise ValueError(f"{len(rows)} entries make an index of {len(index)} bytes (at most "
                         f"{MAX_INDEX_BYTES}): split them into several bundles")  # fmt: skip
    head = MAGIC + _LENGTH.pack(len(index)) + index
    digest = hashlib.sha256(head).digest()
    signature = _sign(key_secret, digest) if key_secret is not None else _UNSIGNED
    parts = [head, digest, signature, *(data for _, data in ordered)]
    whole = _write_atomically(Path(path), parts)
    return BundleInfo(
        path=Path(path),
        entries=len(ordered),
        bytes=sum(len(part) for part in parts),
        archs=tuple(sorted({artifact.arch for artifact, _ in ordered})),
        signed=key_secret is not None,
        sha256=whole,
    )


def _write_atomically(path: Path, parts: list[bytes]) -> str:
    """Write ``parts`` to ``path`` through a tmp file beside it (fsync, rename), so that a
    reader never sees part of a bundle; the SHA-256 of what was written, in hex."""
    folder = path.parent
    tmp = folder / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags | getattr(os, "O_CLOEXEC", 0), _FILE_MODE)
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as file:
            for part in parts:
                file.write(part)
                digest.update(part)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    # The rename itself survives a crash only once the folder is synced; not every file
    # system lets a folder be opened or synced, and the bundle is complete either way.
    with contextlib.suppress(OSError):
        folder_fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(folder_fd)
        finally:
            os.close(folder_fd)
    return digest.hexdigest()


# -- reading ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Opened:
    """A bundle whose header, index digest and signature were checked: its map and index."""

    map: mmap.mmap
    data_at: int  # where the data section starts in the file
    entries: dict[str, BundleEntry]  # in index order (by key)
    signed: bool


def _open(path: Path, secret: bytes | None, shared_cache: bool | None) -> _Opened:
    """Map the bundle at ``path`` and check all but its entries' data; BundleError if it is
    not a bundle to use (OSError included: a missing or unreadable file) or not one to trust
    (see ``_distrusted``; ``shared_cache``: as a cache dir's, default ``$AIONVRTC_SHARED_CACHE``).
    """
    where = f"bundle {path}"
    policy = Policy.current(default_shared_cache() if shared_cache is None else shared_cache)
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        raise BundleError(f"{where}: cannot be read ({exc.strerror or exc})") from exc
    try:
        # Checked on the open file, which the map then reads: the file trusted is the file read.
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BundleError(f"{where}: {kind_of(info)}, not a regular file")
        damage = _distrusted(path, info, policy)
        if damage is not None:
            raise BundleError(
                f"{where}: not trusted, as others could plant kernels in it: {damage}"
            )
        if info.st_size < _MIN_SIZE:
            raise BundleError(
                f"{where}: truncated ({info.st_size} bytes; a bundle has at least {_MIN_SIZE})"
            )
        # The map holds its own descriptor: closing ours leaves it working, and it keeps
        # serving the file's data after the file is removed or replaced by a rename.
        mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise BundleError(f"{where}: cannot be read ({exc.strerror or exc})") from exc
    finally:
        os.close(fd)
    try:
        return _check(mapped, where, secret)
    except BaseException:
        mapped.close()
        raise


def _distrusted(path: Path, info: os.stat_result, policy: Policy) -> Damage | None:
    """What lets someone other than this user or root (or, shared, the group) plant or replace
    the bundle opened at ``path`` (``info``: the open file's fstat), or None. A bundle is code
    that runs on the GPU, held to a cache dir's rules: every folder and link on the way to it,
    through every link it resolves through (whoever owns a link in a sticky folder, as /tmp
    is, may point it at another file), and the file itself. The route is walked after the
    open and must end at the file opened, so the file trusted is the file read."""
    found = route(path)
    damage = policy.route_problem(found, instead=_OWN_COPY)
    if damage is not None:
        return damage
    if found.end_info is None or file_id(found.end_info) != file_id(info):
        return Damage(
            found.end,
            "not the file opened: it was replaced while it was opened",
            "import it again once nothing replaces it",
        )
    problem = policy.problem(info)
    if problem is None:
        return None
    return Damage(found.end, problem, policy.fix(found.end, info, instead=_OWN_COPY))


def _check(mapped: mmap.mmap, where: str, secret: bytes | None) -> _Opened:
    size = len(mapped)
    if mapped[: len(MAGIC)] != MAGIC:
        raise BundleError(f"{where}: not an aionvrtc bundle (bad magic)")
    (index_len,) = _LENGTH.unpack(mapped[len(MAGIC) : _INDEX_AT])
    if index_len > MAX_INDEX_BYTES:
        raise BundleError(
            f"{where}: an index of {index_len} bytes (at most {MAX_INDEX_BYTES}): the file is "
            "damaged"
        )
    digest_at = _INDEX_AT + index_len
    data_at = digest_at + _DIGEST_LEN + _SIGNATURE_LEN
    if data_at > size:
        raise BundleError(
            f"{where}: the index ({index_len} bytes) runs past the end of the file (the file is "
            "truncated or damaged)"
        )
    digest = mapped[digest_at : digest_at + _DIGEST_LEN]
    if hashlib.sha256(mapped[:digest_at]).digest() != digest:
        raise BundleError(
            f"{where}: the index digest does not match (the file is damaged or was changed)"
        )
    signature = mapped[digest_at + _DIGEST_LEN : data_at]
    signed = signature != _UNSIGNED
    if secret is not None:
        if not signed:
            raise BundleError(
                f"{where}: not signed, and a secret is configured (${ENV_REMOTE_SECRET}): it "
                "cannot be trusted"
            )
        if not hmac.compare_digest(signature, _sign(secret, digest)):
            raise BundleError(f"{where}: signed with another secret: it cannot be trusted")
    index = _parse_index(mapped[_INDEX_AT:digest_at], where)
    if index["signed"] is not signed:
        said = "signed" if index["signed"] else "unsigned"
        raise BundleError(
            f"{where}: the index says {said}, the signature field otherwise (the file was changed)"
        )
    entries = _entries(index["entries"], where, size - data_at)
    return _Opened(mapped, data_at, entries, signed)


def _no_number(text: str) -> int:
    raise ValueError(f"{text[:32]} is not a number an index holds")


def _parse_index(raw: bytes, where: str) -> dict[str, Any]:
    """The index's top level, its fields checked (the entries are checked by ``_entries``)."""
    try:
        index = json.loads(
            raw, parse_int=_bounded_int, parse_float=_no_number, parse_constant=_no_number
        )
    except RecursionError as exc:  # the parser's own bound on nesting, reached in microseconds
        raise BundleError(f"{where}: the index is not valid JSON (nested too deep)") from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise BundleError(f"{where}: the index is not valid JSON ({exc})") from exc
    if not isinstance(index, dict) or set(index) != _TOP:
        raise BundleError(
            f"{where}: the index is not a bundle index (an object of {', '.join(sorted(_TOP))})"
        )
    version = index["format_version"]
    if not isinstance(version, int) or isinstance(version, bool):
        raise BundleError(f"{where}: the index's format_version is not a number")
    if version != FORMAT_VERSION:
        raise BundleError(
            f"{where}: holds entries of format version {version}, this aionvrtc reads "
            f"{FORMAT_VERSION}: export it again with this aionvrtc"
        )
    if not isinstance(index["signed"], bool):
        raise BundleError(f"{where}: the index's signed is not true or false")
    if not isinstance(index["entries"], list):
        raise BundleError(f"{where}: the index's entries are not a list")
    return index


def _entries(rows: list[Any], where: str, data_size: int) -> dict[str, BundleEntry]:
    """The index's entries, each field checked, sorted by key, each right after the one
    before and the last ending at the end of the file (``data_size``: the data section's)."""
    entries: dict[str, BundleEntry] = {}
    end, last = 0, ""
    for i, row in enumerate(rows):
        entry = _entry(row, f"{where}: index entry {i}")
        key = entry.key
        if key in entries:
            raise BundleError(f"{where}: key {_short(key)} is in the index twice")
        if key < last:
            raise BundleError(f"{where}: the index is not sorted by key (at entry {i})")
        if entry.offset < end:
            raise BundleError(f"{where}: entry {_short(key)} overlaps the entry before it")
        if entry.offset > end:
            raise BundleError(
                f"{where}: {entry.offset - end} bytes before entry {_short(key)} belong to no "
                "entry (the file was changed)"
            )
        end = entry.offset + entry.size
        if end > data_size:
            raise BundleError(
                f"{where}: entry {_short(key)} runs past the end of the file (the file is "
                "truncated)"
            )
        entries[key] = entry
        last = key
    if end != data_size:
        raise BundleError(
            f"{where}: {data_size - end} bytes after the last entry belong to no entry (the "
            "file was changed)"
        )
    return entries


def _entry(row: Any, where: str) -> BundleEntry:
    if not isinstance(row, dict) or set(row) != _FIELDS:
        raise BundleError(f"{where} is not an object of {', '.join(sorted(_FIELDS))}")
    key, digest = row["key"], row["sha256"]
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise BundleError(f"{where}: its key is not a cache key (64 lowercase hex digits)")
    if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
        raise BundleError(f"{where}: its sha256 is not 64 lowercase hex digits")
    for name in ("arch", "nvrtc_version"):
        text = row[name]
        if not isinstance(text, str) or not 0 < len(text) <= _MAX_TEXT:
            raise BundleError(f"{where}: its {name} is not a short text")
    if row["kind"] not in _KINDS:
        raise BundleError(f"{where}: its kind is none of {', '.join(_KINDS)}")
    offset, size = row["offset"], row["size"]
    for name, value in (("offset", offset), ("size", size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise BundleError(f"{where}: its {name} is not a byte count")
    if not 0 < size <= MAX_ENTRY_BYTES:
        raise BundleError(f"{where}: its size is {size} bytes (at most {MAX_ENTRY_BYTES})")
    return BundleEntry(
        key=key, arch=row["arch"], kind=row["kind"], nvrtc_version=row["nvrtc_version"],
        offset=offset, size=size, sha256=digest,
    )  # fmt: skip


def _problem(entry: BundleEntry, data: bytes) -> tuple[Artifact | None, str]:
    """The entry decoded from ``data`` (its bytes in the bundle), or None and what is wrong."""
    if hashlib.sha256(data).hexdigest() != entry.sha256:
        return None, "does not match its SHA-256 in the index"
    try:
        artifact = decode(data, expected_key=entry.key, expected_arch=entry.arch)
    except CacheCorruptError as exc:
        return None, f"is damaged ({exc})"
    for name in ("kind", "nvrtc_version"):
        listed, held = getattr(entry, name), getattr(artifact, name)
        if listed != held:
            return None, f"is of {name} {held!r}, the index says {listed!r}"
    return artifact, ""


def verify_bundle(
    path: str | os.PathLike[str],
    *,
    secret: bytes | str | None = None,
    shared_cache: bool | None = None,
) -> list[Artifact]:
    """Every entry of the bundle at ``path``, in key order, after checking all of it: that it
    is trusted as a layer is (``shared_cache``: as a cache dir's), header, index digest,
    signature (when ``secret`` is given: then an unsigned bundle is refused), every entry's
    SHA-256 and decoding, and that each entry re-encodes to its very bytes (what an import
    writes). Raises BundleError naming the first problem."""
    where = f"bundle {os.fspath(path)}"
    opened = _open(Path(path), _as_secret(secret), shared_cache)
    try:
        artifacts = []
        for entry in opened.entries.values():
            start = opened.data_at + entry.offset
            data = opened.map[start : start + entry.size]
            artifact, problem = _problem(entry, data)
            if artifact is None:
                raise BundleError(f"{where}: entry {_short(entry.key)} {problem}")
            if encode(artifact) != data:
                raise BundleError(
                    f"{where}: entry {_short(entry.key)} is not encoded as this aionvrtc encodes "
                    "it, so it would change on import: export it again with this aionvrtc"
                )
            artifacts.append(artifact)
        return artifacts
    finally:
        opened.map.close()


class BundleTier:
    """A read-only tier over a bundle file, served in place from a memory map: nothing is
    copied to disk. The header, index digest and (with ``secret``) the signature are checked
    once, here (BundleError if any fails); each entry when it is read, against its SHA-256 in
    the index. A damaged entry is a miss, counted in ``damaged`` and warned about once.
    Thread-safe. The file may be removed or replaced by a rename while the tier is open (the
    map keeps the data); one truncated in place is noticed before each read, but a read racing
    the truncation can still fault (SIGBUS): replace bundles by renaming, as
    ``write_bundle`` does. A bundle that others could have planted or changed is refused, as a
    cache dir would be (``shared_cache``: default ``$AIONVRTC_SHARED_CACHE``, see ``Policy``).
    """

    origin: Origin = "layer"
    local = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        secret: bytes | str | None = None,
        shared_cache: bool | None = None,
    ) -> None:
        self.path = Path(path)
        opened = _open(self.path, _as_secret(secret), shared_cache)
        self._map = opened.map
        self._data_at = opened.data_at
        self._entries = opened.entries
        self.signed = opened.signed
        # Guards the counters, the damaged keys and closing; never held across a read's I/O.
        self._lock = threading.Lock()
        self._damaged: set[str] = set()
        self._closed = False
        self.hits = 0
        self.misses = 0

    def keys(self) -> tuple[str, ...]:
        """The keys the bundle holds, sorted."""
        return tuple(self._entries)

    def read(self, key: str, *, arch: str | None = None) -> Artifact | None:
        """The verified entry for ``key`` (built for ``arch``, when given), or None."""
        entry = self._entries.get(key)
        artifact = None
        if entry is not None and (arch is None or entry.arch == arch):
            artifact = self._load(entry)
        with self._lock:
            if artifact is None:
                self.misses += 1
            else:
                self.hits += 1
        return artifact

    def _load(self, entry: BundleEntry) -> Artifact | None:
        if entry.key in self._damaged:
            return None
        start = self._data_at + entry.offset
        try:
            # The map's size() is the file's size now: a file truncated in place would fault
            # on the first read of a page past its new end.
            if self._map.size() < start + entry.size:
                problem = "is cut off: the bundle file shrank after it was opened"
            else:
                artifact, problem = _problem(entry, self._map[start : start + entry.size])
                if artifact is not None:
                    return artifact
        except (ValueError, OSError):  # closed (ValueError), or the file is gone from under it
            return None
        self._skip(entry.key, problem)
        return None

    def _skip(self, key: str, problem: str) -> None:
        with self._lock:
            if key in self._damaged:
                return
            self._damaged.add(key)
        logger.warning(
            "skipping entry %s of bundle %s: it %s; the kernel is compiled instead",
            _short(key), self.path, problem,
        )  # fmt: skip

    def write(self, artifact: Artifact) -> bool:
        return False  # read-only

    def stats(self) -> LayerStats:
        with self._lock:
            return LayerStats(
                path=str(self.path), kind="bundle", hits=self.hits, misses=self.misses,
                damaged=len(self._damaged), entries=len(self._entries),
            )  # fmt: skip

    def close(self) -> None:
        """Unmap the file; reads after this are misses."""
        with self._lock:
            self._closed = True
        self._map.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> BundleTier:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
