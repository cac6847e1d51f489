"""A program that reads host files never gets an image of their old content (issue 15).

Each variant as the issue measured it: a fresh process per step, the steps sharing one cache
dir, a host file changed between them. Before the fix every second step got the first step's
image from the disk.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from aionvrtc import KernelSpec, kernel_key

# A kernel whose image holds VAL: two values give two different cubins.
KERNEL = "__device__ int value = VAL;\n__global__ void k(int* x) { x[0] = value; }\n"

_CHILD = """
import json, sys
from aionvrtc import CompileError, KernelCache, KernelSpec
source, options, headers, cache_dir = json.loads(sys.argv[1])
try:
    spec = KernelSpec(source, options=options, headers=headers)
except ValueError as exc:
    print(json.dumps({"refused": str(exc)}))
    raise SystemExit
cache = KernelCache("sm_90", cache_dir=cache_dir)
try:
    artifact = cache.get_or_compile(spec)
except CompileError as exc:
    print(json.dumps({"compile_error": str(exc)}))
    raise SystemExit
stats = cache.stats()
print(json.dumps({"key": artifact.key, "image": artifact.image.hex(),
                  "compiles": stats.compiles, "disk_hits": stats.disk.hits}))
"""


def _step(
    cwd: Path,
    cache_dir: Path,
    source: str,
    options: list[str] | None = None,
    headers: dict[str, str] | None = None,
) -> dict[str, object]:
    """One compile request in a fresh process working in ``cwd``."""
    argument = json.dumps([source, options or [], headers or {}, str(cache_dir)])
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, argument],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        raise AssertionError(f"child failed ({proc.returncode}):\n{proc.stderr}")
    result: dict[str, object] = json.loads(proc.stdout)
    return result


def test_an_include_from_the_working_directory_is_a_compile_error(
    tmp_path: Path, cache_dir: Path
) -> None:
    (tmp_path / "val.h").write_text("#define VAL 1\n")
    source = '#include "val.h"\n' + KERNEL
    first = _step(tmp_path, cache_dir, source)
    (tmp_path / "val.h").write_text("#define VAL 2\n")
    second = _step(tmp_path, cache_dir, source)
    for outcome in (first, second):
        assert list(outcome) == ["compile_error"]
        message = str(outcome["compile_error"])
        assert message.startswith("NVRTC failed to compile 'kernel.cu' for sm_90: ")
        assert 'source file "val.h"' in message


def test_an_absolute_include_is_refused_at_construction(tmp_path: Path, cache_dir: Path) -> None:
    header = tmp_path / "dir" / "val.h"
    header.parent.mkdir()
    header.write_text("#define VAL 1\n")
    source = f'#include "{header}"\n' + KERNEL
    first = _step(tmp_path, cache_dir, source)
    header.write_text("#define VAL 2\n")
    second = _step(tmp_path, cache_dir, source)
    assert first == second
    message = str(first["refused"])
    assert message.startswith(f"source, line 1: '#include \"{header}\"' names an absolute path")
    assert "Pass the header's text in headers=" in message
    assert not cache_dir.exists() or not list(cache_dir.rglob("*/*/*"))


def test_an_include_dir_change_compiles_again(tmp_path: Path, cache_dir: Path) -> None:
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "val.h").write_text("#define VAL 1\n")
    source = '#include "val.h"\n' + KERNEL
    first = _step(tmp_path, cache_dir, source, [f"-I{inc}"])
    (inc / "val.h").write_text("#define VAL 2\n")  # same size: only the content tells
    second = _step(tmp_path, cache_dir, source, [f"-I{inc}"])
    third = _step(tmp_path, cache_dir, source, [f"-I{inc}"])
    assert (first["compiles"], first["disk_hits"]) == (1, 0)
    assert (second["compiles"], second["disk_hits"]) == (1, 0)  # not the old image from disk
    assert second["key"] != first["key"]
    assert second["image"] != first["image"]
    # The new content is cached as usual.
    assert (third["compiles"], third["disk_hits"], third["image"]) == (0, 1, second["image"])


def test_a_pre_include_must_be_in_memory_and_its_text_is_in_the_key(
    tmp_path: Path, cache_dir: Path
) -> None:
    (tmp_path / "val.h").write_text("#define VAL 1\n")
    refused = _step(tmp_path, cache_dir, KERNEL, ["--pre-include=val.h"])
    message = str(refused["refused"])
    assert message.startswith("options[0] is '--pre-include=val.h': a pre-include must be one")
    assert "pass headers={'val.h': text} with --pre-include=val.h" in message

    one = _step(tmp_path, cache_dir, KERNEL, ["--pre-include=val.h"], {"val.h": "#define VAL 1"})
    two = _step(tmp_path, cache_dir, KERNEL, ["--pre-include=val.h"], {"val.h": "#define VAL 2"})
    assert (one["compiles"], two["compiles"], two["disk_hits"]) == (1, 1, 0)
    assert one["key"] != two["key"]
    assert one["image"] != two["image"]


def test_services_in_different_folders_with_a_relative_include_dir_get_different_keys(
    tmp_path: Path, cache_dir: Path
) -> None:
    for service, value in (("a", 1), ("b", 2)):
        (tmp_path / service / "include").mkdir(parents=True)
        (tmp_path / service / "include" / "val.h").write_text(f"#define VAL {value}\n")
    source = '#include "val.h"\n' + KERNEL
    a = _step(tmp_path / "a", cache_dir, source, ["-Iinclude"])
    b = _step(tmp_path / "b", cache_dir, source, ["-Iinclude"])
    assert (a["compiles"], b["compiles"], b["disk_hits"]) == (1, 1, 0)
    assert a["key"] != b["key"]
    assert a["image"] != b["image"]


_WRITES = (
    "it writes a file on the host as a side effect of compiling, which a cache hit would "
    "silently skip and concurrent compiles would race on"
)


@pytest.mark.parametrize(
    ("option", "reason"),
    [
        ("--time={out}/time.csv", _WRITES),
        ("-time={out}/time.csv", _WRITES),
        ("--fdevice-time-trace={out}/trace.json", _WRITES),
        ("-dlto", "it produces LTO IR for a link step, not an image this library can load"),
    ],
)
def test_options_that_write_host_files_or_give_no_image_are_refused(
    tmp_path: Path, cache_dir: Path, option: str, reason: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    option = option.format(out=out)
    with pytest.raises(ValueError, match="options") as info:
        KernelSpec(KERNEL.replace("VAL", "1"), options=[option])
    assert str(info.value) == f"options[0] is {option!r}: {reason}"
    # And in a fresh process, in the folder a trace would land in: refused, nothing written.
    outcome = _step(out, cache_dir, KERNEL.replace("VAL", "1"), [option])
    assert outcome == {"refused": str(info.value)}
    assert list(out.iterdir()) == []


@pytest.fixture
def digest_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads that digest include directories from now on (observed only:
    the real digest runs)."""
    import threading

    from aionvrtc import _includes

    threads: list[str] = []
    real_host_files = _includes.host_files

    def observed(*args: Any, **kwargs: Any) -> _includes.HostFiles:
        threads.append(threading.current_thread().name)
        return real_host_files(*args, **kwargs)

    monkeypatch.setattr(_includes, "host_files", observed)
    return threads


