"""The manifest (issue 19): what a service compiles, recorded by real processes to one file, read
back exactly, and replayed for other archs by `aionvrtc warm manifest` with real NVRTC."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from aionvrtc import (
    Compiler,
    KernelSpec,
    Manifest,
    ManifestError,
    ManifestRead,
    read_manifests,
)
from aionvrtc._config import ENV_MANIFEST
from aionvrtc._manifest import spec_line

from .support import ENTRIES, ROOT, make_spec

BROKEN = KernelSpec("__global__ void f() { nope; }", name="bad.cu")
BROKEN_ERROR = 'bad.cu(1): error: identifier "nope" is undefined'


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


async def written(manifest: Manifest | None, count: int) -> None:
    """Wait until ``manifest`` has appended ``count`` lines (its flush runs in a thread)."""
    assert manifest is not None
    deadline = time.monotonic() + 30
    while manifest.written < count:
        assert time.monotonic() < deadline, manifest.written
        await anyio.sleep(0.005)


# -- the line format -----------------------------------------------------------------------------


def test_a_line_is_canonical_json_of_every_field(tmp_path: Path) -> None:
    spec = KernelSpec(
        "__global__ void f() {}", name="f.cu", options=("-DA=1",), headers={"h.cuh": "// h"},
        name_expressions=("f",),
    )  # fmt: skip
    path = tmp_path / "m.jsonl"
    manifest = Manifest(path)
    manifest.record(spec)
    manifest.flush()
    assert path.read_text() == (
        '{"headers":{"h.cuh":"// h"},"manifest":1,"name":"f.cu","name_expressions":["f"],'
        '"options":["-DA=1"],"source":"__global__ void f() {}"}\n'
    )
    assert path.stat().st_mode & 0o777 == 0o600  # kernel sources: private, as the cache is
    assert manifest.written == 1


def test_a_spec_round_trips_exactly(tmp_path: Path) -> None:
    include = tmp_path / "include"
    include.mkdir()
    (include / "extra.cuh").write_text("#define EXTRA 1\n")
    specs = [
        KernelSpec(
            '#include "b/tile.cuh"\n#include "a.cuh"\n// é ✓ \\n "quoted"\n'
            "template <typename T> __global__ void g(T* x) { x[0] = TILE + A; }\n",
            name="custom.cu",
            options=("-std=c++17", "-DN=3", "--pre-include=a.cuh", "-DN=4"),
            headers={"b/tile.cuh": "#define TILE 4\n", "a.cuh": "#define A 2\n"},
            name_expressions=("g<int>", "g<float>"),
        ),
        # Include directories: never interned, so equal only by content.
        KernelSpec('#include "extra.cuh"\n__global__ void h() {}\n', options=(f"-I{include}",)),
        make_spec(),
    ]
    path = tmp_path / "m.jsonl"
    manifest = Manifest(path)
    for spec in specs:
        manifest.record(spec)
    manifest.flush()
    read = read_manifests([path])
    # One path, as a str or a Path, is that path (not the characters of a str).
    for one in (str(path), path):
        assert read_manifests(one).specs == read.specs
    assert read == ManifestRead(specs=specs, duplicates=0, skipped=[])
    for got, want in zip(read.specs, specs, strict=True):
        fields = ("source", "name", "options", "headers", "name_expressions")
        assert [getattr(got, f) for f in fields] == [getattr(want, f) for f in fields]
    assert list(read.specs[0].headers) == ["a.cuh", "b/tile.cuh"]
    assert read.specs[0].name_expressions == ("g<int>", "g<float>")  # in order, as given
    assert path.read_text().isascii()  # json escapes the rest: no encoding to tear


# -- recording from processes ------------------------------------------------------------------

CHILD = """
import anyio
from aionvrtc import Compiler
from tests.support import make_spec

async def main():
    async with Compiler(arch="sm_90", disk=False, manifest={path!r}) as compiler:
        for n in range({first}, {first} + 20):  # one at a time: an append per spec
            await compiler.compile(make_spec(tag=f"manifest_{{n}}"))
            await compiler.compile(make_spec(tag=f"manifest_{{n}}"))  # a memory hit
