"""CuPy's errors mapped to aionvrtc's, at one boundary (as httpx maps httpcore's).

Every call into CuPy that can fail for reasons outside the caller's program (NVRTC missing or
unusable, no GPU or no driver, an image the driver refuses) runs inside ``map_cuda_errors``. The
exception that comes out follows what was being done, not CuPy's class: a CUDARuntimeError while
detecting the GPU means there is no usable GPU (NoDeviceError); an NVRTCError while loading NVRTC
means NVRTC is unusable (NvrtcError), and while compiling that the program failed (CompileError).
A CUDA error while loading an image (``map_load_errors``) is a ModuleLoadError whose status says
whether the image is at fault, the one case where compiling it again can help, and whose class
and message name any other cause (GPUOutOfMemoryError for a full GPU).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import NoReturn

from ._cuda_versions import insufficient_driver
from ._exceptions import GPUOutOfMemoryError, ModuleLoadError

__all__ = [
    "CUDA_ERRORS",
    "IMAGE_REFUSED",
    "cuda_status",
    "describe",
    "is_cuda_error",
    "load_error",
    "map_cuda_errors",
    "map_load_errors",
]

# Caught by base class, so that nothing here imports CuPy (importing aionvrtc must not load it):
# CuPy's NVRTCError, CUDADriverError and CUDARuntimeError all derive from RuntimeError, as do its
# failures to load a CUDA library ("CuPy failed to load libcuda.so.1"); a missing CuPy, or an
# NVRTC binding that cannot be imported, is an ImportError; a library that cannot be opened
# through ctypes, an OSError.
CUDA_ERRORS: tuple[type[Exception], ...] = (RuntimeError, ImportError, OSError)
# RuntimeErrors that are Python's own, never CuPy's: a bug that no mapping may hide.
_PYTHONS_OWN: tuple[type[Exception], ...] = (RecursionError, NotImplementedError)


def is_cuda_error(exc: BaseException) -> bool:
    """Whether ``exc`` is one that CuPy (NVRTC, the CUDA driver or runtime) raises."""
    return isinstance(exc, CUDA_ERRORS) and not isinstance(exc, _PYTHONS_OWN)


def describe(exc: BaseException) -> str:
    """``exc`` as messages quote it: its class, then its text, which for CuPy's errors names the
    status (``CUDARuntimeError: cudaErrorNoDevice: no CUDA-capable device is detected``)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class map_cuda_errors:  # lower case, as contextlib.suppress: it reads as a `with` clause
    """Within the block, a CuPy error ``exc`` becomes ``error(message)``, raised from ``exc``;
    the message is ``"{what}: {describe(exc)}"``, then ``"; {hint}"`` when a hint is given.

    ``what`` names what failed; ``error`` is an exception class, or a function that builds the
    exception from the message (CompileError also needs NVRTC's log). Everything else passes
    through untouched: aionvrtc's own errors, and bugs (TypeError, RecursionError, ...).

    A class rather than a generator-based context manager (0.4 us a block against 1.1 us, on
    the 2-CPU dev VM), and ``reraise`` for the one call on a hot path, where even that is much.
    """

    __slots__ = ("error", "hint", "what")

    def __init__(self, what: str, error: Callable[[str], Exception], *, hint: str = "") -> None:
        self.what = what
        self.error = error
        self.hint = hint

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is not None and is_cuda_error(exc):
            raise self._mapped(exc) from exc

    def _mapped(self, exc: BaseException) -> Exception:
        message = f"{self.what}: {describe(exc)}"
        # A driver older than CuPy's CUDA (the wrong extra): that fix, whatever was done.
        hint = insufficient_driver(exc) or self.hint
        if hint:
            message += f"; {hint}"
        return self.error(message)

    def reraise(self, exc: BaseException) -> NoReturn:
        """Raise what the block would have raised for ``exc``, from an ``except`` clause: for a
        call that ``Compiler.get`` makes at every request, where a bare ``try`` costs nothing
        and a ``with`` block costs more than the call."""
        self.__exit__(type(exc), exc, exc.__traceback__)
        raise exc


# -- loading a module ------------------------------------------------------------------------

# The status CuPy's errors name first ("CUDA_ERROR_OUT_OF_MEMORY: out of memory", the driver's
# cuGetErrorName then cuGetErrorString; "cudaErrorNoDevice: ..." from the runtime). Read from
# the text, not from ``.status``: naming a number would need libcuda, and this module CuPy.
_STATUS = re.compile(r"CUDA_ERROR_[A-Z0-9_]+|cudaError[A-Za-z0-9]+")


def cuda_status(exc: BaseException) -> str | None:
    """The CUDA status ``exc`` reports (``"CUDA_ERROR_INVALID_IMAGE"``), or None."""
    found = _STATUS.match(str(exc))
    return found.group() if found else None


# The driver's verdicts on the image itself, what cuModuleLoadData returned on an H100 (driver
# 580, CuPy 14.2) for: a damaged cubin, random bytes or none, INVALID_IMAGE; a cubin for another
# arch (sm_80, sm_86 and sm_100 on sm_90), NO_BINARY_FOR_GPU; broken PTX, or PTX for a newer GPU,
# INVALID_PTX. Only these make dropping the entry and compiling again worth trying. Any other
# status, named below or not, leaves the entry alone: kept wrongly, an entry costs an error;
# dropped wrongly, the entry, seconds of NVRTC, and a failure again (a full GPU is still full).
IMAGE_REFUSED = frozenset(
    {"CUDA_ERROR_INVALID_IMAGE", "CUDA_ERROR_NO_BINARY_FOR_GPU", "CUDA_ERROR_INVALID_PTX"}
)
_OUT_OF_MEMORY = frozenset({"CUDA_ERROR_OUT_OF_MEMORY", "cudaErrorMemoryAllocation"})

