"""Why a lookup missed (``Compiler.explain``): each part of a kernel's key changed in turn, with
real NVRTC compiles into a real cache dir, and the nearest entry's differing part named; a hit
named by its tier; no entry at all; an entry written before entries kept their parts; the debug
line of every miss."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import aionvrtc
from aionvrtc import Compiler, KernelSpec
from aionvrtc._artifact import Artifact
from aionvrtc._spec import KEY_PARTS, key_parts
from aionvrtc._store import DiskTier

pytestmark = pytest.mark.anyio

SOURCE = """
#include "scale.h"
template <typename T> __global__ void scale(T* x) { x[threadIdx.x] *= (T)FACTOR; }
"""
NAMES = ("scale<float>",)


def spec(**change: object) -> KernelSpec:
    fields: dict[str, object] = {
        "source": SOURCE, "name": "scale.cu", "headers": {"scale.h": "#define FACTOR 2"},
        "options": ("-std=c++17",), "name_expressions": NAMES,
    }  # fmt: skip
    fields.update(change)
    return KernelSpec(**fields)  # type: ignore[arg-type]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_hit_names_its_tier_and_a_miss_the_part_that_differs(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    async with Compiler(arch="sm_90", cache_dir=cache) as compiler:
        base = spec()
        await compiler.compile(base)
        held = await compiler.explain(base)
        assert (held.held_in, held.nearest) == ("memory", None)
        assert held.parts == key_parts(base, "sm_90", aionvrtc._nvrtc.build())
        assert str(held) == f"scale.cu ({held.key[:16]}): held in memory, a lookup hits"
        changes = {
            "source": spec(source=SOURCE + "// a comment\n"),
            "headers": spec(headers={"scale.h": "#define FACTOR 3"}),
            "options": spec(options=("-std=c++17", "-DNDEBUG")),
            "name_expressions": spec(name_expressions=(*NAMES, "scale<double>")),
            "name": spec(name="other.cu"),
        }
        for part, changed in changes.items():
            why = await compiler.explain(changed)
            assert why.held_in is None, part
            assert why.nearest == held.key, part
            assert why.differs == (part,), part
            assert why.theirs == {part: held.parts[part]}, part
            assert f"differs in {part} ({part}: {held.parts[part]} there, " in str(why)
        other_arch = await compiler.explain(base, arch="sm_80")
        assert other_arch.differs == ("arch",)
        assert "arch: sm_90 there, sm_80 here" in str(other_arch)
    # A later process: the disk holds it.
    async with Compiler(arch="sm_90", cache_dir=cache) as compiler:
        assert (await compiler.explain(spec())).held_in == "disk"
        assert (await compiler.explain(spec(), arch="sm_80")).nearest is not None


async def test_an_include_files_change_is_told_apart(tmp_path: Path) -> None:
    include = tmp_path / "include"
    include.mkdir()
    (include / "scale.h").write_text("#define FACTOR 2\n")
    options = ("-std=c++17", f"-I{include}")
    async with Compiler(arch="sm_90", cache_dir=tmp_path / "cache") as compiler:
        first = spec(headers={}, options=options)
        await compiler.compile(first)
        (include / "scale.h").write_text("#define FACTOR 5\n")
        why = await compiler.explain(spec(headers={}, options=options))  # a new spec: re-read
        assert why.differs == ("include_files",)
        assert why.nearest == aionvrtc.kernel_key(first, "sm_90")


async def test_no_entry_of_the_kernel_and_an_entry_without_parts(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    async with Compiler(arch="sm_90", cache_dir=cache) as compiler:
        why = await compiler.explain(spec())
        assert (why.held_in, why.nearest, why.compared) == (None, None, 0)
        missed = "missed in memory, on disk and in the cache-dir layers: no entry of the same "
        assert f"{missed}kernel names" in str(why)
        with pytest.raises(TypeError, match="spec must be a KernelSpec, not str"):
            await compiler.explain("scale.cu")  # type: ignore[arg-type]
    # An entry of the same names as an aionvrtc before parts wrote it (none in its header).
    made = await _compiled_elsewhere(tmp_path, spec(source=SOURCE + "// older\n"))
    old = Artifact(key=made.key, kind=made.kind, image=made.image, arch=made.arch,
                   nvrtc_version=made.nvrtc_version, lowered_names=made.lowered_names)  # fmt: skip
    assert DiskTier(cache).write(old)
    async with Compiler(arch="sm_90", cache_dir=cache) as compiler:
        why = await compiler.explain(spec())
        assert (why.nearest, why.differs, why.compared) == (old.key, ("unknown",), 1)
        assert str(why).endswith("keeps no parts of its key (written before entries kept them)")


async def test_another_nvrtc_build_is_told_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A second NVRTC build cannot be installed here: its entry is written with the build
    # string swapped (the fault injected), then looked up with the real one.
    cache = tmp_path / "cache"
    real = aionvrtc._nvrtc.build()
    monkeypatch.setattr(aionvrtc._nvrtc, "build", lambda: "nvrtc-another-build")
    async with Compiler(arch="sm_90", cache_dir=cache) as compiler:
        await compiler.compile(spec())
    monkeypatch.setattr(aionvrtc._nvrtc, "build", lambda: real)
    async with Compiler(arch="sm_90", cache_dir=cache) as compiler:
        why = await compiler.explain(spec())
        assert why.differs == ("nvrtc_build",)
        assert f"nvrtc_build: nvrtc-another-build there, {real} here" in str(why)


async def test_every_miss_logs_its_parts_at_debug(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with Compiler(arch="sm_90", cache_dir=tmp_path / "cache") as compiler:
        with caplog.at_level(logging.INFO, logger="aionvrtc.misses"):
            await compiler.compile(spec())
        assert not [r for r in caplog.records if r.name == "aionvrtc.misses"]  # off: INFO
        with caplog.at_level(logging.DEBUG, logger="aionvrtc.misses"):
            await compiler.compile(spec(options=("-std=c++17", "-DX")))
            await compiler.compile(spec(options=("-std=c++17", "-DX")))  # a hit: no line
    (line,) = [r.getMessage() for r in caplog.records if r.name == "aionvrtc.misses"]
    assert line.startswith("miss scale.cu ")
    for part in KEY_PARTS:
        assert f"{part}=" in line
    assert "arch=sm_90" in line


async def _compiled_elsewhere(tmp_path: Path, what: KernelSpec) -> Artifact:
    async with Compiler(arch="sm_90", cache_dir=tmp_path / "elsewhere") as compiler:
        return await compiler.compile(what)
