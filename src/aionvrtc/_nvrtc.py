"""The only module that talks to NVRTC (through CuPy's binding, cupy.cuda.nvrtc).

Everything here is blocking: callers on an event loop run it in a worker thread.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import hashlib
import os
import re
import shutil
import stat
import struct
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Literal

from . import _cuda_headers, _includes
from ._cuda_errors import describe, map_cuda_errors
from ._cuda_versions import (
    CHOOSE_EXTRA,
    MAJORS,
    cupy_majors,
    driver_cuda,
    driver_fix,
    extra_for_arch,
)
from ._exceptions import CompileError, NoDeviceError, NvrtcError
from ._target import Target

if TYPE_CHECKING:  # _spec imports this module, for the NVRTC build in its keys
    from ._spec import KernelSpec

__all__ = [
    "CompileResult",
    "build",
    "check_target",
    "compile_program",
    "supported_archs",
    "version",
    "version_string",
]


@functools.cache
def _binding() -> ModuleType:
    try:
        import cupy  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name != "cupy":
            raise  # CuPy itself is broken: its own error says how
        raise NvrtcError(
            f"aionvrtc needs CuPy and NVRTC, and CuPy is not installed; {CHOOSE_EXTRA}"
        ) from None
    try:
        from cupy.cuda import nvrtc

        nvrtc.getVersion()  # loads libnvrtc; fails here rather than on first compile
    except Exception as exc:
        # The hint reads the installed wheels' metadata: only when it is needed.
        map_cuda_errors("NVRTC is not usable", NvrtcError, hint=_install_hint()).reraise(exc)
    return nvrtc  # type: ignore[no-any-return]


def _install_hint() -> str:
    """How to install the NVRTC that the installed CuPy needs (the extra of its CUDA major)."""
    majors = cupy_majors()
    if len(majors) == 1 and majors[0] in MAJORS:
        extra = MAJORS[majors[0]].extra
        return f"install the NVRTC of CuPy's CUDA {majors[0]}: pip install 'aionvrtc[{extra}]'"
    if len(majors) > 1:
        wheels = " and ".join(f"cupy-cuda{m}x" for m in majors)
        return f"{wheels} are both installed and clash: uninstall all but one, then {CHOOSE_EXTRA}"
    return CHOOSE_EXTRA


@functools.cache
def version() -> tuple[int, int]:
    """NVRTC's (major, minor) version."""
    nvrtc = _binding()
    with map_cuda_errors("NVRTC cannot tell its version", NvrtcError):
        major, minor = nvrtc.getVersion()
    return int(major), int(minor)


@functools.cache
def version_string() -> str:
    major, minor = version()
    return f"{major}.{minor}"


@functools.cache
def build() -> str:
    """The exact NVRTC build, for cache keys: "13.5+<libnvrtc build id>+<builtins build id>".

    Two builds of one major.minor (a patch release, a vendor rebuild) may compile differently,
    so the key names the libraries' GNU build IDs (or their SHA-256 when they carry none). Where
    the loaded library cannot be found (not Linux), the version alone.
    """
    _binding()  # loaded, so that it shows in /proc/self/maps
    library = _loaded_library()
    if library is None:
        return version_string()
    # libnvrtc loads its builtins library (the headers it knows) from beside itself.
    folder = os.path.dirname(library)
    builtins = sorted(
        {
            os.path.realpath(path)
            for path in glob.glob(os.path.join(folder, "libnvrtc-builtins*.so*"))
        }
    )
    return "+".join([version_string(), *(_identity(path) for path in [library, *builtins])])


