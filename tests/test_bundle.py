"""Bundles (issue 19, "ship a warm cache"): `aionvrtc cache export` and `import`, and BundleTier
reading one in place, on real entries compiled by real NVRTC (no GPU needed)."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import logging
import os
import shlex
import shutil
import stat
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from aionvrtc import BundleError, CacheCorruptError, KernelCache, KernelSpec, _cli
from aionvrtc._artifact import _IMAGE_LEN, _PREFIX, MAGIC, Artifact, decode, encode
from aionvrtc._spec import FORMAT_VERSION
from aionvrtc._store.bundle import BundleTier, verify_bundle, write_bundle
from aionvrtc._store.disk import DiskTier
from aionvrtc._store.tier import LayerStats
from aionvrtc._units import format_size

from .support import ENTRIES, NOBODY, as_other_user, as_root, make_spec
from .support.layers import tree

SECRET_ENV = "AIONVRTC_REMOTE_SECRET"
HEAD = 16 + 8  # magic and index length: where the index starts
ZERO = bytes(32)


@dataclasses.dataclass(frozen=True)
class Warm:
    """A cache dir holding two kernels for sm_80 and sm_90 each and one record (sm_90)."""

    dir: Path
    specs: tuple[KernelSpec, KernelSpec]
    artifacts: dict[str, Artifact]  # by key
    record: bytes

    def keys_of(self, arch: str | None = None) -> list[str]:
        return sorted(k for k, a in self.artifacts.items() if arch in (None, a.arch))


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> Warm:
    root = tmp_path_factory.mktemp("warm") / "cache"
    specs = (make_spec(), make_spec())
    cache = KernelCache("sm_90", cache_dir=root)
    artifacts = [
        cache.for_arch(arch).get_or_compile(s) for arch in ("sm_80", "sm_90") for s in specs
    ]
    record = b'{"tile": 64}'
    assert cache.put_record("tuning", record)
    assert cache.stats().compiles == 4
    stored = {p.name: decode(p.read_bytes()) for p in _entry_files(root)}
    assert len(stored) == 5
    assert all(stored[a.key] == a for a in artifacts)
    return Warm(root, specs, stored, record)


@pytest.fixture(autouse=True)
def _no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.delenv("AIONVRTC_DISK_LIMIT", raising=False)


def _entry_files(cache: Path) -> list[Path]:
    return sorted(p for p in (cache / f"v{FORMAT_VERSION}").glob("*/*") if p.name[0] != ".")


def entries(cache: Path) -> dict[str, bytes]:
    """The entries in a cache dir, by key: what import added."""
    return {p.name: p.read_bytes() for p in _entry_files(cache)}


Run = Callable[..., tuple[int, Any, str]]


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    """``aionvrtc ARGS --json --cache-dir CACHE`` in this process: status, JSON, stderr."""

    def call(*args: str | Path, cache: Path) -> tuple[int, Any, str]:
        status = _cli.main([*map(str, args), "--json", "--cache-dir", str(cache)])
        out, err = capsys.readouterr()
        return status, json.loads(out), err

    return call


@pytest.fixture
def bundle(warm: Warm, tmp_path: Path, run: Run) -> Path:
    """An unsigned bundle of every entry of ``warm``."""
    path = tmp_path / "warm.bundle"
    assert run("cache", "export", path, cache=warm.dir)[0] == 0
    return path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _layout(data: bytes) -> tuple[dict[str, Any], int]:
    """A bundle's index, and where its data section starts."""
    (length,) = struct.unpack(">Q", data[16:HEAD])
    return json.loads(data[HEAD : HEAD + length]), HEAD + length + 64


def _short(key: str) -> str:
    return f"{key[:16]}..."


# -- export and import -----------------------------------------------------------------------


def test_round_trip_serves_every_kernel_with_no_compile(
    warm: Warm, tmp_path: Path, run: Run
) -> None:
    path = tmp_path / "warm.bundle"
    status, report, err = run("cache", "export", path, cache=warm.dir)
    assert (status, err) == (0, "")
    assert report == {
        "bundle": str(path), "entries": 5, "records": 1, "bytes": path.stat().st_size,
        "archs": ["sm_80", "sm_90"], "signed": False, "sha256": _sha256(path),
    }  # fmt: skip
    empty = tmp_path / "fresh"
    status, report, err = run("cache", "import", path, cache=empty)
    assert (status, err) == (0, "")
    assert report == {
        "bundle": str(path), "entries": 5, "added": 5, "present": 0,
        "signature_verified": False, "directory": str(empty / ENTRIES),
    }  # fmt: skip
    # Byte for byte what the source cache dir holds: import re-encodes, and gets the same bytes.
    assert entries(empty) == entries(warm.dir)

    cache = KernelCache("sm_90", cache_dir=empty)
    for arch in ("sm_80", "sm_90"):
        for spec in warm.specs:
            served = cache.for_arch(arch).get_or_compile(spec)
            assert served == warm.artifacts[served.key]
            assert (served.arch, served.image) == (arch, warm.artifacts[served.key].image)
    assert cache.record("tuning") == warm.record
    stats = cache.stats()
    assert (stats.compiles, stats.disk.hits, stats.disk.misses) == (0, 5, 0)

    again = run("cache", "import", path, cache=empty)
    assert (again[0], again[1]["added"], again[1]["present"]) == (0, 0, 5)


def test_an_entry_re_encodes_to_its_very_bytes(warm: Warm) -> None:
    for path in _entry_files(warm.dir):
        data = path.read_bytes()
        assert encode(decode(data)) == data


