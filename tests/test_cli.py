"""The command line (`python -m aionvrtc`) through real processes on a temporary cache dir, with
real NVRTC compiles (no GPU needed), and the Prometheus collector against a Compiler's stats."""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from aionvrtc import Compiler, _cli, _cuda_versions, _nvrtc, tropical
from aionvrtc._cli import _shared as cli_shared
from aionvrtc._cli import cache as cli_cache
from aionvrtc._spec import FORMAT_VERSION
from aionvrtc._store.disk import DiskTier

from .support import ENTRIES, make_spec
from .support.cli import WARM, cli

KERNELS = len(tropical.all_specs(["andor"], ["bool"]))


@pytest.fixture(scope="module")
def warmed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache dir holding the and-or kernels for sm_90, compiled once for the module."""
    cache = tmp_path_factory.mktemp("warmed")
    first = cli(*WARM, cache=cache)
    assert first == {**first, "archs": ["sm_90"], "kernels": KERNELS, "compiled": KERNELS}
    assert first["from_disk"] == 0
    return cache


@pytest.fixture
def cache(warmed: Path, tmp_path: Path) -> Path:
    """A private copy of the warmed cache dir, for tests that change it."""
    import shutil

    return Path(shutil.copytree(warmed, tmp_path / "cache"))


def entries(cache: Path) -> dict[str, Path]:
    return {p.name: p for p in (cache / ENTRIES).glob("*/*") if not p.name.startswith(".")}


def test_warm_compiles_each_kernel_once(warmed: Path) -> None:
    again = cli(*WARM, cache=warmed)
    assert (again["compiled"], again["from_disk"], again["kernels"]) == (0, KERNELS, KERNELS)
    assert len(entries(warmed)) == KERNELS


# Two archs in one call, sm_80 named twice: its kernels are compiled once.
WARM_TWO = [*WARM[:2], "--arch", "sm_80", "--arch", "sm_90", "--arch", "sm_80", *WARM[4:]]


@pytest.fixture(scope="module")
def warmed_two(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache dir holding the and-or kernels for sm_80 and sm_90, warmed in one call."""
    cache = tmp_path_factory.mktemp("warmed-two")
    first = cli(*WARM_TWO, cache=cache)
    assert first == {
        **first, "archs": ["sm_80", "sm_90"], "kernels": 2 * KERNELS, "compiled": 2 * KERNELS,
        "kept": 2 * KERNELS, "from_disk": 0, "directory": str(cache / ENTRIES),
    }  # fmt: skip
    assert sorted(first) == sorted([
        "archs", "kernels", "compiled", "kept", "from_disk", "compile_seconds", "seconds",
        "directory",
    ])  # fmt: skip
    return cache


def test_warm_compiles_for_several_archs_in_one_call(warmed_two: Path) -> None:
    rows = cli("cache", "ls", cache=warmed_two)
    assert len(rows) == len(entries(warmed_two)) == 2 * KERNELS
    by_arch = {arch: [r for r in rows if r["arch"] == arch] for arch in ("sm_80", "sm_90")}
    assert [len(found) for found in by_arch.values()] == [KERNELS, KERNELS]
    # The same kernels for each: one set of names, compiled twice.
    assert sorted(r["names"] for r in by_arch["sm_80"]) == sorted(
        r["names"] for r in by_arch["sm_90"]
    )
    again = run(*WARM_TWO, "--cache-dir", str(warmed_two))
    assert (again.returncode, again.stderr) == (0, "")
    assert again.stdout.startswith(
        f"{2 * KERNELS} tropical kernels for sm_80, sm_90: 0 compiled, {2 * KERNELS} already on "
        f"disk, in "
    )
    assert again.stdout.endswith(f" s ({warmed_two / ENTRIES})\n")


def test_warm_compiles_only_the_arch_that_is_not_on_disk(cache: Path) -> None:
    # sm_90 is warm already: only sm_100's kernels are compiled, in the one call.
    report = cli(*WARM[:4], "--arch", "sm_100", *WARM[4:], cache=cache)
    assert report == {
        **report, "archs": ["sm_90", "sm_100"], "kernels": 2 * KERNELS, "compiled": KERNELS,
        "kept": KERNELS, "from_disk": KERNELS,
    }  # fmt: skip
    assert len(cli("cache", "ls", "--arch", "sm_100", cache=cache)) == KERNELS


def test_info_counts_the_entries_of_each_arch(warmed_two: Path, tmp_path: Path) -> None:
    import shutil

    rows = cli("cache", "ls", cache=warmed_two)
    version = _nvrtc.version_string()
    expected = {
        arch: {
            "entries": KERNELS,
            "bytes": sum(r["size"] for r in rows if r["arch"] == arch),
            "nvrtc_versions": {version: KERNELS},
        }
        for arch in ("sm_80", "sm_90")
    }
    info = cli("cache", "info", cache=warmed_two)
    assert (info["archs"], info["entries"]) == (expected, 2 * KERNELS)
    # Entries of another process's NVRTC (a CUDA 12 one shares the dir), of an arch that sorts
    # after sm_90 by number, and one whose header names no arch (counted as an entry only).
    cache = Path(shutil.copytree(warmed_two, tmp_path / "cache"))
    shard = sorted(entries(cache).values())[0].parent.name
    planted = {
        b'{"kind":"cubin","arch":"sm_80","nvrtc_version":"12.9"}': "sm_80",
        b'{"kind":"cubin","arch":"sm_100","nvrtc_version":"13.0"}': "sm_100",
        b'{"kind":"cubin","nvrtc_version":"13.0"}': None,
    }
    sizes: dict[str | None, int] = {}
    for header, arch in planted.items():
        entry = _entry_bytes(header)
        sizes[arch] = len(entry)
        _plant(cache, shard, functools.partial(Path.write_bytes, data=entry))
    info = cli("cache", "info", cache=cache)
    assert info["entries"] == 2 * KERNELS + 3
    assert list(info["archs"]) == ["sm_80", "sm_90", "sm_100"]
    assert info["archs"]["sm_80"] == {
        "entries": KERNELS + 1, "bytes": expected["sm_80"]["bytes"] + sizes["sm_80"],
        "nvrtc_versions": {"12.9": 1, version: KERNELS},
    }  # fmt: skip
    assert list(info["archs"]["sm_80"]["nvrtc_versions"]) == sorted(
        ["12.9", version], key=lambda v: tuple(map(int, v.split(".")))
    )
    assert info["archs"]["sm_90"] == expected["sm_90"]
    assert info["archs"]["sm_100"] == {
        "entries": 1, "bytes": sizes["sm_100"], "nvrtc_versions": {"13.0": 1},
    }  # fmt: skip
    table = run("cache", "info", "--cache-dir", str(cache), env={"COLUMNS": "300"}).stdout
    assert (
        f"sm_80: {KERNELS + 1} (NVRTC 12.9: 1, {version}: {KERNELS}); sm_90: {KERNELS} (NVRTC "
        f"{version}); sm_100: 1 (NVRTC 13.0)"
    ) in table