def _loaded_library() -> str | None:
    """The path of the libnvrtc this process loaded, or None if it cannot be told."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="surrogateescape") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6:
                    path = fields[5].rstrip("\n")
                    if os.path.basename(path).startswith("libnvrtc.so") and os.path.isfile(path):
                        return path
    except OSError:
        pass
    return None


def _identity(path: str) -> str:
    build_id = elf_build_id(path)
    if build_id is not None:
        return build_id
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return f"sha256-{digest.hexdigest()}"


_PT_NOTE = 4
_NT_GNU_BUILD_ID = 3


def elf_build_id(path: str) -> str | None:
    """The GNU build ID (hex) in the PT_NOTE segments of the ELF file at ``path``, or None.

    Reads the ELF header, the program headers and the note segments only: never the whole file.
    """
    with open(path, "rb") as file:
        header = file.read(64)
        if len(header) < 52 or header[:4] != b"\x7fELF" or header[4] not in (1, 2):
            return None
        wide = header[4] == 2  # ELFCLASS64
        order = "<" if header[5] == 1 else ">"  # ELFDATA2LSB
        if wide:
            (phoff,) = struct.unpack_from(order + "Q", header, 0x20)
            entry_size, count = struct.unpack_from(order + "HH", header, 0x36)
        else:
            (phoff,) = struct.unpack_from(order + "I", header, 0x1C)
            entry_size, count = struct.unpack_from(order + "HH", header, 0x2A)
        file.seek(phoff)
        table = file.read(entry_size * count)
        for index in range(count):
            base = index * entry_size
            if len(table) < base + (56 if wide else 32):
                break
            (kind,) = struct.unpack_from(order + "I", table, base)
            if kind != _PT_NOTE:
                continue
            if wide:
                (offset,) = struct.unpack_from(order + "Q", table, base + 8)
                (size,) = struct.unpack_from(order + "Q", table, base + 32)
                (align,) = struct.unpack_from(order + "Q", table, base + 48)
            else:
                (offset,) = struct.unpack_from(order + "I", table, base + 4)
                (size,) = struct.unpack_from(order + "I", table, base + 16)
                (align,) = struct.unpack_from(order + "I", table, base + 28)
            file.seek(offset)
            found = _gnu_build_id(file.read(min(size, 1 << 16)), order, 8 if align == 8 else 4)
            if found is not None:
                return found
    return None


def _gnu_build_id(notes: bytes, order: str, align: int) -> str | None:
    position = 0
    while position + 12 <= len(notes):
        name_size, desc_size, kind = struct.unpack_from(order + "III", notes, position)
        name_at = position + 12
        desc_at = name_at + -(-name_size // align) * align
        if kind == _NT_GNU_BUILD_ID and notes[name_at : name_at + name_size] == b"GNU\x00":
            desc = notes[desc_at : desc_at + desc_size]
            return desc.hex() if len(desc) == desc_size and desc else None
        position = desc_at + -(-desc_size // align) * align
    return None


@functools.cache
def supported_archs() -> tuple[int, ...]:
    """The real architectures (as numbers: 75, 80, ..., 120) this NVRTC can compile for."""
    nvrtc = _binding()
    with map_cuda_errors("NVRTC cannot list the architectures it supports", NvrtcError):
        archs = nvrtc.getSupportedArchs()
    return tuple(sorted(int(arch) for arch in archs))


@dataclass(frozen=True, slots=True)
class CompileResult:
    kind: Literal["cubin", "ptx"]
    image: bytes
    lowered_names: dict[str, str]
    log: str
    seconds: float


def _arch_option(target: Target) -> tuple[str, Literal["cubin", "ptx"]]:
    kind = check_target(target)
    if kind == "ptx":
        # A GPU newer than this NVRTC: PTX for the newest virtual arch it knows, which the
        # driver compiles for the GPU at load time.
        return f"--gpu-architecture=compute_{supported_archs()[-1]}", "ptx"
    return f"--gpu-architecture={target.arch}", "cubin"


def check_target(target: Target) -> Literal["cubin", "ptx"]:
    """What this NVRTC makes for ``target``: a cubin for an arch it knows, PTX for a GPU of
    this machine newer than it knows (if the driver is as new as NVRTC, so that it can load
    that PTX). NvrtcError, naming the archs it supports and the fix, for any other arch (with
    the extra whose NVRTC targets it) or PTX the driver could not load."""
    archs = supported_archs()
    if target.number in archs:
        return "cubin"
    # PTX only for a GPU that is here: NVRTC has no cubin for it, and the driver compiles the
    # PTX for it at load. A named arch that no GPU here has and NVRTC does not know is far more
    # often a typo (sm_900, sm_999) than a GPU to come, and PTX for it would be compiled and
    # cached without a word; a GPU newer than NVRTC gets its PTX on its own machine.
    newer = target.number > archs[-1]
    if newer and _a_gpu_here_is(target):
        _require_driver_for_ptx(target)
        return "ptx"
    # Older than it knows, one it skips (sm_101 in 13.x), or newer and not here.
    extra = extra_for_arch(target.number)
    known = ", ".join(f"sm_{arch}" for arch in archs)
    mine = MAJORS.get(version()[0])
    fix = (
        f"install aionvrtc[{extra}], whose NVRTC can"
        if extra is not None and (mine is None or extra != mine.extra)
        else "no CUDA version that aionvrtc installs can"
    )
    if newer:
        fix += " (a GPU newer than NVRTC gets PTX, compiled on the machine that has it)"
    raise NvrtcError(
        f"NVRTC {version_string()} cannot target {target.arch} (it supports {known}); {fix}"
    )


def _a_gpu_here_is(target: Target) -> bool:
    """Whether a GPU of this machine is of ``target``'s architecture (no GPU, no driver, no
    usable CUDA: False)."""
    from . import _cuda  # the GPU's, loaded only for an arch newer than NVRTC

    try:
        capabilities = [_cuda.check_device(device) for device in range(_cuda.device_count())]
    except NoDeviceError:
        return False
    return any(major * 10 + minor == target.number for major, minor in capabilities)


def _require_driver_for_ptx(target: Target) -> None:
    """Refuse PTX that the driver here could not load: PTX from an NVRTC newer than the driver
    fails at load time (CUDA_ERROR_UNSUPPORTED_PTX_VERSION). Without a driver (compiling for
    another machine) there is nothing to check here; loading checks it there."""
    driver = driver_cuda()
    if driver is None or driver >= version():
        return
    raise NvrtcError(
        f"NVRTC {version_string()} does not know {target.arch}, so it would compile PTX for it, "
        f"and the driver here (CUDA {driver[0]}.{driver[1]}) is older than NVRTC and cannot load "
        f"that PTX: {driver_fix(driver, version(), exact=True)}"
    )


def compile_program(spec: KernelSpec, target: Target) -> CompileResult:
    """Compile ``spec`` for ``target``: a CUBIN for the exact arch, or PTX if NVRTC is older.

    Every failure of the program is a CompileError (a Compiler remembers those); NvrtcError if
    the include directories' files no longer match what the spec's key covers.
    """
    nvrtc = _binding()
    arch_option, kind = _arch_option(target)
    host = _host_files(spec)
    added = [f"-I{folder}" for folder in host.added]  # CUDA's headers, after the program's own
    options = [arch_option, *spec.options, *added]
    try:
        with _private_folder(spec) as folder:
            result = _compile(nvrtc, spec, target, kind, options, folder=folder)
    except CompileError:
        _require_unchanged(spec, host)  # a failure of changed files is not the key's failure
        raise
    # Files changed during the compile: the image is not the one the key describes.
    _require_unchanged(spec, host)
    return result


def _host_files(spec: KernelSpec) -> _includes.HostFiles:
    """The host files the spec's keys cover, checked against the files as they are now."""
    host = spec._host_files()
    _require_unchanged(spec, host)
    return host