anyio.run(main)
"""


def test_processes_append_to_one_manifest_concurrently(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    # Process i records specs 10i .. 10i+19: each overlaps its neighbours by 10.
    pipes: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    code = [CHILD.format(path=str(path), first=10 * i) for i in range(4)]
    children = [
        subprocess.Popen([sys.executable, "-c", c], cwd=ROOT, env=env, **pipes) for c in code
    ]
    for child in children:
        out, err = child.communicate(timeout=300)
        assert (child.returncode, out, err) == (0, "", "")
    raw = lines(path)
    assert len(raw) == 80  # 4 processes x 20 specs, each once per process
    assert all(json.loads(line)["manifest"] == 1 for line in raw)  # no line torn or mixed
    read = read_manifests([path])
    assert set(read.specs) == {make_spec(tag=f"manifest_{n}") for n in range(50)}
    assert (len(read.specs), read.duplicates, read.skipped) == (50, 30, [])


def test_one_process_writes_a_spec_once_whatever_records_it(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    spec = make_spec()
    first, second = Manifest(path), Manifest(path)
    for manifest in (first, second, first):  # two Compilers of one process, say
        manifest.record(spec)
        manifest.record(KernelSpec(spec.source, name_expressions=spec.name_expressions))
        manifest.flush()
    assert (first.written, second.written, len(lines(path))) == (1, 0, 1)


def test_a_child_forked_mid_batch_records_all_the_same(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    parent, spec = Manifest(path), make_spec()
    with parent._shared.lock:  # a thread of the parent writing a batch as it forks
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child)
            child = Manifest(path)
            child.record(spec)
            child.flush()
            os._exit(0 if child.written == 1 else 1)
    deadline = time.monotonic() + 30
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            pytest.fail("the forked child waited for its parent's manifest lock")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(done[1]) == 0
    assert read_manifests([path]).specs == [spec]


def test_reading_several_manifests_counts_the_repeats(tmp_path: Path) -> None:
    a, b = make_spec(), make_spec()
    for name, specs in (("one", [a, b]), ("two", [b])):
        manifest = Manifest(tmp_path / name)
        for spec in specs:
            manifest.record(spec)
        manifest.flush()
    read = read_manifests([tmp_path / "one", tmp_path / "two", tmp_path / "one"])
    assert read == ManifestRead(specs=[a, b], duplicates=3, skipped=[])


# -- reading what crashes and strangers leave ----------------------------------------------------


def test_torn_and_garbage_lines_are_skipped_and_reported(tmp_path: Path) -> None:
    a, b = make_spec(), make_spec()
    line_a, line_b = spec_line(a), spec_line(b)
    fields = json.loads(line_a)
    bad = [
        "hello\n",
        '{"a":1}\n',
        json.dumps({**fields, "manifest": 2}) + "\n",
        json.dumps({**fields, "defines": ["X"]}) + "\n",
        json.dumps({k: v for k, v in fields.items() if k != "options"}) + "\n",
        json.dumps({**fields, "source": " "}) + "\n",
        json.dumps({**fields, "options": "-O3"}) + "\n",
        "[1, 2]\n",
        "\n",  # blank: nothing to report
    ]
    path = tmp_path / "m.jsonl"
    path.write_text(line_a + "".join(bad) + line_a + line_b + line_b[:40])
    read = read_manifests([path])
    assert read.specs == [a, b]
    assert read.duplicates == 1
    assert read.skipped == [
        f"{path}:2: not JSON",
        f'{path}:3: not a manifest line (no "manifest" field)',
        f"{path}:4: a manifest line of version 2, and this aionvrtc reads version 1: read it "
        "with the aionvrtc that wrote it",
        f"{path}:5: not a manifest line (unknown defines)",
        f"{path}:6: not a manifest line (no options)",
        f"{path}:7: not a valid KernelSpec: source must be a non-empty CUDA C++ program",
        f"{path}:8: not a valid KernelSpec: options must be a sequence of str such as ('a', "
        "'b'), not str",
        f"{path}:9: not a JSON object",
        f"{path}:13: cut short (no newline at its end: a write that did not finish)",
    ]


def test_an_append_after_a_torn_line_keeps_its_own_lines_whole(tmp_path: Path) -> None:
    a, b = make_spec(), make_spec()
    path = tmp_path / "m.jsonl"
    path.write_text(spec_line(a) + spec_line(b)[:50])  # a writer died mid-line
    manifest = Manifest(path)
    manifest.record(b)
    manifest.flush()
    read = read_manifests([path])
    assert read == ManifestRead(specs=[a, b], duplicates=0, skipped=[f"{path}:2: not JSON"])


def test_a_last_line_whole_but_for_its_newline_is_kept(tmp_path: Path) -> None:
    spec = make_spec()
    path = tmp_path / "m.jsonl"
    path.write_text(spec_line(spec).rstrip("\n"))
    assert read_manifests([path]) == ManifestRead(specs=[spec], duplicates=0, skipped=[])


def test_a_path_that_is_no_manifest_is_an_error(tmp_path: Path) -> None:
    missing, folder, text, config = (tmp_path / n for n in ("missing", "folder", "text", "c"))
    folder.mkdir()
    text.write_text("hello\n" + spec_line(make_spec()))
    config.write_text('{"a": 1}\n{"b": 2}\n')
    fix = f"pass a file that Compiler(manifest=...) or ${ENV_MANIFEST} wrote"
    cases = {
        missing: f"no manifest at {missing}: no such file; pass the path given to "
        f"Compiler(manifest=...) or ${ENV_MANIFEST}",
        folder: f"{folder} is a folder, not a manifest file; pass a file",
        text: f"{text} is not an aionvrtc manifest (line 1 is not a JSON object); {fix}",
        config: f'{config} holds no manifest line (line 1: not a manifest line (no "manifest" '
        f"field)); {fix}",
    }
    for path, message in cases.items():
        with pytest.raises(ManifestError) as raised:
            read_manifests([path])
        assert str(raised.value) == message
    empty = tmp_path / "empty"
    empty.write_text("")
    assert read_manifests([empty]) == ManifestRead(specs=[], duplicates=0, skipped=[])


# -- the Compiler --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_compiler_records_each_spec_at_its_first_miss_only(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m.jsonl"
    spec, other, prefetched = make_spec(), make_spec(), make_spec()
    async with Compiler(arch="sm_90", cache_dir=cache_dir, manifest=path) as compiler:
        manifest = compiler.manifest
        assert manifest is not None
        assert manifest.path == str(path)
        calls: list[KernelSpec] = []
        original = manifest.record

        def counted(spec: KernelSpec) -> None:
            calls.append(spec)
            original(spec)

        monkeypatch.setattr(manifest, "record", counted)
        await compiler.compile(spec)
        await written(manifest, 1)
        assert lines(path) == [spec_line(spec).rstrip("\n")]
        for _ in range(100):  # memory hits: the hot path records nothing, not even a call
            await compiler.compile(spec)
        assert calls == [spec]
        # A miss of a spec recorded before (dropped from memory): noted, no second line.
        await compiler.forget(spec)
        await compiler.compile(spec)
        assert calls == [spec, spec]
        # Another arch: the same spec, one line all the same.
        await compiler.compile(spec, arch="sm_80")
        # Prefetched: recorded then (its requests will be memory hits, which never record).
        assert compiler.prefetch([prefetched]) == 1
        deadline = time.monotonic() + 30
        while compiler.stats().memory.entries < 3:
            assert time.monotonic() < deadline
            await anyio.sleep(0.01)
        await compiler.compile(prefetched)  # a memory hit
        await compiler.compile(other)
    # Closing waited for the last line.
    assert lines(path) == [spec_line(s).rstrip("\n") for s in (spec, prefetched, other)]
    assert calls == [spec, spec, spec, prefetched, other]
    assert manifest.written == 3


@pytest.mark.anyio
async def test_aionvrtc_manifest_is_the_default(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m.jsonl"
    monkeypatch.setenv(ENV_MANIFEST, str(path))
    spec = make_spec()
    async with Compiler(arch="sm_90", cache_dir=cache_dir, manifest=False) as compiler:
        assert compiler.manifest is None
        await compiler.compile(spec)
    assert not path.exists()
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        await compiler.compile(spec)  # a disk hit: still a request, still recorded
    assert read_manifests([path]).specs == [spec]
    monkeypatch.setenv(ENV_MANIFEST, "")
    assert Compiler(arch="sm_90", cache_dir=cache_dir).manifest is None
    with pytest.raises(TypeError, match=r"^manifest must be a path or False, not bool$"):
        Compiler(arch="sm_90", manifest=True)  # type: ignore[arg-type]
    # An empty path would name the working directory: refused, by the Compiler and the
    # Manifest alike, with what to pass instead.
    empty = (
        "manifest must be a file's path, not '' (which names the working directory); pass one "
        "such as 'kernels.jsonl', or manifest=False to a Compiler for none"
    )
    for make in (lambda: Compiler(arch="sm_90", manifest=""), lambda: Manifest("")):
        with pytest.raises(ValueError, match=r"^manifest must be a file's path") as refused:
            make()
        assert str(refused.value) == empty
    assert Manifest(tmp_path / "m2.jsonl").path == str(tmp_path / "m2.jsonl")


@pytest.mark.anyio
@pytest.mark.parametrize("where", ["folder", "read-only"])
async def test_a_manifest_that_cannot_be_written_warns_once_and_fails_nothing(
    where: str,
    tmp_path: Path,
    cache_dir: Path,
    read_only: Callable[[Path], Path],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="aionvrtc")
    if where == "folder":
        path = tmp_path / "m.jsonl"
        path.mkdir()
        whys = {"Is a directory"}
    else:
        folder = tmp_path / "manifests"
        folder.mkdir()
        path = read_only(folder) / "m.jsonl"
        whys = {"Read-only file system", "Permission denied"}  # as root / as a user
    specs = [make_spec() for _ in range(3)]
    async with Compiler(arch="sm_90", cache_dir=cache_dir, manifest=path) as compiler:
        manifest = compiler.manifest
        assert manifest is not None
        assert (await compiler.compile(specs[0])).key
        deadline = time.monotonic() + 30
        while not manifest.failed:  # the first flush tried, and stopped the recording
            assert time.monotonic() < deadline
            await anyio.sleep(0.005)
        for spec in specs[1:]:
            assert (await compiler.compile(spec)).key
        assert compiler.stats().errors == 0
    messages = [r.getMessage() for r in caplog.records if r.name == "aionvrtc"]
    assert len(messages) == 1, messages
    prefix = f"not recording kernels to the manifest {path}: it cannot be written ("
    suffix = f"); point manifest= (or ${ENV_MANIFEST}) at a file this user can write"
    assert messages[0].startswith(prefix)
    assert messages[0].endswith(suffix)
    assert messages[0][len(prefix) : -len(suffix)] in whys
    assert manifest.written == 0
    assert path.is_dir() if where == "folder" else not path.exists()


# -- aionvrtc warm manifest ----------------------------------------------------------------------


def warm(
    *args: str, cache: Path, status: int = 0, env: dict[str, str] | None = None
) -> tuple[Any, str]:
    """``python -m aionvrtc warm manifest ARGS --json --cache-dir CACHE``: its JSON document,
    parsed, and its stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "aionvrtc", "warm", "manifest", *args, "--json", "--cache-dir",
         str(cache)],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert proc.returncode == status, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def record(path: Path, specs: list[KernelSpec]) -> None:
    manifest = Manifest(path)
    for spec in specs:
        manifest.record(spec)
    manifest.flush()


