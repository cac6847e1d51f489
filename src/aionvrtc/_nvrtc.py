"""The only module that talks to NVRTC (through CuPy's binding, cupy.cuda.nvrtc).

Everything here is blocking: callers on an event loop run it in a worker thread.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

from ._exceptions import CompileError, NvrtcError
from ._spec import KernelSpec
from ._target import Target

__all__ = ["CompileResult", "compile_program", "supported_archs", "version", "version_string"]


@functools.cache
def _binding() -> ModuleType:
    try:
        from cupy.cuda import nvrtc

        nvrtc.getVersion()  # loads libnvrtc; fails here rather than on first compile
    except Exception as exc:
        raise NvrtcError(
            f"NVRTC is not usable ({exc}); install the NVRTC wheel with "
            "'pip install \"nvidia-cuda-nvrtc>=13,<14\"' or a CUDA 13 toolkit"
        ) from exc
    return nvrtc  # type: ignore[no-any-return]


@functools.cache
def version() -> tuple[int, int]:
    """NVRTC's (major, minor) version."""
    major, minor = _binding().getVersion()
    return int(major), int(minor)


@functools.cache
def version_string() -> str:
    major, minor = version()
    return f"{major}.{minor}"


@functools.cache
def supported_archs() -> tuple[int, ...]:
    """The real architectures (as numbers: 75, 80, ..., 120) this NVRTC can compile for."""
    return tuple(sorted(int(arch) for arch in _binding().getSupportedArchs()))


@dataclass(frozen=True, slots=True)
class CompileResult:
    kind: Literal["cubin", "ptx"]
    image: bytes
    lowered_names: dict[str, str]
    log: str
    seconds: float


def _arch_option(target: Target) -> tuple[str, Literal["cubin", "ptx"]]:
    archs = supported_archs()
    if target.number > archs[-1]:
        # A GPU newer than this NVRTC: PTX for the newest virtual arch it knows; the driver
        # compiles it for the GPU at load time.
        return f"--gpu-architecture=compute_{archs[-1]}", "ptx"
    if target.number < archs[0]:
        raise NvrtcError(
            f"NVRTC {version_string()} cannot compile for {target.arch}; it supports "
            + ", ".join(f"sm_{arch}" for arch in archs)
        )
    return f"--gpu-architecture={target.arch}", "cubin"


def compile_program(spec: KernelSpec, target: Target) -> CompileResult:
    """Compile ``spec`` for ``target``: a CUBIN for the exact arch, or PTX if NVRTC is older."""
    nvrtc = _binding()
    arch_option, kind = _arch_option(target)
    options = [arch_option, *spec.options]
    started = time.perf_counter()
    program = nvrtc.createProgram(
        spec.source,
        spec.name,
        [text.encode() for text in spec.headers.values()],
        [name.encode() for name in spec.headers],
    )
    try:
        for expression in spec.name_expressions:
            nvrtc.addNameExpression(program, expression)
        try:
            nvrtc.compileProgram(program, options)
        except nvrtc.NVRTCError as exc:
            log = _log(nvrtc, program)
            first = next((line for line in log.splitlines() if "error" in line), str(exc))
            raise CompileError(
                f"NVRTC failed to compile {spec.name!r} for {target.arch}: {first.strip()}",
                log=log,
                program=spec.name,
                options=options,
            ) from exc
        lowered = {expr: nvrtc.getLoweredName(program, expr) for expr in spec.name_expressions}
        image = nvrtc.getCUBIN(program) if kind == "cubin" else nvrtc.getPTX(program)
        log = _log(nvrtc, program)
    finally:
        nvrtc.destroyProgram(program)
    return CompileResult(
        kind=kind,
        image=bytes(image),
        lowered_names=lowered,
        log=log,
        seconds=time.perf_counter() - started,
    )


def _log(nvrtc: ModuleType, program: object) -> str:
    log = nvrtc.getProgramLog(program)
    text = log.decode(errors="replace") if isinstance(log, bytes) else str(log)
    return text.rstrip("\x00")
