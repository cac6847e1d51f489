"""Which CUDA major serves which driver and GPU: the extras, and what the driver here runs.

aionvrtc installs CuPy and NVRTC of one CUDA major through an extra (``aionvrtc[cu13]``,
``aionvrtc[cu12]``), as CuPy ships one wheel per major. What decides is the driver: a cubin from
NVRTC 13 needs a driver for CUDA 13 (580 or newer), one from NVRTC 12 a driver for CUDA 12 (525 or
newer, CUDA 12's minor-version compatibility); and a major drops old GPUs (CUDA 13 compiles for
Turing, sm_75, and newer; CUDA 12 from Maxwell, sm_50).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

__all__ = [
    "CHOOSE_EXTRA",
    "MAJORS",
    "Major",
    "cuda_version",
    "cupy_majors",
    "driver_cuda",
    "driver_fix",
    "driver_release",
    "extra_for_arch",
    "insufficient_driver",
]


@dataclass(frozen=True, slots=True)
class Major:
    """One CUDA major as aionvrtc installs it."""

    number: int
    extra: str  # the pip extra that installs its CuPy and NVRTC
    min_driver: int  # the oldest Linux driver branch that loads this NVRTC's cubins
    archs: tuple[int, ...]  # what the extra's NVRTC compiles for (sm_XY as XY)


MAJORS = {
    # NVRTC 12.9's list, as getSupportedArchs gives it.
    12: Major(
        12, "cu12", 525,
        (50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90, 100, 101, 103, 120, 121),
    ),
    # NVRTC 13.x's (13.0 lacks sm_107; sm_101 became sm_110).
    13: Major(
        13, "cu13", 580,
        (75, 80, 86, 87, 88, 89, 90, 100, 103, 107, 110, 120, 121),
    ),
}  # fmt: skip

# NVRTC and CUDA's headers, as the cu12 and cu13 extras install them.
TOOLKIT = "cuda-toolkit[nvrtc,cudart,cccl]"

# How to choose, said wherever CuPy or NVRTC is missing.
CHOOSE_EXTRA = (
    "install the extra for your NVIDIA driver: pip install 'aionvrtc[cu13]' (CUDA 13, driver 580 "
    "or newer) or 'aionvrtc[cu12]' (CUDA 12, driver 525 or newer); `nvidia-smi` shows the "
    "driver's CUDA version in its first lines"
)


def extra_for_arch(arch: int) -> str | None:
    """The extra whose NVRTC compiles for ``arch`` (as 70 for sm_70), preferring the newest
    major; None if none does."""
    for known in sorted(MAJORS.values(), key=lambda m: -m.number):
        if arch in known.archs:
            return known.extra
    return None


def driver_fix(driver: tuple[int, int], needs: tuple[int, int], *, exact: bool = False) -> str:
    """What to do when the driver here, for CUDA ``driver``, is too old for what needs CUDA
    ``needs`` (a cubin or CuPy's runtime: the major decides; PTX, ``exact``: the NVRTC that made
    it must be no newer than the driver): the extra of the driver's CUDA (the other CuPy wheel
    removed first: two clash), or the NVRTC of its version, or else a newer driver."""
    known = MAJORS.get(needs[0])
    update = (
        f"update the NVIDIA driver to {known.min_driver} or newer"
        if known is not None and not exact
        else f"update the NVIDIA driver to one for CUDA {needs[0]}.{needs[1]} or newer"
    )
    mine = MAJORS.get(driver[0])
    if mine is None:
        return update
    steps = []
    if driver[0] != needs[0]:
        others = [f"cupy-cuda{m}x" for m in cupy_majors() if m != driver[0]]
        if others:
            steps.append(f"pip uninstall {' '.join(others)}")
        steps.append(f"pip install 'aionvrtc[{mine.extra}]' (CUDA {driver[0]}, the driver's)")
    if exact:
        # NVIDIA's metapackage, as the extra installs it: NVRTC and the headers of one release.
        steps.append(f"pip install '{TOOLKIT}=={driver[0]}.{driver[1]}.*'")
    return f"{', then '.join(steps)}; or {update}" if steps else update


def insufficient_driver(exc: BaseException) -> str | None:
    """For CUDA's "driver is insufficient for the runtime" (CuPy of a newer CUDA than the
    driver runs: the usual sign of the wrong extra), what the driver runs and the fix; else
    None."""
    if "InsufficientDriver" not in str(exc):  # cudaErrorInsufficientDriver
        return None
    driver, majors = driver_cuda(), cupy_majors()
    if driver is None or len(majors) != 1:
        return None
    return (
        f"the driver runs CUDA {driver[0]}.{driver[1]}, older than CuPy's CUDA {majors[0]}: "
        + driver_fix(driver, (majors[0], 0))
    )


def cupy_majors() -> list[int]:
    """The CUDA majors of the CuPy wheels installed (``cupy-cuda12x``: 12), read from their
    metadata without importing CuPy: more than one is a clash that CuPy itself cannot settle."""
    from importlib import metadata

    found = set()
    for distribution in metadata.distributions():
        wheel = _CUPY_WHEEL.fullmatch(distribution.metadata["Name"] or "")
        if wheel is not None:
            found.add(int(wheel["major"]))
    return sorted(found)


_CUPY_WHEEL = re.compile(r"cupy[-_]cuda(?P<major>\d+)x", re.IGNORECASE)


@functools.cache
def driver_cuda() -> tuple[int, int] | None:
    """The newest CUDA version the installed driver runs, as (13, 0); None without a driver
    (or without CuPy to ask it). Cached: a driver does not change under a running process."""
    try:
        import cupy

        number = int(cupy.cuda.runtime.driverGetVersion())
    except Exception:  # no CuPy, or no libcuda: no driver to speak of
        return None
    if number <= 0:  # CUDA's documented answer where no driver is installed
        return None
    return cuda_version(number)


def cuda_version(number: int) -> tuple[int, int]:
    """CUDA's version number (13000, from cudaDriverGetVersion or cudaRuntimeGetVersion) as
    (13, 0)."""
    return number // 1000, number % 1000 // 10


_RELEASE = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(?P<release>\d+(?:\.\d+)+)")


def driver_release(path: str = "/proc/driver/nvidia/version") -> str | None:
    """The NVIDIA driver's release (``"580.95.05"``) from the kernel module's version file, or
    None where there is no such file (no driver, not Linux) or it says no release."""
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            text = file.read(4096)
    except OSError:
        return None
    found = _RELEASE.search(text)
    return found["release"] if found else None
