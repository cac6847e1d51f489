"""Shipping a warm cache end to end, as a user does it: record in staging, replay for the
fleet's archs, export a bundle (all of it, or a manifest's share), serve a fresh process from
the bundle alone. Real NVRTC, real processes, the command line as a user runs it."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from aionvrtc import Artifact, Compiler, KernelCache, KernelSpec, kernel_key
from aionvrtc._store import DiskTier

from .support import make_spec, run_python
from .support.cli import cli


async def record(manifest: Path, cache_dir: Path, specs: list[KernelSpec]) -> None:
    """A staging service that asks for ``specs``; its manifest names them."""
    async with Compiler(arch="sm_90", cache_dir=cache_dir, manifest=manifest) as compiler:
        for spec in specs:
            await compiler.compile(spec)


def test_record_replay_export_and_serve_from_the_bundle_alone(tmp_path: Path) -> None:
    manifest, build = tmp_path / "kernels.manifest", tmp_path / "build"
    served = [make_spec() for _ in range(3)]
    anyio.run(record, manifest, tmp_path / "staging", served)

    replay = cli("warm", "manifest", str(manifest), "--arch", "sm_80", "--arch", "sm_90",
                 cache=build)  # fmt: skip
    assert (replay["specs"], replay["kernels"], replay["compiled"]) == (3, 6, 6)
    assert replay["failed"] == []
    bundle = tmp_path / "kernels.bundle"
    exported = cli("cache", "export", str(bundle), "--manifest", str(manifest), cache=build)
    assert (exported["entries"], exported["archs"], exported["missing"]) == (
        6, ["sm_80", "sm_90"], 0,
    )  # fmt: skip

    # A fresh process, an empty writable dir, the bundle as its only layer: nothing compiles.
    specs = ", ".join(
        f"KernelSpec({s.source!r}, name_expressions={s.name_expressions!r})" for s in served
    )
    out = run_python(
        f"""
import json, anyio
from aionvrtc import Compiler, KernelSpec
specs = [{specs}]
async def main():
    async with Compiler(arch="sm_90", cache_dir={str(tmp_path / "empty")!r}) as compiler:
        for arch in ("sm_80", "sm_90"):
            for spec in specs:
                assert (await compiler.compile(spec, arch=arch)).arch == arch
        s = compiler.stats()
        print(json.dumps([s.compiles, s.layers[0].hits, s.layers[0].kind]))
anyio.run(main)
""",
        env={"AIONVRTC_CACHE_LAYERS": str(bundle)},
    )
    assert json.loads(out) == [0, 6, "bundle"]


def test_export_of_a_manifests_share_of_the_cache(tmp_path: Path) -> None:
    manifest, cache_dir = tmp_path / "m.jsonl", tmp_path / "cache"
    named, unnamed, never = make_spec(), make_spec(), make_spec()
    anyio.run(record, manifest, cache_dir, [named])
    # Also in the cache, but asked for by no recorded service: left out.
    cache = KernelCache("sm_80", cache_dir=cache_dir)
    for spec in (named, unnamed):
        cache.get_or_compile(spec)
    KernelCache("sm_90", cache_dir=cache_dir).get_or_compile(unnamed)
    anyio.run(record, tmp_path / "other.jsonl", tmp_path / "elsewhere", [never])
    both = tmp_path / "both.bundle"
    out = cli("cache", "export", str(both), "--manifest", str(manifest),
              "--manifest", str(tmp_path / "other.jsonl"), cache=cache_dir)  # fmt: skip
    # named for sm_80 and sm_90; never is in no cache: missing for both archs.
    assert (out["entries"], out["missing"]) == (2, 2)
    only = tmp_path / "only.bundle"
    out = cli("cache", "export", str(only), "--manifest", str(manifest), "--arch", "sm_90",
              cache=cache_dir)  # fmt: skip
    assert (out["entries"], out["archs"], out["missing"]) == (1, ["sm_90"], 0)
    from aionvrtc._store.bundle import BundleTier

    with BundleTier(both) as tier:
        assert sorted(tier.keys()) == sorted(kernel_key(named, a) for a in ("sm_80", "sm_90"))
    # An entry another CUDA version's NVRTC wrote for an arch this one cannot compile for (a
    # dir shared with a CUDA 12 host): the default archs leave it out, the export goes on.
    DiskTier(cache_dir).write(
        Artifact(key="b" * 64, kind="ptx", image=b"//ptx", arch="sm_70", nvrtc_version="12.9",
                 lowered_names={})
    )  # fmt: skip
    again = tmp_path / "again.bundle"
    out = cli("cache", "export", str(again), "--manifest", str(manifest), cache=cache_dir)
    assert (out["entries"], out["missing"]) == (2, 0)
    # A manifest that is not one: one line, exit 1.
    bad = tmp_path / "bad.jsonl"
    bad.write_text("hello\n")
    error = cli("cache", "export", str(tmp_path / "x.bundle"), "--manifest", str(bad),
                cache=cache_dir, status=1)["error"]  # fmt: skip
    assert str(bad) in error
    assert not (tmp_path / "x.bundle").exists()


@pytest.mark.parametrize("what", ["manifest", "bundle"])
def test_missing_inputs_are_one_line_errors(tmp_path: Path, what: str) -> None:
    missing = tmp_path / "nope"
    args = (
        ["warm", "manifest", str(missing), "--arch", "sm_90"]
        if what == "manifest"
        else ["cache", "import", str(missing)]
    )
    error = cli(*args, cache=tmp_path / "cache", status=1)["error"]
    assert str(missing) in error
    assert "\n" not in error