@pytest.mark.anyio
async def test_the_compiler_digests_include_directories_off_the_event_loop(
    tmp_path: Path, digest_threads: list[str]
) -> None:
    import threading

    from aionvrtc import Compiler

    include = tmp_path / "include"
    include.mkdir()
    (include / "val.h").write_text("#define VAL 7\n")
    spec = KernelSpec('#include "val.h"\n' + KERNEL, options=[f"-I{include}"])
    assert spec.reads_host_files
    threads = digest_threads
    loop_thread = threading.current_thread().name
    async with Compiler(arch="sm_90", cache_dir=tmp_path / "cache") as compiler:
        first = await compiler.compile(spec)
        again = await compiler.compile(spec)
        stats = compiler.stats()
    assert first is again
    assert (stats.compiles, stats.memory.hits) == (1, 1)
    # The key's digest ran in a worker thread; the compile checks the files again (there too).
    assert threads
    assert loop_thread not in threads, threads


@pytest.mark.anyio
async def test_prefetch_digests_include_directories_off_the_event_loop(
    tmp_path: Path, digest_threads: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    import logging
    import threading

    import anyio

    from aionvrtc import Compiler

    include, outside = tmp_path / "include", tmp_path / "outside"
    include.mkdir()
    outside.mkdir()
    (include / "val.h").write_text("#define VAL 7\n")
    (outside / "val.h").write_text('#include "/etc/hostname"\n')  # refused when digested
    good = KernelSpec('#include "val.h"\n' + KERNEL, options=[f"-I{include}"])
    refused = KernelSpec('#include "val.h"\n' + KERNEL, options=[f"-I{outside}"])
    threads = digest_threads
    loop_thread = threading.current_thread().name
    async with Compiler(arch="sm_90", cache_dir=tmp_path / "cache") as compiler:
        with caplog.at_level(logging.WARNING, logger="aionvrtc"):
            assert compiler.prefetch([good, refused]) == 2  # never raises, never digests here
            assert threads == []
            with anyio.fail_after(60):
                while compiler.stats().compiles < 1 or compiler.stats().in_flight:
                    await anyio.sleep(0.01)
        artifact = await compiler.compile(good)
        stats = compiler.stats()
    assert (stats.compiles, stats.memory.hits, stats.errors) == (1, 1, 0)
    assert artifact.key == kernel_key(good, "sm_90")
    assert loop_thread not in threads, threads
    warnings = [r.getMessage() for r in caplog.records if "not prefetching" in r.getMessage()]
    assert len(warnings) == 1
    assert "/etc/hostname" in warnings[0]