def test_info_reports_the_entries(warmed: Path) -> None:
    info = cli("cache", "info", cache=warmed)
    files = entries(warmed).values()
    assert info["entries"] == KERNELS
    assert info["bytes"] == sum(p.stat().st_size for p in files)
    assert info["archs"] == {
        "sm_90": {
            "entries": KERNELS, "bytes": info["bytes"],
            "nvrtc_versions": {_nvrtc.version_string(): KERNELS},
        }
    }  # fmt: skip
    assert info["limit"] == 1 << 30
    assert info["format_version"] == FORMAT_VERSION
    assert info["directory"] == str(warmed / f"v{FORMAT_VERSION}")
    assert (info["trusted"], info["trust_problem"], info["damaged"]) == (True, None, 0)
    assert info["oldest"] <= info["newest"]
    assert (info["corrupt_dropped"], info["evictions"], info["pruned"]) == (0, 0, 0)


def test_tables_for_people(warmed: Path) -> None:
    def run(*args: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "aionvrtc", *args, "--cache-dir", str(warmed)],
            capture_output=True, text=True, timeout=60, check=True,
            env={**os.environ, "COLUMNS": "200"},
        )  # fmt: skip
        return proc.stdout

    info = run("cache", "info")
    assert f"{KERNELS} entries" in info
    assert "of 1.0 GiB" in info
    assert "0 corrupt entries dropped, 0 evicted, 0 pruned" in info
    assert f"sm_90: {KERNELS} (NVRTC {_nvrtc.version_string()})" in info
    listing = run("cache", "ls")
    assert f"{KERNELS} entries in {warmed / ENTRIES}" in listing
    assert listing.count("sm_90") == KERNELS
    assert "no GPU here" in subprocess.run(
        [sys.executable, "-m", "aionvrtc", *WARM[:2], "--cache-dir", str(warmed)],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "AIONVRTC_ARCH": "", "CUDA_VISIBLE_DEVICES": ""},
    ).stderr  # fmt: skip


def test_ls_lists_and_filters(warmed: Path) -> None:
    rows = cli("cache", "ls", cache=warmed)
    assert {row["key"] for row in rows} == set(entries(warmed))
    for row in rows:
        assert (row["kind"], row["arch"]) == ("cubin", "sm_90")
        template, _, rest = row["names"][0].partition("<")
        assert template in ("tropical_gemm", "tropical_counted", "tropical_counted_rows",
                            "tropical_count", "tropical_top")  # fmt: skip
        assert rest.startswith("bool, AndOr")
        assert row["size"] == entries(warmed)[row["key"]].stat().st_size
    assert cli("cache", "ls", "--arch", "sm_80", cache=warmed) == []
    assert len(cli("cache", "ls", "--arch", "sm_90", "--newer-than", "1h", cache=warmed)) == KERNELS
    assert cli("cache", "ls", "--older-than", "1h", cache=warmed) == []


def test_prune_removes_the_least_recently_used_first(cache: Path) -> None:
    files = sorted(entries(cache).items())
    now = time.time()
    for age, (_, path) in enumerate(files):  # the first key is the most recently used
        os.utime(path, (now - 60 * age, now - 60 * age))
    sizes = [path.stat().st_size for _, path in files]
    keep = 3
    result = cli("cache", "prune", "--max-size", str(sum(sizes[:keep])), cache=cache)
    assert result["removed"] == len(files) - keep
    assert result["removed_keys"] == sorted(key for key, _ in files[keep:])
    assert set(entries(cache)) == {key for key, _ in files[:keep]}
    assert result["bytes"] == sum(sizes[:keep])
    # By age: the entry unused for two minutes goes, the newer ones stay.
    result = cli("cache", "prune", "--older-than", "90s", cache=cache)
    assert result["removed_keys"] == [files[2][0]]
    assert cli("cache", "info", cache=cache)["pruned"] == len(files) - keep + 1


def test_clear_removes_every_entry(cache: Path) -> None:
    assert cli("cache", "clear", cache=cache)["removed"] == KERNELS
    assert cli("cache", "info", cache=cache)["entries"] == 0


def test_an_earlier_formats_folder_is_listed_and_left_alone(cache: Path) -> None:
    # What an upgrade leaves: a v2 folder of the format before, its entries in place. This
    # release lists it, counts none of it, and neither prune nor clear touches it.
    old = cache / "v2"
    (old / "ab").mkdir(parents=True)
    entry = old / "ab" / ("ab" * 32)
    entry.write_bytes(b"an entry of the format before")
    info = cli("cache", "info", cache=cache)
    assert (info["other_format_versions"], info["entries"]) == (["v2"], KERNELS)
    assert info["format_version"] == FORMAT_VERSION != 2
    assert cli("cache", "prune", "--max-size", "0", cache=cache)["removed"] == KERNELS
    assert cli("cache", "clear", cache=cache)["removed"] == 0
    assert entry.read_bytes() == b"an entry of the format before"
    people = subprocess.run(
        [sys.executable, "-m", "aionvrtc", "cache", "info", "--cache-dir", str(cache)],
        capture_output=True, text=True, timeout=120, check=True,
        env={**os.environ, "COLUMNS": "200"},
    ).stdout  # fmt: skip
    assert "other formats" in people
    assert "v2 (not read by this version)" in people


def test_info_counts_what_other_processes_dropped_and_evicted(cache: Path) -> None:
    keys = sorted(entries(cache))
    path = entries(cache)[keys[0]]
    path.write_bytes(path.read_bytes()[:100])  # truncated: dropped on the next read
    tier = DiskTier(cache, limit=1)  # another process, with a tiny limit
    assert tier.read(keys[0]) is None
    assert tier.evict() == KERNELS - 1
    info = cli("cache", "info", cache=cache)
    assert (info["corrupt_dropped"], info["evictions"], info["entries"]) == (1, KERNELS - 1, 0)


def test_doctor_passes_on_a_writable_dir(tmp_path: Path) -> None:
    report = cli("doctor", cache=tmp_path / "fresh")
    checks = {c["check"]: c for c in report["checks"]}
    assert report["ok"] is True
    assert checks["nvrtc"]["status"] == "ok"
    assert checks["nvrtc"]["detail"].startswith(f"NVRTC {_nvrtc.version_string()} from /")
    assert "sm_90" in checks["archs"]["detail"]
    assert checks["cache dir"]["status"] == "ok"
    assert checks["cache dir"]["detail"].endswith(", mode 0700; writable")
    assert checks["file locks"]["status"] == "ok"
    assert checks["free space"]["status"] in ("ok", "warn")


def test_doctor_warns_about_a_read_only_dir(cache: Path, read_only: Callable[[Path], Path]) -> None:
    # A read-only cache (an image's, a read-only mount) is supported: its entries are read.
    view = read_only(cache)
    report = cli("doctor", cache=view)
    checks = {c["check"]: c for c in report["checks"]}
    assert report["ok"] is True
    assert checks["cache dir"]["status"] == "warn"
    detail = checks["cache dir"]["detail"]
    assert detail.startswith(f"{view / ENTRIES}: trusted: owner uid {os.geteuid()}")
    assert "not writable by this user" in detail
    assert "entries are read from it, new kernels are compiled and kept in memory" in detail
    assert "chmod" not in checks["cache dir"]["fix"]
    assert "AIONVRTC_CACHE_DIR" in checks["cache dir"]["fix"]
    assert checks["file locks"]["status"] == "ok"  # not needed: nothing is written


