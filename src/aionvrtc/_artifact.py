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


@dataclass(frozen=True, slots=True)
class Artifact:
    """A compiled program: the image to load and what is known about how it was made."""

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

    def __post_init__(self) -> None:
        if not isinstance(self.lowered_names, MappingProxyType):
            object.__setattr__(self, "lowered_names", MappingProxyType(dict(self.lowered_names)))

    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def size(self) -> int:
        """Bytes this artifact holds (image, log and names): what the memory tier charges."""
        names = sum(len(k) + len(v) for k, v in self.lowered_names.items())
        return len(self.image) + len(self.log) + names + 256


def encode(artifact: Artifact) -> bytes:
    header = json.dumps(
        {
            "key": artifact.key,
            "kind": artifact.kind,
            "arch": artifact.arch,
            "nvrtc_version": artifact.nvrtc_version,
            "package_version": artifact.package_version,
            "lowered_names": dict(artifact.lowered_names),
            "created": artifact.created,
            "compile_seconds": artifact.compile_seconds,
            "log": artifact.log,
        },
        separators=(",", ":"),
        sort_keys=True,
    ).encode()
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
    return int(header_len)


def _parse_header(raw: bytes) -> dict[str, Any]:
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise _corrupt(f"unreadable header ({exc})") from exc
    if not isinstance(header, dict):
        raise _corrupt("header is not an object")
    return header


def decode(
    data: bytes, *, expected_key: str | None = None, expected_arch: str | None = None
) -> Artifact:
    """Verify and decode an entry. Raises CacheCorruptError saying what is wrong with it."""
    if len(data) < _MIN_LEN:
        raise _corrupt(f"truncated ({len(data)} bytes)")
    header_len = _check_prefix(data)
    body, checksum = data[:-_CHECKSUM_LEN], data[-_CHECKSUM_LEN:]
    if hashlib.sha256(body).digest() != checksum:
        raise _corrupt("checksum mismatch (truncated or modified)")
    image_at = _PREFIX.size + header_len + _IMAGE_LEN.size
    if image_at > len(body):
        raise _corrupt("header length runs past the end")
    (image_len,) = _IMAGE_LEN.unpack_from(body, image_at - _IMAGE_LEN.size)
    if image_at + image_len != len(body):
        raise _corrupt("image length does not match the entry size")
    header = _parse_header(body[_PREFIX.size : _PREFIX.size + header_len])
    key = _typed(header, "key", str)
    if expected_key is not None and key != expected_key:
        raise _corrupt(f"entry holds key {key[:16]}... but was read as {expected_key[:16]}...")
    kind = _typed(header, "kind", str)
    if kind not in ("cubin", "ptx", "data"):
        raise _corrupt(f"unknown kind {kind!r}")
    image = body[image_at:]
    if kind == "cubin" and not image.startswith(_ELF_MAGIC):
        raise _corrupt("cubin image is not an ELF file")
    arch = _typed(header, "arch", str)
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
        nvrtc_version=_typed(header, "nvrtc_version", str),
        lowered_names=lowered,
        compile_seconds=float(_typed(header, "compile_seconds", (int, float))),
        log=_typed(header, "log", str),
        created=float(_typed(header, "created", (int, float))),
        package_version=_typed(header, "package_version", str),
    )
