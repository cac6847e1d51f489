"""The command line (`python -m aionvrtc`) through real processes on a temporary cache dir, with
real NVRTC compiles (no GPU needed), and the Prometheus collector against a Compiler's stats."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from aionvrtc import Compiler, tropical
from aionvrtc._spec import FORMAT_VERSION
from aionvrtc._store.disk import DiskTier

from .conftest import make_spec

# The and-or semiring on bool has the fewest tropical kernels (the generic kernel's variants).
WARM = ["warm", "tropical", "--arch", "sm_90", "--semirings", "andor", "--dtypes", "bool"]
KERNELS = len(tropical.all_specs(["andor"], ["bool"]))


def cli(*args: str, cache: Path, status: int = 0, timeout: float = 300) -> Any:
    """Run ``python -m aionvrtc ARGS --json --cache-dir CACHE``; its JSON output, parsed."""
    proc = subprocess.run(
        [sys.executable, "-m", "aionvrtc", *args, "--json", "--cache-dir", str(cache)],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    assert proc.returncode == status, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def warmed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache dir holding the and-or kernels for sm_90, compiled once for the module."""
    cache = tmp_path_factory.mktemp("warmed")
    first = cli(*WARM, cache=cache)
    assert first == {**first, "arch": "sm_90", "kernels": KERNELS, "compiled": KERNELS}
    assert first["from_disk"] == 0
    return cache


@pytest.fixture
def cache(warmed: Path, tmp_path: Path) -> Path:
    """A private copy of the warmed cache dir, for tests that change it."""
    import shutil

    return Path(shutil.copytree(warmed, tmp_path / "cache"))


def entries(cache: Path) -> dict[str, Path]:
    return {p.name: p for p in (cache / "v2").glob("*/*") if not p.name.startswith(".")}


def test_warm_compiles_each_kernel_once(warmed: Path) -> None:
    again = cli(*WARM, cache=warmed)
    assert (again["compiled"], again["from_disk"], again["kernels"]) == (0, KERNELS, KERNELS)
    assert len(entries(warmed)) == KERNELS


def test_info_reports_the_entries(warmed: Path) -> None:
    info = cli("cache", "info", cache=warmed)
    files = entries(warmed).values()
    assert info["entries"] == KERNELS
    assert info["bytes"] == sum(p.stat().st_size for p in files)
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
    listing = run("cache", "ls")
    assert f"{KERNELS} entries in {warmed / 'v2'}" in listing
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
        assert row["names"][0].startswith("tropical_gemm<bool, AndOr")
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
    assert checks["nvrtc"]["detail"].startswith("NVRTC 13.")
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
    assert detail.startswith(f"{view / 'v2'}: trusted: owner uid {os.geteuid()}")
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
    assert not (loose / "v2").exists()  # an untrusted dir is not written, by doctor either
    info = cli("cache", "info", cache=loose)
    assert (info["trusted"], info["entries"]) == (False, 0)
    assert info["trust_problem"] == {
        "path": str(loose), "problem": f"writable by others (owner uid {os.geteuid()}, mode 0777)",
        "fix": f"chmod go-w {loose}",
    }  # fmt: skip


def test_doctor_makes_private_folders(tmp_path: Path) -> None:
    root = tmp_path / "made" / "by" / "doctor"
    report = cli("doctor", cache=root)
    for folder in (tmp_path / "made", tmp_path / "made" / "by", root, root / "v2"):
        assert folder.stat().st_mode & 0o7777 == 0o700, folder
    check = {c["check"]: c for c in report["checks"]}["cache dir"]
    assert check["status"] == "ok"
    assert check["detail"].startswith(f"{root / 'v2'}: trusted: owner uid {os.geteuid()}")
    assert os.listdir(root / "v2") == [".index"]  # the probes are gone; made with the folder
    assert (root / "v2" / ".index").stat().st_mode & 0o7777 == 0o600


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
    shard = cache / "v2" / name
    shard.mkdir(mode=0o700, exist_ok=True)
    make(shard / key)
    return shard / key


def _free_shard(cache: Path) -> str:
    used = {p.name for p in (cache / "v2").iterdir()}
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
    linked = cache / "v2" / _free_shard(cache)
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
    os.mkfifo(cache / "v2" / ".events")
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
    assert (cache / "v2" / ".events").is_fifo()


def test_bad_input_names_what_was_wrong(tmp_path: Path) -> None:
    assert cli("cache", "prune", cache=tmp_path, status=1) == {
        "error": "prune needs --max-size SIZE, --older-than AGE or both"
    }
    proc = subprocess.run(
        [sys.executable, "-m", "aionvrtc", "cache", "prune", "--max-size", "12X"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "not a size: '12X'" in proc.stderr
    error = cli(*WARM[:3], "sm_9", cache=tmp_path, status=1)["error"]
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
