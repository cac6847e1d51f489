"""The GPU at CuPy's boundary: the driver's errors as CuPy raises them, whether a GPU is here, and a
fake driver for load faults no CPU (and no GPU on demand) can produce."""

from __future__ import annotations

from typing import Any

import numpy as np

from .seeds import seeded

# What CuPy's CUDADriverError says for the statuses the tests raise: cuGetErrorString's words
# after the status's name. Those of 2, 200, 209, 218, 222 and 700 are what cuModuleLoadData
# returned on an H100 (driver 580, CuPy 14.2) for a full GPU, a damaged cubin, a cubin for
# another arch, broken PTX, PTX from a newer toolchain and a context after a kernel's fault.
DRIVER_ERRORS = {
    "CUDA_ERROR_OUT_OF_MEMORY": (2, "out of memory"),
    "CUDA_ERROR_NOT_INITIALIZED": (3, "initialization error"),
    "CUDA_ERROR_INVALID_IMAGE": (200, "device kernel image is invalid"),
    "CUDA_ERROR_INVALID_CONTEXT": (201, "invalid device context"),
    "CUDA_ERROR_NO_BINARY_FOR_GPU": (
        209, "no kernel image is available for execution on the device"
    ),
    "CUDA_ERROR_INVALID_PTX": (218, "a PTX JIT compilation failed"),
    "CUDA_ERROR_JIT_COMPILER_NOT_FOUND": (221, "PTX JIT compiler library not found"),
    "CUDA_ERROR_UNSUPPORTED_PTX_VERSION": (
        222, "the provided PTX was compiled with an unsupported toolchain."
    ),
    "CUDA_ERROR_ILLEGAL_ADDRESS": (700, "an illegal memory access was encountered"),
    "CUDA_ERROR_UNKNOWN": (999, "unknown error"),
}  # fmt: skip


def driver_error(name: str = "CUDA_ERROR_INVALID_IMAGE") -> Exception:
    """CuPy's CUDADriverError for status ``name``, as the driver raises it: made by CuPy where
    libcuda is there to name the status, else by hand as CuPy makes it (``status``, and the
    text "NAME: description")."""
    import cupy

    kind = cupy.cuda.driver.CUDADriverError
    status, text = DRIVER_ERRORS[name]
    try:
        return kind(status)  # type: ignore[no-any-return]
    except RuntimeError:  # "CuPy failed to load libcuda.so.1"
        error = kind.__new__(kind)
        RuntimeError.__init__(error, f"{name}: {text}")
        error.status = status
        return error  # type: ignore[no-any-return]


def has_gpu() -> bool:
    try:
        import cupy

        return bool(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return False


class FakeDriver:
    """The GPU this CPU lacks, at CuPy's boundary: device 0, compute capability 9.0, whose
    cuModuleLoadData (CuPy's ``Module.load``) raises the status ``fault`` while it is set (a
    full GPU, a broken context, or every image refused), or ``refused[image]`` for an image
    it refuses, and otherwise takes the image. Faults that no CPU can produce, and no GPU on
    demand: the one place the tests replace a real part. Everything else (NVRTC, the tiers,
    the Compiler) is real."""

    def __init__(self) -> None:
        self.fault: str | None = None
        self.refused: dict[bytes, str] = {}
        self.tries = 0  # images given to cuModuleLoadData
        self.loaded: list[bytes] = []  # images it took

    def load(self, image: bytes) -> None:
        self.tries += 1
        status = self.fault or self.refused.get(image)
        if status is not None:
            raise driver_error(status)
        self.loaded.append(image)


def runtime_error(status: int = 100) -> Exception:
    import cupy

    return cupy.cuda.runtime.CUDARuntimeError(status)  # type: ignore[no-any-return]


def run_axpy(module: Any, expression: str, dtype: Any, n: int = 10_007) -> float:
    """Launch axpy on fresh random inputs; the largest error against NumPy."""
    import cupy

    rng = seeded(f"axpy of {expression}")
    x_host, y_host = rng.standard_normal(n).astype(dtype), rng.standard_normal(n).astype(dtype)
    x, y = cupy.asarray(x_host), cupy.asarray(y_host)
    a = dtype(rng.standard_normal())
    module.get_function(expression)(((n + 127) // 128,), (128,), (a, x, y, np.int32(n)))
    want = a.astype(np.float64) * x_host + y_host
    return float(np.abs(cupy.asnumpy(y).astype(np.float64) - want).max())