REPORT = [
    "archs", "kernels", "specs", "duplicates", "skipped", "compiled", "kept", "from_disk",
    "compile_seconds", "seconds", "directory", "failed",
]  # fmt: skip


def test_warm_manifest_compiles_every_spec_for_every_arch_once(tmp_path: Path) -> None:
    specs = [make_spec(), make_spec(options=("-DSCALE=2",)), make_spec(headers={"u.cuh": "//"})]
    path, cache = tmp_path / "m.jsonl", tmp_path / "cache"
    record(path, specs)
    with path.open("a") as file:  # another process's line, and a crash mid-append
        file.write(spec_line(specs[0]) + spec_line(specs[1])[:30])
    before = path.read_bytes()
    args = (str(path), "--arch", "sm_80", "--arch", "sm_90", "--jobs", "4")
    # $AIONVRTC_MANIFEST naming the manifest itself: warming records nothing to it.
    first, stderr = warm(*args, cache=cache, env={ENV_MANIFEST: str(path)})
    assert list(first) == REPORT
    assert first == {
        **first, "archs": ["sm_80", "sm_90"], "kernels": 6, "specs": 3, "duplicates": 1,
        "skipped": [f"{path}:5: cut short (no newline at its end: a write that did not finish)"],
        "compiled": 6, "kept": 6, "from_disk": 0, "directory": str(cache / ENTRIES), "failed": [],
    }  # fmt: skip
    assert stderr == f"warning: skipped {first['skipped'][0]}\n"
    assert path.read_bytes() == before
    again, _ = warm(*args, cache=cache)
    assert (again["compiled"], again["from_disk"], again["kept"]) == (0, 6, 0)
    ls = [sys.executable, "-m", "aionvrtc", "cache", "ls", "--json", "--cache-dir", str(cache)]
    rows = json.loads(subprocess.run(ls, capture_output=True, text=True, check=True).stdout)
    names = sorted(spec.name_expressions[0] for spec in specs)
    for arch in ("sm_80", "sm_90"):
        assert sorted(row["names"][0] for row in rows if row["arch"] == arch) == names
    assert len(rows) == 6


