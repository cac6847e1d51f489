"""The one boundary where CuPy's errors (NVRTC, the CUDA driver and runtime) become aionvrtc's:
real CuPy exception objects raised through it, and through each place that calls CuPy. No GPU
is needed: the CuPy calls are made to fail."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from aionvrtc import (
    AionvrtcError,
    Artifact,
    CompileError,
    GPUOutOfMemoryError,
    ModuleLoadError,
    NoDeviceError,
    NvrtcError,
    Target,
    _cuda,
    _nvrtc,
)
from aionvrtc._cuda_errors import (
    IMAGE_REFUSED,
    cuda_status,
    describe,
    is_cuda_error,
    map_cuda_errors,
)
from aionvrtc._cuda_versions import cupy_majors

from .support import driver_error, make_spec
from .support.gpu import runtime_error

NO_DEVICE = "cudaErrorNoDevice: no CUDA-capable device is detected"
INVALID_IMAGE = "CUDA_ERROR_INVALID_IMAGE: device kernel image is invalid"


def nvrtc_error(status: int = 6) -> Exception:
    from cupy.cuda import nvrtc

    return nvrtc.NVRTCError(status)  # type: ignore[no-any-return]


def test_cupy_error_classes_are_the_ones_the_boundary_catches() -> None:
    # The boundary catches by base class so that it need not import CuPy: this is what it
    # relies on, checked against the installed CuPy.
    for error in (nvrtc_error(), runtime_error(), driver_error()):
        assert isinstance(error, RuntimeError)
        assert is_cuda_error(error)
    assert str(nvrtc_error()) == "NVRTC_ERROR_COMPILATION (6)"
    assert str(runtime_error()) == NO_DEVICE
    assert str(driver_error()) == INVALID_IMAGE


def test_module_load_error_lives_with_the_others() -> None:
    assert ModuleLoadError.__module__ == "aionvrtc._exceptions"
    assert issubclass(ModuleLoadError, AionvrtcError)
    assert _cuda.ModuleLoadError is ModuleLoadError  # _compiler catches it under this name


def compile_error(message: str) -> CompileError:
    return CompileError(message, log="kernel.cu(1): error: oops", program="k.cu", options=())


@pytest.mark.parametrize(
    ("make", "error", "text"),
    [
        (nvrtc_error, NvrtcError, "NVRTCError: NVRTC_ERROR_COMPILATION (6)"),
        (nvrtc_error, compile_error, "NVRTCError: NVRTC_ERROR_COMPILATION (6)"),
        (runtime_error, NoDeviceError, f"CUDARuntimeError: {NO_DEVICE}"),
        (driver_error, ModuleLoadError, f"CUDADriverError: {INVALID_IMAGE}"),
        (driver_error, NoDeviceError, f"CUDADriverError: {INVALID_IMAGE}"),
        (
            lambda: RuntimeError("CuPy failed to load libcuda.so.1: OSError: not found"),
            NoDeviceError,
            "RuntimeError: CuPy failed to load libcuda.so.1: OSError: not found",
        ),
        (
            lambda: ModuleNotFoundError("No module named 'cupy'"),
            NvrtcError,
            "ModuleNotFoundError: No module named 'cupy'",
        ),
        (lambda: OSError("libnvrtc.so.13: cannot open"), NvrtcError, "OSError: libnvrtc.so.13"),
        (RuntimeError, NoDeviceError, "RuntimeError"),
    ],
)
def test_each_cupy_error_becomes_the_library_error_of_what_was_done(
    make: Callable[[], Exception], error: Callable[[str], Exception], text: str
) -> None:
    raised = make()
    with pytest.raises(AionvrtcError) as info, map_cuda_errors("loading k", error, hint="fix it"):
        raise raised
    want = error if isinstance(error, type) else CompileError
    assert type(info.value) is want
    assert info.value.__cause__ is raised
    assert str(info.value).startswith(f"loading k: {text}")
    assert info.value.args[0].endswith("; fix it")


def test_without_a_hint_the_message_is_what_failed_and_why() -> None:
    raised = runtime_error()
    with pytest.raises(NoDeviceError) as info, map_cuda_errors("detecting", NoDeviceError):
        raise raised
    assert str(info.value) == f"detecting: CUDARuntimeError: {NO_DEVICE}"


@pytest.mark.parametrize(
    "raised",
    [
        NvrtcError("already ours"),
        CompileError("already ours", log="", program="k.cu", options=()),
        TypeError("a bug"),
        ValueError("a bad argument"),
        RecursionError("a bug"),
        NotImplementedError("a bug"),
        KeyError("a bug"),
    ],
    ids=type,
)
def test_anything_but_a_cupy_error_passes_through_untouched(raised: Exception) -> None:
    with pytest.raises(type(raised)) as info, map_cuda_errors("loading k", NoDeviceError):
        raise raised
    assert info.value is raised
    assert info.value.__cause__ is None


def test_a_block_that_does_not_fail_returns_its_value() -> None:
    def body() -> int:
        with map_cuda_errors("loading k", NoDeviceError):
            return 7

    assert body() == 7


def reraised(boundary: map_cuda_errors, raised: Exception) -> None:
    try:
        raise raised
    except Exception as exc:
        boundary.reraise(exc)


def test_reraise_maps_from_an_except_clause_as_the_block_does() -> None:
    boundary = map_cuda_errors("asking", NoDeviceError, hint="name one")
    raised = runtime_error()
    with pytest.raises(NoDeviceError) as info:
        reraised(boundary, raised)
    assert info.value.__cause__ is raised
    assert str(info.value) == f"asking: CUDARuntimeError: {NO_DEVICE}; name one"
    bug = TypeError("a bug")
    with pytest.raises(TypeError) as not_mapped:
        reraised(boundary, bug)
    assert not_mapped.value is bug


def test_describe_names_the_class_then_the_text() -> None:
    assert describe(nvrtc_error(6)) == "NVRTCError: NVRTC_ERROR_COMPILATION (6)"
    assert describe(ImportError()) == "ImportError"


# -- each place that calls CuPy ------------------------------------------------------------


def raising(error: Exception) -> Callable[..., Any]:
    def call(*args: object, **kwargs: object) -> Any:
        raise error

    return call


@pytest.fixture
def no_device_binding() -> Iterator[None]:
    """current_device binds cupy's getDevice on first use: restore whatever was bound."""
    bound = _cuda._Runtime.get_device
    try:
        yield
    finally:
        _cuda._Runtime.get_device = bound


