"""Artifact, a compiled program, and its self-verifying on-disk encoding.

Entry layout (all integers big-endian):

    magic  b"AIONVRTC"         8 bytes
    format version             u16
    header length              u32, then the header: UTF-8 JSON (key, kind, arch, versions,
                               lowered names, created, compile seconds, log)
    image length               u64, then the image (CUBIN or PTX)
    checksum                   SHA-256 over everything above, 32 bytes

Everything is verified on read, so a truncated, bit-flipped, foreign or other-version entry is
detected and never handed to the driver.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, BinaryIO, Literal

from ._exceptions import CacheCorruptError
from ._spec import FORMAT_VERSION
from ._version import __version__

__all__ = ["Artifact", "ArtifactKind", "decode", "encode", "read_header"]

ArtifactKind = Literal["cubin", "ptx", "data"]  # data: a named record (KernelCache.record)

MAGIC = b"AIONVRTC"
_PREFIX = struct.Struct(">8sHI")  # magic, format version, header length
_IMAGE_LEN = struct.Struct(">Q")
_CHECKSUM_LEN = 32
_MIN_LEN = _PREFIX.size + _IMAGE_LEN.size + _CHECKSUM_LEN
_ELF_MAGIC = b"\x7fELF"
# Bounds on what a header may hold, so that an entry crafted with a valid checksum can only ever
# be refused (CacheCorruptError), never raise OverflowError or RecursionError in every reader.
MAX_HEADER_BYTES = 16 << 20  # bytes; the header holds NVRTC's log, which can be long
# The header is an object holding objects (lowered_names, parts) and an object of lists
# (part_items): 3 deep.
_MAX_NESTING = 3
_MAX_INT_DIGITS = 20  # the header's integers are times and seconds
_MAX_TIME = 2.0**40  # seconds since the epoch (year 36812): past it, `created` is not a time
_MAX_TEXT = 256  # characters of the short fields (arch, versions)
_KEY = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class Artifact:
    """A compiled program: the image to load and what is known about how it was made.

    Frozen; ``Compiler.compile`` and ``KernelCache.get_or_compile`` return one, and
    ``Compiler.get`` loads one.

    Attributes:
        key: The cache key it is stored under (hex SHA-256, see ``kernel_key``).
        kind: ``"cubin"`` (an ELF image for the exact arch), ``"ptx"`` (for a GPU newer than
            the NVRTC that made it: the driver compiles it at load) or ``"data"`` (a record,
            see ``Compiler.save_record``).
        image: The bytes to load: the cubin or the PTX (a record's data, for ``"data"``).
        arch: The target it was compiled for, such as ``"sm_90"``.
        nvrtc_version: The version of the NVRTC that made it, such as ``"13.5"``.
        lowered_names: Each name expression of the spec to its lowered (mangled) name, in the
            spec's order (the order of the spec that compiled it: two specs that list the same
            names in two orders share a key, and its entry), held read-only. An entry written
            before aionvrtc kept that order has them sorted.
        compile_seconds: Seconds NVRTC took to compile it (0.0 for a record).
        log: NVRTC's log of the compile (warnings), ``""`` if it said nothing.
        created: When it was made, in seconds since the epoch (``time.time()``).
        package_version: The version of aionvrtc that made it.
        parts: What each part of its key held (``key_parts``: format, name, arch and NVRTC
            build as they are, the others as digests), for ``Compiler.explain``; empty for a
            record and for an entry written before aionvrtc kept them.
        part_items: The items of the parts that can be told apart in words (``part_items``:
            options, name expressions, headers and include folders), for ``Compiler.explain``
            to say which of them differ; a part too long to keep is left out, and all of them
            for a record and an entry written before aionvrtc kept them.
    """

    key: str
    kind: ArtifactKind
    image: bytes
    arch: str
    nvrtc_version: str
    lowered_names: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    compile_seconds: float = 0.0
    log: str = ""
    created: float = field(default_factory=time.time)
    package_version: str = __version__
    parts: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    part_items: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if not isinstance(self.lowered_names, MappingProxyType):
            object.__setattr__(self, "lowered_names", MappingProxyType(dict(self.lowered_names)))
        if not isinstance(self.parts, MappingProxyType):
            object.__setattr__(self, "parts", MappingProxyType(dict(self.parts)))
        if not isinstance(self.part_items, MappingProxyType):
            items = {part: tuple(values) for part, values in self.part_items.items()}
            object.__setattr__(self, "part_items", MappingProxyType(items))

    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def size(self) -> int:
        """Bytes this artifact holds (image, log, names and key parts, items included): what
        the memory tier charges."""
        names = sum(len(k) + len(v) for k, v in self.lowered_names.items())
        parts = sum(len(k) + len(v) for k, v in self.parts.items())
        items = sum(len(k) + sum(map(len, v)) for k, v in self.part_items.items())
        return len(self.image) + len(self.log) + names + parts + items + 256


def encode(artifact: Artifact) -> bytes:
    fields: dict[str, Any] = {
        "key": artifact.key,
        "kind": artifact.kind,
        "arch": artifact.arch,
        "nvrtc_version": artifact.nvrtc_version,
        "package_version": artifact.package_version,
        "lowered_names": dict(artifact.lowered_names),
        "created": artifact.created,
        "compile_seconds": artifact.compile_seconds,
        "log": artifact.log,
    }
    # (absent, an entry reads as one written before parts were kept)
    if artifact.parts:
        fields["parts"] = dict(sorted(artifact.parts.items()))
    if artifact.part_items:
        fields["part_items"] = {k: list(v) for k, v in sorted(artifact.part_items.items())}
    # Sorted but for the lowered names, which keep the spec's order (a disk hit lists them as
    # the compile did); an entry written sorted throughout re-encodes to its very bytes.
    header = json.dumps(dict(sorted(fields.items())), separators=(",", ":")).encode()
    body = b"".join(
        (
            _PREFIX.pack(MAGIC, FORMAT_VERSION, len(header)),
            header,
            _IMAGE_LEN.pack(len(artifact.image)),
            artifact.image,
        )
    )
    return body + hashlib.sha256(body).digest()


def _corrupt(reason: str) -> CacheCorruptError:
    return CacheCorruptError(f"corrupt cache entry: {reason}")


def _typed(header: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = header.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise _corrupt(f"header field {name!r} is missing or of the wrong type")
    return value


def read_header(file: BinaryIO) -> dict[str, Any]:
    """The header of the entry ``file`` is positioned at, read without the image and not
    verified (the checksum covers the image too): for listing a cache, never for loading."""
    prefix = file.read(_PREFIX.size)
    if len(prefix) < _PREFIX.size:
        raise _corrupt(f"truncated ({len(prefix)} bytes)")
    header_len = _check_prefix(prefix)
    raw = file.read(header_len)
    if len(raw) < header_len:
        raise _corrupt("header length runs past the end")
    return _parse_header(raw)


def _check_prefix(data: bytes) -> int:
    """The header length, after the magic and the format version are checked."""
    magic, version, header_len = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise _corrupt("not an aionvrtc entry (bad magic)")
    if version != FORMAT_VERSION:
        raise _corrupt(f"format version {version}, this aionvrtc reads {FORMAT_VERSION}")
    if header_len > MAX_HEADER_BYTES:
        raise _corrupt(f"header of {header_len} bytes (at most {MAX_HEADER_BYTES})")
    return int(header_len)


def _parse_header(raw: bytes) -> dict[str, Any]:
    try:
        header = json.loads(
            raw, parse_int=_bounded_int, parse_float=_finite_float, parse_constant=_no_constant
        )
    except RecursionError as exc:  # the parser's own bound on nesting, reached in microseconds
        raise _corrupt(f"header nested more than {_MAX_NESTING} deep") from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise _corrupt(f"unreadable header ({exc})") from exc
    if not isinstance(header, dict):
        raise _corrupt("header is not an object")
    if _nests_deeper(header, _MAX_NESTING):
        raise _corrupt(f"header nested more than {_MAX_NESTING} deep")
    return header


def _nests_deeper(header: dict[str, Any], limit: int) -> bool:
    """Whether containers in ``header`` (itself at depth 1) nest deeper than ``limit``: level
    by level, so a flat header (every read) costs one pass over its values."""
    level: list[Any] = [header]
    for depth in range(2, limit + 2):
        level = [
            child
            for container in level
            for child in (container.values() if isinstance(container, dict) else container)
            if isinstance(child, dict | list)
        ]
        if not level:
            return False
        if depth > limit:
            return True
    return False


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text)} digits")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)  # 1e400 parses as inf
    if not math.isfinite(value):
        raise ValueError(f"a number out of range ({text[:32]})")
    return value


def _no_constant(text: str) -> float:
    raise ValueError(f"{text} is not a number a header holds")


def _number(header: Mapping[str, Any], name: str, high: float) -> float:
    """A header number in [0, high]: JSON ints and floats both, never a bool."""
    value = float(_typed(header, name, (int, float)))
    if not 0.0 <= value <= high:
        raise _corrupt(f"header field {name!r} is out of range ({value!r})")
    return value


def _text(header: Mapping[str, Any], name: str) -> str:
    value: str = _typed(header, name, str)
    if len(value) > _MAX_TEXT:
        raise _corrupt(f"header field {name!r} is {len(value)} characters long")
    return value


def decode(
    data: bytes, *, expected_key: str | None = None, expected_arch: str | None = None
) -> Artifact:
    """Verify and decode an entry. Raises CacheCorruptError saying what is wrong with it."""
    if len(data) < _MIN_LEN:
        raise _corrupt(f"truncated ({len(data)} bytes)")
    header_len = _check_prefix(data)
    body = memoryview(data)[:-_CHECKSUM_LEN]  # not copied: the image may be megabytes
    if hashlib.sha256(body).digest() != data[-_CHECKSUM_LEN:]:
        raise _corrupt("checksum mismatch (truncated or modified)")
    image_at = _PREFIX.size + header_len + _IMAGE_LEN.size
    if image_at > len(body):
        raise _corrupt("header length runs past the end")
    (image_len,) = _IMAGE_LEN.unpack_from(body, image_at - _IMAGE_LEN.size)
    if image_at + image_len != len(body):
        raise _corrupt("image length does not match the entry size")
    header = _parse_header(bytes(body[_PREFIX.size : _PREFIX.size + header_len]))
    key = _typed(header, "key", str)
    if not _KEY.fullmatch(key):
        raise _corrupt("header field 'key' is not a cache key")
    if expected_key is not None and key != expected_key:
        raise _corrupt(f"entry holds key {key[:16]}... but was read as {expected_key[:16]}...")
    kind = _typed(header, "kind", str)
    if kind not in ("cubin", "ptx", "data"):
        raise _corrupt(f"unknown kind {kind!r}")
    image = bytes(body[image_at:])
    if kind == "cubin" and not image.startswith(_ELF_MAGIC):
        raise _corrupt("cubin image is not an ELF file")
    arch = _text(header, "arch")
    if expected_arch is not None and arch != expected_arch:
        raise _corrupt(f"entry was compiled for {arch}, expected {expected_arch}")
    lowered = _typed(header, "lowered_names", dict)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in lowered.items()):
        raise _corrupt("lowered names are not strings")
    return Artifact(
        key=key,
        kind=kind,
        image=image,
        arch=arch,
        nvrtc_version=_text(header, "nvrtc_version"),
        lowered_names=lowered,
        compile_seconds=_number(header, "compile_seconds", _MAX_TIME),
        log=_typed(header, "log", str),
        created=_number(header, "created", _MAX_TIME),
        package_version=_text(header, "package_version"),
        parts=header_parts(header),
        part_items=header_part_items(header),
    )


def header_parts(header: Mapping[str, Any]) -> dict[str, str]:
    """The key's parts an entry's header keeps (``Artifact.parts``); {} where it keeps none, or
    holds them in a shape this version does not read: only ``Compiler.explain`` reads them, so
    an entry is never refused (and removed from a shared dir) over them."""
    parts = header.get("parts", {})
    if not isinstance(parts, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and len(v) <= _MAX_TEXT for k, v in parts.items()
    ):
        return {}
    return parts


def header_part_items(header: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """The items of the key's parts an entry's header keeps (``Artifact.part_items``); {} where
    it keeps none, or holds them in a shape this version does not read (as ``header_parts``)."""
    items = header.get("part_items", {})
    if not isinstance(items, dict) or not all(
        isinstance(k, str)
        and isinstance(v, list)
        and all(isinstance(t, str) and len(t) <= _MAX_TEXT for t in v)
        for k, v in items.items()
    ):
        return {}
    return {part: tuple(values) for part, values in items.items()}