def test_export_is_reproducible(warm: Warm, tmp_path: Path, run: Run) -> None:
    first = tmp_path / "first.bundle"
    assert run("cache", "export", first, cache=warm.dir)[0] == 0
    # The same entries in another cache dir, written later and in another order, exported
    # later: the same bytes.
    other = tmp_path / "other"
    tier = DiskTier(other)
    for key in reversed(warm.keys_of()):
        assert tier.write(warm.artifacts[key])
    for path in _entry_files(other):
        os.utime(path, (1e9, 1e9))
    second = tmp_path / "second.bundle"
    assert run("cache", "export", second, cache=other)[0] == 0
    assert second.read_bytes() == first.read_bytes()
    # The library call, given the entries in any order, once or twice each.
    data = [encode(warm.artifacts[key]) for key in warm.keys_of()]
    info = write_bundle(tmp_path / "third.bundle", [*reversed(data), data[2], data[0]])
    assert (tmp_path / "third.bundle").read_bytes() == first.read_bytes()
    assert info == type(info)(
        path=tmp_path / "third.bundle", entries=5, bytes=first.stat().st_size,
        archs=("sm_80", "sm_90"), signed=False, sha256=_sha256(first),
    )  # fmt: skip
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_the_format_is_as_documented(warm: Warm, bundle: Path) -> None:
    data = bundle.read_bytes()
    assert data[:16] == b"AIONVRTC-BUNDLE1"
    index, data_at = _layout(data)
    (length,) = struct.unpack(">Q", data[16:HEAD])
    raw = data[HEAD : HEAD + length]
    assert raw == json.dumps(index, sort_keys=True, separators=(",", ":")).encode()
    assert (
        data[HEAD + length : HEAD + length + 32] == hashlib.sha256(data[: HEAD + length]).digest()
    )
    assert data[HEAD + length + 32 : data_at] == ZERO
    assert (index["format_version"], index["signed"]) == (FORMAT_VERSION, False)
    offset = 0
    for row, key in zip(index["entries"], warm.keys_of(), strict=True):
        entry = encode(warm.artifacts[key])
        artifact = warm.artifacts[key]
        assert row == {
            "key": key, "arch": artifact.arch, "kind": artifact.kind,
            "nvrtc_version": artifact.nvrtc_version, "offset": offset, "size": len(entry),
            "sha256": hashlib.sha256(entry).hexdigest(),
        }  # fmt: skip
        assert data[data_at + offset : data_at + offset + len(entry)] == entry
        offset += len(entry)
    assert data_at + offset == len(data)


def test_export_arch_selects_entries(warm: Warm, tmp_path: Path, run: Run, bundle: Path) -> None:
    path = tmp_path / "sm80.bundle"
    status, report, _ = run("cache", "export", path, "--arch", "sm_80", cache=warm.dir)
    assert status == 0
    assert (report["entries"], report["records"], report["archs"]) == (2, 0, ["sm_80"])
    with BundleTier(path) as tier:
        assert tier.keys() == tuple(warm.keys_of("sm_80"))
    both = tmp_path / "both.bundle"
    argv = ("cache", "export", both, "--arch", "sm_90", "--arch", "sm_80", "--arch", "sm_90")
    assert run(*argv, cache=warm.dir)[1]["entries"] == 5
    assert both.read_bytes() == bundle.read_bytes()


def test_export_with_nothing_to_export_fails(warm: Warm, tmp_path: Path, run: Run) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()  # one that does not exist is said so (test_cli)
    status, report, err = run("cache", "export", tmp_path / "x.bundle", cache=empty)
    message = (
        f"nothing to export: {empty / ENTRIES} holds no entries; compile kernels into it first "
        "(aionvrtc warm, or run the program that uses them)"
    )
    assert (status, report, err) == (1, {"error": message}, f"error: {message}\n")
    status, report, err = run(
        "cache", "export", tmp_path / "x.bundle", "--arch", "sm_75", cache=warm.dir
    )
    message = message.replace(str(empty), str(warm.dir)).replace("entries;", "entries for sm_75;")
    assert (status, report, err) == (1, {"error": message}, f"error: {message}\n")
    assert not (tmp_path / "x.bundle").exists()


