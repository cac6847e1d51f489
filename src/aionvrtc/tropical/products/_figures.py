"""A GPU's measured ceilings, which a contraction's roofline is counted against: the add+max
pairs per second of the tropical kernels' inner step for each element type (the register probe
of kernels/tropical_probe.cu) and the bytes per second of a device-to-device copy. Measured once
per GPU model (a second or so) and kept as a record in the compiler's disk cache beside the
tuned tiles, so that later processes on the same kind of GPU read them instead."""

from __future__ import annotations

import functools
import json
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import numpy as np

from ..._compiler import Compiler
from ..._spec import KernelSpec
from ..._sync import on_default
from ._specs import family_digest, family_spec
from ._tune import timed

__all__ = [
    "MODEL_FIGURES",
    "PROBE_TYPES",
    "DeviceFigures",
    "device_figures",
    "known_figures",
    "probe_spec",
]

# The probe of each element type: its C++ type and whether it takes DPX's one-instruction
# add+max (__viaddmax_s32, as the tiled int32 kernels do). bool's and/or is counted at int32's.
PROBE_TYPES: dict[str, tuple[str, bool]] = {
    "float32": ("float", False),
    "float64": ("double", False),
    "int32": ("int", True),
    "int64": ("long long", False),
}
_PAIRS_PER_ITERATION = 64  # accumulators per thread (tropical_probe.cu)
_ITERATIONS = 4096
_REPEATS = 7
_COPY_BYTES = 1 << 30  # a copy this large runs at the memory's bandwidth, far past the L2

_known: dict[int, DeviceFigures] = {}  # by device, once measured or read in this process


@dataclass(frozen=True, slots=True)
class DeviceFigures:
    """What a GPU was measured to do at best, the ceilings of a contraction's roofline.

    Attributes:
        gpu: The GPU's name, as the driver reports it (``"NVIDIA H200"``).
        pairs_per_s: Add+max pairs per second of the inner step, by element type name
            (``float32``, ``float64``, ``int32``, ``int64``); ``bool`` counts as ``int32``.
        copy_bytes_per_s: Bytes per second of a device-to-device copy, read and written
            bytes counted.
        multiprocessors: The GPU's streaming multiprocessors (a step on fewer blocks than a
            few per multiprocessor leaves it partly idle).

    Raises:
        TypeError: ``gpu`` is not a str, ``pairs_per_s`` not a mapping, a ceiling not a real
            number or ``multiprocessors`` not an int.
        ValueError: ``pairs_per_s`` lacks one of the kernels' element types (``float32``,
            ``float64``, ``int32``, ``int64``), a ceiling is not a finite number above 0, or
            ``multiprocessors`` is below 1.
    """

    gpu: str
    pairs_per_s: Mapping[str, float]
    copy_bytes_per_s: float
    multiprocessors: int

    def __post_init__(self) -> None:
        # A ceiling no GPU has is refused: bound() divides by each, and a zero, negative, NaN
        # or infinite one gave an infinite, negative, NaN or 0 s time.
        if not isinstance(self.gpu, str):
            raise TypeError(f"DeviceFigures.gpu must be a str, got {type(self.gpu).__name__}")
        if not isinstance(self.pairs_per_s, Mapping):
            raise TypeError(
                "DeviceFigures.pairs_per_s must map each element type to its rate, got "
                f"{type(self.pairs_per_s).__name__}"
            )
        missing = [t for t in PROBE_TYPES if t not in self.pairs_per_s]
        if missing:
            raise ValueError(
                f"DeviceFigures.pairs_per_s has no rate for {', '.join(missing)}: give one for "
                f"each of {', '.join(PROBE_TYPES)}"
            )
        for name, rate in self.pairs_per_s.items():
            _check_ceiling(f"pairs_per_s[{name!r}]", rate)
        _check_ceiling("copy_bytes_per_s", self.copy_bytes_per_s)
        cores = self.multiprocessors
        if not isinstance(cores, int) or isinstance(cores, bool):
            raise TypeError(
                f"DeviceFigures.multiprocessors must be an int, got {type(cores).__name__}"
            )
        if cores < 1:
            raise ValueError(f"DeviceFigures.multiprocessors is {cores}: a GPU has at least 1")

    def bound(self, pairs: int, nbytes: int, dtype: Any) -> float:
        """The least time a step of ``pairs`` add+max pairs moving ``nbytes`` can take.

        Args:
            pairs: The step's (x)-and-(+) pairs: batch * M * N * K.
            nbytes: The bytes it must move through device memory: each operand read once,
                the result written once (and any copy read and written).
            dtype: Its element type (a NumPy dtype or its name).

        Returns:
            Seconds: the longer of the pairs at the probe's rate and the bytes at the copy's.

        Raises:
            KeyError: ``dtype`` is not one of the kernels' element types.
        """
        name = np.dtype(dtype).name
        rate = self.pairs_per_s["int32" if name == "bool" else name]
        return max(pairs / rate, nbytes / self.copy_bytes_per_s)

    def to_json(self) -> dict[str, Any]:
        """The figures as JSON data (what the record holds).

        Returns:
            A dict of ``gpu``, ``pairs_per_s``, ``copy_bytes_per_s`` and ``multiprocessors``.
        """
        return {
            "gpu": self.gpu,
            "pairs_per_s": dict(self.pairs_per_s),
            "copy_bytes_per_s": self.copy_bytes_per_s,
            "multiprocessors": self.multiprocessors,
        }


