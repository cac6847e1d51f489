"""Real NVRTC on the CPU: images, lowered names, errors."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from aionvrtc import CompileError, Compiler, KernelSpec, NvrtcError, Target, _nvrtc, kernel_key
from aionvrtc._cuda_versions import driver_fix

from .support import make_spec, run_python

INCLUDING = '#include "val.h"\n__device__ int value = VAL;\n__global__ void k(int* x) { x[0] = 1; }'


def test_cubin_for_the_exact_arch_with_lowered_names() -> None:
    spec = make_spec("lowered", name_expressions=["scale_lowered<float>", "scale_lowered<double>"])
    result = _nvrtc.compile_program(spec, Target("sm_90"))
    assert result.kind == "cubin"
    assert result.image[:4] == b"\x7fELF"
    assert result.lowered_names == {
        "scale_lowered<float>": "_Z13scale_loweredIfEvPT_S0_i",
        "scale_lowered<double>": "_Z13scale_loweredIdEvPT_S0_i",
    }
    assert result.seconds > 0


def test_headers_are_served_from_memory() -> None:
    spec = KernelSpec(
        '#include "detail/value.cuh"\n__global__ void k(int* x) { x[0] = VALUE; }',
        headers={"detail/value.cuh": "#define VALUE 42\n"},
    )
    assert _nvrtc.compile_program(spec, Target("sm_80")).image[:4] == b"\x7fELF"


def a_gpu_of(arch: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine as if its one GPU were of ``arch`` (no such GPU exists to test on)."""
    from aionvrtc import _cuda

    monkeypatch.setattr(_cuda, "device_count", lambda: 1)
    monkeypatch.setattr(_cuda, "_capabilities", {0: divmod(arch.number, 10)})


def test_ptx_for_a_gpu_here_newer_than_nvrtc(monkeypatch: pytest.MonkeyPatch) -> None:
    newest = _nvrtc.supported_archs()[-1]
    future = Target(f"sm_{newest + 100}")
    a_gpu_of(future, monkeypatch)
    monkeypatch.setattr(_nvrtc, "driver_cuda", _nvrtc.version)  # as new as NVRTC: its PTX loads
    result = _nvrtc.compile_program(make_spec(), future)
    assert result.kind == "ptx"
    text = result.image.decode()
    assert f".target sm_{newest}" in text
    assert ".entry" in text


@pytest.mark.parametrize("arch", ["sm_999", "sm_900"])
def test_a_named_arch_newer_than_nvrtc_that_no_gpu_here_has_is_refused(arch: str) -> None:
    # A typo (sm_900 for sm_90) would otherwise compile PTX, cached without a word.
    known = ", ".join(f"sm_{a}" for a in _nvrtc.supported_archs())
    with pytest.raises(NvrtcError) as info:
        _nvrtc.compile_program(make_spec(), Target(arch))
    assert str(info.value) == (
        f"NVRTC {_nvrtc.version_string()} cannot target {arch} (it supports {known}); no CUDA "
        "version that aionvrtc installs can (a GPU newer than NVRTC gets PTX, compiled on the "
        "machine that has it)"
    )


def test_arch_older_than_nvrtc_supports_is_a_clear_error() -> None:
    version = _nvrtc.version_string()
    with pytest.raises(NvrtcError) as info:
        _nvrtc.compile_program(make_spec(), Target("sm_30"))
    assert str(info.value).startswith(f"NVRTC {version} cannot target sm_30 (it supports sm_")
    assert str(info.value).endswith("); no CUDA version that aionvrtc installs can")


def test_volta_is_compiled_by_nvrtc_12_and_refused_by_13_naming_the_extra() -> None:
    # CUDA 13 dropped Volta: NVRTC 12 (aionvrtc[cu12]) compiles a cubin for sm_70 without a
    # GPU, NVRTC 13 says which extra can.
    major = _nvrtc.version()[0]
    if major == 12:
        for arch in ("sm_70", "sm_90"):
            result = _nvrtc.compile_program(make_spec(), Target(arch))
            assert (result.kind, result.image[:4]) == ("cubin", b"\x7fELF")
        assert _nvrtc.check_target(Target("sm_70")) == "cubin"
    else:
        assert major >= 13
        message = f"NVRTC {_nvrtc.version_string()} cannot target sm_70 (it supports sm_75"
        with pytest.raises(NvrtcError, match=re.escape(message)) as info:
            _nvrtc.compile_program(make_spec(), Target("sm_70"))
        assert str(info.value).endswith("); install aionvrtc[cu12], whose NVRTC can")


