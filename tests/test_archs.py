"""One Compiler for several targets, and what each CUDA major and driver can do. Real NVRTC on
the CPU; a driver's version is injected only where it cannot be installed here."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import anyio
import pytest

from aionvrtc import (
    Artifact,
    Compiler,
    KernelCache,
    KernelSpec,
    NvrtcError,
    Target,
    _cuda_versions,
    _nvrtc,
    kernel_key,
)
from aionvrtc._cache import ArchStats
from aionvrtc._cuda import runnable
from aionvrtc._cuda_versions import MAJORS, driver_fix, driver_release, extra_for_arch
from aionvrtc._target import device_target

from .support import ENTRIES, make_spec

pytestmark = pytest.mark.anyio

ARCHS = ("sm_80", "sm_90")


async def test_one_compile_per_key_and_arch_under_concurrent_requests(cache_dir: Path) -> None:
    spec = make_spec()
    results: dict[str, list[Artifact]] = {arch: [] for arch in ARCHS}

    async def request(arch: str) -> None:
        results[arch].append(await compiler.compile(spec, arch=arch))

    async with Compiler(arch="sm_90", cache_dir=cache_dir, concurrency=2) as compiler:
        async with anyio.create_task_group() as tg:
            for _ in range(100):
                for arch in ARCHS:
                    tg.start_soon(request, arch)
        stats = compiler.stats()
        # The default target is the Compiler's arch; a Target and its name are one target.
        assert await compiler.compile(spec) is results["sm_90"][0]
        assert await compiler.compile(spec, arch=Target("sm_80")) is results["sm_80"][0]
    for arch in ARCHS:
        assert len(results[arch]) == 100
        assert all(artifact is results[arch][0] for artifact in results[arch])
        assert results[arch][0].arch == arch
        assert results[arch][0].key == kernel_key(spec, arch)
    assert results["sm_80"][0].image != results["sm_90"][0].image
    assert (stats.requests, stats.compiles, stats.joined) == (200, 2, 198)
    assert set(stats.archs) == set(ARCHS)
    for arch in ARCHS:
        assert stats.archs[arch].entries == 1
        assert stats.archs[arch].compiles == 1
        assert stats.archs[arch].compile_errors == 0
        assert stats.archs[arch].compile_seconds > 0
    assert stats.compile_seconds == pytest.approx(
        sum(share.compile_seconds for share in stats.archs.values())
    )

    # Another Compiler, another default target: both archs come from disk.
    async with Compiler(arch="sm_80", cache_dir=cache_dir) as again:
        for arch in ARCHS:
            artifact = await again.compile(spec, arch=arch)
            assert (artifact.arch, artifact.image) == (arch, results[arch][0].image)
        stats = again.stats()
    assert (stats.compiles, stats.disk.hits) == (0, 2)
    assert stats.archs == {arch: ArchStats(1, 0, 0, 0.0) for arch in ARCHS}


async def test_keys_prefetch_records_and_forget_per_arch(cache_dir: Path) -> None:
    specs = [make_spec() for _ in range(3)]
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        assert compiler.key(specs[0]) == kernel_key(specs[0], "sm_90")
        assert compiler.key(specs[0], arch="sm_80") == kernel_key(specs[0], "sm_80")
        assert compiler.prefetch(specs, arch="sm_80") == 3
        with anyio.fail_after(60):  # a regression fails, not hangs
            while (now := compiler.stats()).compiles < 3 or now.queued or now.in_flight:
                await anyio.sleep(0.01)  # until the last one is stored, not only compiled
        stats = compiler.stats()
        assert stats.archs["sm_80"].compiles == 3
        assert stats.archs.get("sm_90", ArchStats(0, 0, 0, 0.0)).compiles == 0
        # Prefetched for sm_80: served from memory, no compile.
        before = stats.memory.hits
        for spec in specs:
            assert (await compiler.compile(spec, arch="sm_80")).arch == "sm_80"
        assert compiler.stats().memory.hits == before + 3
        assert compiler.stats().compiles == 3

        # Records are kept per target.
        assert await compiler.save_record("tiles", b"eighty", arch="sm_80")
        assert await compiler.save_record("tiles", b"ninety")
        assert await compiler.load_record("tiles", arch="sm_80") == b"eighty"
        assert await compiler.load_record("tiles", arch="sm_90") == b"ninety"
        assert await compiler.load_record("tiles", arch="sm_75") is None

        # forget() drops the spec for every target the Compiler served.
        await compiler.compile(specs[0])
        on_disk = [
            cache_dir / ENTRIES / k[:2] / k for k in (compiler.key(specs[0], arch=a) for a in ARCHS)
        ]
        assert all(path.exists() for path in on_disk)
        await compiler.forget(specs[0])
        assert not any(path.exists() for path in on_disk)
        compiles = compiler.stats().compiles
        await compiler.compile(specs[0], arch="sm_80")
        await compiler.compile(specs[0], arch="sm_90")
        assert compiler.stats().compiles == compiles + 2


async def test_bad_archs_are_clear_errors(cache_dir: Path) -> None:
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        with pytest.raises(
            ValueError, match="arch must look like 'sm_90', 'sm_90a' or 'sm_100f', got 'hopper'"
        ):
            await compiler.compile(make_spec(), arch="hopper")
        with pytest.raises(TypeError, match="arch must be a str such as 'sm_90', not int"):
            await compiler.compile(make_spec(), arch=90)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="arch must be a str such as 'sm_90', not list"):
            await compiler.compile(make_spec(), arch=["sm_90"])  # type: ignore[arg-type]
        assert compiler.stats().compiles == 0
    with pytest.raises(
        ValueError, match=r"^arch must look like 'sm_90', 'sm_90a' or 'sm_100f', got 'hopper'$"
    ):
        kernel_key(make_spec(), "hopper")
    with pytest.raises(TypeError, match=r"^arch must be a str such as 'sm_90', not int$"):
        kernel_key(make_spec(), 90)  # type: ignore[arg-type]


async def test_an_arch_nvrtc_cannot_target_is_refused_when_the_compiler_is_made(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Not at the first compile: said once, where the arch was named, with the extra that has it.
    arch, extra = ("sm_50", "cu12") if _nvrtc.version()[0] >= 13 else ("sm_88", "cu13")
    known = ", ".join(f"sm_{a}" for a in _nvrtc.supported_archs())
    message = (
        f"NVRTC {_nvrtc.version_string()} cannot target {arch} (it supports {known}); install "
        f"aionvrtc[{extra}], whose NVRTC can"
    )
    for make in (
        lambda: Compiler(arch=arch, cache_dir=cache_dir),
        lambda: KernelCache(arch, cache_dir=cache_dir),
        lambda: KernelCache("sm_90", cache_dir=cache_dir).for_arch(arch),
        lambda: kernel_key(make_spec(), arch),  # a key no entry could ever be stored under
    ):
        with pytest.raises(NvrtcError) as info:
            make()
        assert str(info.value) == message
    monkeypatch.setenv("AIONVRTC_ARCH", arch)
    with pytest.raises(NvrtcError, match=f"^{re.escape(message)}$"):
        Compiler(cache_dir=cache_dir)
    monkeypatch.delenv("AIONVRTC_ARCH")
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        with pytest.raises(NvrtcError, match=f"^{re.escape(message)}$"):
            await compiler.compile(make_spec(), arch=arch)
        assert (compiler.stats().compiles, compiler.stats().queued) == (0, 0)


def test_a_kernel_cache_serves_several_targets_from_one_set_of_tiers(cache_dir: Path) -> None:
    cache = KernelCache("sm_90", cache_dir=cache_dir)
    eighty = cache.for_arch("sm_80")
    assert cache.for_arch("sm_80") is eighty
    assert cache.for_arch(Target("sm_90")) is cache
    assert eighty.for_arch("sm_90") is cache
    assert (eighty.memory, eighty.disk) == (cache.memory, cache.disk)
    spec = make_spec()
    views: list[KernelCache] = []

    def aim() -> None:  # threads asking for one new target at once get one view
        views.append(cache.for_arch("sm_75"))

    threads = [threading.Thread(target=aim) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(view is views[0] for view in views)
    assert eighty.get_or_compile(spec).arch == "sm_80"
    assert cache.get_or_compile(spec).arch == "sm_90"
    assert eighty.get_or_compile(spec) is eighty.get_or_compile(spec)
    stats = cache.stats()
    assert stats == eighty.stats()  # one cache, whichever view asks
    assert (stats.requests, stats.compiles, stats.memory.entries) == (4, 2, 2)
    assert stats.memory.archs == {"sm_80": 1, "sm_90": 1}
    assert (stats.archs["sm_80"].compiles, stats.archs["sm_90"].compiles) == (1, 1)
    assert stats.archs["sm_75"] == ArchStats(0, 0, 0, 0.0)
    assert cache.forget(spec) == [kernel_key(spec, arch) for arch in ("sm_90", "sm_80", "sm_75")]
    assert cache.stats().memory.archs == {}


def test_the_memory_tier_counts_entries_per_arch_through_evictions() -> None:
    from aionvrtc._store import MemoryTier

    def artifact(n: int, arch: str) -> Artifact:
        return Artifact(f"{n:064x}", "cubin", b"\x7fELF" + bytes(1000), arch, "13.0")

    tier = MemoryTier(limit=5 * 1300)
    for n in range(4):
        tier.write(artifact(n, "sm_80"))
    tier.write(artifact(4, "sm_90"))
    assert tier.stats().archs == {"sm_80": 4, "sm_90": 1}
    tier.write(artifact(0, "sm_90"))  # the same key, now another arch's: replaced
    assert tier.stats().archs == {"sm_80": 3, "sm_90": 2}
    for n in range(5, 8):  # evicts the three least recent: 1, 2, 3 (sm_80)
        tier.write(artifact(n, "sm_75"))
    stats = tier.stats()
    assert (stats.evictions, stats.entries) == (3, 5)
    assert stats.archs == {"sm_75": 3, "sm_90": 2}
    assert tier.discard(f"{4:064x}")
    assert tier.stats().archs == {"sm_75": 3, "sm_90": 1}
    tier.clear()
    assert tier.stats().archs == {}


@pytest.mark.parametrize(
    ("capability", "preferred", "expected"),
    [
        ((9, 0), None, "sm_90"),
        ((9, 0), "sm_80", "sm_90"),  # another GPU's arch: the device's own
        ((8, 6), "sm_80", "sm_86"),  # a cubin for 8.0 would run, but 8.6's own is better
        ((9, 0), "sm_90a", "sm_90a"),  # the same GPU with its arch-specific features
        ((9, 0), "sm_90", "sm_90"),
        ((10, 3), "sm_100f", "sm_100f"),  # a family that covers the GPU
        ((10, 0), "sm_103f", "sm_100"),  # a family member newer than the GPU
        ((12, 0), "sm_100f", "sm_120"),  # another family
        ((10, 3), "sm_100a", "sm_103"),  # arch-specific to another GPU
    ],
)
def test_the_target_of_a_device(
    capability: tuple[int, int], preferred: str | None, expected: str
) -> None:
    given = Target(preferred) if preferred is not None else None
    assert device_target(capability, given) == Target(expected)


def _artifact(kind: str, arch: str, nvrtc: str) -> Artifact:
    return Artifact("0" * 64, kind, b"", arch, nvrtc)  # type: ignore[arg-type]


def test_what_an_image_needs_of_the_gpu_and_the_driver() -> None:
    cubin = _artifact("cubin", "sm_90", "13.0")
    assert runnable(cubin, (9, 0), (13, 0)) is None
    assert runnable(cubin, (9, 0), None) is None  # no driver known: the load decides
    assert runnable(cubin, (8, 0), (13, 0)) == (
        "a cubin for sm_90 cannot run on a GPU of compute capability 8.0; get() compiles for "
        "the device's own arch, sm_80"
    )
    assert runnable(_artifact("cubin", "sm_90a", "13.0"), (9, 0), (13, 0)) is None
    assert runnable(_artifact("cubin", "sm_80", "13.0"), (8, 6), (13, 0)) is None
    # NVRTC 13's cubins need a driver for CUDA 13; NVRTC 12's load on any CUDA 12 driver.
    assert runnable(_artifact("cubin", "sm_90", "13.5"), (9, 0), (12, 8)) == (
        "a cubin from NVRTC 13.5 needs a driver for CUDA 13 (580 or newer) and this driver runs "
        f"CUDA 12.8: {driver_fix((12, 8), (13, 5))}"
    )
    assert runnable(_artifact("cubin", "sm_90", "12.9"), (9, 0), (12, 0)) is None
    assert runnable(_artifact("cubin", "sm_90", "13.5"), (9, 0), (13, 0)) is None
    # PTX from a newer NVRTC than the driver: CUDA_ERROR_UNSUPPORTED_PTX_VERSION at load.
    ptx = _artifact("ptx", "sm_130", "13.5")
    assert runnable(ptx, (13, 0), (13, 5)) is None
    assert runnable(ptx, (13, 0), (13, 0)) == (
        "PTX from NVRTC 13.5 needs a driver for CUDA 13.5 or newer and this driver runs CUDA "
        "13.0: pip install 'cuda-toolkit[nvrtc,cudart,cccl]==13.0.*'; or update the NVIDIA "
        "driver to one for CUDA 13.5 or newer"
    )
    assert runnable(ptx, (12, 0), (13, 5)) == (
        "a ptx for sm_130 cannot run on a GPU of compute capability 12.0; get() compiles for the "
        "device's own arch, sm_120"
    )


def test_the_extras_and_their_drivers() -> None:
    assert {m: (MAJORS[m].extra, MAJORS[m].min_driver) for m in MAJORS} == {
        12: ("cu12", 525),
        13: ("cu13", 580),
    }
    archs = (35, 50, 61, 70, 72, 75, 88, 90, 95, 101, 110, 121)
    assert [extra_for_arch(a) for a in archs] == [
        None, "cu12", "cu12", "cu12", "cu12", "cu13", "cu13", "cu13", None, "cu12", "cu13", "cu13",
    ]  # fmt: skip
    # What this NVRTC supports agrees with the table of its major (13.0 lacks 13.x's sm_107).
    major = MAJORS[_nvrtc.version()[0]]
    assert set(_nvrtc.supported_archs()) <= set(major.archs)
    assert _nvrtc.supported_archs()[0] == major.archs[0]


def test_an_arch_inside_nvrtcs_range_that_it_skips_names_the_extra_that_has_it() -> None:
    # NVRTC 13 renamed sm_101 to sm_110; NVRTC 12.9 has no sm_88. Such an arch is refused
    # before NVRTC sees it (it would fail as a CompileError, remembered as the spec's).
    skipped, extra = ("sm_101", "cu12") if _nvrtc.version()[0] >= 13 else ("sm_88", "cu13")
    with pytest.raises(NvrtcError) as info:
        _nvrtc.check_target(Target(skipped))
    assert str(info.value).endswith(f"); install aionvrtc[{extra}], whose NVRTC can")
    with pytest.raises(NvrtcError, match=r"cannot target sm_95 .*; no CUDA version that"):
        _nvrtc.compile_program(make_spec(), Target("sm_95"))


def test_the_fix_for_a_driver_too_old(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_cuda_versions, "cupy_majors", lambda: [13])
    # A cubin of CUDA 13 (or CuPy's CUDA 13 runtime) on a CUDA 12 driver: the driver's extra.
    assert driver_fix((12, 8), (13, 0)) == (
        "pip uninstall cupy-cuda13x, then pip install 'aionvrtc[cu12]' (CUDA 12, the driver's); "
        "or update the NVIDIA driver to 580 or newer"
    )
    # PTX of NVRTC 13.5 on a CUDA 13.0 driver: the driver's NVRTC, pinned.
    assert driver_fix((13, 0), (13, 5), exact=True) == (
        "pip install 'cuda-toolkit[nvrtc,cudart,cccl]==13.0.*'; or update the NVIDIA driver to "
        "one for CUDA 13.5 or newer"
    )
    # Across majors, PTX needs both: cu12 brings NVRTC 12.9, newer than a 12.8 driver.
    assert driver_fix((12, 8), (13, 5), exact=True) == (
        "pip uninstall cupy-cuda13x, then pip install 'aionvrtc[cu12]' (CUDA 12, the driver's), "
        "then pip install 'cuda-toolkit[nvrtc,cudart,cccl]==12.8.*'; or update the NVIDIA "
        "driver to one for CUDA 13.5 or newer"
    )
    assert driver_fix((11, 8), (13, 0)) == "update the NVIDIA driver to 580 or newer"


def test_a_driver_older_than_cupys_cuda_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # cu13 installed where the driver runs CUDA 12: CuPy's runtime refuses at its first call
    # (cudaErrorInsufficientDriver), before any compile or load. No such driver here: the
    # error and the driver's version are injected; the mapping is the real one.
    import cupy

    from aionvrtc import NoDeviceError, _cuda

    from .support.gpu import runtime_error

    monkeypatch.setattr(_cuda_versions, "cupy_majors", lambda: [13])
    monkeypatch.setattr(_cuda_versions, "driver_cuda", lambda: (12, 8))

    def insufficient(*args: object) -> None:
        raise runtime_error(35)  # cudaErrorInsufficientDriver

    monkeypatch.setattr(cupy.cuda.runtime, "getDeviceCount", insufficient)
    monkeypatch.setattr(_cuda, "_capabilities", {})
    fix = (
        "the driver runs CUDA 12.8, older than CuPy's CUDA 13: pip uninstall cupy-cuda13x, then "
        "pip install 'aionvrtc[cu12]' (CUDA 12, the driver's); or update the NVIDIA driver to "
        "580 or newer"
    )
    with pytest.raises(NoDeviceError) as info:
        _cuda.check_device(0)
    assert str(info.value).startswith("no usable CUDA GPU here: CUDARuntimeError: ")
    assert "cudaErrorInsufficientDriver" in str(info.value)
    assert str(info.value).endswith(f"; {fix}")


@pytest.mark.parametrize(
    ("text", "release"),
    [
        (
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep 23 09:57:33 UTC "
            "2025\nGCC version:  gcc version 13.3.0\n",
            "580.95.05",
        ),
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  575.57.08  Release Build  "
            "(dvs-builder@U16-I3-B17-1-1)  Sat May 24 07:21:18 UTC 2025\n",
            "575.57.08",
        ),
        ("NVRM version: something else entirely\n", None),
    ],
)
def test_the_driver_release_is_read_from_the_kernel_module(
    tmp_path: Path, text: str, release: str | None
) -> None:
    path = tmp_path / "version"
    path.write_text(text)
    assert driver_release(str(path)) == release
    assert driver_release(str(tmp_path / "missing")) is None


def test_artifacts_of_two_nvrtc_builds_share_a_cache_dir_under_their_own_keys(
    cache_dir: Path,
) -> None:
    # What another CUDA major's process would store: the same spec and arch, another NVRTC
    # build, so another key (the key covers the build); each reads only its own.
    from aionvrtc._spec import derive_key

    spec = make_spec()
    cache = KernelCache("sm_90", cache_dir=cache_dir)
    mine = cache.get_or_compile(spec)
    other_key = derive_key(spec, "sm_90", "12.9+0123456789abcdef")
    assert other_key != mine.key
    assert cache.disk is not None
    other = dataclasses.replace(mine, key=other_key, nvrtc_version="12.9", image=b"\x7fELF other")
    assert cache.disk.write(other)
    fresh = KernelCache("sm_90", cache_dir=cache_dir)
    found = fresh.get_or_compile(spec)
    assert (found.key, found.image, found.nvrtc_version) == (
        mine.key, mine.image, _nvrtc.version_string(),
    )  # fmt: skip
    assert fresh.stats().compiles == 0
    assert fresh.disk is not None
    assert fresh.disk.read(other_key, arch="sm_90") == other


def test_specs_compile_for_every_supported_arch(tmp_path: Path) -> None:
    # The oldest and newest real archs this NVRTC supports: cubins, each its own key.
    spec = KernelSpec("__global__ void k(int* x) { x[0] = 1; }")
    archs = _nvrtc.supported_archs()
    cache = KernelCache(f"sm_{archs[0]}", cache_dir=tmp_path)
    images = {cache.for_arch(f"sm_{a}").get_or_compile(spec).image for a in (archs[0], archs[-1])}
    assert len(images) == 2
    assert all(image[:4] == b"\x7fELF" for image in images)


# The Python of an environment with the other CUDA major's extra (CI sets it: see .ci/run).
OTHER_MAJOR = os.environ.get("AIONVRTC_OTHER_MAJOR_PYTHON")

_BOTH = """
import json, sys
from aionvrtc import KernelCache, KernelSpec, _nvrtc
spec = KernelSpec(sys.argv[1])
cache = KernelCache("sm_90", cache_dir=sys.argv[2])
artifact = cache.get_or_compile(spec)
print(json.dumps({"nvrtc": _nvrtc.version_string(), "key": artifact.key,
                  "compiles": cache.stats().compiles, "image": artifact.image[:4].hex()}))
