"""Artifacts on the GPU: loading into per-device CuPy modules, and awaiting GPU work.

The only module that touches the CUDA driver. Loading a kernel's image takes tens of
microseconds and is done on the caller's thread; creating a device's context takes far longer
and is done once per device in a worker thread.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel

from ._artifact import Artifact
from ._cuda_errors import map_cuda_errors, map_load_errors
from ._cuda_versions import MAJORS, driver_cuda, driver_fix
from ._exceptions import ModuleLoadError, NoDeviceError

__all__ = [
    "Module",
    "ModuleLoadError",  # from _exceptions; _compiler catches it as _cuda.ModuleLoadError
    "check_device",
    "current_device",
    "init_device",
    "load",
    "synchronize",
]

# What every device query maps a CuPy failure to. One instance, kept: it holds no state, and
# current_device runs on every Compiler.get.
_NO_DEVICE = map_cuda_errors(
    "no usable CUDA GPU here",
    NoDeviceError,
    hint="`await compiler.compile(spec)` compiles without one when the Compiler is given "
    "arch='sm_90'",
)


class _Runtime:
    # cupy.cuda.runtime.getDevice, bound on first use: Compiler.get calls it on every request.
    get_device: Callable[[], int] | None = None


def current_device() -> int:
    """CuPy's current device in this thread. NoDeviceError without a usable GPU."""
    try:
        get_device = _Runtime.get_device
        if get_device is None:
            import cupy

            get_device = _Runtime.get_device = cupy.cuda.runtime.getDevice
        return get_device()
    except Exception as exc:
        _NO_DEVICE.reraise(exc)


_capabilities: dict[int, tuple[int, int]] = {}
_ready: set[int] = set()
_lock = threading.Lock()


def check_device(device: int) -> tuple[int, int]:
    """Validate ``device`` and return its compute capability (major, minor)."""
    if type(device) is not int:  # first: True would find device 1's entry (True == 1)
        raise TypeError(f"device must be an int, not {type(device).__name__}")
    try:
        return _capabilities[device]
    except KeyError:
        pass
    with _NO_DEVICE:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
        if not 0 <= device < count:
            raise ValueError(f"device must be in 0..{count - 1}, got {device}")
        # Not getDeviceProperties: that builds a large dict (about 1 ms).
        major, minor = divmod(int(cupy.cuda.Device(device).compute_capability), 10)
    capability = (major, minor)
    _capabilities[device] = capability
    return capability


def device_count() -> int:
    with _NO_DEVICE:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())


def init_device(device: int) -> None:
    """Create ``device``'s primary context (blocking, ~100 ms the first time): call it in a
    worker thread so the event loop never waits for it."""
    if device in _ready:
        return
    with map_cuda_errors(f"cannot create a CUDA context on device {device}", NoDeviceError):
        import cupy

        with _lock, cupy.cuda.Device(device):
            cupy.cuda.runtime.free(0)  # the usual way to make the runtime create the context
            _ready.add(device)


def device_ready(device: int) -> bool:
    """Whether ``device``'s context exists, so using it from this thread costs nothing."""
    if device in _ready:
        return True
    # A probe: whatever stops it from asking means "not ready", and init_device says why.
    with contextlib.suppress(NoDeviceError), _NO_DEVICE:
        import cupy

        # Made current in this thread by the application already (cheap to ask).
        if cupy.cuda.runtime.getDevice() == device and cupy.cuda.driver.ctxGetCurrent() != 0:
            _ready.add(device)
            return True
    return False


class Module:
    """An artifact loaded into one device's context; kernels by name or name expression.

    Made by ``Compiler.get`` (not by hand), which returns the same Module for every ``get`` of
    a spec on a device.

    Args:
        artifact: The artifact loaded, kept as ``artifact``.
        device: The CUDA device index it is loaded on, kept as ``device``.
        module: CuPy's module holding the loaded image (``cupy.cuda.function.Module``).

    Raises:
        Nothing: the arguments are kept as given; loading (``Compiler.get``) is what can fail.
    """

    __slots__ = ("__weakref__", "_functions", "_module", "artifact", "device")

    def __init__(self, artifact: Artifact, device: int, module: Any) -> None:
        self.artifact = artifact
        self.device = device
        self._module = module
        self._functions: dict[str, Any] = {}

    def get_function(self, name: str) -> Any:
        """The kernel ``name``, looked up once and then kept.

        Args:
            name: A name expression given in the spec (``"gemm<float>"``) or a plain
                (extern "C" or mangled) symbol.

        Returns:
            The kernel as a ``cupy.cuda.function.Function``: the same object for every call
            with ``name``.

        Raises:
            KeyError: The module holds no kernel ``name``, or the driver could not look it up
                (the message lists the name expressions; the cause is CuPy's error).
            TypeError: ``name`` is not a str.
        """
        try:
            return self._functions[name]
        except KeyError:
            pass
        symbol = self.artifact.lowered_names.get(name, name)
        known = ", ".join(self.artifact.lowered_names) or "none"
        missing = f"no kernel {name!r} in this module (name expressions: {known})"
        with map_cuda_errors(missing, KeyError):  # KeyError: as a mapping says it has no such key
            function = self._module.get_function(symbol)
        self._functions[name] = function
        return function

    def __repr__(self) -> str:
        return f"<Module {self.artifact.key[:12]} {self.artifact.kind} on device {self.device}>"