def _check_ceiling(field: str, value: object) -> None:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"DeviceFigures.{field} must be a number, got {type(value).__name__}")
    try:
        x = float(value)
    except OverflowError:  # an int past float64's range
        x = math.inf
    if not (math.isfinite(x) and x > 0):
        raise ValueError(
            f"DeviceFigures.{field} is {value!r}: a ceiling is a finite number above 0, per second"
        )


# What ranks contraction orders where no GPU's figures were measured in the process (planning
# needs no GPU): an H200's f32, f64 and int32 (DPX) probes and copy bandwidth, as measured in
# benchmarks/results/tropical_gemm-nvidia-h200.md; int64, which that run did not probe, at half
# int32's rate (its add and max take two instructions each). An order's rank depends on the
# figures' ratios, not on their scale.
MODEL_FIGURES = DeviceFigures(
    "NVIDIA H200 (modelled)",
    {"float32": 15.53e12, "float64": 5.41e12, "int32": 15.10e12, "int64": 7.55e12},
    4.22e12,
    132,
)


def probe_spec(dtype: str) -> KernelSpec:
    """The register probe of one element type.

    Args:
        dtype: ``"float32"``, ``"float64"``, ``"int32"`` or ``"int64"``.

    Returns:
        Its KernelSpec (kernels/tropical_probe.cu).

    Raises:
        KeyError: Another dtype.
    """
    ctype, dpx = PROBE_TYPES[dtype]
    return family_spec("probe", f"probe<{ctype}, {'true' if dpx else 'false'}>")


def known_figures(device: int) -> DeviceFigures | None:
    """The figures of ``device`` measured (or read) in this process, else None.

    Args:
        device: A CUDA device number.

    Returns:
        Its DeviceFigures, or None before ``device_figures`` ran for it.
    """
    return _known.get(device)