"""


@pytest.mark.skipif(
    OTHER_MAJOR is None, reason="needs $AIONVRTC_OTHER_MAJOR_PYTHON (CI's second environment)"
)
def test_both_majors_share_one_cache_dir(cache_dir: Path) -> None:
    assert OTHER_MAJOR is not None
    source = make_spec().source
    runs = []
    for python in [sys.executable, OTHER_MAJOR] * 2:
        proc = subprocess.run(
            [python, "-c", _BOTH, source, str(cache_dir)],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs.append(json.loads(proc.stdout))
    mine, other = runs[0], runs[1]
    assert int(mine["nvrtc"].split(".")[0]) != int(other["nvrtc"].split(".")[0])
    assert mine["key"] != other["key"]  # the key covers the NVRTC build
    assert [run["compiles"] for run in runs] == [1, 1, 0, 0]  # each reads its own entry back
    assert [run["key"] for run in runs[2:]] == [mine["key"], other["key"]]
    assert {run["image"] for run in runs} == {"7f454c46"}  # cubins, both
    listing = subprocess.run(
        [sys.executable, "-m", "aionvrtc", "cache", "ls", "--json", "--cache-dir", str(cache_dir)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    rows = json.loads(listing.stdout)
    assert sorted((row["key"], row["nvrtc_version"]) for row in rows) == sorted(
        [(mine["key"], mine["nvrtc"]), (other["key"], other["nvrtc"])]
    )


async def test_metrics_per_arch(cache_dir: Path) -> None:
    from prometheus_client import CollectorRegistry

    from aionvrtc.metrics import register

    registry = CollectorRegistry()
    spec = make_spec()
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        register(compiler, registry=registry, name="svc")
        for arch in ("sm_80", "sm_90", "sm_80"):
            await compiler.compile(spec, arch=arch)

        def sample(name: str, arch: str) -> float | None:
            labels = {"compiler": "svc", "arch": arch}
            return registry.get_sample_value(f"aionvrtc_{name}", labels)

        for arch in ("sm_80", "sm_90"):
            assert sample("arch_compiles_total", arch) == 1
            assert sample("arch_memory_entries", arch) == 1
        assert sample("arch_compiles_total", "sm_75") is None
        assert registry.get_sample_value("aionvrtc_compiles_total", {"compiler": "svc"}) == 2
