"""CuPy's errors mapped to aionvrtc's, at one boundary (as httpx maps httpcore's).

Every call into CuPy that can fail for reasons outside the caller's program (NVRTC missing or
unusable, no GPU or no driver, an image the driver refuses) runs inside ``map_cuda_errors``. The
exception that comes out follows what was being done, not CuPy's class: a CUDARuntimeError while
detecting the GPU means there is no usable GPU (NoDeviceError); a CUDADriverError while loading
an image means the driver refused it (ModuleLoadError); an NVRTCError while loading NVRTC means
NVRTC is unusable (NvrtcError), and while compiling that the program failed (CompileError).
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import NoReturn

from ._cuda_versions import insufficient_driver

__all__ = ["CUDA_ERRORS", "describe", "is_cuda_error", "map_cuda_errors"]

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
            message = f"{self.what}: {describe(exc)}"
            # A driver older than CuPy's CUDA (the wrong extra): that fix, whatever was done.
            hint = insufficient_driver(exc) or self.hint
            if hint:
                message += f"; {hint}"
            raise self.error(message) from exc

    def reraise(self, exc: BaseException) -> NoReturn:
        """Raise what the block would have raised for ``exc``, from an ``except`` clause: for a
        call that ``Compiler.get`` makes at every request, where a bare ``try`` costs nothing
        and a ``with`` block costs more than the call."""
        self.__exit__(type(exc), exc, exc.__traceback__)
        raise exc