def test_ptx_that_the_driver_here_could_not_load_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An older driver than NVRTC cannot be installed here: its version is injected.
    newest = _nvrtc.supported_archs()[-1]
    future = Target(f"sm_{newest + 100}")
    a_gpu_of(future, monkeypatch)
    major, minor = _nvrtc.version()
    monkeypatch.setattr(_nvrtc, "driver_cuda", lambda: (major, minor))  # as new: PTX
    assert _nvrtc.check_target(future) == "ptx"
    older = (major, minor - 1) if minor else (major - 1, 9)
    monkeypatch.setattr(_nvrtc, "driver_cuda", lambda: older)
    with pytest.raises(NvrtcError) as info:
        _nvrtc.compile_program(make_spec(), future)
    assert str(info.value) == (
        f"NVRTC {major}.{minor} does not know {future.arch}, so it would compile PTX for it, "
        f"and the driver here (CUDA {older[0]}.{older[1]}) is older than NVRTC and cannot load "
        f"that PTX: {driver_fix(older, (major, minor), exact=True)}"
    )
    assert "pip install 'cuda-toolkit[nvrtc,cudart,cccl]==" in str(info.value)  # pinned
    # A driver for an older major: the extra of its CUDA, and its NVRTC.
    monkeypatch.setattr(_nvrtc, "driver_cuda", lambda: (12, 8))
    if major > 12:
        with pytest.raises(NvrtcError, match=re.escape("pip install 'aionvrtc[cu12]'")) as info:
            _nvrtc.check_target(future)
        assert "then pip install 'cuda-toolkit[nvrtc,cudart,cccl]==12.8.*'; or update" in str(
            info.value
        )
    # A driver whose CUDA version cannot be told: PTX, which loading checks.
    monkeypatch.setattr(_nvrtc, "driver_cuda", lambda: None)
    assert _nvrtc.compile_program(make_spec(), future).kind == "ptx"


def test_without_cupy_every_entry_point_names_both_extras() -> None:
    out = run_python(
        """
import sys
sys.modules["cupy"] = None  # as if CuPy were not installed: import cupy fails
import aionvrtc
for call in (lambda: aionvrtc.Compiler(arch="sm_90"), lambda: aionvrtc.resolve_target(),
             lambda: aionvrtc.KernelCache("sm_90")):
    try:
        call()
    except aionvrtc.AionvrtcError as exc:
        print(type(exc).__name__, exc)
"""
    )
    lines = out.splitlines()
    assert len(lines) == 3
    choose = (
        "install the extra for your NVIDIA driver: pip install 'aionvrtc[cu13]' (CUDA 13, "
        "driver 580 or newer) or 'aionvrtc[cu12]' (CUDA 12, driver 525 or newer); `nvidia-smi` "
        "shows the driver's CUDA version in its first lines"
    )
    assert (
        lines[0] == f"NvrtcError aionvrtc needs CuPy and NVRTC, and CuPy is not installed; {choose}"
    )
    assert (
        lines[1]
        == f"NoDeviceError cannot detect the GPU architecture: CuPy is not installed; {choose}"
    )
    assert lines[2] == lines[0]


def test_compile_error_carries_the_log_line() -> None:
    source = "__global__ void broken() { int x = ; }"
    spec = KernelSpec(source, name="broken.cu", options=["-std=c++17"])
    with pytest.raises(CompileError) as info:
        _nvrtc.compile_program(spec, Target("sm_90"))
    error = info.value
    assert "broken.cu(1): error: expected an expression" in error.log
    assert "expected an expression" in str(error)
    assert str(error).startswith("NVRTC failed to compile 'broken.cu' for sm_90")
    assert error.program == "broken.cu"
    assert error.options == ("--gpu-architecture=sm_90", "-std=c++17")


def test_bad_option_and_bad_name_expression_are_compile_errors() -> None:
    with pytest.raises(CompileError, match="for sm_90") as info:
        _nvrtc.compile_program(make_spec(options=["--no-such-option"]), Target("sm_90"))
    assert info.value.options[-1] == "--no-such-option"
    with pytest.raises(CompileError, match="nope") as info:
        _nvrtc.compile_program(make_spec(name_expressions=["nope<int>"]), Target("sm_90"))
    assert 'identifier "nope" is undefined' in info.value.log


def test_compile_error_survives_pickling() -> None:
    import pickle

    error = CompileError("failed", log="x.cu(1): error", program="x.cu", options=["-O3"])
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.log, copy.program, copy.options, str(copy)) == (
        error.log,
        error.program,
        error.options,
        str(error),
    )