def _require_unchanged(spec: KernelSpec, host: _includes.HostFiles) -> None:
    if not host.entries:
        return
    fix = (
        "so the image would not be the one its key describes; forget() the spec "
        "(Compiler.forget or KernelCache.forget: its next request reads the files again) or "
        "create a new KernelSpec"
    )
    try:
        now = spec._take_host_files(lambda: host.added)
    except ValueError as exc:  # a file changed into one that is refused
        raise NvrtcError(f"{exc}; the include directories changed since the key was derived, "
                         f"{fix}") from exc  # fmt: skip
    changed = host.changed(now)
    if changed is not None:
        raise NvrtcError(f"{changed} changed since this KernelSpec's cache key was derived, {fix}")


# The file name of the program inside its private folder: what it is called in NVRTC's
# messages and __FILE__ is spec.name, through a #line directive.
_PROGRAM = "program.cu"


def _headers_hint() -> str:
    hint = _cuda_headers.install_hint(version()[0])
    return f"if it is one of CUDA's own headers: none were found on this host; {hint}"


@contextlib.contextmanager
def _private_folder(spec: KernelSpec) -> Iterator[str]:
    """A new folder only this user can open, holding the spec's in-memory headers as files,
    for the program to be compiled in, removed afterwards.

    Why not NVRTC's in-memory headers and --no-source-include: the option also keeps NVRTC
    from looking for a quoted include beside the file that includes it, which CUDA's own
    headers need (cooperative_groups/details/driver_abi.h includes "info.h" from its folder);
    without it, NVRTC looks beside the program and beside in-memory headers in the working
    directory, which the key does not cover. In a private folder, "beside" holds exactly the
    in-memory headers, wherever the process runs.
    """
    root = tempfile.gettempdir()
    problem = _temp_root_problem(root)
    if problem is not None:
        raise NvrtcError(
            f"cannot compile in {root}: {problem}, so others could swap the program's private "
            "folder for one of theirs; set TMPDIR to a folder only this user can write (or "
            "fix its mode)"
        )
    try:
        # The pid in the name lets a later process remove it if this one dies mid-compile.
        folder = tempfile.mkdtemp(prefix=f"aionvrtc-{os.getpid()}-")
        for name, text in spec.headers.items():
            path = os.path.join(folder, name)
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            with open(fd, "wb") as file:
                file.write(_named(name, text).encode())
    except OSError as exc:
        raise NvrtcError(
            f"cannot make a private folder for the program's headers in "
            f"{tempfile.gettempdir()} ({exc.strerror or exc}); set TMPDIR to a folder this user "
            "can write"
        ) from exc
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _in_folder(options: list[str], folder: str) -> list[str]:
    """``options`` as NVRTC gets them for a program in ``folder`` (see _private_folder): that
    folder searched first (the in-memory headers come before any -I folder), and each
    pre-include named by its path there (NVRTC looks for a relative one in the working
    directory first)."""
    given = list(options)
    for index, end, name in reversed(_includes.pre_includes(given)):  # later indices first
        given[index:end] = [f"--pre-include={os.path.join(folder, name)}"]
    return [given[0], f"-I{folder}", *given[1:]]


