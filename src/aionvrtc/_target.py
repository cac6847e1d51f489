"""The GPU architecture a kernel is compiled for, and the one rule that picks it."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from . import _config
from ._config import ENV_ARCH
from ._cuda_errors import map_cuda_errors
from ._cuda_versions import CHOOSE_EXTRA
from ._exceptions import NoDeviceError
from ._units import quoted

__all__ = ["ENV_ARCH", "Target", "TargetLike", "as_target", "device_target", "resolve_target"]

# The target when none is named: for compiling on a machine without a GPU (CI, a Docker build),
# or for another GPU than this one.

# sm_90, sm_90a (arch-specific features such as wgmma), sm_100f (family-portable).
_ARCH = re.compile(r"sm_(?P<number>[1-9][0-9]{1,2})(?P<suffix>[af]?)")


@dataclass(frozen=True, slots=True)
class Target:
    """A real GPU architecture such as ``Target("sm_90")``; ``Target.current()`` detects it.

    Wherever a target is needed an ``arch="sm_90"`` string is accepted too.

    Attributes:
        arch: The architecture's name: ``"sm_90"``; ``"sm_90a"``, with arch-specific features
            such as wgmma (for that GPU alone); or ``"sm_100f"``, family-portable.
        number: Its number without the suffix (90 for ``"sm_90a"``): derived from ``arch``,
            not passed.

    Raises:
        TypeError: ``arch`` is not a str.
        ValueError: ``arch`` does not look like ``"sm_90"``, ``"sm_90a"`` or ``"sm_100f"``.
    """

    arch: str
    number: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.arch, str):
            raise TypeError(f"arch must be a str such as 'sm_90', not {type(self.arch).__name__}")
        match = _ARCH.fullmatch(self.arch)
        if match is None:
            raise ValueError(
                f"arch must look like 'sm_90', 'sm_90a' or 'sm_100f', got {quoted(self.arch)}"
            )
        object.__setattr__(self, "number", int(match["number"]))

    def __str__(self) -> str:
        return self.arch

    @classmethod
    def current(cls, device: int | None = None) -> Target:
        """The architecture of ``device``.

        Args:
            device: The CUDA device index; default: CuPy's current device.

        Returns:
            The device's own architecture, from its compute capability (``sm_90`` for 9.0),
            without a suffix.

        Raises:
            NoDeviceError: CuPy is not installed, or CUDA or the GPU cannot be used (there is
                no device ``device``, say).
        """
        return _detect(device, hint="pass the target explicitly, for example arch='sm_90'")


def _detect(device: int | None, *, hint: str) -> Target:
    try:
        import cupy
    except ModuleNotFoundError as exc:
        if exc.name != "cupy":
            raise
        raise NoDeviceError(
            f"cannot detect the GPU architecture: CuPy is not installed; {CHOOSE_EXTRA}"
        ) from None
    with map_cuda_errors("cannot detect the GPU architecture", NoDeviceError, hint=hint):
        capability = str(cupy.cuda.Device(device).compute_capability)
    return Target(f"sm_{capability}")


TargetLike = Target | str


def resolve_target(arch: TargetLike | None = None, *, default: TargetLike | None = None) -> Target:
    """The target to compile for: ``arch`` if given; else ``$AIONVRTC_ARCH`` if set; else the
    current GPU's; else ``default``.

    Args:
        arch: The target asked for (``"sm_90"`` or a ``Target``).
        default: The target where it comes to the GPU and there is none (``"sm_90"`` or a
            ``Target``); checked whenever it comes to the GPU, with a GPU too.

    Returns:
        The ``Target``.

    Raises:
        NoDeviceError: It comes to the GPU, there is none and no ``default`` is given.
        ValueError: ``arch`` or ``default`` is not an arch such as ``"sm_90"``, or
            ``$AIONVRTC_ARCH`` is not (the message names the variable).
        TypeError: ``arch`` or ``default`` is neither a str nor a ``Target``.
    """
    if arch is not None:
        return as_target(arch)
    named = _config.text(ENV_ARCH)
    if named:  # set but empty counts as unset, so that a script can clear it
        try:
            return _named(named)
        except ValueError as exc:
            raise ValueError(f"${ENV_ARCH}: {exc}") from exc
    if default is None:
        return _detect(None, hint=f"name the target: arch='sm_90', or ${ENV_ARCH}=sm_90")
    fallback = as_target(default)  # a bad default is an error with a GPU too
    try:
        return Target.current()
    except NoDeviceError:
        return fallback


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


def device_target(capability: tuple[int, int], preferred: Target | None = None) -> Target:
    """The target for a GPU of compute ``capability``: its own architecture (``sm_90`` for
    9.0), or ``preferred`` when that names the same GPU with a feature suffix (``sm_90a``) or a
    family that covers it (``sm_100f`` for 10.3): a choice the caller made for this GPU."""
    major, minor = capability
    own = _named(f"sm_{major}{minor}")
    if preferred is not None:
        if preferred.number == own.number:
            return preferred
        family, member = divmod(preferred.number, 10)
        if preferred.arch.endswith("f") and family == major and member <= minor:
            return preferred
    return own