# The other statuses of a failed load, by cause: what the message says happened, and the fix.
_CAUSES: dict[str, tuple[str, str]] = {}


def _cause(statuses: Iterable[str], cause: str, fix: str) -> None:
    _CAUSES.update(dict.fromkeys(statuses, (cause, fix)))


_cause(_OUT_OF_MEMORY, "out of GPU memory", "free GPU memory and retry")
# Sticky: after a kernel's fault, CUDA reports it to every later call in the context (a load
# after a null write returned CUDA_ERROR_ILLEGAL_ADDRESS on the H100).
_cause(
    [
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "CUDA_ERROR_LAUNCH_FAILED",
        "CUDA_ERROR_ILLEGAL_INSTRUCTION",
        "CUDA_ERROR_MISALIGNED_ADDRESS",
        "CUDA_ERROR_INVALID_ADDRESS_SPACE",
        "CUDA_ERROR_INVALID_PC",
        "CUDA_ERROR_HARDWARE_STACK_ERROR",
        "CUDA_ERROR_ASSERT",
        "CUDA_ERROR_LAUNCH_TIMEOUT",
        "CUDA_ERROR_ECC_UNCORRECTABLE",
        "CUDA_ERROR_NVLINK_UNCORRECTABLE",
        "CUDA_ERROR_CONTAINED",
        "cudaErrorIllegalAddress",
        "cudaErrorLaunchFailure",
        "cudaErrorIllegalInstruction",
        "cudaErrorMisalignedAddress",
        "cudaErrorInvalidAddressSpace",
        "cudaErrorInvalidPc",
        "cudaErrorHardwareStackError",
        "cudaErrorAssert",
        "cudaErrorLaunchTimeout",
        "cudaErrorECCUncorrectable",
        "cudaErrorNvlinkUncorrectable",
    ],
    "an earlier fault on the device broke this process's CUDA context, which CUDA reports to "
    "every later call",
    "restart the process",
)
_cause(
    [
        "CUDA_ERROR_INVALID_CONTEXT",
        "CUDA_ERROR_CONTEXT_IS_DESTROYED",
        "cudaErrorContextIsDestroyed",
    ],
    "the device's CUDA context was destroyed or reset",
    "keep the context alive while its modules are in use, or restart the process",
)
_cause(
    [
        "CUDA_ERROR_NOT_INITIALIZED",
        "CUDA_ERROR_DEINITIALIZED",
        "CUDA_ERROR_NO_DEVICE",
        "CUDA_ERROR_INVALID_DEVICE",
        "CUDA_ERROR_DEVICE_UNAVAILABLE",
        "CUDA_ERROR_DEVICE_NOT_LICENSED",
        "CUDA_ERROR_STUB_LIBRARY",
        "CUDA_ERROR_SYSTEM_NOT_READY",
        "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
        "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
        "cudaErrorNoDevice",
        "cudaErrorInvalidDevice",
        "cudaErrorDevicesUnavailable",
        "cudaErrorDeviceUnavailable",
        "cudaErrorInitializationError",
        "cudaErrorInsufficientDriver",
        "cudaErrorCudartUnloading",
        "cudaErrorStubLibrary",
        "cudaErrorSystemNotReady",
        "cudaErrorSystemDriverMismatch",
    ],
    "the GPU or its driver is not usable now",
    "check the GPU and its driver (nvidia-smi)",
)
# The image is sound and this driver cannot use it: the same NVRTC would make the same PTX.
_cause(
    ["CUDA_ERROR_UNSUPPORTED_PTX_VERSION"],
    "the driver is older than the NVRTC that made this PTX",
    "update the NVIDIA driver, or use an NVRTC no newer than the driver",
)
_cause(
    ["CUDA_ERROR_JIT_COMPILER_NOT_FOUND", "CUDA_ERROR_JIT_COMPILATION_DISABLED"],
    "the driver's PTX JIT compiler is missing or disabled",
    "unset CUDA_DISABLE_PTX_JIT, or use an NVRTC that knows the GPU's arch (a cubin needs no JIT)",
)


def load_error(what: str, exc: BaseException) -> ModuleLoadError:
    """The error for CuPy's ``exc`` raised while ``what`` (``"loading k (cubin for sm_90, ...)
    on device 0"``): with ``status``, and a message naming the cause and the fix. A status in
    IMAGE_REFUSED is the image's fault, and the caller decides what becomes of the entry; for
    any other, the message says the entry is kept (the Compiler leaves it alone)."""
    status = cuda_status(exc)
    if status in IMAGE_REFUSED:
        return ModuleLoadError(
            f"{what} failed: the driver refused the image as invalid ({describe(exc)})",
            status=status,
        )
    cause, fix = _CAUSES.get(status or "", ("the driver failed", ""))
    detail = status if status in _CAUSES else describe(exc)
    fix = insufficient_driver(exc) or fix
    message = f"{what} failed: {cause} ({detail}); the cached kernel is kept"
    if fix:
        message += f"; {fix}"
    error = GPUOutOfMemoryError if status in _OUT_OF_MEMORY else ModuleLoadError
    return error(message, status=status)


class map_load_errors(map_cuda_errors):  # lower case, as map_cuda_errors
    """``map_cuda_errors`` for loading a module (cuModuleLoadData): within the block, a CuPy
    error ``exc`` becomes ``load_error(what, exc)``, raised from ``exc``."""

    __slots__ = ()

    def __init__(self, what: str) -> None:
        super().__init__(what, ModuleLoadError)

    def _mapped(self, exc: BaseException) -> Exception:
        return load_error(self.what, exc)