def test_export_to_a_path_that_cannot_be_written_fails(
    warm: Warm, tmp_path: Path, run: Run
) -> None:
    path = tmp_path / "missing" / "x.bundle"
    status, report, err = run("cache", "export", path, cache=warm.dir)
    message = (
        f"cannot write the bundle {path} (No such file or directory); name a file in a folder "
        "this user can write"
    )
    assert (status, report, err) == (1, {"error": message}, f"error: {message}\n")
    (tmp_path / "folder.bundle").mkdir()
    status, report, _ = run("cache", "export", tmp_path / "folder.bundle", cache=warm.dir)
    assert report["error"] == (
        f"cannot write the bundle {tmp_path / 'folder.bundle'} (Is a directory); name a file "
        "in a folder this user can write"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["folder.bundle"]  # no tmp file left


def test_export_leaves_the_cache_as_it_was(warm: Warm, tmp_path: Path, run: Run) -> None:
    # A damaged entry is left out (and not removed), and no entry's recency changes.
    copy = Path(shutil.copytree(warm.dir, tmp_path / "copy"))
    files = _entry_files(copy)
    damaged = files[1]
    raw = bytearray(damaged.read_bytes())
    raw[-40] ^= 0xFF  # in the image: the header (and the index's summary of it) still reads
    damaged.write_bytes(raw)
    for path in files:
        os.utime(path, (1e9, 1e9))
    status, report, err = run("cache", "export", tmp_path / "x.bundle", cache=copy)
    assert (status, report["entries"]) == (0, 4)
    assert str(damaged) in err
    assert [(p.exists(), p.stat().st_mtime) for p in files] == [(True, 1e9)] * 5
    with BundleTier(tmp_path / "x.bundle") as tier:
        assert tier.keys() == tuple(k for k in warm.keys_of() if k != damaged.name)


def test_export_of_an_untrusted_cache_dir_fails(warm: Warm, tmp_path: Path, run: Run) -> None:
    copy = Path(shutil.copytree(warm.dir, tmp_path / "copy"))
    copy.chmod(0o777)
    damage = DiskTier(copy).trust_problem
    assert damage is not None
    status, report, _ = run("cache", "export", tmp_path / "x.bundle", cache=copy)
    assert (status, report["error"]) == (
        1,
        f"nothing to export: {copy} is not trusted ({copy} is writable by others (owner uid "
        f"{os.geteuid()}, mode 0777)); chmod go-w {copy}",
    )
    assert damage.fix == f"chmod go-w {copy}"


# -- signatures ------------------------------------------------------------------------------


def test_a_signed_bundle_imports_with_its_secret_only(
    warm: Warm, tmp_path: Path, run: Run, monkeypatch: pytest.MonkeyPatch, bundle: Path
) -> None:
    monkeypatch.setenv(SECRET_ENV, "first secret")
    signed = tmp_path / "signed.bundle"
    status, report, _ = run("cache", "export", signed, cache=warm.dir)
    assert (status, report["signed"]) == (0, True)
    data = signed.read_bytes()
    index, data_at = _layout(data)
    digest = data[data_at - 64 : data_at - 32]
    mac = hmac.new(b"first secret", b"aionvrtc-bundle:1\0" + digest, hashlib.sha256).digest()
    assert (index["signed"], data[data_at - 32 : data_at]) == (True, mac)
    assert data[data_at:] == bundle.read_bytes()[_layout(bundle.read_bytes())[1] :]

    target = tmp_path / "target"
    monkeypatch.setenv(SECRET_ENV, "another secret")
    message = f"bundle {signed}: signed with another secret: it cannot be trusted"
    assert run("cache", "import", signed, cache=target) == (
        1, {"error": message}, f"error: {message}\n",
    )  # fmt: skip
    message = (
        f"bundle {bundle}: not signed, and a secret is configured ($AIONVRTC_REMOTE_SECRET): it "
        "cannot be trusted"
    )
    assert run("cache", "import", bundle, cache=target)[1:] == (
        {"error": message}, f"error: {message}\n",
    )  # fmt: skip
    assert entries(target) == {}

    monkeypatch.setenv(SECRET_ENV, "first secret")
    status, report, _ = run("cache", "import", signed, cache=target)
    assert (status, report["added"], report["signature_verified"]) == (0, 5, True)
    assert entries(target) == entries(warm.dir)
    # Without a secret, the signature is not checked: the bundle is trusted as the file is.
    monkeypatch.delenv(SECRET_ENV)
    status, report, _ = run("cache", "import", signed, cache=tmp_path / "t2")
    assert (status, report["added"], report["signature_verified"]) == (0, 5, False)


def test_bundle_tier_checks_the_signature_at_open(warm: Warm, bundle: Path, tmp_path: Path) -> None:
    signed = tmp_path / "signed.bundle"
    write_bundle(signed, [encode(a) for a in warm.artifacts.values()], secret="s1")
    with BundleTier(signed, secret=b"s1") as tier:
        assert (tier.signed, len(tier.keys())) == (True, 5)
    with BundleTier(signed) as tier:  # no secret: not checked
        assert tier.signed
    with pytest.raises(BundleError) as raised:
        BundleTier(signed, secret=b"s2")
    assert str(raised.value) == f"bundle {signed}: signed with another secret: it cannot be trusted"
    with pytest.raises(BundleError) as raised:
        BundleTier(bundle, secret="s1")
    assert str(raised.value) == (
        f"bundle {bundle}: not signed, and a secret is configured ($AIONVRTC_REMOTE_SECRET): it "
        "cannot be trusted"
    )
    with pytest.raises(ValueError, match=r"^secret is empty"):
        BundleTier(bundle, secret=b"")


# -- damaged bundles: refused whole ----------------------------------------------------------


def _flip(at: int) -> Callable[[bytes], bytes]:
    return lambda data: data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


def _in_entry(number: int, back: int) -> Callable[[bytes], bytes]:
    """Flip a byte ``back`` bytes before the end of entry ``number`` (its image, or checksum)."""

    def change(data: bytes) -> bytes:
        index, data_at = _layout(data)
        row = index["entries"][number]
        return _flip(data_at + row["offset"] + row["size"] - back)(data)

    return change


def _index_end(data: bytes) -> int:
    return _layout(data)[1] - 64


TAMPERED: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "a byte of the index": (
        _flip(HEAD + 30),
        "the index digest does not match (the file is damaged or was changed)",
    ),
    "a byte of the digest": (
        lambda d: _flip(_index_end(d) + 5)(d),
        "the index digest does not match (the file is damaged or was changed)",
    ),
    "the signature of an unsigned bundle": (
        lambda d: _flip(_index_end(d) + 40)(d),
        "the index says unsigned, the signature field otherwise (the file was changed)",
    ),
    "the last byte cut off": (
        lambda d: d[:-1],
        "entry {last} runs past the end of the file (the file is truncated)",
    ),
    "cut to 50 bytes": (lambda d: d[:50], "truncated (50 bytes; a bundle has at least 88)"),
    "cut inside the index": (
        lambda d: d[:200],
        "the index ({length} bytes) runs past the end of the file (the file is truncated or "
        "damaged)",
    ),
    "the magic": (lambda d: b"AIONVRTC-BUNDLE2" + d[16:], "not an aionvrtc bundle (bad magic)"),
    "bytes appended": (
        lambda d: d + b"abc",
        "3 bytes after the last entry belong to no entry (the file was changed)",
    ),
    "a byte of an entry's image": (
        _in_entry(2, 100),
        "entry {third} does not match its SHA-256 in the index",
    ),
    "a byte of an entry's checksum": (
        _in_entry(4, 1),
        "entry {fifth} does not match its SHA-256 in the index",
    ),
}


@pytest.mark.parametrize("what", list(TAMPERED))
def test_a_damaged_bundle_is_refused_whole(
    what: str, warm: Warm, bundle: Path, tmp_path: Path, run: Run
) -> None:
    change, problem = TAMPERED[what]
    good = bundle.read_bytes()
    keys = warm.keys_of()
    (length,) = struct.unpack(">Q", good[16:HEAD])
    problem = problem.format(
        last=_short(keys[-1]), third=_short(keys[2]), fifth=_short(keys[4]), length=length
    )
    bad = tmp_path / "bad.bundle"
    bad.write_bytes(change(good))
    target = tmp_path / "target"
    DiskTier(target).probe_write()  # the cache dir exists: nothing is added to it
    message = f"bundle {bad}: {problem}"
    assert run("cache", "import", bad, cache=target) == (
        1, {"error": message}, f"error: {message}\n",
    )  # fmt: skip
    assert entries(target) == {}
    with pytest.raises(BundleError) as raised:
        verify_bundle(bad)
    assert str(raised.value) == message


