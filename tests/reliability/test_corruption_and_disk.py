"""Corrupt entries of every kind, disk faults and file permissions: each detected or survived,
counted, and the request served from memory and NVRTC (real files; a fault is injected by hand
only where it cannot be produced for real)."""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from aionvrtc import KernelCache, kernel_key
from aionvrtc._artifact import encode
from aionvrtc._spec import FORMAT_VERSION

from ..support import ENTRIES, make_spec


def test_folders_are_private_and_entries_not_writable_by_others(cache_dir: Path) -> None:
    art = KernelCache("sm_90", cache_dir=cache_dir).get_or_compile(make_spec())
    entry = cache_dir / ENTRIES / art.key[:2] / art.key
    for folder in (cache_dir, cache_dir / ENTRIES, entry.parent):
        assert folder.stat().st_mode & 0o777 == 0o700, folder
    assert entry.stat().st_mode & 0o777 == 0o600


# -- corruption --------------------------------------------------------------------------


def _damage(kind: str, path: Path, other: bytes) -> None:
    data = path.read_bytes()
    damaged = {
        "truncated": data[: len(data) // 2],
        "bit-flipped": data[:100] + bytes([data[100] ^ 0x01]) + data[101:],
        "empty": b"",
        "garbage": os.urandom(len(data)),
        "wrong magic": b"NOTOURS!" + data[8:],
        "future version": data[:8] + (FORMAT_VERSION + 1).to_bytes(2, "big") + data[10:],
        "swapped key": other,
    }[kind]
    path.write_bytes(damaged)


DAMAGE = ["truncated", "bit-flipped", "empty", "garbage", "wrong magic", "future version"]
DAMAGE += ["swapped key"]


@pytest.mark.parametrize("kind", DAMAGE)
def test_corrupt_entries_are_dropped_counted_and_recompiled(
    cache_dir: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    spec, other = make_spec(), make_spec()
    writer = KernelCache("sm_90", cache_dir=cache_dir)
    good = writer.get_or_compile(spec)
    other_art = writer.get_or_compile(other)
    entry = cache_dir / ENTRIES / good.key[:2] / good.key
    _damage(kind, entry, encode(other_art))

    reader = KernelCache("sm_90", cache_dir=cache_dir)
    with caplog.at_level(logging.WARNING, logger="aionvrtc"):
        art = reader.get_or_compile(spec)
    assert art.image == good.image
    assert art.key == good.key
    stats = reader.stats()
    assert (stats.disk.corrupt_dropped, stats.compiles, stats.disk.hits) == (1, 1, 0)
    assert [r.message for r in caplog.records if "dropping disk cache entry" in r.message]
    # The recompiled entry replaced the bad one and verifies.
    assert KernelCache("sm_90", cache_dir=cache_dir).get_or_compile(spec).image == good.image


def test_entry_for_another_arch_under_this_key_is_refused(cache_dir: Path) -> None:
    spec = make_spec()
    on_80 = KernelCache("sm_80", cache_dir=cache_dir).get_or_compile(spec)
    key_90 = kernel_key(spec, "sm_90")
    planted = cache_dir / ENTRIES / key_90[:2] / key_90
    planted.parent.mkdir(parents=True, exist_ok=True)
    from dataclasses import replace

    planted.write_bytes(encode(replace(on_80, key=key_90)))  # valid checksum, wrong arch
    cache = KernelCache("sm_90", cache_dir=cache_dir)
    art = cache.get_or_compile(spec)
    assert art.arch == "sm_90"
    assert cache.stats().disk.corrupt_dropped == 1


def test_symlinked_entry_is_not_followed(cache_dir: Path, tmp_path: Path) -> None:
    spec = make_spec()
    art = KernelCache("sm_90", cache_dir=cache_dir).get_or_compile(spec)
    entry = cache_dir / ENTRIES / art.key[:2] / art.key
    target = tmp_path / "elsewhere"
    target.write_bytes(entry.read_bytes())
    entry.unlink()
    entry.symlink_to(target)
    cache = KernelCache("sm_90", cache_dir=cache_dir)
    cache.get_or_compile(spec)
    stats = cache.stats()
    assert (stats.disk.hits, stats.compiles, stats.disk.corrupt_dropped) == (0, 1, 1)
    assert not entry.is_symlink()
    assert target.read_bytes()  # the link's target was never touched


# -- disk faults -------------------------------------------------------------------------


def test_read_only_cache_dir_serves_and_warns_once(
    cache_dir: Path, read_only: Callable[[Path], Path], caplog: pytest.LogCaptureFixture
) -> None:
    cached = make_spec()
    KernelCache("sm_90", cache_dir=cache_dir).get_or_compile(cached)
    view = read_only(cache_dir)
    cache = KernelCache("sm_90", cache_dir=view)
    with caplog.at_level(logging.WARNING, logger="aionvrtc"):
        assert cache.get_or_compile(cached).image[:4] == b"\x7fELF"  # read from disk
        fresh = [cache.get_or_compile(make_spec()) for _ in range(3)]  # compiled, not stored
    assert all(a.image[:4] == b"\x7fELF" for a in fresh)
    stats = cache.stats()
    assert (stats.disk.hits, stats.compiles, stats.disk.write_failures) == (1, 3, 1)
    assert stats.disk.writable is False
    warnings = [r.message for r in caplog.records if "not writable" in r.message]
    assert len(warnings) == 1
    assert "writing disabled" in warnings[0]
    # Served from memory afterwards.
    assert cache.get_or_compile(cached) is cache.get_or_compile(cached)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_full_disk_disables_writing(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch, code: int, caplog: pytest.LogCaptureFixture
) -> None:
    # A full disk cannot be produced on demand here: inject ENOSPC at the fsync of the write.
    def full(fd: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", full)
    cache = KernelCache("sm_90", cache_dir=cache_dir)
    with caplog.at_level(logging.WARNING, logger="aionvrtc"):
        arts = [cache.get_or_compile(make_spec()) for _ in range(2)]
    assert all(a.kind == "cubin" for a in arts)
    stats = cache.stats()
    assert (stats.compiles, stats.disk.write_failures, stats.disk.writable) == (2, 1, False)
    assert len([r for r in caplog.records if "not writable" in r.message]) == 1
    leftovers = [p.name for p in cache_dir.rglob("*") if p.is_file()]
    # No tmp file, no entry, no lock file (removed as it is let go): the empty index made with
    # the version folder is all there is.
    assert leftovers == [".index"]


def test_cache_dir_deleted_under_a_running_cache(cache_dir: Path) -> None:
    import shutil

    cache = KernelCache("sm_90", cache_dir=cache_dir)
    cache.get_or_compile(make_spec())
    shutil.rmtree(cache_dir)
    spec = make_spec()
    art = cache.get_or_compile(spec)
    assert (cache_dir / ENTRIES / art.key[:2] / art.key).is_file()  # recreated
    assert cache.stats().disk.write_failures == 0
