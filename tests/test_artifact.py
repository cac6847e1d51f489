"""The entry encoding: round trip, and every kind of damage detected."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aionvrtc import FORMAT_VERSION, Artifact, CacheCorruptError, KernelCache
from aionvrtc._artifact import MAGIC, decode, encode, read_header

from .support import make_spec
from .support.workloads import checksummed

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
    corrupt(f"format version 99, this aionvrtc reads {FORMAT_VERSION}", bytes(future))


def good_header() -> dict[str, object]:
    data = encode(artifact())
    header_len = struct.unpack_from(">I", data, 10)[0]
    return dict(json.loads(data[14 : 14 + header_len]))


def reencode(mutate: dict[str, object], image: bytes | None = None) -> bytes:
    """A well-formed entry (valid checksum) whose header says something wrong."""
    header = good_header()
    header.update(mutate)
    return checksummed(json.dumps(header).encode(), artifact().image if image is None else image)


def test_verified_but_wrong_entries_are_refused() -> None:
    corrupt("holds key abababab", encode(artifact()), expected_key="cd" * 32)
    corrupt("compiled for sm_90, expected sm_80", encode(artifact()), expected_arch="sm_80")
    corrupt("unknown kind 'fatbin'", reencode({"kind": "fatbin"}))
    corrupt("'arch' is missing", reencode({"arch": 90}))
    corrupt("lowered names are not strings", reencode({"lowered_names": {"a": 1}}))
    corrupt("not an ELF file", encode(artifact(image=b"MZ not elf")))


def test_names_keep_their_order_and_parts_their_items_through_the_encoding() -> None:
    # The lowered names in the spec's order (not sorted), the key's parts and their items kept,
    # the rest of the header sorted as it always was: an entry written before, sorted all
    # through and without items, decodes and encodes to its very bytes (what bundling checks).
    names = {"k<float>": "_Z1kIfEvv", "k<double>": "_Z1kIdEvv", "k<int>": "_Z1kIiEvv"}
    items = {"options": ("-std=c++17", "--use_fast_math"), "headers": ("0123456789abcdef t.h",)}
    made = artifact(lowered_names=names, parts={"name": "k.cu"}, part_items=items)
    back = decode(encode(made))
    assert back == made
    assert list(back.lowered_names) == ["k<float>", "k<double>", "k<int>"]
    assert back.part_items == items
    # The memory tier charges what the header keeps too: "name" + "k.cu", and the items.
    kept = len("namek.cu") + sum(len(k) + len("".join(v)) for k, v in items.items())
    assert made.size - artifact(lowered_names=names).size == kept
    older = json.dumps(
        {**good_header(), "lowered_names": names}, sort_keys=True, separators=(",", ":")
    )
    entry = checksummed(older.encode(), artifact().image)
    assert list(decode(entry).lowered_names) == ["k<double>", "k<float>", "k<int>"]
    assert encode(decode(entry)) == entry
    # What only explain reads, in a shape this version does not read (a later one's, or
    # damaged under a valid checksum), reads as none: the entry is served, never refused.
    bad = {"options": "-O3"}, {"options": [1]}, {"options": ["x" * 257]}, ["options"]
    for part_items in bad:
        served = decode(reencode({"part_items": part_items}))
        assert (served.part_items, served.image) == ({}, artifact().image)
    for parts in ({"name": 1}, ["name"], {"source": "x" * 257}):
        served = decode(reencode({"parts": parts, "part_items": {"options": ["-O3"]}}))
        assert (served.parts, served.part_items) == ({}, {"options": ("-O3",)})


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

    body = struct.pack(">8sHI", MAGIC, FORMAT_VERSION, claimed % (len(header) + 16)) + header
    body += struct.pack(">Q", 4) + b"\x7fELF"
    with pytest.raises(CacheCorruptError):
        decode(body + hashlib.sha256(body).digest())


# -- crafted entries with a valid checksum: bounded, so only ever refused -------------------------


def test_huge_numbers_in_a_checksummed_header_are_refused() -> None:
    # Before: float(10**400) raised OverflowError in every reader, and the entry was kept.
    corrupt("unreadable header .*integer of 401 digits", reencode({"created": 10**400}))
    corrupt("unreadable header .*out of range", checksummed(
        json.dumps(good_header()).replace('"created":', '"created": 1e400, "x":').encode()
    ))  # fmt: skip
    corrupt("unreadable header .*NaN", reencode({"compile_seconds": float("nan")}))
    corrupt("'created' is out of range", reencode({"created": -5}))
    corrupt("'compile_seconds' is out of range", reencode({"compile_seconds": 2.0**41}))
    corrupt("'arch' is 1000 characters long", reencode({"arch": "s" * 1000}))
    corrupt("'key' is not a cache key", reencode({"key": "../../etc/passwd"}))


def test_deeply_nested_header_is_refused_before_parsing() -> None:
    # Before: RecursionError from the JSON parser reached every caller in every process.
    deep = b"[" * 100_000 + b"]" * 100_000
    corrupt("nested more than 3 deep", checksummed(deep))
    nested_names: dict[str, object] = {"lowered_names": {"k": {"a": {"b": "c"}}}}
    corrupt("nested more than 3 deep", reencode(nested_names))
    # An unterminated string of escaped quotes: a regex that skipped strings took 20 s at 80 KB
    # (quadratic); the parser reads it once.
    started = time.perf_counter()
    corrupt("unreadable header", checksummed(b'{"log": "' + b'\\"' * 500_000 + b"[[[["))
    assert time.perf_counter() - started < 5.0
    # Brackets inside strings are text, not nesting: an NVRTC log may hold any of them.
    log = artifact(log='error: [[[[{{{{ ]]]] }}}} \\" [[[[')
    assert decode(encode(log)).log == log.log


def test_header_length_is_bounded_before_reading() -> None:
    import io

    from aionvrtc._artifact import MAX_HEADER_BYTES

    claimed = MAX_HEADER_BYTES + 1
    corrupt(f"header of {claimed} bytes", checksummed(b"{}", claimed=claimed))
    with pytest.raises(CacheCorruptError, match=f"header of {claimed} bytes"):
        read_header(io.BytesIO(struct.pack(">8sHI", MAGIC, FORMAT_VERSION, claimed)))
    deep = b"[" * 50_000
    with pytest.raises(CacheCorruptError, match="nested more than 3 deep"):
        read_header(io.BytesIO(struct.pack(">8sHI", MAGIC, FORMAT_VERSION, len(deep)) + deep))


def test_a_crafted_entry_on_disk_is_dropped_and_recompiled(cache_dir: Path) -> None:
    spec = make_spec()
    first = KernelCache("sm_90", cache_dir=cache_dir).get_or_compile(spec)
    entry = cache_dir / f"v{FORMAT_VERSION}" / first.key[:2] / first.key
    header = {**good_header(), "key": first.key, "created": 10**400}
    entry.write_bytes(checksummed(json.dumps(header).encode(), first.image))
    cache = KernelCache("sm_90", cache_dir=cache_dir)
    again = cache.get_or_compile(spec)  # before: OverflowError, every time, in every process
    assert again.image == first.image
    stats = cache.stats()
    assert (stats.disk.corrupt_dropped, stats.compiles, stats.disk.hits) == (1, 1, 0)
    assert decode(entry.read_bytes(), expected_key=first.key) == again  # rewritten, good


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=20,
)  # fmt: skip


@given(st.dictionaries(
    st.sampled_from(sorted(good_header())) | st.text(max_size=8), json_values, max_size=12
))  # fmt: skip
@settings(max_examples=400, deadline=None, derandomize=True)
def test_arbitrary_checksummed_headers_decode_or_raise_cache_corrupt(
    mutate: dict[str, object],
) -> None:
    header = good_header()
    header.update(mutate)
    data = checksummed(json.dumps(header).encode(), artifact().image)
    try:
        decoded = decode(data)
    except CacheCorruptError:
        return
    assert decoded.key == header["key"]
    assert 0 <= decoded.created <= 2.0**40