def test_version_and_archs() -> None:
    major, minor = _nvrtc.version()
    assert major in (12, 13)  # the majors aionvrtc installs (aionvrtc[cu12], aionvrtc[cu13])
    assert (major, minor) >= (12, 9)  # cu12 brings the last 12.x
    assert _nvrtc.version_string() == f"{major}.{minor}"
    assert 90 in _nvrtc.supported_archs()
    # The library loaded is the one of this major, named in the key's build.
    assert _nvrtc.build().startswith(f"{major}.{minor}+")


def test_a_quoted_include_never_resolves_against_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "val.h").write_text("#define VAL 1\n")
    monkeypatch.chdir(tmp_path)
    # Nor against the program's folder.
    spec = KernelSpec(INCLUDING, name=str(tmp_path / "k.cu"))
    with pytest.raises(CompileError, match=re.escape('source file "val.h"')) as info:
        _nvrtc.compile_program(spec, Target("sm_90"))
    # Said by the program's name; no option names the working directory or the program's folder.
    assert f"{tmp_path / 'k.cu'}(1): catastrophic error" in info.value.log
    assert not [option for option in info.value.options if str(tmp_path) in option]
    # Nor beside an in-memory header, in a folder of the working directory.
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "val.h").write_text("#define VAL 2\n")
    beside = KernelSpec(
        '#include "sub/a.h"\n__global__ void k() {}', headers={"sub/a.h": '#include "val.h"\n'}
    )
    with pytest.raises(CompileError, match=re.escape('source file "val.h"')) as info:
        _nvrtc.compile_program(beside, Target("sm_90"))
    assert 'sub/a.h(1): catastrophic error: cannot open source file "val.h"' in info.value.log


def test_include_dir_files_are_compiled_and_a_change_needs_a_new_spec(tmp_path: Path) -> None:
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "val.h").write_text("#define VAL 1\n")
    old = KernelSpec(INCLUDING, options=[f"-I{inc}"])
    first = _nvrtc.compile_program(old, Target("sm_90"))
    (inc / "val.h").write_text("#define VAL 2\n")
    # The old spec's key covers VAL 1: compiling VAL 2 under it would store a stale entry.
    with pytest.raises(NvrtcError, match="changed since this KernelSpec's cache key") as info:
        _nvrtc.compile_program(old, Target("sm_90"))
    assert f"include directory {str(inc)!r}" in str(info.value)
    assert "forget() the spec" in str(info.value)
    assert "or create a new KernelSpec" in str(info.value)
    new = KernelSpec(INCLUDING, options=[f"-I{inc}"])
    second = _nvrtc.compile_program(new, Target("sm_90"))
    assert kernel_key(new, "sm_90") != kernel_key(old, "sm_90")
    assert second.image != first.image
    outside = tmp_path / "outside.h"
    outside.write_text("#define VAL 3\n")
    (inc / "val.h").write_text(f'#include "{outside}"\n')  # now a file the key cannot cover
    with pytest.raises(NvrtcError, match=re.escape(f"{inc / 'val.h'}, line 1: ")) as info:
        _nvrtc.compile_program(new, Target("sm_90"))
    assert f"makes NVRTC read {outside}, a file outside every include folder" in str(info.value)
    assert "the include directories changed since the key was derived" in str(info.value)


@pytest.mark.anyio
async def test_forget_reads_a_changed_include_directory_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "val.h").write_text("#define VAL 1\n")
    spec = KernelSpec(INCLUDING, options=[f"-I{inc}"])
    async with Compiler(arch="sm_90", cache_dir=tmp_path / "cache") as compiler:
        first = await compiler.compile(spec)
        (inc / "val.h").write_text("#define VAL 2\n")
        await compiler.forget(spec)  # drops the entry, and the spec's snapshot of its files
        with caplog.at_level(logging.WARNING, logger="aionvrtc"):
            second = await compiler.compile(spec)
        stats = compiler.stats()
    assert second.key != first.key
    assert second.image != first.image
    assert stats.compiles == 2
    assert not [r for r in caplog.records if r.exc_info]  # no traceback logged


def test_a_log_that_is_not_utf8_still_gives_a_compile_error(tmp_path: Path) -> None:
    # CuPy decodes NVRTC's log as UTF-8; the log quotes the offending line of a Latin-1 header.
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "bad.h").write_bytes(b"int caf\xe9 = ;\n")
    spec = KernelSpec('#include "bad.h"\n__global__ void k() {}', options=[f"-I{inc}"])
    with pytest.raises(CompileError, match=r"NVRTC failed to compile 'kernel\.cu' for sm_90") as e:
        _nvrtc.compile_program(spec, Target("sm_90"))
    assert e.value.log.startswith("(NVRTC's log could not be read: UnicodeDecodeError: ")


def _broken_cubin(calls: list[object]) -> object:
    def get_cubin(program: object) -> bytes:
        calls.append(program)
        raise RuntimeError("the binding failed")  # what getCUBIN raised after -dlto

    return get_cubin