def test_a_damaged_bundle_says_so_in_one_line_with_no_traceback(
    bundle: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.bundle"
    bad.write_bytes(_in_entry(0, 100)(bundle.read_bytes()))
    key = _layout(bad.read_bytes())[0]["entries"][0]["key"]
    proc = subprocess.run(
        [sys.executable, "-m", "aionvrtc", "cache", "import", str(bad), "--cache-dir",
         str(tmp_path / "target")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == (
        f"error: bundle {bad}: entry {_short(key)} does not match its SHA-256 in the index\n"
    )
    assert not (tmp_path / "target").exists()


def test_every_cut_and_every_flipped_byte_is_refused(bundle: Path, tmp_path: Path) -> None:
    good = bundle.read_bytes()
    bad = tmp_path / "bad.bundle"
    data_at = _layout(good)[1]
    # Every byte of the header, index, digest and signature; every 13th of the entries.
    places = [*range(data_at), *range(data_at, len(good), 13)]
    for at in places:
        bad.write_bytes(_flip(at)(good))
        with pytest.raises(BundleError):
            verify_bundle(bad)
    for size in [*range(0, data_at + 2), *range(data_at, len(good), 97), len(good) - 1]:
        bad.write_bytes(good[:size])
        with pytest.raises(BundleError):
            verify_bundle(bad)


# -- crafted indexes: a valid digest, contents that lie ---------------------------------------


def craft(
    index: Any, data: bytes = b"", *, length: int | None = None, signature: bytes = ZERO
) -> bytes:
    """A bundle with ``index`` (an object, or raw bytes) whose digest is right."""
    raw = index if isinstance(index, bytes) else json.dumps(index).encode()
    head = b"AIONVRTC-BUNDLE1" + struct.pack(">Q", len(raw) if length is None else length) + raw
    return head + hashlib.sha256(head).digest() + signature + data


def _row(entry: bytes, offset: int = 0, **changes: Any) -> dict[str, Any]:
    artifact = decode(entry)
    row = {
        "key": artifact.key, "arch": artifact.arch, "kind": artifact.kind,
        "nvrtc_version": artifact.nvrtc_version, "offset": offset, "size": len(entry),
        "sha256": hashlib.sha256(entry).hexdigest(),
    }  # fmt: skip
    return {**row, **changes}


def _replaced(index: dict[str, Any], offset: str) -> bytes:
    """``index`` as JSON, its first offset written as ``offset`` says (what json.dumps cannot
    write)."""
    return json.dumps(index).replace('"offset": 0', offset, 1).encode()


def _index(*rows: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {"entries": list(rows), "format_version": FORMAT_VERSION, "signed": False, **changes}


def _noncanonical(artifact: Artifact) -> bytes:
    """``artifact`` encoded as another encoder might: valid, yet not the bytes encode gives."""
    header = json.dumps({
        "key": artifact.key, "kind": artifact.kind, "arch": artifact.arch,
        "nvrtc_version": artifact.nvrtc_version, "package_version": artifact.package_version,
        "lowered_names": dict(artifact.lowered_names), "created": artifact.created,
        "compile_seconds": artifact.compile_seconds, "log": artifact.log,
        **({"parts": dict(artifact.parts)} if artifact.parts else {}),
        **({"part_items": {k: list(v) for k, v in artifact.part_items.items()}}
           if artifact.part_items else {}),
    }).encode()  # fmt: skip
    body = b"".join((
        _PREFIX.pack(MAGIC, FORMAT_VERSION, len(header)), header,
        _IMAGE_LEN.pack(len(artifact.image)), artifact.image,
    ))  # fmt: skip
    return body + hashlib.sha256(body).digest()


def _crafted(warm: Warm) -> dict[str, tuple[bytes, str]]:
    kernels = [k for k in warm.keys_of("sm_90") if warm.artifacts[k].kind == "cubin"]
    a, b = (encode(warm.artifacts[k]) for k in kernels)
    ka, kb = decode(a).key, decode(b).key
    both = a + b
    odd = _noncanonical(decode(a))
    fields = "arch, key, kind, nvrtc_version, offset, sha256, size"
    return {
        "a huge index length": (
            craft(_index(), length=1 << 63),
            f"an index of {1 << 63} bytes (at most {64 << 20}): the file is damaged",
        ),
        "an index length past the end": (
            craft(_index(), length=1000),
            "the index (1000 bytes) runs past the end of the file (the file is truncated or "
            "damaged)",
        ),
        "an entry past the end": (
            craft(_index(_row(a, size=len(a) + 1)), a),
            f"entry {_short(ka)} runs past the end of the file (the file is truncated)",
        ),
        "an offset past the end": (
            craft(_index(_row(a, offset=1 << 60)), a),
            f"{1 << 60} bytes before entry {_short(ka)} belong to no entry (the file was changed)",
        ),
        "a duplicate key": (
            craft(_index(_row(a), _row(a, offset=len(a))), a + a),
            f"key {_short(ka)} is in the index twice",
        ),
        "keys out of order": (
            craft(_index(_row(b), _row(a, offset=len(b))), b + a)
            if kb > ka
            else craft(_index(_row(a), _row(b, offset=len(a))), both),
            "the index is not sorted by key (at entry 1)",
        ),
        "overlapping entries": (
            craft(_index(_row(a), _row(b, offset=len(a) - 1)), both[: len(a) - 1] + b),
            f"entry {_short(kb)} overlaps the entry before it",
        ),
        "bad JSON": (
            craft(b"{not json"),
            "the index is not valid JSON (Expecting property name enclosed in double quotes: "
            "line 1 column 2 (char 1))",
        ),
        "JSON nested deep": (
            craft(b"[" * 100_000),
            "the index is not valid JSON (nested too deep)",
        ),
        "a huge number": (
            craft(_replaced(_index(_row(a)), '"offset": ' + "9" * 40), a),
            "the index is not valid JSON (an integer of 40 digits)",
        ),
        "a float": (
            craft(_replaced(_index(_row(a)), '"offset": 0.5'), a),
            "the index is not valid JSON (0.5 is not a number an index holds)",
        ),
        "NaN": (
            craft(_replaced(_index(_row(a)), '"offset": NaN'), a),
            "the index is not valid JSON (NaN is not a number an index holds)",
        ),
        "not an object": (
            craft([]),
            "the index is not a bundle index (an object of entries, format_version, signed)",
        ),
        "another format version": (
            craft(_index(format_version=FORMAT_VERSION + 1)),
            f"holds entries of format version {FORMAT_VERSION + 1}, this aionvrtc reads "
            f"{FORMAT_VERSION}: export it again with this aionvrtc",
        ),
        "signed not a bool": (craft(_index(signed=1)), "the index's signed is not true or false"),
        "says signed, is not": (
            craft(_index(signed=True)),
            "the index says signed, the signature field otherwise (the file was changed)",
        ),
        "entries not a list": (craft(_index(entries={})), "the index's entries are not a list"),
        "a missing field": (
            craft(_index({k: v for k, v in _row(a).items() if k != "sha256"}), a),
            f"index entry 0 is not an object of {fields}",
        ),
        "a key that is no key": (
            craft(_index(_row(a, key="../../etc/passwd")), a),
            "index entry 0: its key is not a cache key (64 lowercase hex digits)",
        ),
        "a bad sha256": (
            craft(_index(_row(a, sha256="00")), a),
            "index entry 0: its sha256 is not 64 lowercase hex digits",
        ),
        "an empty arch": (
            craft(_index(_row(a, arch="")), a),
            "index entry 0: its arch is not a short text",
        ),
        "an unknown kind": (
            craft(_index(_row(a, kind="elf")), a),
            "index entry 0: its kind is none of cubin, ptx, data",
        ),
        "a negative size": (
            craft(_index(_row(a, size=-1)), a),
            "index entry 0: its size is not a byte count",
        ),
        "a boolean offset": (
            craft(_index(_row(a, offset=False)), a),
            "index entry 0: its offset is not a byte count",
        ),
        "a huge size": (
            craft(_index(_row(a, size=1 << 40)), a),
            f"index entry 0: its size is {1 << 40} bytes (at most {256 << 20})",
        ),
        # The index says what the entry is not: refused when the entry is read.
        "the index's kind lies": (
            craft(_index(_row(a, kind="ptx")), a),
            f"entry {_short(ka)} is of kind 'cubin', the index says 'ptx'",
        ),
        "the index's arch lies": (
            craft(_index(_row(a, arch="sm_80")), a),
            f"entry {_short(ka)} is damaged (corrupt cache entry: entry was compiled for sm_90, "
            "expected sm_80)",
        ),
        "an entry another encoder wrote": (
            craft(_index(_row(odd)), odd),
            f"entry {_short(ka)} is not encoded as this aionvrtc encodes it, so it would change "
            "on import: export it again with this aionvrtc",
        ),
    }


CRAFTED = [
    "a huge index length", "an index length past the end", "an entry past the end",
    "an offset past the end", "a duplicate key", "keys out of order", "overlapping entries",
    "bad JSON", "JSON nested deep", "a huge number", "a float", "NaN", "not an object",
    "another format version", "signed not a bool", "says signed, is not", "entries not a list",
    "a missing field", "a key that is no key", "a bad sha256", "an empty arch", "an unknown kind",
    "a negative size", "a boolean offset", "a huge size",
]  # fmt: skip
READ_LATER = ["the index's kind lies", "the index's arch lies"]
# Import refuses it (re-encoded, it would not be the bytes the index vouches for); read in
# place, it is a valid entry.
SERVED = "an entry another encoder wrote"


@pytest.mark.parametrize("what", [*CRAFTED, *READ_LATER, SERVED])
def test_a_crafted_index_is_refused_with_a_bundle_error(
    what: str, warm: Warm, tmp_path: Path
) -> None:
    content, problem = _crafted(warm)[what]
    path = tmp_path / "crafted.bundle"
    path.write_bytes(content)
    message = f"bundle {path}: {problem}"
    with pytest.raises(BundleError) as raised:
        verify_bundle(path)
    assert str(raised.value) == message
    if what in READ_LATER:  # the tier opens, and the entry is skipped when read
        with BundleTier(path) as tier:
            assert tier.read(tier.keys()[0]) is None
            assert tier.stats().damaged == 1
    elif what == SERVED:
        with BundleTier(path) as tier:
            key = tier.keys()[0]
            assert tier.read(key) == warm.artifacts[key]
            assert tier.stats().damaged == 0
    else:
        with pytest.raises(BundleError) as raised:
            BundleTier(path)
        assert str(raised.value) == message


def test_what_is_not_a_bundle_file_is_refused(tmp_path: Path) -> None:
    cases = {
        tmp_path / "missing.bundle": "cannot be read (No such file or directory)",
        tmp_path: "a folder, not a regular file",
    }
    fifo = tmp_path / "fifo.bundle"
    os.mkfifo(fifo)
    cases[fifo] = "a FIFO, not a regular file"  # and the open does not wait for a writer
    for path, problem in cases.items():
        for call in (verify_bundle, BundleTier):
            with pytest.raises(BundleError) as raised:
                call(path)
            assert str(raised.value) == f"bundle {path}: {problem}"


def test_write_bundle_takes_only_entries_it_can_ship(warm: Warm, tmp_path: Path) -> None:
    artifact = warm.artifacts[warm.keys_of()[0]]
    data = encode(artifact)
    path = tmp_path / "x.bundle"
    with pytest.raises(CacheCorruptError, match=r"^corrupt cache entry: checksum mismatch"):
        write_bundle(path, [data[:-1] + bytes([data[-1] ^ 1])])
    with pytest.raises(ValueError, match="not encoded as") as raised:
        write_bundle(path, [_noncanonical(artifact)])
    assert str(raised.value) == (
        f"entry {_short(artifact.key)} is not encoded as this aionvrtc encodes it"
    )
    other = encode(dataclasses.replace(artifact, created=artifact.created + 1))
    with pytest.raises(ValueError, match="two different entries") as raised:
        write_bundle(path, [data, other])
    assert str(raised.value) == f"two different entries hold key {_short(artifact.key)}: give one"
    assert not path.exists()
    # No entries is a bundle too (the CLI refuses to write one).
    info = write_bundle(path, [])
    assert (info.entries, info.archs, path.stat().st_size) == (0, (), info.bytes)
    assert verify_bundle(path) == []


# -- import into a cache dir that cannot take it ---------------------------------------------


def test_import_into_an_untrusted_cache_dir_adds_nothing(
    warm: Warm, bundle: Path, tmp_path: Path, run: Run
) -> None:
    target = tmp_path / "target"
    target.mkdir(mode=0o777)
    target.chmod(0o777)
    status, report, _ = run("cache", "import", bundle, cache=target)
    assert (status, report) == (1, {"error": (
        f"cannot import {bundle}: {target} is not trusted ({target} is writable by others "
        f"(owner uid {os.geteuid()}, mode 0777)); chmod go-w {target}"
    )})  # fmt: skip
    assert list(target.iterdir()) == []


def test_import_into_a_read_only_cache_dir_adds_nothing(
    warm: Warm,
    bundle: Path,
    tmp_path: Path,
    run: Run,
    read_only: Callable[[Path], Path],
) -> None:
    folder = tmp_path / "target"
    DiskTier(folder).probe_write()  # made, with its version folder, then made read-only
    view = read_only(folder)
    failure = DiskTier(view).probe_write()
    assert failure is not None
    status, report, _ = run("cache", "import", bundle, cache=view)
    assert (status, report) == (1, {"error": (
        f"cannot import {bundle}: {view / ENTRIES} cannot be written ({failure}); point "
        "--cache-dir (or AIONVRTC_CACHE_DIR) at a folder this user can write"
    )})  # fmt: skip
    assert entries(view) == {}


def test_import_of_more_than_the_cache_limit_adds_nothing(
    bundle: Path, tmp_path: Path, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIONVRTC_DISK_LIMIT", "10000")
    total = sum(row["size"] for row in _layout(bundle.read_bytes())[0]["entries"])
    assert total > 10000
    status, report, _ = run("cache", "import", bundle, cache=tmp_path / "target")
    assert (status, report) == (1, {"error": (
        f"cannot import {bundle}: its 5 entries take {format_size(total)}, more than the cache "
        f"limit of {format_size(10000)}; raise $AIONVRTC_DISK_LIMIT"
    )})  # fmt: skip
    assert entries(tmp_path / "target") == {}


# -- trust: a bundle is imported only where it would be read as a layer ----------------------

NOT_TRUSTED = "not trusted, as others could plant kernels in it"
OWN_COPY = "copy it, if you trust where it came from, into a folder of your own"

# A case makes a bundle holding ``data`` in ``folder`` (a folder uid 65534 can reach), and gives
# the path to import and what is wrong ("<path> is <problem>; fix: <fix>"), or None if trusted.
Made = tuple[Path, str | None]


def _file(path: Path, data: bytes, mode: int = 0o644) -> Path:
    path.write_bytes(data)
    path.chmod(mode)  # whatever the umask
    return path


def _folder(path: Path, mode: int) -> Path:
    path.mkdir()
    path.chmod(mode)
    return path


def _others_can_write(folder: Path, data: bytes) -> Made:
    path = _file(folder / "k.bundle", data, 0o666)
    uid = os.geteuid()
    return (
        path,
        f"{path} is writable by others (owner uid {uid}, mode 0666); fix: chmod go-w {path}",
    )


def _group_can_write(folder: Path, data: bytes) -> Made:
    path = _file(folder / "k.bundle", data, 0o664)
    uid, gid = os.geteuid(), path.stat().st_gid
    return path, (
        f"{path} is writable by group {gid} (owner uid {uid}, mode 0664); fix: chmod go-w "
        f"{path}, or share it with group {gid}: AIONVRTC_SHARED_CACHE=1"
    )


def _in_a_folder_others_can_write(folder: Path, data: bytes) -> Made:
    shared = _folder(folder / "drop", 0o777)  # without the sticky bit: others rename in it
    return _file(shared / "k.bundle", data), (
        f"{shared} is writable by others without the sticky bit (mode 0777); fix: chmod o-w "
        f"{shared}"
    )


def _planted_by_another_user(folder: Path, data: bytes) -> Made:
    drop = _folder(folder / "drop", 0o1777)  # as /tmp: anyone may add a file of their own
    path = drop / "k.bundle"

    def plant() -> dict[str, Any]:
        return {"wrote": path.write_bytes(data)}

    as_other_user(plant)
    mode = stat.S_IMODE(path.stat().st_mode)
    return path, (
        f"{path} is owned by uid {NOBODY} (mode {mode:04o}), not by this user (uid "
        f"{os.geteuid()}) or root; fix: {OWN_COPY}"
    )


def _link_to_a_file_others_can_write(folder: Path, data: bytes) -> Made:
    target, problem = _others_can_write(folder, data)
    link = folder / "link.bundle"
    link.symlink_to(target)  # the link is this user's: the file it names is not safe
    return link, problem


def _link_in_a_folder_others_can_write(folder: Path, data: bytes) -> Made:
    target = _file(folder / "k.bundle", data)
    shared = _folder(folder / "drop", 0o777)
    link = shared / "k.bundle"
    link.symlink_to(target)  # a safe file, named through a link that others can swap
    return link, (
        f"{shared} is writable by others without the sticky bit (mode 0777); fix: chmod o-w "
        f"{shared}"
    )


def _link_of_another_user(folder: Path, data: bytes) -> Made:
    target = _file(folder / "k.bundle", data)
    drop = _folder(folder / "drop", 0o1777)
    link = drop / "k.bundle"

    def plant() -> dict[str, Any]:
        # Its owner may replace it (the sticky bit lets them) to point at another file.
        os.symlink(target, link)
        return {}

    as_other_user(plant)
    return link, (
        f"{link} is a symbolic link owned by uid {NOBODY}, not by this user (uid "
        f"{os.geteuid()}) or root; fix: {OWN_COPY}"
    )


def _chain_through_a_link_of_another_user(folder: Path, data: bytes) -> Made:
    # A link of this user's (root's) naming another user's link in a sticky folder: the second
    # link's owner may point it elsewhere, though neither is a part of the path given.
    theirs, problem = _link_of_another_user(folder, data)
    link = folder / "chain.bundle"
    link.symlink_to(theirs)
    return link, problem


def _chain_through_a_folder_others_can_write(folder: Path, data: bytes) -> Made:
    # This user's links all the way, the second in a folder others can rename in.
    inner, problem = _link_in_a_folder_others_can_write(folder, data)
    link = folder / "chain.bundle"
    link.symlink_to(inner)
    return link, problem


def _chain_through_a_folder_link_of_another_user(folder: Path, data: bytes) -> Made:
    # A relative link through another user's link to a folder: the bundle's folder is theirs
    # to choose, though the file at the end is this user's.
    real = _folder(folder / "real", 0o755)
    _file(real / "k.bundle", data)
    drop = _folder(folder / "drop", 0o1777)
    theirs = drop / "dir"

    def plant() -> dict[str, Any]:
        os.symlink(real, theirs)
        return {}

    as_other_user(plant)
    link = folder / "chain.bundle"
    link.symlink_to("drop/dir/k.bundle")
    return link, (
        f"{theirs} is a symbolic link owned by uid {NOBODY}, not by this user (uid "
        f"{os.geteuid()}) or root; fix: {OWN_COPY}"
    )


def _yours(folder: Path, data: bytes) -> Made:
    return _file(folder / "k.bundle", data), None


def _in_a_sticky_folder(folder: Path, data: bytes) -> Made:
    return _file(_folder(folder / "drop", 0o1777) / "k.bundle", data), None


def _your_link_to_your_file(folder: Path, data: bytes) -> Made:
    link = folder / "link.bundle"
    link.symlink_to(_file(folder / "k.bundle", data))
    return link, None


def _chain_of_your_links(folder: Path, data: bytes) -> Made:
    # Links of this user's in a sticky folder and in a folder of its own, relative and absolute.
    inner = _folder(folder / "drop", 0o1777) / "inner.bundle"
    inner.symlink_to(_file(folder / "k.bundle", data))
    link = folder / "chain.bundle"
    link.symlink_to("drop/../drop/inner.bundle")
    return link, None


def _group_can_write_shared(folder: Path, data: bytes) -> Made:
    return _file(folder / "k.bundle", data, 0o664), None  # a group of this user's: opted in


Case = Callable[[Path, bytes], Made]
REFUSED = [
    pytest.param(_others_can_write, id="file-0666"),
    pytest.param(_group_can_write, id="file-0664"),
    pytest.param(_in_a_folder_others_can_write, id="folder-0777"),
    pytest.param(_planted_by_another_user, id="owned-by-nobody", marks=as_root),
    pytest.param(_link_to_a_file_others_can_write, id="link-to-file-0666"),
    pytest.param(_link_in_a_folder_others_can_write, id="link-in-folder-0777"),
    pytest.param(_link_of_another_user, id="link-owned-by-nobody", marks=as_root),
    pytest.param(_chain_through_a_link_of_another_user, id="chain-link-by-nobody", marks=as_root),
    pytest.param(_chain_through_a_folder_others_can_write, id="chain-folder-0777"),
    pytest.param(
        _chain_through_a_folder_link_of_another_user, id="chain-dir-link-by-nobody", marks=as_root
    ),
]
ACCEPTED = [
    pytest.param(_yours, id="file-0644"),
    pytest.param(_in_a_sticky_folder, id="folder-1777"),
    pytest.param(_your_link_to_your_file, id="link-to-file-0644"),
    pytest.param(_chain_of_your_links, id="chain-of-your-links"),
    pytest.param(_group_can_write_shared, id="file-0664-shared"),
]


@dataclasses.dataclass(frozen=True)
class Planted:
    """A bundle of one entry for a kernel's key holding another kernel (right key, arch and
    checksum): what someone who could write the bundle would plant."""

    key: str
    entry: bytes
    bundle: bytes


@pytest.fixture
def planted(warm: Warm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Planted:
    monkeypatch.delenv("AIONVRTC_SHARED_CACHE", raising=False)
    first, second = (a for a in warm.artifacts.values() if (a.arch, a.kind) == ("sm_90", "cubin"))
    entry = encode(dataclasses.replace(second, key=first.key))
    path = tmp_path / "planted.bundle"
    write_bundle(path, [entry])
    return Planted(first.key, entry, path.read_bytes())


def _made(case: Case, folder: Path, planted: Planted, monkeypatch: pytest.MonkeyPatch) -> Made:
    if case is _group_can_write_shared:
        monkeypatch.setenv("AIONVRTC_SHARED_CACHE", "1")
    return case(folder, planted.bundle)


@pytest.mark.parametrize("case", REFUSED)
def test_import_refuses_a_bundle_others_could_change_and_adds_nothing(
    case: Case,
    planted: Planted,
    other_users_dir: Path,
    tmp_path: Path,
    run: Run,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, damage = _made(case, other_users_dir, planted, monkeypatch)
    target = tmp_path / "target"
    assert DiskTier(target).probe_write() is None  # a cache dir as a write makes it, empty
    before = tree(target)
    status, report, err = run("cache", "import", path, cache=target)
    message = f"bundle {path}: {NOT_TRUSTED}: {damage}"
    assert (status, report) == (1, {"error": message})
    assert err == f"error: {message}\n"
    assert tree(target) == before
    # The fix named works (its first way, where there are several).
    fix = damage.split("; fix: ")[1].split(", or ")[0] if damage else ""
    if fix == OWN_COPY:
        copy = tmp_path / "copy.bundle"  # cp, as a user would: the copy is theirs
        subprocess.run(["cp", str(path), str(copy)], check=True)
        path = copy
    else:
        subprocess.run(shlex.split(fix), check=True)
    status, report, _ = run("cache", "import", path, cache=target)
    assert (status, report["added"]) == (0, 1)
    assert entries(target) == {planted.key: planted.entry}


@pytest.mark.parametrize("case", ACCEPTED)
def test_import_takes_a_bundle_only_this_user_or_root_could_change(
    case: Case,
    planted: Planted,
    other_users_dir: Path,
    tmp_path: Path,
    run: Run,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, damage = _made(case, other_users_dir, planted, monkeypatch)
    assert damage is None
    target = tmp_path / "target"
    status, report, err = run("cache", "import", path, cache=target)
    assert (status, report["added"], err) == (0, 1, "")
    assert entries(target) == {planted.key: planted.entry}


@pytest.mark.parametrize("case", [*REFUSED, *ACCEPTED])
def test_import_and_a_layer_give_one_verdict(
    case: Case,
    planted: Planted,
    other_users_dir: Path,
    tmp_path: Path,
    run: Run,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from aionvrtc._store.layers import open_layers

    path, damage = _made(case, other_users_dir, planted, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="aionvrtc"):
        layers = open_layers([path])
    warned = [r.getMessage() for r in caplog.records]
    for layer in layers:
        layer.close()
    status, report, _ = run("cache", "import", path, cache=tmp_path / "target")
    if damage is None:
        assert (len(layers), warned, status) == (1, [], 0)
    else:
        message = f"bundle {path}: {NOT_TRUSTED}: {damage}"
        assert (layers, warned) == ([], [f"not reading the cache layer {path}: {message}"])
        assert (status, report) == (1, {"error": message})


# -- BundleTier: reading in place ------------------------------------------------------------


def test_bundle_tier_counts_hits_misses_and_arch_mismatches(warm: Warm, bundle: Path) -> None:
    key80, key90 = warm.keys_of("sm_80")[0], warm.keys_of("sm_90")[0]
    with BundleTier(bundle) as tier:
        assert tier.keys() == tuple(warm.keys_of())
        assert tier.read(key90) == warm.artifacts[key90]
        assert tier.read(key90, arch="sm_90") == warm.artifacts[key90]
        assert tier.read("0" * 64) is None
        assert tier.read("not a key") is None
        assert tier.read(key80, arch="sm_90") is None  # built for another arch: a miss
        assert tier.read(key80, arch="sm_80") == warm.artifacts[key80]
        assert tier.stats() == LayerStats(
            path=str(bundle), kind="bundle", hits=3, misses=3, damaged=0, entries=5
        )
        assert tier.write(warm.artifacts[key80]) is False  # read-only
        assert tier.read(key80) is not None
    assert tier.closed
    assert tier.read(key80) is None  # closed: a miss, never an error
    assert tier.stats().misses == 4


def test_bundle_tier_skips_a_damaged_entry_and_warns_once(
    warm: Warm, bundle: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "damaged.bundle"
    path.write_bytes(_in_entry(1, 100)(bundle.read_bytes()))
    key = warm.keys_of()[1]
    caplog.set_level(logging.WARNING, logger="aionvrtc")
    with BundleTier(path) as tier:
        assert [tier.read(key) for _ in range(3)] == [None] * 3
        for other in warm.keys_of()[:1] + warm.keys_of()[2:]:
            assert tier.read(other) == warm.artifacts[other]
        assert tier.stats() == LayerStats(
            path=str(path), kind="bundle", hits=4, misses=3, damaged=1, entries=5
        )
    assert [r.getMessage() for r in caplog.records] == [
        f"skipping entry {_short(key)} of bundle {path}: it does not match its SHA-256 in the "
        "index; the kernel is compiled instead"
    ]


def test_bundle_tier_reads_after_the_file_is_removed_or_replaced(
    warm: Warm, bundle: Path, tmp_path: Path
) -> None:
    path = Path(shutil.copy(bundle, tmp_path / "gone.bundle"))
    with BundleTier(path) as tier:
        path.unlink()
        assert [tier.read(k) for k in warm.keys_of()] == [warm.artifacts[k] for k in warm.keys_of()]
        # Another bundle renamed into its place: this tier still serves the one it opened.
        write_bundle(path, [encode(warm.artifacts[warm.keys_of()[0]])])
        assert tier.read(warm.keys_of()[4]) == warm.artifacts[warm.keys_of()[4]]
        assert tier.stats().hits == 6


def test_bundle_tier_notices_a_file_cut_in_place(
    warm: Warm, bundle: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = Path(shutil.copy(bundle, tmp_path / "cut.bundle"))
    last = warm.keys_of()[-1]
    with BundleTier(path) as tier:
        os.truncate(path, path.stat().st_size - 10)  # in place: the map sees it
        assert tier.read(last) is None
        assert tier.read(warm.keys_of()[0]) == warm.artifacts[warm.keys_of()[0]]
        assert (tier.stats().damaged, tier.stats().hits) == (1, 1)
    assert caplog.records[-1].getMessage() == (
        f"skipping entry {_short(last)} of bundle {path}: it is cut off: the bundle file shrank "
        "after it was opened; the kernel is compiled instead"
    )


def test_bundle_tier_reads_from_many_threads(warm: Warm, bundle: Path) -> None:
    keys, rounds, threads = warm.keys_of(), 20, 8
    wrong: list[str] = []

    def reader() -> None:
        for _ in range(rounds):
            for key in keys:
                if tier.read(key) != warm.artifacts[key]:
                    wrong.append(key)
            tier.read("f" * 64)

    with BundleTier(bundle) as tier:
        workers = [threading.Thread(target=reader) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        assert wrong == []
        stats = tier.stats()
        assert (stats.hits, stats.misses) == (threads * rounds * len(keys), threads * rounds)