def test_warm_manifest_for_people_is_one_line(tmp_path: Path) -> None:
    path, cache = tmp_path / "m.jsonl", tmp_path / "cache"
    record(path, [make_spec(), make_spec()])
    proc = subprocess.run(
        [sys.executable, "-m", "aionvrtc", "warm", "manifest", str(path), "--arch", "sm_90",
         "--cache-dir", str(cache)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.startswith("2 kernels (2 from the manifests) for sm_90: 2 compiled, 0 ")
    assert proc.stdout.endswith(f" s ({cache / ENTRIES})\n")
    assert proc.stdout.count("\n") == 1


def test_a_spec_that_fails_is_named_and_the_others_are_kept(tmp_path: Path) -> None:
    good = [make_spec(), make_spec()]
    path, cache = tmp_path / "m.jsonl", tmp_path / "cache"
    record(path, [good[0], BROKEN, good[1]])
    args = (str(path), "--arch", "sm_80", "--arch", "sm_90", "--jobs", "1")
    report, stderr = warm(*args, cache=cache, status=1)
    failed = [
        {"name": "bad.cu", "arch": arch, "error": BROKEN_ERROR} for arch in ("sm_80", "sm_90")
    ]
    assert report == {
        **report, "kernels": 6, "specs": 3, "compiled": 4, "kept": 4, "failed": failed,
        "error": f"2 of 6 kernels failed to compile (the others are in {cache / ENTRIES}): bad.cu "
        f"for sm_80, sm_90: {BROKEN_ERROR}",
    }  # fmt: skip
    assert stderr == f"error: {report['error']}\n"
    # The good ones are kept: a second run compiles only the broken one (and fails again).
    again, _ = warm(*args, cache=cache, status=1)
    assert (again["compiled"], again["from_disk"], again["failed"]) == (0, 4, failed)


def test_warm_manifest_errors_are_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    report, stderr = warm(str(missing), "--arch", "sm_90", cache=tmp_path / "c", status=1)
    assert report == {
        "error": f"no manifest at {missing}: no such file; pass the path given to "
        f"Compiler(manifest=...) or ${ENV_MANIFEST}"
    }
    assert stderr == f"error: {report['error']}\n"
    empty = tmp_path / "empty"
    empty.write_text(spec_line(make_spec())[:20])
    report, _ = warm(str(empty), "--arch", "sm_90", cache=tmp_path / "c", status=1)
    assert report["error"] == (
        f"no kernels to warm in {empty} (1 line skipped): record them by running the service "
        f"with {ENV_MANIFEST} (or Compiler(manifest=...)) set to the manifest's path"
    )
    assert (report["specs"], report["duplicates"], len(report["skipped"])) == (0, 0, 1)
    assert not (tmp_path / "c").exists()  # refused before anything was made


@pytest.mark.anyio
async def test_a_spec_that_fails_to_compile_is_not_recorded(
    tmp_path: Path, cache_dir: Path
) -> None:
    from aionvrtc import CompileError

    path = tmp_path / "m.jsonl"
    broken = KernelSpec("__global__ void k() { not_defined(); }")
    good = make_spec()
    async with Compiler(arch="sm_90", cache_dir=cache_dir, manifest=path) as compiler:
        with pytest.raises(CompileError):
            await compiler.compile(broken)
        await compiler.compile(good)
    assert lines(path) == [spec_line(good).rstrip("\n")]