_STALE = re.compile(r"aionvrtc-(?P<pid>\d+)-")


@functools.cache
def _temp_root_problem(root: str) -> str | None:
    """Once per process and folder: why the private folders cannot be made safely in ``root``
    (it, or a folder above it, lets others replace what is inside), or None; and then the
    private folders that processes of this user left there when they died mid-compile are
    removed."""
    from pathlib import Path

    from ._store._trust import Policy, route

    policy = Policy.current(shared=False)
    damage = policy.route_problem(route(Path(root) / "aionvrtc"), instead="a TMPDIR of your own")
    if damage is not None:
        return f"{damage.path} is {damage.problem}"
    try:
        with os.scandir(root) as listing:
            names = [entry.name for entry in listing if _STALE.match(entry.name)]
    except OSError:
        return None  # making a folder there says what is wrong, if anything
    for name in names:
        pid = int(_STALE.match(name)["pid"])  # type: ignore[index]
        path = os.path.join(root, name)
        with contextlib.suppress(OSError):
            info = os.lstat(path)
            if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not _alive(pid):
                shutil.rmtree(path, ignore_errors=True)
    return None


def _alive(pid: int) -> bool:
    if pid <= 1:  # not a process of ours (0 would mean this process's group)
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _named(name: str, text: str) -> str:
    """``text`` as the file ``name``: in NVRTC's messages and __FILE__, not its path on disk."""
    # A backslash and a quote escaped; a "?" too, so that no "??/" trigraph (C++11 and 14)
    # turns into a backslash. Control characters are refused in names (_spec).
    quoted = name.replace("\\", "\\\\").replace('"', '\\"').replace("?", "\\?")
    return f'#line 1 "{quoted}"\n{text}'


def _compile(
    nvrtc: ModuleType,
    spec: KernelSpec,
    target: Target,
    kind: Literal["cubin", "ptx"],
    options: list[str],
    *,
    folder: str,
) -> CompileResult:
    started = time.perf_counter()
    what = f"NVRTC failed to compile {spec.name!r} for {target.arch}"
    program = None
    compiling = False
    path = os.path.join(folder, _PROGRAM)

    def read_log() -> str:
        # Said as the user named things, not by the private folder's path.
        return _log(nvrtc, program).replace(path, spec.name).replace(folder + os.sep, "")

    def failed(message: str) -> CompileError:
        # Every failure of the binding here belongs to this program (a bare RuntimeError from
        # getCUBIN, an error status from getLoweredName): as a CompileError the Compiler
        # remembers it instead of compiling again at every request.
        log = read_log() if program is not None else ""
        if compiling:  # NVRTC rejected the program: its log's first error says why
            first = next((line.strip() for line in log.splitlines() if "error" in line), None)
            message = f"{what}: {first}" if first else message
            if "cannot open source file" in log and not _cuda_headers.search_dirs():
                # A header NVRTC cannot open may be one of CUDA's, and this host has none.
                message = f"{message} ({_headers_hint()})"
        return CompileError(message, log=log, program=spec.name, options=options)

    try:
        with map_cuda_errors(what, failed):
            program = nvrtc.createProgram(_named(spec.name, spec.source), path, [], [])
            for expression in spec.name_expressions:
                nvrtc.addNameExpression(program, expression)
            compiling = True
            nvrtc.compileProgram(program, _in_folder(options, folder))
            compiling = False
            lowered = {expr: nvrtc.getLoweredName(program, expr) for expr in spec.name_expressions}
            image = nvrtc.getCUBIN(program) if kind == "cubin" else nvrtc.getPTX(program)
            log = read_log()
    finally:
        if program is not None:
            # A program that cannot be destroyed leaks its memory; the outcome stands.
            with contextlib.suppress(Exception):
                nvrtc.destroyProgram(program)
    return CompileResult(
        kind=kind,
        image=bytes(image),
        lowered_names=lowered,
        log=log,
        seconds=time.perf_counter() - started,
    )


def _log(nvrtc: ModuleType, program: object) -> str:
    try:
        log = nvrtc.getProgramLog(program)
    except Exception as exc:  # the binding decodes it as UTF-8; a header's bytes may not be
        return f"(NVRTC's log could not be read: {describe(exc)})"
    text = log.decode(errors="replace") if isinstance(log, bytes) else str(log)
    return text.rstrip("\x00")
