"""Real NVRTC on the CPU: images, lowered names, errors."""

from __future__ import annotations

import pytest

from aionvrtc import CompileError, KernelSpec, NvrtcError, Target, _nvrtc

from .conftest import make_spec


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


def test_ptx_when_the_arch_is_newer_than_nvrtc() -> None:
    newest = _nvrtc.supported_archs()[-1]
    future = Target(f"sm_{newest + 100}")
    result = _nvrtc.compile_program(make_spec(), future)
    assert result.kind == "ptx"
    text = result.image.decode()
    assert f".target sm_{newest}" in text
    assert ".entry" in text


def test_arch_older_than_nvrtc_supports_is_a_clear_error() -> None:
    with pytest.raises(NvrtcError, match=r"cannot compile for sm_30; it supports sm_\d+"):
        _nvrtc.compile_program(make_spec(), Target("sm_30"))


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
    assert major >= 13
    assert _nvrtc.version_string() == f"{major}.{minor}"
    assert 90 in _nvrtc.supported_archs()
