"""Read-only layers: cache dirs and bundles read after the writable cache dir, never written.
Real NVRTC, real files and permissions."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import anyio
import pytest

from aionvrtc import Compiler, KernelCache, KernelSpec

from .support import ENTRIES, make_spec
from .support.layers import tree

pytestmark = pytest.mark.anyio


def entries_of(root: Path) -> list[Path]:
    """The cache entries under ``root`` (files named by a key)."""
    return [p for p in (root / ENTRIES).rglob("*") if p.is_file() and len(p.name) == 64]


def warm_layer(root: Path, specs: list[KernelSpec], arch: str = "sm_90") -> None:
    cache = KernelCache(arch, cache_dir=root)
    for spec in specs:
        cache.get_or_compile(spec)
    assert cache.stats().compiles == len(specs)


async def test_a_dir_layer_serves_in_place_and_is_never_written(tmp_path: Path) -> None:
    layer, writable = tmp_path / "layer", tmp_path / "writable"
    shipped = [make_spec() for _ in range(3)]
    warm_layer(layer, shipped)
    before = tree(layer)
    new = make_spec()
    async with Compiler(arch="sm_90", cache_dir=writable, layers=[layer]) as compiler:
        for spec in shipped:
            artifact = await compiler.compile(spec)
            assert artifact.key == compiler.key(spec)
        await compiler.compile(new)  # not in the layer: compiled, written to the writable dir
        for spec in shipped:  # now from memory
            await compiler.compile(spec)
        stats = compiler.stats()
    assert stats.compiles == 1
    assert (stats.disk.hits, stats.disk.writes) == (0, 1)
    (only,) = stats.layers
    assert (only.path, only.kind, only.hits, only.misses, only.damaged) == (
        str(layer), "dir", 3, 1, 0,
    )  # fmt: skip
    assert tree(layer) == before  # not written, no entry touched (not even its mtime)
    written = [p.name for p in entries_of(writable)]
    assert written == [KernelCache("sm_90", cache_dir=writable).key(new)]  # not copied


async def test_layers_are_read_in_order_after_the_writable_dir(tmp_path: Path) -> None:
    first, second, writable = tmp_path / "first", tmp_path / "second", tmp_path / "writable"
    a, b, c = make_spec(), make_spec(), make_spec()
    warm_layer(first, [a])
    warm_layer(second, [a, b])
    warm_layer(writable, [c])
    async with Compiler(arch="sm_90", cache_dir=writable, layers=[first, second]) as compiler:
        for spec in (a, b, c):
            await compiler.compile(spec)
        stats = compiler.stats()
    assert stats.compiles == 0
    assert stats.disk.hits == 1  # c, from the writable dir, before any layer
    assert [(s.hits, s.misses) for s in stats.layers] == [(1, 1), (1, 0)]  # a; then b


async def test_a_damaged_entry_in_a_layer_is_skipped_counted_and_compiled(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    layer, writable = tmp_path / "layer", tmp_path / "writable"
    spec = make_spec()
    warm_layer(layer, [spec])
    key = KernelCache("sm_90", cache_dir=layer).key(spec)
    entry = layer / ENTRIES / key[:2] / key
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0x01
    entry.write_bytes(bytes(data))
    before = tree(layer)
    with caplog.at_level(logging.WARNING, logger="aionvrtc"):
        async with Compiler(arch="sm_90", cache_dir=writable, layers=[layer]) as compiler:
            artifact = await compiler.compile(spec)
            stats = compiler.stats()
    assert artifact.image[:4] == b"\x7fELF"
    assert stats.compiles == 1
    assert (stats.layers[0].hits, stats.layers[0].damaged) == (0, 1)
    assert tree(layer) == before  # the damaged entry is left where it is
    assert f"skipping damaged entry {entry} of a read-only cache: " in caplog.text


async def test_a_layer_that_disappears_while_the_service_runs(tmp_path: Path) -> None:
    layer, writable = tmp_path / "layer", tmp_path / "writable"
    served, later = make_spec(), make_spec()
    warm_layer(layer, [served, later])
    async with Compiler(arch="sm_90", cache_dir=writable, layers=[layer]) as compiler:
        await compiler.compile(served)
        shutil.rmtree(layer)
        assert (await compiler.compile(served)).image[:4] == b"\x7fELF"  # memory
        assert (await compiler.compile(later)).image[:4] == b"\x7fELF"  # compiled: no error
        stats = compiler.stats()
    assert stats.compiles == 1
    assert (stats.layers[0].hits, stats.layers[0].misses) == (1, 1)


def test_layers_from_the_environment_and_a_missing_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    layer, missing = tmp_path / "layer", tmp_path / "missing"
    spec = make_spec()
    warm_layer(layer, [spec])
    monkeypatch.setenv("AIONVRTC_CACHE_LAYERS", os.pathsep.join([str(missing), "", str(layer)]))
    with caplog.at_level(logging.WARNING, logger="aionvrtc"):
        cache = KernelCache("sm_90", cache_dir=tmp_path / "writable")
    assert [r.getMessage() for r in caplog.records] == [
        f"not reading the cache layer {missing}: layer '{missing}' does not exist (in "
        "$AIONVRTC_CACHE_LAYERS)"
    ]
    assert [s.path for s in cache.stats().layers] == [str(layer)]
    cache.get_or_compile(spec)
    assert (cache.stats().compiles, cache.stats().layers[0].hits) == (0, 1)
    # An explicit list replaces the environment's; an empty one means no layers.
    assert KernelCache("sm_90", cache_dir=tmp_path / "w2", layers=[]).stats().layers == ()
    with pytest.raises(TypeError, match=r"layers must be a list of paths"):
        KernelCache("sm_90", cache_dir=tmp_path / "w3", layers=str(layer))  # a str is iterable


def test_an_untrusted_layer_dir_is_not_read(tmp_path: Path) -> None:
    # Code that runs on the GPU: a layer others can write is not trusted, as a cache dir.
    layer = tmp_path / "layer"
    spec = make_spec()
    warm_layer(layer, [spec])
    layer.chmod(0o777)
    cache = KernelCache("sm_90", cache_dir=tmp_path / "writable", layers=[layer])
    cache.get_or_compile(spec)
    assert cache.stats().compiles == 1
    assert cache.stats().layers[0].hits == 0


def test_a_layer_serves_every_arch_and_each_from_its_own_key(tmp_path: Path) -> None:
    layer = tmp_path / "layer"
    spec = make_spec()
    warm_layer(layer, [spec], "sm_80")
    warm_layer(layer, [spec], "sm_90")
    cache = KernelCache("sm_90", cache_dir=tmp_path / "writable", layers=[layer])
    assert cache.for_arch("sm_80").get_or_compile(spec).arch == "sm_80"
    assert cache.get_or_compile(spec).arch == "sm_90"
    assert (cache.stats().compiles, cache.stats().layers[0].hits) == (0, 2)


async def test_a_layer_hit_is_read_in_the_io_lane_while_another_key_compiles(
    tmp_path: Path,
) -> None:
    from .support import make_slow_spec

    layer, writable = tmp_path / "layer", tmp_path / "writable"
    spec = make_spec()
    warm_layer(layer, [spec])
    async with (
        Compiler(arch="sm_90", cache_dir=writable, layers=[layer]) as compiler,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(compiler.compile, make_slow_spec())
        await anyio.sleep(0.05)  # the slow compile holds the only compile slot
        with anyio.fail_after(5):
            await compiler.compile(spec)
        assert compiler.stats().compiles == 0  # served while the other still compiles


def bundle_of(
    root: Path, out: Path, specs: list[KernelSpec], *, secret: bytes | None = None
) -> Path:
    """A bundle of ``specs`` compiled for sm_90 (through a cache dir at ``root``)."""
    from aionvrtc._store.bundle import write_bundle

    warm_layer(root, specs)
    write_bundle(out, [p.read_bytes() for p in entries_of(root)], secret=secret)
    return out


def test_a_fresh_process_whose_only_cache_is_a_bundle_compiles_nothing(tmp_path: Path) -> None:
    from .support import run_python

    spec = make_spec()
    bundle = bundle_of(tmp_path / "staging", tmp_path / "kernels.bundle", [spec, make_spec()])
    out = run_python(
        f"""
