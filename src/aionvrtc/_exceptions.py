"""One exception hierarchy: everything aionvrtc raises on purpose derives from AionvrtcError.

Third-party errors (CuPy's NVRTC binding, the CUDA driver and runtime) are mapped to these at one
boundary, ``_cuda_errors.map_cuda_errors``, with ``raise ... from exc`` so the original stays
attached.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "AionvrtcError",
    "BundleError",
    "CacheCorruptError",
    "CompileError",
    "CompileOnHotPath",
    "CompilerClosed",
    "GPUOutOfMemoryError",
    "ManifestError",
    "ModuleLoadError",
    "NoDeviceError",
    "NvrtcError",
    "QueueFull",
    "first_error",
]


class AionvrtcError(Exception):
    """Raised for every failure that aionvrtc reports itself; catch this to catch them all."""


class CompileError(AionvrtcError):
    """Raised when NVRTC rejects a program: bad source, a bad option or a name expression it
    cannot resolve. ``log`` holds NVRTC's full log, ``program`` the program's file name and
    ``options`` the exact options it was given (the target architecture included)."""

    def __init__(self, message: str, *, log: str, program: str, options: Sequence[str]) -> None:
        super().__init__(message)
        self.log = log
        self.program = program
        self.options = tuple(options)

    def __str__(self) -> str:
        text = super().__str__()
        return f"{text}\n{self.log.rstrip()}" if self.log.strip() else text

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only arguments need help to survive pickling (process pools, multiprocessing).
        return (_rebuild_compile_error, (self.args[0], self.log, self.program, self.options))


def _rebuild_compile_error(
    message: str, log: str, program: str, options: Sequence[str]
) -> CompileError:
    return CompileError(message, log=log, program=program, options=options)


class CacheCorruptError(AionvrtcError):
    """Raised when a cache entry fails verification: truncated, bit-flipped, foreign, of another
    format version, or holding a different key than its name says. The cache tiers catch it,
    drop the entry and count it; it reaches callers only from the decoding functions."""


class BundleError(AionvrtcError):
    """Raised when a bundle file (many cache entries in one, see ``aionvrtc cache export``)
    cannot be used: unreadable, not a bundle, damaged or changed, of another format version,
    unsigned while a secret is configured, or signed with another secret. The message names
    the file and what is wrong with it."""


class NvrtcError(AionvrtcError):
    """Raised when NVRTC cannot be used at all (the library is missing or fails to load) or
    cannot serve a request for reasons other than the program itself, such as a target
    architecture older than this NVRTC supports."""


class NoDeviceError(AionvrtcError):
    """Raised when a CUDA GPU is needed, to detect the target architecture or to load a
    module, and none is usable. Name the target explicitly (``arch="sm_90"``) to compile
    without one."""


class ModuleLoadError(AionvrtcError):
    """Raised when a module cannot be loaded onto a device: the driver refuses the artifact's
    image (damaged, holding no code for this GPU, PTX it cannot compile), the image cannot run
    there (another architecture, a driver too old for it), or the device cannot take it now (a
    CUDA context broken by an earlier fault, a GPU gone). ``status`` names the driver's error
    (``"CUDA_ERROR_INVALID_IMAGE"``), or is None when aionvrtc refused the image before loading
    it. ``Compiler.get`` drops an image the driver refused as invalid and compiles it again,
    once per key an hour; any other failure leaves the cache as it was."""

    def __init__(self, message: str, *, status: str | None = None) -> None:
        super().__init__(message)
        self.status = status


class GPUOutOfMemoryError(ModuleLoadError, MemoryError):
    """Raised when loading a module fails for lack of GPU memory (CUDA_ERROR_OUT_OF_MEMORY).
    The cached kernel is kept and nothing is compiled: free GPU memory (other processes', or
    CuPy's pool: ``cupy.get_default_memory_pool().free_all_blocks()``) and ask again. A
    MemoryError too, as CuPy's own OutOfMemoryError is, so a handler of one sees both."""


class ManifestError(AionvrtcError):
    """Raised when a file given as a manifest (``read_manifests``, ``aionvrtc warm manifest``)
    cannot be read or is not a manifest at all. Lines of a manifest that cannot be read (one cut
    short by a crash) are skipped and reported instead."""


class CompilerClosed(AionvrtcError):
    """Raised by a request made to a Compiler that is closed or closing, and in every waiter of
    a job that was still queued when the Compiler closed."""


class QueueFull(AionvrtcError):
    """Raised at once by a request that would queue past a bound: a Compiler's ``max_queued``
    kernels waiting to be looked up or compiled. The message names the bound and the fixes;
    nothing was queued, and a later request may be served."""


class CompileOnHotPath(AionvrtcError):
    """Raised at once by a request that would wait for NVRTC while its Compiler serves with
    ``start_serving("error")``: the kernel was not compiled ahead. The compile goes on in the
    background (a warm-up's priority), so a later request finds it; the message names the
    kernel and the fixes."""


def first_error(group: BaseExceptionGroup[Exception]) -> BaseException:
    """The first error of a task group of fetches or compiles: the first that failed stopped
    the others, so it is raised as the one call would raise it, not as a group of one (a
    failure is rarely more than one error repeated)."""
    first: BaseException = group.exceptions[0]
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    return first