@pytest.mark.usefixtures("no_device_binding")
def test_current_device_without_a_gpu() -> None:
    raised = runtime_error()
    _cuda._Runtime.get_device = raising(raised)
    with pytest.raises(NoDeviceError) as info:
        _cuda.current_device()
    assert info.value.__cause__ is raised
    assert str(info.value) == (
        f"no usable CUDA GPU here: CUDARuntimeError: {NO_DEVICE}; `await compiler.compile(spec)` "
        "compiles without one when the Compiler is given arch='sm_90'"
    )


def test_check_device_and_device_count_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import cupy

    raised = runtime_error(35)
    monkeypatch.setattr(cupy.cuda.runtime, "getDeviceCount", raising(raised))
    for call in (lambda: _cuda.check_device(7), _cuda.device_count):
        with pytest.raises(
            NoDeviceError, match=r"^no usable CUDA GPU here: CUDARuntimeError: "
        ) as info:
            call()
        assert info.value.__cause__ is raised
    # A device number out of range is the caller's mistake, not CuPy's: not mapped.
    monkeypatch.setattr(cupy.cuda.runtime, "getDeviceCount", lambda: 1)
    with pytest.raises(ValueError, match=r"device must be in 0\.\.0, got 7"):
        _cuda.check_device(7)


def test_init_device_names_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    import cupy

    raised = runtime_error(2)  # cudaErrorMemoryAllocation
    monkeypatch.setattr(cupy.cuda, "Device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(cupy.cuda.runtime, "free", raising(raised))
    with pytest.raises(NoDeviceError) as info:
        _cuda.init_device(7)
    assert info.value.__cause__ is raised
    assert str(info.value).startswith(
        "cannot create a CUDA context on device 7: CUDARuntimeError: cudaErrorMemoryAllocation"
    )
    assert 7 not in _cuda._ready


def test_device_ready_is_false_when_cupy_cannot_tell(monkeypatch: pytest.MonkeyPatch) -> None:
    import cupy

    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", raising(runtime_error()))
    assert _cuda.device_ready(7) is False
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", raising(TypeError("a bug")))
    with pytest.raises(TypeError, match="a bug"):
        _cuda.device_ready(7)


def artifact() -> Artifact:
    return Artifact(
        key="ab" * 32, kind="cubin", image=b"\x7fELF damaged", arch="sm_90", nvrtc_version="13.0",
        lowered_names={"k<float>": "_Z1kIfEvv"},
    )  # fmt: skip


LOADING = f"loading k<float> (cubin for sm_90, key {'ab' * 8}...) on device 3 failed: "
KEPT = "the cached kernel is kept"


def refusing_module(monkeypatch: pytest.MonkeyPatch, raised: Exception) -> None:
    """CuPy's Module (cuModuleLoadData underneath) raising ``raised``, on a device 3 of compute
    capability 9.0."""
    import cupy
    from cupy.cuda import function

    class Refusing:
        def load(self, image: bytes) -> None:
            raise raised

    monkeypatch.setattr(_cuda, "check_device", lambda device: (9, 0))
    monkeypatch.setattr(cupy.cuda, "Device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(function, "Module", Refusing)


@pytest.mark.parametrize(
    "name", ["CUDA_ERROR_INVALID_IMAGE", "CUDA_ERROR_NO_BINARY_FOR_GPU", "CUDA_ERROR_INVALID_PTX"]
)
def test_an_image_the_driver_refuses_as_invalid_says_so(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    raised = driver_error(name)
    refusing_module(monkeypatch, raised)
    with pytest.raises(ModuleLoadError) as info:
        _cuda.load(artifact(), 3)
    assert type(info.value) is ModuleLoadError
    assert info.value.__cause__ is raised
    assert info.value.status == name
    assert name in IMAGE_REFUSED  # the one verdict that Compiler.get answers by compiling again
    # The Compiler decides what becomes of the entry: the message does not promise either.
    assert str(info.value) == (
        f"{LOADING}the driver refused the image as invalid (CUDADriverError: {raised})"
    )


@pytest.mark.parametrize(
    ("raised", "error", "text"),
    [
        (
            lambda: driver_error("CUDA_ERROR_OUT_OF_MEMORY"),
            GPUOutOfMemoryError,
            f"out of GPU memory (CUDA_ERROR_OUT_OF_MEMORY); {KEPT}; free GPU memory and retry",
        ),
        (  # from the runtime: making the context current (cudaSetDevice) on a full GPU
            lambda: runtime_error(2),
            GPUOutOfMemoryError,
            f"out of GPU memory (cudaErrorMemoryAllocation); {KEPT}; free GPU memory and retry",
        ),
        (
            lambda: driver_error("CUDA_ERROR_ILLEGAL_ADDRESS"),
            ModuleLoadError,
            "an earlier fault on the device broke this process's CUDA context, which CUDA "
            f"reports to every later call (CUDA_ERROR_ILLEGAL_ADDRESS); {KEPT}; restart the "
            "process",
        ),
        (
            lambda: driver_error("CUDA_ERROR_INVALID_CONTEXT"),
            ModuleLoadError,
            f"the device's CUDA context was destroyed or reset (CUDA_ERROR_INVALID_CONTEXT); "
            f"{KEPT}; keep the context alive while its modules are in use, or restart the process",
        ),
        (
            lambda: driver_error("CUDA_ERROR_NOT_INITIALIZED"),
            ModuleLoadError,
            f"the GPU or its driver is not usable now (CUDA_ERROR_NOT_INITIALIZED); {KEPT}; "
            "check the GPU and its driver (nvidia-smi)",
        ),
        (
            lambda: runtime_error(100),
            ModuleLoadError,
            f"the GPU or its driver is not usable now (cudaErrorNoDevice); {KEPT}; check the "
            "GPU and its driver (nvidia-smi)",
        ),
        (  # the image is sound: the same NVRTC would make the same PTX again
            lambda: driver_error("CUDA_ERROR_UNSUPPORTED_PTX_VERSION"),
            ModuleLoadError,
            "the driver is older than the NVRTC that made this PTX "
            f"(CUDA_ERROR_UNSUPPORTED_PTX_VERSION); {KEPT}; update the NVIDIA driver, or use an "
            "NVRTC no newer than the driver",
        ),
        (
            lambda: driver_error("CUDA_ERROR_JIT_COMPILER_NOT_FOUND"),
            ModuleLoadError,
            "the driver's PTX JIT compiler is missing or disabled "
            f"(CUDA_ERROR_JIT_COMPILER_NOT_FOUND); {KEPT}; unset CUDA_DISABLE_PTX_JIT, or use an "
            "NVRTC that knows the GPU's arch (a cubin needs no JIT)",
        ),
    ],
    ids=[
        "out-of-memory",
        "runtime-out-of-memory",
        "sticky-fault",
        "context-gone",
        "not-initialized",
        "runtime-no-device",
        "ptx-too-new",
        "no-jit",
    ],
)
def test_a_load_that_fails_for_another_cause_names_it_and_keeps_the_entry(
    monkeypatch: pytest.MonkeyPatch,
    raised: Callable[[], Exception],
    error: type[ModuleLoadError],
    text: str,
) -> None:
    cupy_error = raised()
    refusing_module(monkeypatch, cupy_error)
    with pytest.raises(ModuleLoadError) as info:
        _cuda.load(artifact(), 3)
    assert type(info.value) is error
    assert info.value.__cause__ is cupy_error
    assert info.value.status == cuda_status(cupy_error)
    assert info.value.status not in IMAGE_REFUSED
    assert str(info.value) == LOADING + text


def test_a_load_error_of_no_known_status_quotes_cupy_and_keeps_the_entry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for raised in (
        driver_error("CUDA_ERROR_UNKNOWN"),
        RuntimeError("CuPy failed to load libcuda.so.1: OSError: not found"),
    ):
        refusing_module(monkeypatch, raised)
        with pytest.raises(ModuleLoadError) as info:
            _cuda.load(artifact(), 3)
        assert type(info.value) is ModuleLoadError
        assert info.value.status == cuda_status(raised)
        assert str(info.value) == f"{LOADING}the driver failed ({describe(raised)}); {KEPT}"
    assert cuda_status(driver_error("CUDA_ERROR_UNKNOWN")) == "CUDA_ERROR_UNKNOWN"


def test_a_bug_under_a_load_is_not_mapped(monkeypatch: pytest.MonkeyPatch) -> None:
    bug = TypeError("a bug")
    refusing_module(monkeypatch, bug)
    with pytest.raises(TypeError) as info:
        _cuda.load(artifact(), 3)
    assert info.value is bug


def test_cuda_status_is_the_name_cupy_quotes_first() -> None:
    assert cuda_status(driver_error("CUDA_ERROR_OUT_OF_MEMORY")) == "CUDA_ERROR_OUT_OF_MEMORY"
    assert cuda_status(runtime_error(2)) == "cudaErrorMemoryAllocation"
    assert cuda_status(nvrtc_error()) is None  # NVRTC's statuses are not CUDA's
    assert cuda_status(RuntimeError("not CUDA_ERROR_OUT_OF_MEMORY at the start")) is None


def test_gpu_out_of_memory_is_a_module_load_error_and_a_memory_error() -> None:
    import copy
    import pickle

    import aionvrtc

    assert GPUOutOfMemoryError.__module__ == "aionvrtc._exceptions"
    assert issubclass(GPUOutOfMemoryError, ModuleLoadError)
    assert issubclass(GPUOutOfMemoryError, MemoryError)  # as CuPy's OutOfMemoryError is
    assert aionvrtc.GPUOutOfMemoryError is GPUOutOfMemoryError
    assert "GPUOutOfMemoryError" in aionvrtc.__all__
    error = GPUOutOfMemoryError("loading k failed", status="CUDA_ERROR_OUT_OF_MEMORY")
    # Every waiter of a shared job gets a copy (Compiler._fresh); processes get pickles.
    for clone in (copy.copy(error), pickle.loads(pickle.dumps(error))):
        assert type(clone) is GPUOutOfMemoryError
        assert (str(clone), clone.status) == ("loading k failed", "CUDA_ERROR_OUT_OF_MEMORY")
    assert ModuleLoadError("refused before loading").status is None


def test_a_missing_kernel_is_a_key_error_naming_the_known_ones() -> None:
    raised = driver_error()

    class Raw:
        def get_function(self, name: str) -> None:
            raise raised

    module = _cuda.Module(artifact(), 0, Raw())
    with pytest.raises(KeyError) as info:
        module.get_function("k<int>")
    assert info.value.__cause__ is raised
    assert info.value.args[0] == (
        f"no kernel 'k<int>' in this module (name expressions: k<float>): "
        f"CUDADriverError: {INVALID_IMAGE}"
    )


def test_detecting_the_arch_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import cupy

    raised = runtime_error()
    monkeypatch.setattr(cupy.cuda, "Device", raising(raised))
    with pytest.raises(NoDeviceError) as info:
        Target.current()
    assert info.value.__cause__ is raised
    assert str(info.value) == (
        f"cannot detect the GPU architecture: CUDARuntimeError: {NO_DEVICE}; pass the target "
        "explicitly, for example arch='sm_90'"
    )


def test_nvrtc_that_cannot_load_is_an_nvrtc_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from cupy.cuda import nvrtc

    raised = RuntimeError("CuPy failed to load libnvrtc.so.13: OSError: cannot open")
    monkeypatch.setattr(nvrtc, "getVersion", raising(raised))
    _nvrtc._binding.cache_clear()
    try:
        with pytest.raises(NvrtcError) as info:
            _nvrtc._binding()
    finally:
        _nvrtc._binding.cache_clear()  # the failure was not cached; nor is anything else now
    assert info.value.__cause__ is raised
    (major,) = cupy_majors()  # the extra of the CuPy installed, whose NVRTC is missing
    assert str(info.value) == (
        "NVRTC is not usable: RuntimeError: CuPy failed to load libnvrtc.so.13: OSError: cannot "
        f"open; install the NVRTC of CuPy's CUDA {major}: pip install 'aionvrtc[cu{major}]'"
    )


def test_an_nvrtc_error_after_the_compile_is_the_programs(monkeypatch: pytest.MonkeyPatch) -> None:
    from cupy.cuda import nvrtc

    raised = nvrtc_error(11)
    monkeypatch.setattr(nvrtc, "getLoweredName", raising(raised))
    spec = make_spec()
    with pytest.raises(CompileError) as info:
        _nvrtc.compile_program(spec, Target("sm_90"))
    assert info.value.__cause__ is raised
    assert info.value.args[0] == (
        f"NVRTC failed to compile {spec.name!r} for sm_90: NVRTCError: "
        "NVRTC_ERROR_INTERNAL_ERROR (11)"
    )
    assert info.value.program == spec.name


def test_a_bug_under_the_compile_is_not_called_a_compile_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cupy.cuda import nvrtc

    monkeypatch.setattr(nvrtc, "getCUBIN", raising(TypeError("a bug")))
    with pytest.raises(TypeError, match="a bug"):
        _nvrtc.compile_program(make_spec(), Target("sm_90"))