import json, anyio
from aionvrtc import Compiler, KernelSpec
spec = KernelSpec({spec.source!r}, name_expressions={spec.name_expressions!r})
async def main():
    async with Compiler(arch="sm_90", cache_dir={str(tmp_path / "empty")!r}) as compiler:
        artifact = await compiler.compile(spec)
        s = compiler.stats()
        print(json.dumps([s.compiles, s.disk.hits, [(l.kind, l.hits, l.entries) for l in s.layers],
                          artifact.image[:4].hex()]))
anyio.run(main)
""",
        env={"AIONVRTC_CACHE_LAYERS": str(bundle)},
    )
    assert json.loads(out) == [0, 0, [["bundle", 1, 2]], "7f454c46"]
    assert entries_of(tmp_path / "empty") == []  # served in place, not copied


async def test_a_bundle_layer_skips_a_damaged_entry_and_survives_its_file_going(
    tmp_path: Path,
) -> None:
    good, bad, later = make_spec(), make_spec(), make_spec()
    bundle = bundle_of(tmp_path / "staging", tmp_path / "k.bundle", [good, bad, later])
    key = KernelCache("sm_90", cache_dir=tmp_path / "staging").key(bad)
    entry = (tmp_path / "staging" / ENTRIES / key[:2] / key).read_bytes()
    data = bytearray(bundle.read_bytes())
    at = data.find(entry)  # the entry's bytes, as the bundle holds them
    assert at > 0
    data[at + len(entry) // 2] ^= 0x01  # inside that entry: the index still vouches for it
    tampered = tmp_path / "tampered.bundle"
    tampered.write_bytes(bytes(data))
    async with Compiler(arch="sm_90", cache_dir=tmp_path / "w", layers=[tampered]) as compiler:
        await compiler.compile(good)
        tampered.unlink()  # the layer's file goes: its memory map stays readable
        await compiler.compile(later)
        await compiler.compile(bad)  # damaged in the bundle: compiled instead
        stats = compiler.stats()
    assert stats.compiles == 1
    (layer,) = stats.layers
    assert (layer.kind, layer.hits, layer.misses, layer.damaged) == ("bundle", 2, 1, 1)


def test_a_signed_bundle_layer_is_read_only_with_its_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    spec = make_spec()
    bundle = bundle_of(tmp_path / "staging", tmp_path / "k.bundle", [spec], secret=b"s" * 32)
    monkeypatch.setenv("AIONVRTC_REMOTE_SECRET", "another secret")
    with caplog.at_level(logging.WARNING, logger="aionvrtc"):
        refused = KernelCache("sm_90", cache_dir=tmp_path / "a", layers=[bundle])
    assert refused.stats().layers == ()  # left out, saying why
    assert f"not reading the cache layer {bundle}: " in caplog.text
    assert "signed with another secret" in caplog.text
    monkeypatch.setenv("AIONVRTC_REMOTE_SECRET", "s" * 32)
    cache = KernelCache("sm_90", cache_dir=tmp_path / "b", layers=[bundle])
    cache.get_or_compile(spec)
    assert (cache.stats().compiles, cache.stats().layers[0].hits) == (0, 1)


def test_the_remote_tiers_secret_verifies_bundle_layers(tmp_path: Path) -> None:
    from aionvrtc import RedisTier

    spec = make_spec()
    unsigned = bundle_of(tmp_path / "a", tmp_path / "unsigned.bundle", [spec])
    signed = bundle_of(tmp_path / "b", tmp_path / "signed.bundle", [spec], secret=b"k" * 32)
    remote = RedisTier("redis://127.0.0.1:1", secret="k" * 32)  # not connected: only its secret
    layers = [unsigned, signed]
    cache = KernelCache("sm_90", cache_dir=tmp_path / "w", remote=remote, layers=layers)
    assert [s.path for s in cache.stats().layers] == [str(signed)]


def test_a_forgotten_kernel_is_compiled_not_served_from_the_layer_again(tmp_path: Path) -> None:
    spec = make_spec()
    bundle = bundle_of(tmp_path / "staging", tmp_path / "k.bundle", [spec])
    cache = KernelCache("sm_90", cache_dir=tmp_path / "w", layers=[bundle])
    cache.get_or_compile(spec)
    assert cache.stats().compiles == 0
    cache.forget(spec)  # "the next request compiles it"
    cache.get_or_compile(spec)
    assert (cache.stats().compiles, cache.stats().layers[0].hits) == (1, 1)


def test_warming_with_layers_in_the_environment_still_fills_the_cache_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aionvrtc import tropical

    from .support.cli import WARM, cli

    staging = tmp_path / "staging"
    assert cli(*WARM, cache=staging)["compiled"] > 0
    bundle = tmp_path / "k.bundle"
    from aionvrtc._store.bundle import write_bundle

    write_bundle(bundle, [p.read_bytes() for p in entries_of(staging)])
    monkeypatch.setenv("AIONVRTC_CACHE_LAYERS", str(bundle))
    target = tmp_path / "target"
    warmed = cli(*WARM, cache=target)
    kernels = len(tropical.all_specs(["andor"], ["bool"]))
    assert (warmed["compiled"], warmed["kept"]) == (kernels, kernels)
    assert len(entries_of(target)) == kernels


async def test_closing_the_compiler_lets_go_of_its_bundles(tmp_path: Path) -> None:
    spec = make_spec()
    bundle = bundle_of(tmp_path / "staging", tmp_path / "k.bundle", [spec])

    def maps() -> int:  # the bundle's memory maps this process holds
        with open("/proc/self/maps") as lines:
            return sum(line.rstrip().endswith(str(bundle)) for line in lines)

    before = maps()
    for _ in range(5):
        async with Compiler(arch="sm_90", cache_dir=tmp_path / "w", layers=[bundle]) as c:
            await c.compile(spec)
            assert maps() == before + 1
    assert maps() == before


def test_the_cache_reads_its_tiers_in_order_and_locks_those_that_lock(tmp_path: Path) -> None:
    # Checked by mypy too: every tier is a Tier, as the core reads them.
    from aionvrtc import Artifact
    from aionvrtc._store.tier import Locking, Tier

    bundle = bundle_of(tmp_path / "staging", tmp_path / "k.bundle", [make_spec()])
    cache = KernelCache("sm_90", cache_dir=tmp_path / "w", layers=[tmp_path / "staging", bundle])
    tiers: list[Tier] = list(cache.tiers)
    assert [(t.origin, t.local, isinstance(t, Locking)) for t in tiers] == [
        ("disk", True, True),
        ("layer", True, False),
        ("layer", True, False),
    ]
    artifact = Artifact("0" * 64, "cubin", b"\x7fELF", "sm_90", "13.0")
    assert [t.write(artifact) for t in tiers[1:]] == [False, False]  # a layer is never written
