"""The entry encoding: round trip, and every kind of damage detected."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aionvrtc import Artifact, CacheCorruptError
from aionvrtc._artifact import MAGIC, decode, encode

KEY = "ab" * 32


def artifact(**kwargs: object) -> Artifact:
    fields: dict[str, object] = {
        "key": KEY,
        "kind": "cubin",
        "image": b"\x7fELF" + bytes(range(256)) * 4,
        "arch": "sm_90",
        "nvrtc_version": "13.5",
        "lowered_names": {"k<float>": "_Z1kIfEvv"},
        "compile_seconds": 0.25,
        "log": "warning: something",
    }
    fields.update(kwargs)
    return Artifact(**fields)  # type: ignore[arg-type]


def test_round_trip() -> None:
    original = artifact()
    assert decode(encode(original), expected_key=KEY, expected_arch="sm_90") == original
    ptx = artifact(kind="ptx", image=b"//\n.version 9.0\n")
    assert decode(encode(ptx)) == ptx


def corrupt(match: str, data: bytes, **kwargs: str) -> None:
    with pytest.raises(CacheCorruptError, match=match):
        decode(data, **kwargs)


def test_every_byte_flipped_is_detected() -> None:
    data = encode(artifact())
    for at in range(len(data)):
        damaged = bytearray(data)
        damaged[at] ^= 0x10
        with pytest.raises(CacheCorruptError):
            decode(bytes(damaged))


def test_truncations_are_detected() -> None:
    data = encode(artifact())
    for length in (0, 1, 7, 20, len(data) // 2, len(data) - 1):
        with pytest.raises(CacheCorruptError):
            decode(data[:length])
    corrupt(r"truncated \(0 bytes\)", b"")


def test_foreign_and_other_version_entries() -> None:
    data = encode(artifact())
    corrupt("bad magic", b"\x00" * len(data))
    corrupt("bad magic", b"GARBAGE!" + data[8:])
    future = bytearray(data)
    struct.pack_into(">H", future, len(MAGIC), 99)
    corrupt("format version 99, this aionvrtc reads 1", bytes(future))


def reencode(mutate: dict[str, object], image: bytes | None = None) -> bytes:
    """A well-formed entry (valid checksum) whose header says something wrong."""
    good = artifact()
    data = encode(good if image is None else artifact(image=image))
    header_len = struct.unpack_from(">I", data, 10)[0]
    header = json.loads(data[14 : 14 + header_len])
    header.update(mutate)
    body = json.dumps(header).encode()
    rest = data[14 + header_len : -32]
    import hashlib

    out = struct.pack(">8sHI", MAGIC, 1, len(body)) + body + rest
    return out + hashlib.sha256(out).digest()


def test_verified_but_wrong_entries_are_refused() -> None:
    corrupt("holds key abababab", encode(artifact()), expected_key="cd" * 32)
    corrupt("compiled for sm_90, expected sm_80", encode(artifact()), expected_arch="sm_80")
    corrupt("unknown kind 'fatbin'", reencode({"kind": "fatbin"}))
    corrupt("'arch' is missing", reencode({"arch": 90}))
    corrupt("lowered names are not strings", reencode({"lowered_names": {"a": 1}}))
    corrupt("not an ELF file", encode(artifact(image=b"MZ not elf")))


def test_lowered_names_are_read_only() -> None:
    with pytest.raises(TypeError):
        artifact().lowered_names["x"] = "y"  # type: ignore[index]


@given(st.binary(max_size=4096))
@settings(max_examples=300, deadline=None)
def test_arbitrary_bytes_only_ever_raise_cache_corrupt(data: bytes) -> None:
    with pytest.raises(CacheCorruptError):
        decode(data)
    with pytest.raises(CacheCorruptError):
        decode(MAGIC + data)  # past the magic check, into the version/checksum/header logic


@given(st.binary(max_size=512), st.integers(min_value=0, max_value=2**32 - 1))
@settings(max_examples=300, deadline=None)
def test_well_checksummed_garbage_headers_only_raise_cache_corrupt(
    header: bytes, claimed: int
) -> None:
    import hashlib

    body = struct.pack(">8sHI", MAGIC, 1, claimed % (len(header) + 16)) + header
    body += struct.pack(">Q", 4) + b"\x7fELF"
    with pytest.raises(CacheCorruptError):
        decode(body + hashlib.sha256(body).digest())
