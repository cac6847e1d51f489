"""The GPU architecture a kernel is compiled for."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from ._exceptions import NoDeviceError

__all__ = ["Target", "TargetLike", "as_target"]

# sm_90, sm_90a (arch-specific features such as wgmma), sm_100f (family-portable).
_ARCH = re.compile(r"sm_(?P<number>[1-9][0-9]{1,2})(?P<suffix>[af]?)")


@dataclass(frozen=True, slots=True)
class Target:
    """A real GPU architecture such as ``Target("sm_90")``; ``Target.current()`` detects it.

    Wherever a target is needed an ``arch="sm_90"`` string is accepted too.
    """

    arch: str
    number: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.arch, str):
            raise TypeError(f"arch must be a str such as 'sm_90', not {type(self.arch).__name__}")
        match = _ARCH.fullmatch(self.arch)
        if match is None:
            raise ValueError(
                f"arch must look like 'sm_90', 'sm_90a' or 'sm_100f', got {self.arch!r}"
            )
        object.__setattr__(self, "number", int(match["number"]))

    def __str__(self) -> str:
        return self.arch

    @classmethod
    def current(cls, device: int | None = None) -> Target:
        """The architecture of ``device`` (default: CuPy's current device).

        Raises NoDeviceError when CUDA or the GPU cannot be used.
        """
        try:
            import cupy

            dev = cupy.cuda.Device(device)
            capability = str(dev.compute_capability)
        except Exception as exc:  # CuPy raises runtime and driver errors of several types.
            raise NoDeviceError(
                f"cannot detect the GPU architecture ({exc}); "
                "pass the target explicitly, for example arch='sm_90'"
            ) from exc
        return cls(f"sm_{capability}")


TargetLike = Target | str


def as_target(target: TargetLike | None) -> Target:
    """Normalise a ``Target``, an arch string, or None (detect from the current GPU)."""
    if target is None:
        return Target.current()
    if isinstance(target, Target):
        return target
    return _named(target) if isinstance(target, str) else Target(target)


@functools.lru_cache(maxsize=64)
def _named(arch: str) -> Target:
    # Targets are immutable and few: parse each name once (keys are asked for per request).
    return Target(arch)
