"""Where CUDA's own headers are: the runtime's (``cuda_fp16.h``, ``cooperative_groups.h``...)
and CCCL's (``<cuda/std/...>``, CUB, Thrust).

NVRTC ships none of them, so a program that includes one fails with "could not open source
file" unless it is on the search path. They are found as NVIDIA's ``cuda-pathfinder`` (which
CuPy uses too) finds them: the NVIDIA wheels (``aionvrtc[cu13]`` brings the runtime's and
CCCL's), ``$CONDA_PREFIX``, ``$CUDA_PATH``/``$CUDA_HOME``, a system CUDA toolkit. A program
that reads any header from the host searches them after its own ``-I`` folders, and its key
covers their files as it covers any include folder's (``_includes``).
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass

__all__ = [
    "LOCATOR_FIX",
    "HeaderDir",
    "install_hint",
    "located",
    "locator_problem",
    "other_major_hint",
    "search_dirs",
]

# (what the folder holds, pathfinder's name for it, a header whose #define gives its version)
_WANTED = (
    ("CUDA runtime", "cudart", "cuda_runtime_api.h", "CUDART_VERSION"),
    ("CCCL", "cccl", "cuda/std/__cccl/version.h", "CCCL_VERSION"),
)


@dataclass(frozen=True, slots=True)
class HeaderDir:
    """One folder of CUDA's headers, as found."""

    what: str  # "CUDA runtime" or "CCCL"
    path: str  # absolute, resolved
    found_via: str  # cuda-pathfinder's word: "site-packages", "conda", "CUDA_PATH", ...
    version: str | None  # such as "13.5" (the runtime) or "3.5.0" (CCCL), None if unreadable


@functools.cache
def located() -> tuple[HeaderDir, ...]:
    """The folders of CUDA's headers found on this host, runtime first; once per process
    (the wheels and toolkits a process could find do not change under it: a pip install
    while it runs is seen by the next process). Empty where none is installed."""
    if locator_problem() is not None:  # then no program finds CUDA's headers; doctor says why
        return ()
    # 75 ms to import: only for programs that read host headers, and for doctor.
    from cuda.pathfinder import locate_nvidia_header_directory

    found: list[HeaderDir] = []
    for what, name, header, macro in _WANTED:
        try:
            place = locate_nvidia_header_directory(name)
        except Exception:  # its search spawns a probe; a failure there means not found
            place = None
        if place is None or place.abs_path is None:
            continue
        path = os.path.realpath(place.abs_path)
        found.append(HeaderDir(what, path, place.found_via, _version(path, header, macro)))
    return tuple(found)


# The fix where cuda-pathfinder cannot be used (1.3.4 added the function used here).
LOCATOR_FIX = "pip install 'cuda-pathfinder>=1.3.4'"


@functools.cache
def locator_problem() -> str | None:
    """Why cuda-pathfinder cannot look for the headers (missing, or too old: LOCATOR_FIX);
    None if it can."""
    try:
        from cuda.pathfinder import locate_nvidia_header_directory  # noqa: F401
    except ImportError as exc:
        return f"cuda-pathfinder, which finds them, cannot be used ({exc})"
    return None


def search_dirs() -> tuple[str, ...]:
    """The folders NVRTC searches for CUDA's headers, in order."""
    return tuple(place.path for place in located())


def install_hint(major: int | None) -> str:
    """How to get CUDA's headers for an NVRTC of CUDA ``major`` (None: not known)."""
    from ._cuda_versions import MAJORS

    extras = [MAJORS[major].extra] if major in MAJORS else [m.extra for m in MAJORS.values()]
    wheels = " or ".join(f"pip install 'aionvrtc[{extra}]'" for extra in extras)
    return (
        f"{wheels} brings them (the CUDA runtime's and CCCL's wheels), or set CUDA_PATH to a CUDA "
        "toolkit of the same major as NVRTC"
    )


def other_major_hint(major: int) -> str:
    """How to replace CUDA headers of another major than NVRTC's ``major``: found first, the
    wheels must be the ones replaced (CUDA_PATH is searched after them)."""
    from ._cuda_versions import TOOLKIT

    return (
        f"pip install '{TOOLKIT}=={major}.*' (the headers of NVRTC's release); where the "
        "headers are a toolkit's, point CUDA_PATH at one of that major"
    )


def _version(folder: str, header: str, macro: str) -> str | None:
    try:
        with open(os.path.join(folder, header), encoding="latin-1") as file:
            text = file.read(1 << 16)
    except OSError:
        return None
    found = re.search(rf"^\s*#\s*define\s+{macro}\s+(\d+)\s*$", text, re.MULTILINE)
    if found is None:
        return None
    number = int(found[1])
    if macro == "CUDART_VERSION":  # 13050: major * 1000 + minor * 10
        return f"{number // 1000}.{number % 1000 // 10}"
    # CCCL_VERSION 3005000: major * 1000000 + minor * 1000 + patch
    return f"{number // 1_000_000}.{number // 1000 % 1000}.{number % 1000}"