def test_doctor_fails_on_a_file_with_a_fix_that_is_not_chmod(tmp_path: Path) -> None:
    path = tmp_path / "a-file"
    path.write_text("not a folder")
    report = cli("doctor", cache=path, status=1)
    check = {c["check"]: c for c in report["checks"]}["cache dir"]
    assert (check["status"], check["detail"]) == (
        "fail", f"{path} is not a folder: nothing can be cached there",
    )  # fmt: skip
    assert "chmod" not in check["fix"]
    assert check["fix"].startswith("point AIONVRTC_CACHE_DIR (or --cache-dir) at a folder")
    assert path.read_text() == "not a folder"


def test_doctor_says_chmod_go_w_for_a_dir_others_can_write(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    report = cli("doctor", cache=loose, status=1)
    check = {c["check"]: c for c in report["checks"]}["cache dir"]
    assert check["status"] == "fail"
    assert f"{loose} (owner uid {os.geteuid()}" in check["detail"]
    assert "mode 0777) is not trusted, so it is neither read nor written" in check["detail"]
    assert f"{loose} is writable by others" in check["detail"]
    assert check["fix"] == f"chmod go-w {loose}"
    assert not (loose / ENTRIES).exists()  # an untrusted dir is not written, by doctor either
    info = cli("cache", "info", cache=loose)
    assert (info["trusted"], info["entries"]) == (False, 0)
    assert info["trust_problem"] == {
        "path": str(loose), "problem": f"writable by others (owner uid {os.geteuid()}, mode 0777)",
        "fix": f"chmod go-w {loose}",
    }  # fmt: skip


def test_doctor_makes_private_folders(tmp_path: Path) -> None:
    root = tmp_path / "made" / "by" / "doctor"
    report = cli("doctor", cache=root)
    for folder in (tmp_path / "made", tmp_path / "made" / "by", root, root / ENTRIES):
        assert folder.stat().st_mode & 0o7777 == 0o700, folder
    check = {c["check"]: c for c in report["checks"]}["cache dir"]
    assert check["status"] == "ok"
    assert check["detail"].startswith(f"{root / ENTRIES}: trusted: owner uid {os.geteuid()}")
    assert os.listdir(root / ENTRIES) == [".index"]  # the probes are gone; made with the folder
    assert (root / ENTRIES / ".index").stat().st_mode & 0o7777 == 0o600


# -- damaged items ---------------------------------------------------------------------------


def _entry_bytes(header: bytes, image: bytes = b"\x7fELF") -> bytes:
    """An entry with any header bytes, in the on-disk layout, with a valid checksum."""
    import hashlib
    import struct

    body = b"".join((
        b"AIONVRTC", struct.pack(">HI", FORMAT_VERSION, len(header)), header,
        struct.pack(">Q", len(image)), image,
    ))  # fmt: skip
    return body + hashlib.sha256(body).digest()


def _plant(cache: Path, name: str, make: Callable[[Path], object]) -> Path:
    """Make something (``make(path)``) at the path of a new key starting with ``name``."""
    import secrets

    key = name + secrets.token_hex(31)
    shard = cache / ENTRIES / name
    shard.mkdir(mode=0o700, exist_ok=True)
    make(shard / key)
    return shard / key


def _free_shard(cache: Path) -> str:
    used = {p.name for p in (cache / ENTRIES).iterdir()}
    return next(f"{i:02x}" for i in range(256) if f"{i:02x}" not in used)


def test_damaged_items_are_listed_and_skipped_never_a_traceback(
    cache: Path, tmp_path: Path
) -> None:
    some = sorted(entries(cache).values())[0]  # picked before a FIFO shares its name pattern
    any_shard = some.parent.name
    fifo = _plant(cache, any_shard, os.mkfifo)
    folder = _plant(cache, any_shard, lambda p: p.mkdir())
    garbage = _plant(cache, any_shard, lambda p: p.write_bytes(os.urandom(300)))
    deep = _plant(cache, any_shard, lambda p: p.write_bytes(
        _entry_bytes(b'{"kind":' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    ))  # fmt: skip
    huge_int = _plant(cache, any_shard, lambda p: p.write_bytes(
        _entry_bytes(b'{"created":' + b"9" * 5000 + b"}")
    ))  # fmt: skip
    long_header = _plant(cache, any_shard, lambda p: p.write_bytes(
        b"AIONVRTC" + FORMAT_VERSION.to_bytes(2, "big") + b"\xff\xff\xff\xff{}"
    ))  # fmt: skip
    # Readable, but with values the row code must not trust: shown as unknown.
    odd = _plant(cache, any_shard, lambda p: p.write_bytes(_entry_bytes(
        b'{"kind":["x"],"arch":{"a":1},"nvrtc_version":7,"created":1e308,"lowered_names":{"f":1}}'
    )))  # fmt: skip
    year_10000 = b'{"created":253402300800.0}'
    late = _plant(cache, any_shard, lambda p: p.write_bytes(_entry_bytes(year_10000)))
    # A shard that is a link to a folder holding a valid-looking entry: never followed.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    linked = cache / ENTRIES / _free_shard(cache)
    (elsewhere / (linked.name + "0" * 62)).write_bytes(some.read_bytes())
    linked.symlink_to(elsewhere)

    bad = {fifo, folder, garbage, deep, huge_int, long_header, linked}
    table = subprocess.run(
        [sys.executable, "-m", "aionvrtc", "cache", "ls", "--cache-dir", str(cache)],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "COLUMNS": "300"},
    )  # fmt: skip
    assert (table.returncode, table.stderr) == (0, "")
    assert f"{len(bad)} damaged items, not used" in table.stdout
    assert f"{KERNELS + 2} entries in" in table.stdout

    info = cli("cache", "info", cache=cache, timeout=60)
    assert (info["entries"], info["damaged"]) == (KERNELS + 2, len(bad))

    rows = cli("cache", "ls", cache=cache, timeout=60)
    damaged = {Path(r["path"]): r for r in rows if r["kind"] == "damaged"}
    assert set(damaged) == bad
    assert damaged[fifo]["problem"] == "a FIFO, not a regular file"
    assert damaged[folder]["problem"] == "a folder, not a regular file"
    assert damaged[linked]["problem"] == "a symbolic link, not a folder"
    assert damaged[linked]["fix"] == f"rm {linked}"
    for path in (garbage, deep, huge_int, long_header):
        assert damaged[path]["problem"].startswith("an entry whose header cannot be read ("), path
    odd_rows = {r["key"]: r for r in rows if r["key"] in (odd.name, late.name)}
    assert odd_rows[odd.name] == {
        **odd_rows[odd.name], "kind": None, "arch": None, "nvrtc_version": None, "created": None,
        "names": ["f"],
    }  # fmt: skip
    assert odd_rows[late.name]["created"] is None

    pruned = cli("cache", "prune", "--max-size", "0", cache=cache, timeout=60)
    skipped = {Path(d["path"]) for d in pruned["damaged"]}
    assert skipped == {fifo, folder, linked}  # garbage entries are files: pruned like any
    assert pruned["entries"] == 0
    assert fifo.is_fifo()
    assert folder.is_dir()
    assert linked.is_symlink()
    assert len(list(elsewhere.iterdir())) == 1  # the link's target was not touched


def test_a_fifo_at_the_event_log_does_not_hang_info_or_logging(cache: Path) -> None:
    os.mkfifo(cache / ENTRIES / ".events")
    info = cli("cache", "info", cache=cache, timeout=60)
    assert (info["entries"], info["corrupt_dropped"], info["pruned"]) == (KERNELS, 0, 0)
    # Logging an event (a prune) in another process: it returns, the FIFO is left alone.
    code = (
        "import sys\n"
        "from aionvrtc._store.disk import DiskTier\n"
        "tier = DiskTier(sys.argv[1])\n"
        "print(tier.prune(max_bytes=0), tier.events()['pruned'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(cache)], capture_output=True, text=True, timeout=60,
        check=True,
    )  # fmt: skip
    assert done.stdout.split() == [str(KERNELS), "0"]
    assert (cache / ENTRIES / ".events").is_fifo()


def test_bad_input_names_what_was_wrong(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "aionvrtc", "cache", "prune", "--max-size", "12X"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "not a size: '12X'" in proc.stderr
    # An arch that is not one is bad usage, as a size that is not one: exit 2.
    error = cli(*WARM[:3], "sm_9", cache=tmp_path, status=2)["error"]
    assert "arch must look like 'sm_90'" in error


@pytest.mark.anyio
async def test_metrics_follow_the_compiler_stats(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry

    from aionvrtc.metrics import register

    registry = CollectorRegistry()

    def sample(name: str) -> float | None:
        return registry.get_sample_value(f"aionvrtc_{name}", {"compiler": "svc"})

    spec = make_spec()
    async with Compiler(arch="sm_90", cache_dir=tmp_path) as compiler:
        register(compiler, registry=registry, name="svc")
        assert sample("requests_total") == 0
        assert sample("hit_ratio") == 0
        await compiler.compile(spec)
        await compiler.compile(spec)
        stats = compiler.stats()
        assert sample("requests_total") == stats.requests == 2
        assert sample("compiles_total") == stats.compiles == 1
        assert sample("memory_hits_total") == stats.memory.hits == 1
        assert sample("hit_ratio") == 0.5
        assert sample("compile_seconds_total") == pytest.approx(stats.compile_seconds)
        assert sample("queue_depth") == 0
        assert sample("disk_writable") == 1
        assert sample("disk_trusted") == 1
        assert sample("remote_foreign_locks_total") == stats.remote.foreign_locks == 0
        assert sample("memory_entries") == stats.memory.entries == 1


def test_sizes_ages_and_the_disk_limit_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from aionvrtc._store.disk import default_disk_limit
    from aionvrtc._units import parse_age, parse_size

    assert [parse_size(t) for t in ("100", "1.5K", "500MiB", "2G", "1tb")] == [
        100, 1536, 500 << 20, 2 << 30, 1 << 40,
    ]  # fmt: skip
    assert [parse_age(t) for t in ("90", "90s", "30m", "12h", "7d", "2w")] == [
        90, 90, 1800, 43200, 604800, 1209600,
    ]  # fmt: skip
    for bad in ("", "G", "-1M", "1.5.2"):
        with pytest.raises(ValueError, match="not a size"):
            parse_size(bad)
    monkeypatch.setenv("AIONVRTC_DISK_LIMIT", "64M")
    assert default_disk_limit() == 64 << 20
    assert DiskTier(Path("unused")).limit == 64 << 20
    monkeypatch.setenv("AIONVRTC_DISK_LIMIT", "lots")
    with pytest.raises(ValueError, match=r"\$AIONVRTC_DISK_LIMIT: not a size: 'lots'"):
        default_disk_limit()


def test_a_reader_that_stops_early_is_not_an_error(warmed: Path) -> None:
    # `aionvrtc cache ls --json | head -1`: the pipe closes before the output is written.
    child = subprocess.Popen(
        [sys.executable, "-m", "aionvrtc", "cache", "ls", "--json", "--cache-dir", str(warmed)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert child.stdout is not None
    child.stdout.close()
    _, err = child.communicate(timeout=60)
    assert child.returncode == 0
    assert b"Traceback" not in err


# -- newcomers: one line per error, exit statuses, help ------------------------------------------


def run(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python -m aionvrtc ARGS`` as a shell would run it (no --cache-dir added)."""
    return subprocess.run(
        [sys.executable, "-m", "aionvrtc", *args], capture_output=True, text=True,
        timeout=timeout, check=False, env={**os.environ, **(env or {})},
    )  # fmt: skip


def failure(*args: str, status: int, cache: Path | None = None, **kwargs: Any) -> str:
    """Run a command that must fail with ``status``: its one line on stderr, checked against
    the one JSON document that --json prints on stdout; the line's message is returned."""
    where = () if cache is None else ("--cache-dir", str(cache))
    human = run(*args, *where, **kwargs)
    assert human.returncode == status, human.stdout + human.stderr
    assert human.stdout == ""
    assert "Traceback" not in human.stderr
    lines = human.stderr.splitlines()
    assert len(lines) == 1, human.stderr
    as_json = run(*args, *where, "--json", **kwargs)
    assert as_json.returncode == status, as_json.stdout + as_json.stderr
    document = json.loads(as_json.stdout)  # one document, nothing else on stdout
    if status == 2:
        prog, _, message = lines[0].partition(": error: ")
        assert prog.startswith("aionvrtc")
    else:
        assert lines[0].startswith("error: ")
        message = lines[0][len("error: ") :]
    assert document["error"] == message
    return message


def test_the_names_warm_offers_are_tropicals() -> None:
    assert tuple(tropical.SEMIRINGS) == _cli.SEMIRING_NAMES
    assert tuple(str(d) for d in tropical.tuning.DTYPES) == _cli.DTYPE_NAMES


def test_help_lists_the_choices_in_plain_text() -> None:
    top = run("--help")
    assert top.returncode == 0
    assert "``" not in top.stdout
    assert "130 interrupted" in top.stdout
    for command in ("cache", "warm", "doctor"):
        assert command in top.stdout
    warm = run("warm", "tropical", "--help")
    assert warm.returncode == 0
    assert "``" not in warm.stdout
    assert "maxplus, minplus, maxmul, andor" in warm.stdout
    assert "float32, float64, int32, int64, bool" in warm.stdout
    assert "andor takes bool" in warm.stdout


@pytest.mark.parametrize(
    ("group", "commands"),
    [
        (["cache"], ["info", "ls", "clear", "prune", "export", "import"]),
        (["warm"], ["tropical", "manifest"]),
    ],
)
def test_a_group_without_a_command_prints_its_own_help(
    group: list[str], commands: list[str]
) -> None:
    proc = run(*group)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.startswith(f"usage: aionvrtc {group[0]} ")
    assert "doctor" not in proc.stderr  # not the top-level help
    for command in commands:
        assert command in proc.stderr
    needed = f"a command is needed: {', '.join(commands)}"
    assert proc.stderr.splitlines()[-1] == f"aionvrtc {group[0]}: error: {needed}"
    as_json = run(*group, "--json")
    assert as_json.returncode == 2
    assert json.loads(as_json.stdout) == {"error": needed}
    assert run().returncode == 2  # no command at all: the top-level help, the same way


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["cache", "ls", "--arch", "banana"],
            "argument --arch: arch must look like 'sm_90', 'sm_90a' or 'sm_100f', got 'banana'; "
            "see aionvrtc cache ls --help",
        ),
        (
            ["warm", "tropical", "--arch", "sm_90", "--dtypes", "float33"],
            "argument --dtypes: invalid choice: 'float33' (choose from 'float32', 'float64', "
            "'int32', 'int64', 'bool'); see aionvrtc warm tropical --help",
        ),
        (
            ["warm", "tropical", "--semirings", "plusmax"],
            "argument --semirings: invalid choice: 'plusmax' (choose from 'maxplus', 'minplus', "
            "'maxmul', 'andor'); see aionvrtc warm tropical --help",
        ),
        (
            ["warm", "tropical", "--jobs", "0"],
            "argument --jobs: must be a whole number of parallel compiles, at least 1, got '0'; "
            "see aionvrtc warm tropical --help",
        ),
        (
            ["warm", "tropical", "--batched", "256x0x2"],
            "argument --batched: must be a product's sizes MxNxK (A is M x K, B is K x N), such "
            "as 256x256x256, got '256x0x2'; see aionvrtc warm tropical --help",
        ),
        (
            ["warm", "tropical", "--batched", "8x8x8", "--max-batch", "none"],
            "argument --max-batch: must be a whole number of requests, at least 1, got 'none'; "
            "see aionvrtc warm tropical --help",
        ),
        (
            ["cache", "info", "--colour"],
            "unrecognized arguments: --colour; see aionvrtc cache info --help",
        ),
        (  # a usage error that the parser cannot see: 2 all the same, not 1
            ["cache", "prune"],
            "prune needs --max-size SIZE, --older-than AGE or both; see aionvrtc cache prune "
            "--help",
        ),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(
    args: list[str], message: str, tmp_path: Path
) -> None:
    assert failure(*args, status=2, cache=tmp_path) == message


@pytest.mark.parametrize("group", [[], ["cache"], ["warm"]])
def test_an_unknown_option_of_a_group_is_named_without_the_help(group: list[str]) -> None:
    prog = " ".join(["aionvrtc", *group])
    message = f"unrecognized arguments: --foo; see {prog} --help"
    assert failure(*group, "--foo", status=2) == message
    proc = run(*group, "--foo")
    assert proc.stderr == f"{prog}: error: {message}\n"  # one line: no help printed


def test_a_semiring_and_dtypes_that_make_no_kernel_say_what_it_takes(tmp_path: Path) -> None:
    args = ("warm", "tropical", "--arch", "sm_90", "--semirings", "andor", "--dtypes", "float32")
    assert failure(*args, status=1, cache=tmp_path) == (
        "no tropical kernels for semiring andor with dtype float32: andor takes bool"
    )
    assert not tmp_path.joinpath(ENTRIES).exists()  # refused before anything was made


def test_an_arch_nvrtc_cannot_target_is_refused_before_anything_is_compiled(
    tmp_path: Path,
) -> None:
    version, major = _nvrtc.version_string(), _nvrtc.version()[0]
    supported = ", ".join(f"sm_{a}" for a in _nvrtc.supported_archs())
    # sm_90 first: refused all the same, before its kernels are compiled.
    args = (*WARM[:4], "--arch", "sm_30", *WARM[4:])
    assert failure(*args, status=1, cache=tmp_path) == (
        f"NVRTC {version} cannot target sm_30 (it supports {supported}); no CUDA version that "
        "aionvrtc installs can"
    )
    assert not tmp_path.joinpath(ENTRIES).exists()
    # A typo that no GPU here has: refused with the list, not compiled to PTX with exit 0.
    message = failure(*WARM[:2], "--arch", "sm_999", *WARM[4:], status=1, cache=tmp_path)
    assert message == (
        f"NVRTC {version} cannot target sm_999 (it supports {supported}); no CUDA version that "
        "aionvrtc installs can (a GPU newer than NVRTC gets PTX, compiled on the machine that "
        "has it)"
    )
    assert not tmp_path.joinpath(ENTRIES).exists()
    if major >= 13:  # Volta left CUDA 13: CUDA 12's NVRTC targets it
        message = failure(*WARM[:2], "--arch", "sm_70", *WARM[4:], status=1, cache=tmp_path)
        assert message == (
            f"NVRTC {version} cannot target sm_70 (it supports {supported}); install "
            "aionvrtc[cu12], whose NVRTC can"
        )
        assert not tmp_path.joinpath(ENTRIES).exists()


def test_warm_into_a_file_fails_before_compiling(tmp_path: Path) -> None:
    path = tmp_path / "a-file"
    path.write_text("not a folder")
    for cache, blocker in ((path, path), (path / "below", path)):
        message = failure(*WARM, status=1, cache=cache)
        assert message == (
            f"nothing compiled for sm_90 could be kept: {blocker} is not a folder; point "
            "--cache-dir (or AIONVRTC_CACHE_DIR) at a folder"
        )
    assert path.read_text() == "not a folder"


def test_every_cache_command_refuses_a_file_as_its_cache_dir(tmp_path: Path) -> None:
    # info, ls, clear and prune called it trusted, with exit 0; warm and doctor refused it.
    path = tmp_path / "a-file"
    path.write_text("not a folder")
    message = f"{path} is not a folder; point --cache-dir (or AIONVRTC_CACHE_DIR) at a folder"
    commands = (
        ["cache", "info"], ["cache", "ls"], ["cache", "clear"],
        ["cache", "prune", "--max-size", "1G"], ["cache", "export", str(tmp_path / "x.bundle")],
    )  # fmt: skip
    for args in commands:
        assert failure(*args, status=1, cache=path) == message, args
    assert failure("cache", "info", status=1, cache=path / "below") == message
    assert path.read_text() == "not a folder"
    assert not tmp_path.joinpath("x.bundle").exists()


def test_a_cache_dir_that_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "typo"
    # Named with --cache-dir, to read: a typo more often than a cache to come.
    said = (
        f"{missing} does not exist; point --cache-dir at a cache dir (the first compile, or "
        "aionvrtc warm, makes one)"
    )
    for args in (["cache", "info"], ["cache", "ls"], ["cache", "export", str(tmp_path / "x")]):
        assert failure(*args, status=1, cache=missing) == said, args
    # To remove from: nothing to do, and what was asked for holds.
    for args in (["cache", "clear"], ["cache", "prune", "--older-than", "1d"]):
        proc = run(*args, "--cache-dir", str(missing))
        assert (proc.returncode, proc.stdout, proc.stderr) == (
            0, f"nothing to do: {missing} does not exist\n", "",
        )  # fmt: skip
        report = cli(*args, cache=missing)
        assert (report["removed"], report["exists"]) == (0, False)
    # The default (or $AIONVRTC_CACHE_DIR) on a fresh machine: an empty cache, no error.
    fresh = {"AIONVRTC_CACHE_DIR": str(missing)}
    info = run("cache", "info", "--json", env=fresh)
    assert (info.returncode, info.stderr) == (0, "")
    report = json.loads(info.stdout)
    assert (report["location"], report["exists"], report["entries"]) == (str(missing), False, 0)
    listed = run("cache", "ls", "--json", env=fresh)
    assert (listed.returncode, json.loads(listed.stdout), listed.stderr) == (0, [], "")
    table = run("cache", "info", env={**fresh, "COLUMNS": "300"})  # one line per row
    assert table.returncode == 0
    assert f"{missing} does not exist yet: the first compile (or aionvrtc warm) makes it" in (
        table.stdout
    )
    assert not missing.exists()  # none of them made it


def test_warm_into_an_untrusted_dir_fails_before_compiling(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    message = failure(*WARM, status=1, cache=loose)
    assert message.startswith(f"nothing compiled for sm_90 could be kept: {loose} is not trusted")
    assert message.endswith(f"chmod go-w {loose}")


def test_warm_into_a_read_only_dir_reads_it_and_fails_only_when_it_compiles(
    cache: Path, read_only: Callable[[Path], Path]
) -> None:
    view = read_only(cache)
    # Everything asked for is there: a read-only cache is a warm one (exit 0).
    done = cli(*WARM, cache=view)
    assert (done["compiled"], done["kept"], done["from_disk"]) == (0, 0, KERNELS)
    # Kernels that are not there are compiled, cannot be kept: exit 1 at the first one.
    args = ("warm", "tropical", "--arch", "sm_90", "--semirings", "maxplus", "--dtypes", "int32")
    proc = run(*args, "--jobs", "1", "--json", "--cache-dir", str(view))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["error"].startswith(
        f"kernels compiled for sm_90 cannot be kept: {view / ENTRIES} cannot be written ("
    )
    assert report["error"].endswith(
        "; point --cache-dir (or AIONVRTC_CACHE_DIR) at a folder this user can write"
    )
    assert (report["compiled"], report["kept"]) == (1, 0)  # stopped after the first
    assert report["kernels"] == len(tropical.all_specs(["maxplus"], ["int32"]))
    assert proc.stderr == f"error: {report['error']}\n"  # one line; no warning besides
    assert len(entries(cache)) == KERNELS


def test_clear_and_prune_fail_when_entries_cannot_be_removed(
    cache: Path, read_only: Callable[[Path], Path]
) -> None:
    view = read_only(cache)
    for args in (("cache", "clear"), ("cache", "prune", "--max-size", "0")):
        message = failure(*args, status=1, cache=view)
        assert message.startswith(
            f"removed 0 entries from {view / ENTRIES}, but {KERNELS} could not be removed: "
            f"{view / ENTRIES}/"
        )
        assert (" is on a read-only file system; " in message) or (
            " is not writable by this user (" in message
        )
    report = cli("cache", "clear", cache=view, status=1)
    assert (report["removed"], report["not_removed"]) == (0, KERNELS)
    # Nothing is due: nothing failed.
    assert cli("cache", "prune", "--older-than", "1d", cache=view)["removed"] == 0
    assert len(entries(cache)) == KERNELS


def test_warm_prints_one_line_when_stdout_is_not_a_terminal(warmed: Path) -> None:
    proc = run(*WARM, "--cache-dir", str(warmed), env={"COLUMNS": "40"})
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.startswith(f"{KERNELS} tropical kernels for sm_90: 0 compiled, ")
    assert proc.stdout.count("\n") == 1  # no blank line before it, no wrapping at 40 columns


def interrupted_warm(cache: Path, *options: str) -> tuple[int, str, str]:
    """``warm tropical`` stopped by a real SIGINT once it has kept its first kernel: its exit
    status, stdout and stderr."""
    # Many kernels, one at a time, none from NVRTC's own cache: still compiling when stopped.
    args = ["warm", "tropical", "--arch", "sm_90", "--semirings", "maxplus", "--jobs", "1"]
    child = subprocess.Popen(
        [sys.executable, "-m", "aionvrtc", *args, *options, "--cache-dir", str(cache)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "CUDA_CACHE_DISABLE": "1"},
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not entries(cache):  # the first kernel kept: it is running, past its imports
        assert child.poll() is None
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=120)
    return child.returncode, out, err


def test_ctrl_c_during_warm_says_what_was_kept_and_exits_130(tmp_path: Path) -> None:
    # It exited 130 without a word, after minutes of compiles.
    total = len(tropical.all_specs(["maxplus"]))
    status, out, err = interrupted_warm(tmp_path)
    assert (status, out) == (130, "")
    said = re.fullmatch(
        rf"interrupted: (\d+) of {total} kernels compiled and kept in {re.escape(str(tmp_path))}"
        rf"/{ENTRIES}\n",
        err,
    )
    assert said is not None, err
    # Said as it stopped: a compile running then finishes, and is kept, after.
    kept = int(said[1])
    assert 1 <= kept <= len(entries(tmp_path)) < total
    # With --json, the document says so, and what was done.
    again = tmp_path / "again"
    status, out, err = interrupted_warm(again, "--json")
    report = json.loads(out)
    assert (status, report["error"], report["kernels"]) == (130, "interrupted", total)
    assert (report["archs"], report["directory"], report["from_disk"]) == (
        ["sm_90"], str(again / ENTRIES), 0,
    )  # fmt: skip
    assert 1 <= report["kept"] <= report["compiled"] <= len(entries(again)) < total
    assert err == (
        f"interrupted: {report['kept']} of {total} kernels compiled and kept in {again / ENTRIES}\n"
    )


def test_ctrl_c_in_json_mode_says_so_on_stdout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_cache, "_contents", interrupted)  # what `cache info` lists with
    assert _cli.main(["cache", "info", "--json", "--cache-dir", str(tmp_path)]) == 130
    out, err = capsys.readouterr()
    assert (json.loads(out), err) == ({"error": "interrupted"}, "")


def test_a_bug_is_one_line_and_debug_shows_its_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        logging.getLogger("aionvrtc").exception("a job failed\nwith a long story")
        raise ExceptionGroup("in a task group", [RuntimeError("boom\nsecond line")])

    monkeypatch.setattr(cli_cache, "_contents", broken)  # what `cache info` lists with
    argv = ["cache", "info", "--cache-dir", str(tmp_path)]
    assert _cli.main(argv) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "error: RuntimeError: boom (a bug in aionvrtc 0.1.0: run the command again with --debug "
        "for the traceback, and report it)\n"
    )
    with pytest.raises(ExceptionGroup):
        _cli.main([*argv, "--debug"])
    assert "a job failed\nwith a long story" in capsys.readouterr().err  # the log, whole


def test_warnings_are_said_once_each_after_the_output(
    warmed: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    contents = cli_shared._contents  # the one `cache info` calls (as cli_cache._contents)

    def noisy(*args: Any, **kwargs: Any) -> Any:
        for _ in range(3):
            logging.getLogger("aionvrtc").warning("the disk is %s\n(details)", "odd")
        return contents(*args, **kwargs)

    monkeypatch.setattr(cli_cache, "_contents", noisy)  # what `cache info` lists with
    assert _cli.main(["cache", "info", "--json", "--cache-dir", str(warmed)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["entries"] == KERNELS
    assert err == "warning: the disk is odd\n"


def test_doctor_says_no_driver_when_there_is_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import cupy

    monkeypatch.setattr(cupy.cuda.runtime, "driverGetVersion", lambda: 0)  # no libcuda at all
    assert _cli.main(["doctor", "--json", "--cache-dir", str(tmp_path / "c")]) == 0
    report = json.loads(capsys.readouterr().out)
    gpus = {c["check"]: c for c in report["checks"]}["gpus"]
    assert gpus == {
        "check": "gpus", "status": "warn",
        "detail": "no NVIDIA driver found: kernels compile (aionvrtc warm) but do not load",
        "fix": "none to compile only; to run kernels, a machine with an NVIDIA GPU and its driver",
    }  # fmt: skip
    assert "error" not in report


def test_doctor_fails_below_a_file_and_says_so_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "a-file"
    path.write_text("not a folder")
    proc = run("doctor", "--cache-dir", str(path / "cache"), env={"COLUMNS": "200"})
    assert proc.returncode == 1
    assert proc.stderr == "error: checks failed: cache dir (each says its fix)\n"
    report = cli("doctor", cache=path / "cache", status=1)
    check = {c["check"]: c for c in report["checks"]}["cache dir"]
    assert check["detail"] == (
        f"{path} is not a folder, so {path / 'cache'} cannot be made: nothing can be cached there"
    )
    assert check["fix"].startswith("point AIONVRTC_CACHE_DIR (or --cache-dir) at a folder")
    assert report["error"] == "checks failed: cache dir (each says its fix)"


def test_doctor_shows_each_path_whole_in_a_narrow_terminal(tmp_path: Path) -> None:
    # At 60 columns the detail column is 16 wide: a path was cut there ("/work/main/.v…"),
    # now it is folded over as many lines as it takes. Each check's detail, as --json gives
    # it, is read back whole from the table's detail column (its lines joined, white space
    # dropped: a wrap at a space drops the space).
    cache = tmp_path / "a-cache-dir-whose-name-is-wider-than-the-column" / "cache"
    proc = run("doctor", "--cache-dir", str(cache), env={"COLUMNS": "60"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert max(map(len, lines)) <= 60
    column = "".join(line.split("│")[3] for line in lines if line.count("│") == 5)
    shown = re.sub(r"\s", "", column)
    report = cli("doctor", cache=cache)
    details = [c["detail"] for c in report["checks"]]
    assert str(cache) in " ".join(details)
    library = report["nvrtc"]["library"]
    assert "libnvrtc" in library
    assert library in " ".join(details)
    for detail in details:
        assert re.sub(r"\s", "", detail) in shown, detail
    assert "…" not in proc.stdout


def test_doctor_says_which_nvrtc_and_the_driver_its_cubins_need(tmp_path: Path) -> None:
    report = cli("doctor", cache=tmp_path / "c")
    checks = {c["check"]: c for c in report["checks"]}
    version, library = _nvrtc.version_string(), _nvrtc._loaded_library()
    major = _cuda_versions.MAJORS[_nvrtc.version()[0]]
    assert library is not None
    assert library.startswith("/")
    assert checks["nvrtc"] == {
        "check": "nvrtc", "status": "ok", "detail": f"NVRTC {version} from {library}", "fix": "",
    }  # fmt: skip
    assert checks["min driver"] == {
        "check": "min driver", "status": "ok",
        "detail": f"{major.min_driver}: cubins from NVRTC {version} load on NVIDIA drivers "
        f"{major.min_driver} or newer (CUDA {major.number}, as aionvrtc[{major.extra}] "
        "installs it)",
        "fix": "",
    }  # fmt: skip
    assert report["nvrtc"] == {
        "version": version, "library": library, "extra": major.extra,
        "min_driver": major.min_driver,
    }  # fmt: skip
    cuda, release = _cuda_versions.driver_cuda(), _cuda_versions.driver_release()
    if cuda is None and release is None:  # this dev VM, and CI: no driver
        assert report["driver"] is None
        assert checks["driver"] == {
            "check": "driver", "status": "ok",
            "detail": "none here: kernels compile (aionvrtc warm), and load on machines whose "
            f"NVIDIA driver is {major.min_driver} or newer",
            "fix": "",
        }  # fmt: skip
    else:
        assert cuda is not None
        assert report["driver"] == {"release": release, "cuda": f"{cuda[0]}.{cuda[1]}"}
        assert checks["driver"]["status"] == ("ok" if cuda[0] >= major.number else "fail")
    names = [c["check"] for c in report["checks"]]
    assert names[:5] == ["nvrtc", "archs", "min driver", "driver", "gpus"]


@pytest.mark.parametrize(
    ("cuda", "release", "status", "detail", "fix"),
    [
        ((13, 0), "580.95.05", "ok", "580.95.05 (CUDA 13.0): loads the cubins of NVRTC {v}", ""),
        ((14, 1), None, "ok", "CUDA 14.1: loads the cubins of NVRTC {v}", ""),
        (
            (12, 8), "570.86.10", "fail",
            "570.86.10 (CUDA 12.8) is older than NVRTC {v} (CUDA 13) and cannot load the kernels "
            "compiled here",
            "pip uninstall cupy-cuda13x, then pip install 'aionvrtc[cu12]' (CUDA 12, the "
            "driver's); or update the NVIDIA driver to 580 or newer",
        ),
        (
            (11, 8), "520.61.05", "fail",
            "520.61.05 (CUDA 11.8) is older than NVRTC {v} (CUDA 13) and cannot load the kernels "
            "compiled here",
            "update the NVIDIA driver to 580 or newer",
        ),
        (
            None, "580.95.05", "warn",
            "the NVIDIA kernel module 580.95.05 is loaded, but CUDA cannot use the driver "
            "(libcuda): kernels compile but do not load",
            "install the driver's CUDA library (libcuda) of the same release; in a container, "
            "run it with the NVIDIA container toolkit (docker run --gpus all)",
        ),
    ],
    ids=["cuda13", "cuda14-no-release", "cuda12", "cuda11", "module-without-libcuda"],
)  # fmt: skip
def test_doctor_checks_the_driver_against_nvrtc(
    cuda: tuple[int, int] | None,
    release: str | None,
    status: str,
    detail: str,
    fix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if _nvrtc.version()[0] != 13:
        pytest.skip("the cases are written for NVRTC 13 (aionvrtc[cu13])")
    monkeypatch.setattr(_cuda_versions, "driver_cuda", lambda: cuda)
    monkeypatch.setattr(_cuda_versions, "driver_release", lambda: release)
    monkeypatch.setattr(_cuda_versions, "cupy_majors", lambda: [13])
    code = _cli.main(["doctor", "--json", "--cache-dir", str(tmp_path / "c")])
    report = json.loads(capsys.readouterr().out)
    check = {c["check"]: c for c in report["checks"]}["driver"]
    v = _nvrtc.version_string()
    assert check == {"check": "driver", "status": status, "detail": detail.format(v=v), "fix": fix}
    assert report["driver"] == {
        "release": release,
        "cuda": None if cuda is None else f"{cuda[0]}.{cuda[1]}",
    }
    if status == "fail":
        assert code == 1
        assert report["error"] == "checks failed: driver (each says its fix)"
    else:
        assert "driver" not in report.get("error", "")


_WITHOUT_CUPY = (
    "import sys\n"
    "sys.modules['cupy'] = None  # as if CuPy were not installed: its import fails\n"
    "from aionvrtc._cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def _without_cupy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT_CUPY, *args], capture_output=True, text=True,
        timeout=60, check=False, env={**os.environ, "AIONVRTC_ARCH": ""},
    )  # fmt: skip


def test_without_cupy_doctor_fails_naming_both_extras(tmp_path: Path) -> None:
    proc = _without_cupy("doctor", "--json", "--cache-dir", str(tmp_path / "c"))
    assert (proc.returncode, proc.stderr) == (1, "")
    report = json.loads(proc.stdout)
    checks = {c["check"]: c for c in report["checks"]}
    assert checks["nvrtc"] == {
        "check": "nvrtc", "status": "fail",
        "detail": "aionvrtc needs CuPy and NVRTC, and CuPy is not installed",
        "fix": _cuda_versions.CHOOSE_EXTRA,
    }  # fmt: skip
    assert "pip install 'aionvrtc[cu13]'" in checks["nvrtc"]["fix"]
    assert "'aionvrtc[cu12]'" in checks["nvrtc"]["fix"]
    assert checks["gpus"] == {
        "check": "gpus", "status": "warn",
        "detail": "CuPy is not installed: no GPU can be found or used",
        "fix": _cuda_versions.CHOOSE_EXTRA,
    }  # fmt: skip
    assert [c["check"] for c in report["checks"]][:2] == ["nvrtc", "gpus"]
    assert (report["nvrtc"], report["driver"], report["ok"]) == (None, None, False)
    assert report["error"] == "checks failed: nvrtc (each says its fix)"
    assert checks["cache dir"]["status"] == "ok"  # the other checks ran


def test_without_cupy_warm_says_how_to_install_it(tmp_path: Path) -> None:
    needed = (
        f"aionvrtc needs CuPy and NVRTC, and CuPy is not installed; {_cuda_versions.CHOOSE_EXTRA}"
    )
    for args in (WARM, WARM[:2]):  # with no arch named, not "no GPU here" first
        proc = _without_cupy(*args, "--cache-dir", str(tmp_path))
        assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", f"error: {needed}\n")
    assert not tmp_path.joinpath(ENTRIES).exists()


def test_doctor_says_where_cuda_headers_are_and_how_to_get_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from aionvrtc import _cli, _cuda_headers

    report = cli("doctor", cache=tmp_path / "c")
    checks = {c["check"]: c for c in report["checks"]}
    for place in _cuda_headers.located():
        check = checks[f"{place.what} headers"]
        assert check["status"] == "ok"
        assert check["detail"] == (
            f"{place.what} {place.version} in {place.path} (found via {place.found_via})"
        )
    assert checks["CUDA runtime headers"]["detail"].startswith(
        f"CUDA runtime {_nvrtc.version()[0]}."
    )
    # A host without them (neither wheels, conda, CUDA_PATH nor a toolkit): a warning.
    monkeypatch.setattr(_cuda_headers, "located", lambda: ())
    assert _cli.main(["doctor", "--json", "--cache-dir", str(tmp_path / "c")]) == 0
    checks = {c["check"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    extra = _cuda_versions.MAJORS[_nvrtc.version()[0]].extra
    for what in ("CUDA runtime", "CCCL"):
        assert checks[f"{what} headers"] == {
            "check": f"{what} headers", "status": "warn",
            "detail": "not found: a program that includes one of them (<cuda_fp16.h>, "
            "<cooperative_groups.h>, <cuda/std/...>, CUB) fails to compile",
            "fix": f"pip install 'aionvrtc[{extra}]' brings them (the CUDA runtime's and CCCL's "
            "wheels), or set CUDA_PATH to a CUDA toolkit of the same major as NVRTC",
        }  # fmt: skip


def test_doctor_warns_of_cuda_headers_of_another_major_than_nvrtc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from aionvrtc import _cli, _cuda_headers

    major = _nvrtc.version()[0]
    other = _cuda_headers.HeaderDir("CUDA runtime", "/opt/cuda-x/include", "CUDA_PATH", "11.8")
    monkeypatch.setattr(_cuda_headers, "located", lambda: (other,))
    assert _cli.main(["doctor", "--json", "--cache-dir", str(tmp_path / "c")]) == 0
    checks = {c["check"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["CUDA runtime headers"]["status"] == "warn"
    assert checks["CUDA runtime headers"]["detail"] == (
        f"CUDA runtime 11.8 in /opt/cuda-x/include (found via CUDA_PATH), with NVRTC of CUDA "
        f"{major}: programs that include them may not compile"
    )
    assert checks["CUDA runtime headers"]["fix"] == (
        f"pip install 'cuda-toolkit[nvrtc,cudart,cccl]=={major}.*' (the headers of NVRTC's "
        "release); where the headers are a toolkit's, point CUDA_PATH at one of that major"
    )
    assert checks["CCCL headers"]["status"] == "warn"  # not found at all


def test_doctor_says_when_cuda_pathfinder_cannot_look_for_cuda_headers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # An older cuda-pathfinder, without the function (1.3.4 added it).
    import cuda.pathfinder

    from aionvrtc import _cli, _cuda_headers

    monkeypatch.delattr(cuda.pathfinder, "locate_nvidia_header_directory")
    _cuda_headers.locator_problem.cache_clear()
    _cuda_headers.located.cache_clear()
    try:
        assert _cli.main(["doctor", "--json", "--cache-dir", str(tmp_path / "c")]) == 0
        checks = {c["check"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    finally:
        _cuda_headers.locator_problem.cache_clear()
        _cuda_headers.located.cache_clear()
    check = checks["CUDA headers"]
    assert check["status"] == "warn"
    assert check["detail"].startswith(
        "not looked for: cuda-pathfinder, which finds them, cannot be used (cannot import name "
        "'locate_nvidia_header_directory'"
    )
    assert check["fix"] == "pip install 'cuda-pathfinder>=1.3.4'"
