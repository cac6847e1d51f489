"""Loading artifacts into per-device CuPy modules: the only module that touches the CUDA driver."""

from __future__ import annotations

import threading
from typing import Any

from ._artifact import Artifact
from ._exceptions import AionvrtcError, NoDeviceError

__all__ = ["Module", "ModuleLoadError", "device_id", "load"]


class ModuleLoadError(AionvrtcError):
    """Raised when the driver refuses an artifact's image (wrong arch, unsupported PTX, a
    damaged image). ``Compiler.get`` drops such an image and recompiles it once first."""


def device_id(device: int | None) -> int:
    """``device``, or CuPy's current device, checked to exist. NoDeviceError without a GPU."""
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
        current = cupy.cuda.runtime.getDevice() if device is None else device
    except Exception as exc:  # CuPy raises runtime and driver errors of several types.
        raise NoDeviceError(
            f"no usable CUDA GPU here ({exc}); `await compiler.compile(spec)` compiles without "
            "one when the Compiler is given arch='sm_90'"
        ) from exc
    if isinstance(current, bool) or not isinstance(current, int) or not 0 <= current < count:
        raise ValueError(f"device must be an int in 0..{count - 1}, got {device!r}")
    return current


class Module:
    """An artifact loaded into one device's context; kernels by name or name expression."""

    __slots__ = ("_functions", "_module", "artifact", "device")

    def __init__(self, artifact: Artifact, device: int, module: Any) -> None:
        self.artifact = artifact
        self.device = device
        self._module = module
        self._functions: dict[str, Any] = {}

    def get_function(self, name: str) -> Any:
        """The kernel ``name``: a name expression given in the spec (``"gemm<float>"``) or a
        plain (extern "C" or mangled) symbol. Returns a ``cupy.cuda.function.Function``."""
        try:
            return self._functions[name]
        except KeyError:
            pass
        symbol = self.artifact.lowered_names.get(name, name)
        try:
            function = self._module.get_function(symbol)
        except Exception as exc:
            known = ", ".join(self.artifact.lowered_names) or "none"
            raise KeyError(
                f"no kernel {name!r} in this module (name expressions: {known})"
            ) from exc
        self._functions[name] = function
        return function

    def __repr__(self) -> str:
        return f"<Module {self.artifact.key[:12]} {self.artifact.kind} on device {self.device}>"


_modules: dict[tuple[str, int], Module] = {}
_lock = threading.Lock()


def load(artifact: Artifact, device: int) -> Module:
    """Load ``artifact`` on ``device`` once per process; later calls return the same Module."""
    module = _modules.get((artifact.key, device))
    if module is not None:
        return module
    with _lock:
        module = _modules.get((artifact.key, device))
        if module is None:
            module = _modules[artifact.key, device] = Module(
                artifact, device, _load_image(artifact, device)
            )
    return module


def _load_image(artifact: Artifact, device: int) -> Any:
    import cupy
    from cupy.cuda.function import Module as CupyModule

    try:
        with cupy.cuda.Device(device):
            raw = CupyModule()
            raw.load(artifact.image)
    except Exception as exc:
        raise ModuleLoadError(
            f"the driver refused the {artifact.kind} for {artifact.arch} "
            f"(key {artifact.key[:16]}...) on device {device}: {exc}"
        ) from exc
    return raw


def forget(key: str) -> None:
    """Unload every device's module for ``key`` (their kernels keep working while referenced)."""
    with _lock:
        for found in [k for k in _modules if k[0] == key]:
            del _modules[found]