def runnable(
    artifact: Artifact, capability: tuple[int, int], driver: tuple[int, int] | None
) -> str | None:
    """Why ``artifact`` cannot run on a device of ``capability`` under a driver for CUDA
    ``driver`` (None: not known), or None if it can."""
    number = int(artifact.arch[3:].rstrip("af"))
    major, minor = divmod(number, 10)
    device = capability[0] * 10 + capability[1]
    if artifact.kind == "ptx":
        ok = device >= number  # the driver compiles PTX for any newer GPU
    elif artifact.arch.endswith("a"):
        ok = capability == (major, minor)  # arch-specific features exist on that GPU alone
    else:
        ok = capability[0] == major and capability[1] >= minor
    if not ok:
        return (
            f"a {artifact.kind} for {artifact.arch} cannot run on a GPU of compute capability "
            f"{capability[0]}.{capability[1]}; get() compiles for the device's own arch, "
            f"sm_{device}"
        )
    made = _version(artifact.nvrtc_version)
    if driver is None or made is None:
        return None
    runs = f"this driver runs CUDA {driver[0]}.{driver[1]}"
    if artifact.kind == "ptx" and driver < made:
        return (
            f"PTX from NVRTC {made[0]}.{made[1]} needs a driver for CUDA {made[0]}.{made[1]} or "
            f"newer and {runs}: {driver_fix(driver, made, exact=True)}"
        )
    known = MAJORS.get(made[0])
    if artifact.kind == "cubin" and driver[0] < made[0] and known is not None:
        return (
            f"a cubin from NVRTC {made[0]}.{made[1]} needs a driver for CUDA {made[0]} "
            f"({known.min_driver} or newer) and {runs}: {driver_fix(driver, made)}"
        )
    return None


def _version(text: str) -> tuple[int, int] | None:
    """ "13.5" as (13, 5); None if it does not say a version."""
    major, _, minor = text.partition(".")
    return (int(major), int(minor)) if major.isdigit() and minor.isdigit() else None


def load(artifact: Artifact, device: int) -> Module:
    """Load ``artifact`` into ``device``'s context (cuModuleLoadData). A ModuleLoadError says by
    its ``status`` whether the driver refused the image itself (``IMAGE_REFUSED``); one for a
    full GPU is a GPUOutOfMemoryError."""
    reason = runnable(artifact, check_device(device), driver_cuda())
    if reason is not None:
        raise ModuleLoadError(reason)
    with map_load_errors(f"loading {describe_artifact(artifact)} on device {device}"):
        import cupy
        from cupy.cuda.function import Module as CupyModule

        with cupy.cuda.Device(device):
            raw = CupyModule()
            raw.load(artifact.image)
    return Module(artifact, device, raw)


def describe_artifact(artifact: Artifact) -> str:
    """``artifact`` as messages name it: its first kernel, its kind, arch and key."""
    names = list(artifact.lowered_names)
    kernels = names[0] if names else "the kernels"
    if len(names) > 1:
        kernels += f" and {len(names) - 1} more"
    return f"{kernels} ({artifact.kind} for {artifact.arch}, key {artifact.key[:16]}...)"


# Polling an event: first at once, then at each pass of the event loop for a while (asyncio's
# timers sleep at least a millisecond where the loop is idle: epoll counts whole ms), then
# backing off, so a short kernel costs little latency and a long one little CPU.
_EAGER = 200e-6  # seconds polled at every pass
_FIRST_POLL = 50e-6  # seconds
_MAX_POLL = 1e-3  # seconds


class _Wait:
    __slots__ = ("event", "woken")

    def __init__(self, event: Any) -> None:
        self.event, self.woken = event, anyio.Event()


# The tasks of this event loop waiting in synchronize.
_waiting: anyio.lowlevel.RunVar[set[_Wait]] = anyio.lowlevel.RunVar("aionvrtc.synchronize")


async def synchronize(work: Any = None) -> None:
    """Wait until GPU work is done without blocking the event loop.

    Polls an event with a short backoff, so an asyncio or trio server keeps serving while the
    GPU works; the task that finds its work done wakes every other task of the loop whose work
    is done too, so that tasks waiting for the same work (a batch) go on together.

    Args:
        work: A ``cupy.cuda.Stream`` or ``cupy.cuda.ExternalStream`` (all work queued on it so
            far), a ``cupy.cuda.Event`` (recorded earlier), or None for CuPy's current stream.

    Raises:
        TypeError: ``work`` is none of those.
        ImportError: CuPy is not installed.
        cupy.cuda.runtime.CUDARuntimeError: CUDA reported an error for the work or the device
            (a kernel's fault, such as an illegal address); CuPy's own error, passed on as it
            is.
    """
    import cupy

    if work is None:
        work = cupy.cuda.get_current_stream()
    if isinstance(work, cupy.cuda.Event):
        event = work
    elif isinstance(work, cupy.cuda.Stream | cupy.cuda.ExternalStream):
        event = cupy.cuda.Event(block=False, disable_timing=True)
        event.record(work)
    else:
        raise TypeError(
            f"synchronize takes a cupy.cuda.Stream or cupy.cuda.Event, not {type(work).__name__}"
        )
    if event.done:
        return
    try:
        waiting = _waiting.get()
    except LookupError:
        waiting = set()
        _waiting.set(waiting)
    mine = _Wait(event)
    waiting.add(mine)
    try:
        eager = anyio.current_time() + _EAGER
        delay = _FIRST_POLL
        while not mine.woken.is_set():
            if anyio.current_time() < eager:
                await anyio.lowlevel.checkpoint()
            else:
                with anyio.move_on_after(delay):
                    await mine.woken.wait()
                delay = min(delay * 2, _MAX_POLL)
            if not mine.woken.is_set() and event.done:
                for other in waiting:
                    if other.event.done:
                        other.woken.set()
    finally:
        waiting.discard(mine)