async def device_figures(
    device: int | None = None, *, compiler: Compiler | None = None, remeasure: bool = False
) -> DeviceFigures:
    """The ceilings of ``device``: read from the record kept for its kind of GPU, else measured
    (the probe of each element type, a 1 GiB device copy: about a second) and kept.

    Args:
        device: The CUDA device (default: CuPy's current one).
        compiler: The Compiler that fetches the probes and keeps the record (default: the
            process-wide one).
        remeasure: Measure even where a record is kept.

    Returns:
        The device's DeviceFigures.

    Raises:
        aionvrtc.NoDeviceError: No GPU (CuPy finds none).
        aionvrtc.AionvrtcError: A probe could not be compiled or loaded.
        cupy.cuda.memory.OutOfMemoryError: No room for the copy's 2 GiB.
    """
    import cupy

    where = cupy.cuda.Device().id if device is None else device
    if not remeasure and where in _known:
        return _known[where]
    find = functools.partial(_kept_or_measured, where=where, remeasure=remeasure)
    if compiler is None:  # the process-wide one's methods run on its own event loop
        figures = await anyio.to_thread.run_sync(on_default, find)
    else:
        figures = await find(compiler)
    _known[where] = figures
    return figures


async def _kept_or_measured(compiler: Compiler, *, where: int, remeasure: bool) -> DeviceFigures:
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(where)
    gpu = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    name = _record_name(gpu, props)
    target = compiler.target_for(where)
    stored = None if remeasure else await compiler.load_record(name, arch=target)
    figures = _parse(stored) if stored is not None else None
    if figures is None:
        modules = [await compiler.get(probe_spec(t), device=where) for t in PROBE_TYPES]
        figures = await anyio.to_thread.run_sync(_measure, gpu, where, props, modules)
        data = json.dumps(figures.to_json(), sort_keys=True).encode()
        await compiler.save_record(name, data, arch=target)
    return figures


def _record_name(gpu: str, props: Mapping[str, Any]) -> str:
    """The record of a kind of GPU: its name and arch, and the probes' source."""
    return (
        f"tropical-figures/{gpu}/sm_{props['major']}{props['minor']}/" + family_digest("probe")[:16]
    )


def _parse(data: bytes) -> DeviceFigures | None:
    """The figures a record holds, or None for one that is not a record of figures (then they
    are measured again, as a bad cache entry is compiled again): not JSON, nested past the
    parser's recursion limit, of another shape, or a ceiling no GPU has."""
    try:
        raw = json.loads(data)
        return DeviceFigures(
            str(raw["gpu"]),
            {str(k): float(v) for k, v in raw["pairs_per_s"].items()},
            float(raw["copy_bytes_per_s"]),
            int(raw["multiprocessors"]),
        )
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError):
        return None


def _measure(gpu: str, device: int, props: Any, modules: Any) -> DeviceFigures:
    import cupy

    blocks, threads = props["multiProcessorCount"] * 4, 256
    rates = {}
    with cupy.cuda.Device(device):
        for dtype, module in zip(PROBE_TYPES, modules, strict=True):
            rates[dtype] = _pairs_per_s(module, dtype, blocks=blocks, threads=threads)
        rates_copy = _copy_bytes_per_s()
    return DeviceFigures(gpu, rates, rates_copy, int(props["multiProcessorCount"]))


def _pairs_per_s(module: Any, dtype: str, *, blocks: int, threads: int) -> float:
    """The probe of ``dtype`` filling the GPU (4 blocks of 256 threads per SM), timed."""
    import cupy

    ctype, dpx = PROBE_TYPES[dtype]
    kind = np.dtype(dtype).type
    function = module.get_function(f"probe<{ctype}, {'true' if dpx else 'false'}>")
    args = (cupy.zeros(1, dtype=dtype), kind(-1), kind(1), np.int64(_ITERATIONS))
    seconds = timed(lambda: function((blocks,), (threads,), args), _REPEATS)
    return blocks * threads * _ITERATIONS * _PAIRS_PER_ITERATION / seconds


def _copy_bytes_per_s() -> float:
    """A 1 GiB device-to-device copy, timed: bytes read and written per second."""
    import cupy

    src = cupy.ones(_COPY_BYTES // 4, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    seconds = timed(lambda: dst.__setitem__(Ellipsis, src), _REPEATS)
    return 2 * _COPY_BYTES / seconds