def test_a_binding_failure_other_than_nvrtcerror_is_a_compile_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cupy.cuda import nvrtc

    calls: list[object] = []
    monkeypatch.setattr(nvrtc, "getCUBIN", _broken_cubin(calls))
    spec = make_spec(options=["-lineinfo"])
    with pytest.raises(CompileError) as info:
        _nvrtc.compile_program(spec, Target("sm_90"))
    error = info.value
    assert str(error) == (
        "NVRTC failed to compile 'kernel.cu' for sm_90: RuntimeError: the binding failed"
    )
    assert isinstance(error.__cause__, RuntimeError)
    assert error.options == ("--gpu-architecture=sm_90", "-lineinfo")
    assert len(calls) == 1


@pytest.mark.anyio
async def test_the_compiler_remembers_a_binding_failure(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cupy.cuda import nvrtc

    calls: list[object] = []
    monkeypatch.setattr(nvrtc, "getCUBIN", _broken_cubin(calls))
    spec = make_spec()
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        for _ in range(3):
            with pytest.raises(CompileError, match="RuntimeError: the binding failed"):
                await compiler.compile(spec)
        stats = compiler.stats()
    assert len(calls) == 1  # NVRTC ran once; the next requests failed fast
    assert (stats.requests, stats.compiles, stats.errors) == (3, 0, 3)


def _maps_library() -> Path:
    _nvrtc.version()
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = Path(line.split(maxsplit=5)[-1])
        if path.name.startswith("libnvrtc.so"):
            return path
    raise AssertionError("libnvrtc is not in /proc/self/maps")


def _readelf_build_id(path: Path, readelf: str) -> str:
    notes = subprocess.run([readelf, "-n", str(path)], capture_output=True, text=True, check=True)
    found = re.findall(r"Build ID: ([0-9a-f]+)", notes.stdout)
    assert len(found) == 1, notes.stdout
    return str(found[0])


def test_build_names_the_loaded_libraries_by_their_gnu_build_ids() -> None:
    if not Path("/proc/self/maps").is_file():
        pytest.skip("no /proc/self/maps: the build is the version alone here")
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf (binutils) is not installed")
    library = _maps_library()
    builtins = sorted(library.parent.glob("libnvrtc-builtins*.so*"))
    assert builtins, "libnvrtc-builtins is not beside libnvrtc"
    expected = [_readelf_build_id(path, readelf) for path in [library, *builtins]]
    assert _nvrtc.build() == "+".join([_nvrtc.version_string(), *expected])
    assert all(re.fullmatch(r"[0-9a-f]{40}", build_id) for build_id in expected)


def test_build_falls_back_to_a_digest_then_to_the_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cubin is an ELF file without a GNU build ID: a real one stands in for a library.
    cubin = _nvrtc.compile_program(make_spec(), Target("sm_90")).image
    assert cubin[:4] == b"\x7fELF"
    library = tmp_path / "libnvrtc.so.13"
    library.write_bytes(cubin)
    (tmp_path / "libnvrtc-builtins.so.13.5").write_bytes(b"not an ELF file")
    (tmp_path / "libnvrtc-builtins.so").symlink_to("libnvrtc-builtins.so.13.5")  # counted once
    assert _nvrtc.elf_build_id(str(library)) is None
    monkeypatch.setattr(_nvrtc, "_loaded_library", lambda: str(library))
    expected = [hashlib.sha256(cubin).hexdigest(), hashlib.sha256(b"not an ELF file").hexdigest()]
    assert _nvrtc.build.__wrapped__() == "+".join(
        [_nvrtc.version_string(), *(f"sha256-{digest}" for digest in expected)]
    )
    monkeypatch.setattr(_nvrtc, "_loaded_library", lambda: None)  # not Linux
    assert _nvrtc.build.__wrapped__() == _nvrtc.version_string()
    assert os.path.exists(library)


@pytest.mark.parametrize(
    "options",
    [["--pre-include=val.h"], ["-include", "val.h"], ["-include=val.h", "-DX=1"]],
)
def test_a_pre_include_is_the_in_memory_header_whatever_the_working_directory_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: list[str]
) -> None:
    (tmp_path / "val.h").write_text("__device__ int from_the_working_directory;\n")
    monkeypatch.chdir(tmp_path)
    spec = KernelSpec(
        "__global__ void k() { from_memory = 1; }",
        options=options,
        headers={"val.h": "__device__ int from_memory;\n"},
    )
    result = _nvrtc.compile_program(spec, Target("sm_90"))
    assert set(re.findall(rb"from_\w+", result.image)) == {b"from_memory"}
