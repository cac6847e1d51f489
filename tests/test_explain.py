"""Why a lookup missed (``Compiler.explain``): each part of a kernel's key changed in turn, with
real NVRTC compiles into a real cache dir, and the nearest entry's differing part named, and
said in words (the option, name expression, header or include folder added, removed, changed or
reordered) from memory's entry and the disk's alike; a hit named by its tier; no entry at all;
an entry written before entries kept their parts, or their items; the key unchanged by what
entries keep; the debug line of every miss."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

import aionvrtc
from aionvrtc import Compiler, KernelSpec
from aionvrtc._artifact import Artifact
from aionvrtc._spec import KEY_PARTS, PART_CHARS, derive_key, key_parts, part_items
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
        # Each part changed, and what explain says of it: the source (kept as a digest alone)
        # and the name as they are, the others in words.
        source = spec(source=SOURCE + "// a comment\n")
        changes = {
            "source": (source, f"{held.parts['source']} there, {source_digest(source)} here"),
            "headers": (spec(headers={"scale.h": "#define FACTOR 3"}), "scale.h changed"),
            "options": (spec(options=("-std=c++17", "-DNDEBUG")), "-DNDEBUG added"),
            "name_expressions": (
                spec(name_expressions=(*NAMES, "scale<double>")),
                "scale<double> added",
            ),
            "name": (spec(name="other.cu"), "scale.cu there, other.cu here"),
        }
        for part, (changed, said) in changes.items():
            why = await compiler.explain(changed)
            assert why.held_in is None, part
            assert why.nearest == held.key, part
            assert why.differs == (part,), part
            assert why.theirs == {part: held.parts[part]}, part
            assert str(why).endswith(f" differs in {part} ({part}: {said})"), str(why)
        other_arch = await compiler.explain(base, arch="sm_80")
        assert other_arch.differs == ("arch",)
        assert "arch: sm_90 there, sm_80 here" in str(other_arch)
    # A later process: the disk holds it.
    async with Compiler(arch="sm_90", cache_dir=cache) as compiler:
        assert (await compiler.explain(spec())).held_in == "disk"
        assert (await compiler.explain(spec(), arch="sm_80")).nearest is not None


def source_digest(changed: KernelSpec) -> str:
    return key_parts(changed, "sm_90", aionvrtc._nvrtc.build())["source"]


async def test_options_headers_and_names_are_said_in_words_from_disk(tmp_path: Path) -> None:
    # The entry is read from the disk by a later Compiler (its header's items, not memory's
    # artifact): adding --use_fast_math is said as such, not as two digests of the options.
    cache = tmp_path / "cache"
    base = spec(
        options=("-std=c++17", "-DA", "-DB"), name_expressions=(*NAMES, "scale<double>"),
        headers={"scale.h": "#define FACTOR 2", "old.h": "", "same.h": "// same"},
    )  # fmt: skip
    async with Compiler(arch="sm_90", cache_dir=cache) as compiler:
        await compiler.compile(base)
    said: dict[str, dict[tuple[Any, ...], str]] = {
        "options": {
            ("-std=c++17", "-DA", "-DB", "--use_fast_math"): "--use_fast_math added",
            ("-std=c++17", "-DB"): "-DA removed",
            ("-std=c++17", "-DB", "-DA"): "reordered from -std=c++17 -DA -DB to -std=c++17 -DB -DA",
            ("-DB", "-std=c++17", "-DC", "-DD"): (
                "-DC, -DD added and -DA removed and reordered from -std=c++17 -DB to -DB -std=c++17"
            ),
            ("-std=c++17", "-DA", "-DB", "-DB"): "-DB added",
            # An item holding a space or a comma is quoted: it reads as one.
            ("-std=c++17", "-DA", "-DB", "-DX=1 2", "-DY=a,b"): "'-DX=1 2', '-DY=a,b' added",
        },
        "headers": {
            (("scale.h", "#define FACTOR 3"), ("same.h", "// same"), ("new.h", "")): (
                "scale.h changed and new.h added and old.h removed"
            ),
        },
        "name_expressions": {(NAMES[0],): "scale<double> removed"},
    }
    async with Compiler(arch="sm_90", cache_dir=cache) as compiler:
        for part, cases in said.items():
            for value, words in cases.items():
                fields: dict[str, object] = {
                    "options": base.options, "name_expressions": base.name_expressions,
                    "headers": dict(base.headers),
                }  # fmt: skip
                fields[part] = dict(value) if part == "headers" else value
                changed = spec(**fields)
                why = await compiler.explain(changed)
                assert (why.held_in, why.differs) == (None, (part,)), value
                assert why.changes == {part: words}
                assert str(why).endswith(f"differs in {part} ({part}: {words})")


async def test_what_entries_keep_leaves_the_key_as_it_was_and_is_bounded() -> None:
    # The key's derivation is not touched by what the entries keep beside it: a key derived
    # before (pinned here) is derived again, and every entry written before stays a hit.
    pinned = KernelSpec(
        '#include "scale.h"\n__global__ void f() {}', name="scale.cu",
        headers={"scale.h": "#define FACTOR 2"}, options=("-std=c++17", "--use_fast_math"),
        name_expressions=("f",),
    )  # fmt: skip
    key = derive_key(pinned, "sm_90", "nvrtc-build")
    assert key == "6b04beea7b59cb81c8744ef4437bc1494bd283f3d1cd11f527ad8809d5dd1b1b"
    # Items are clipped to a start and a digest; a part too long to keep is left out (and
    # told by its digest alone).
    long = "-D" + "X" * 300
    kept = part_items(spec(options=("-std=c++17", long, long + "Y")))
    first, second = kept["options"][1:]
    assert (len(first), len(second)) == (200, 200)
    assert first != second
    assert (first[:5], first[-1]) == ("-DXXX", ")")
    many = tuple(f"-DNAME_{n}={n}" for n in range(PART_CHARS // 10))
    assert set(part_items(spec(options=many))) == {"headers", "name_expressions", "include_files"}


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
        assert why.changes == {"include_files": f"{include} changed"}
        other = tmp_path / "other"
        other.mkdir()
        (other / "scale.h").write_text("#define FACTOR 2\n")
        moved = await compiler.explain(spec(headers={}, options=("-std=c++17", f"-I{other}")))
        assert moved.differs == ("options", "include_files")
        assert moved.changes == {
            "options": f"-I{other} added and -I{include} removed",
            "include_files": f"{other} added and {include} removed",
        }


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
    # One that kept its parts but not their items: told by the digests, as before items.
    made = await _compiled_elsewhere(tmp_path, spec(options=("-std=c++17", "-DOLDER")))
    older = Artifact(key=made.key, kind=made.kind, image=made.image, arch=made.arch,
                     nvrtc_version=made.nvrtc_version, lowered_names=made.lowered_names,
                     parts=made.parts)  # fmt: skip
    cache = tmp_path / "older"
    assert DiskTier(cache).write(older)
    async with Compiler(arch="sm_90", cache_dir=cache) as compiler:
        why = await compiler.explain(spec())
        assert (why.nearest, why.differs, why.changes) == (older.key, ("options",), {})
        ours = key_parts(spec(), "sm_90", aionvrtc._nvrtc.build())["options"]
        assert str(why).endswith(f"(options: {older.parts['options']} there, {ours} here)")


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
