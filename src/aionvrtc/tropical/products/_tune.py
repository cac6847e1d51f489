"""A small autotuner: the fastest tile of each shape class on this GPU, cached through the compiler.

For each shape class and tile variant (element type, with or without argmax) it times the
candidate tiles on one representative product, after checking each candidate's result against
the generic kernel's, itself checked against the NumPy reference on sample rows. The winners are
kept as a record in the compiler's disk cache (keyed by GPU, target, NVRTC version and the
kernels' source), so later processes on the same kind of GPU read them instead of tuning again.
"""

from __future__ import annotations

import functools
import json
import logging
import statistics
from collections.abc import Callable, Iterable
from typing import Any

import anyio.to_thread
import numpy as np

from ..._compiler import Compiler
from ..._exceptions import CompileError
from ..._sync import on_default
from ._launching import launch
from ._product_plan import plan
from ._reference import matmul as numpy_matmul
from ._semirings import SEMIRINGS, numpy_dtype
from ._shape_classes import (
    CANDIDATES,
    SHAPES,
    TILES,
    Tile,
    install,
    tile_fits,
    tile_variant,
    tuned_tiles,
)
from ._specs import family_digest, tiled_spec

__all__ = ["autotune", "random_operands", "timed"]

logger = logging.getLogger("aionvrtc")


def random_operands(shape: tuple[int, ...], dtype: Any, semiring_name: str) -> Any:
    """Fresh random CuPy operands: normal floats, integers in [-1000, 1000); non-negative for
    max-times.

    Floats are drawn in float32 and cast (float64 operands hold float32 values). Made on
    CuPy's current device, with CuPy's random generator.

    Args:
        shape: The array's shape, such as (M, K) or (batch, M, K).
        dtype: The element type: a NumPy dtype, type or name such as ``"float32"``.
        semiring_name: The semiring the operands are for: ``"maxmul"`` gets their absolute
            values, any other name the values as drawn.

    Returns:
        A new CuPy array of ``shape`` and ``dtype``.

    Raises:
        TypeError: ``dtype`` is not one NumPy understands.
        cupy.cuda.memory.OutOfMemoryError: The array does not fit in GPU memory.
    """
    import cupy

    if np.dtype(dtype).kind == "f":
        x = cupy.random.standard_normal(shape, dtype=np.float32).astype(dtype)
    else:
        x = cupy.random.randint(-1000, 1000, size=shape).astype(dtype)
    return cupy.abs(x) if semiring_name == "maxmul" else x


def timed(call: Callable[..., object], repeats: int, *, graph: bool = True) -> float:
    """Median seconds of one ``call`` (GPU work on the current stream), timed with CUDA events.

    With ``graph`` (``call`` must not allocate) the events time replays of a CUDA graph of enough
    calls to run about 2 ms (at most 100): launched one by one from Python, kernels of a few
    microseconds timed the host, not the GPU. Without, each call is timed alone. ``call`` runs
    once first, untimed (to compile, load and allocate), and once more to size the graph.

    Args:
        call: What to time: a function of no arguments that enqueues GPU work on CuPy's
            current stream, such as ``lambda: launch(plan, module, None)``.
        repeats: How many timings the median is taken of: replays of the graph with
            ``graph``, else single calls.
        graph: Time replays of a CUDA graph of the calls, captured on a stream of its own.

    Returns:
        The median time of one call, in seconds.

    Raises:
        statistics.StatisticsError: ``repeats`` is below 1 (a ValueError).
        RuntimeError: With ``graph``, ``call`` did what a stream capture does not allow, such
            as synchronising or allocating GPU memory (CuPy's CUDA error).
    """
    import cupy

    call()  # compiles, loads and allocates outside any capture
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    stream = cupy.cuda.get_current_stream()
    run, inner = call, 1
    if graph:
        start.record()
        call()
        stop.record()
        stop.synchronize()
        once = max(cupy.cuda.get_elapsed_time(start, stop) / 1e3, 1e-7)
        inner = min(100, max(1, int(2e-3 / once)))
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            stream.begin_capture()
            for _ in range(inner):
                call()
            captured = stream.end_capture()
        run = lambda: captured.launch(stream)  # noqa: E731
    samples = []
    for _ in range(repeats):
        start.record(stream)
        run()
        stop.record(stream)
        stop.synchronize()
        samples.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3 / inner)
    return float(statistics.median(samples))


def _record_name(device: int) -> str:
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(device)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    code = family_digest("tiled")[:16]  # the tiled kernels' source: no other family's
    return f"tropical-tiles/{name}/sm_{props['major']}{props['minor']}/{code}"


def _parse(data: bytes) -> dict[str, dict[str, Tile]] | None:
    try:
        table = json.loads(data)
        return {
            kind: {variant: _tile(tile) for variant, tile in variants.items()}
            for kind, variants in table.items()
            if kind in TILES
        }
    except (ValueError, TypeError, AttributeError, RecursionError):  # RecursionError: nested
        return None


def _tile(value: Any) -> Tile:
    if not (isinstance(value, list) and len(value) == 6 and all(type(v) is int for v in value)):
        raise TypeError(f"not a tile: {value!r}")
    return (value[0], value[1], value[2], value[3], value[4], value[5])


def _tuned_dtypes(dtypes: Iterable[object]) -> list[np.dtype[np.generic]]:
    """``dtypes`` as NumPy dtypes, each one the tuned kernels are built for (the numeric ones:
    and-or on bool has no tuned kernel); else ValueError naming the argument and the choices."""
    if isinstance(dtypes, str | np.dtype):
        raise TypeError(f"dtypes must be a list such as ['float32'], not {dtypes!r}")
    numeric = SEMIRINGS["maxplus"].dtypes
    checked = []
    for dtype in dtypes:
        found = numpy_dtype(dtype, "dtypes")
        if found not in numeric:
            allowed = ", ".join(str(d) for d in numeric)
            raise ValueError(f"dtypes: autotune tunes {allowed}, not {found}")
        checked.append(found)
    return checked


async def autotune(
    dtypes: Iterable[object] = ("float32", "float64", "int32", "int64"),
    *,
    kinds: Iterable[str] = tuple(SHAPES),
    argmax: Iterable[bool] = (False, True),
    device: int = 0,
    retune: bool = False,
    repeats: int = 5,
    compiler: Compiler | None = None,
    report: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, dict[str, Tile]]:
    """Tune the tiles of the named shape classes for ``dtypes`` (with and without argmax) on
    ``device``, and use them for matmul on that device from now on.

    The winners are read from ``compiler``'s disk cache when an earlier run on the same kind of
    GPU stored them, unless ``retune``; otherwise each candidate is compiled through the
    compiler, checked, timed on the class's representative product (SHAPES) and the fastest
    stored. A candidate that does not compile, or whose result differs from the generic
    kernel's, is skipped (and logged); a class none of whose candidates serves keeps its tile.
    Max-plus stands for the three semirings the tuned kernels serve.

    Args:
        dtypes: The element types to tune: float32, float64, int32 or int64 (and-or on bool
            has no tuned kernel).
        kinds: The shape classes to tune, keys of ``SHAPES``. Default: all.
        argmax: The variants to tune: without argmax (False), with it (True), or both.
        device: The CUDA device to tune on and for.
        retune: Time the candidates even where a stored record has the winners.
        repeats: How many timings each candidate's median is taken of.
        compiler: The Compiler that compiles the candidates and keeps the record. Default: the
            process-wide Compiler (the tuning then runs on its event loop, in its thread).
        report: A function that receives one dict per candidate timed, with keys ``"class"``,
            ``"variant"``, ``"tile"`` (a list), ``"seconds"`` and ``"pairs_per_s"``; called
            in the process-wide Compiler's thread where ``compiler`` is None.

    Returns:
        The table now in use on ``device``, by shape class then variant to a tile (as
        ``tuned_tiles(device)`` returns it).

    Raises:
        TypeError: ``dtypes`` is a str or a dtype, not a list of them.
        ValueError: An entry of ``dtypes`` is not a dtype, or not one that autotune tunes
            (raised before the GPU is used); a name of ``kinds`` is not a shape class;
            ``repeats`` is below 1 where a candidate is timed (``statistics.StatisticsError``).
        AssertionError: The generic kernel's result disagrees with the NumPy reference: the
            candidates could not be checked, so nothing is tuned.
        CompileError: NVRTC refused the generic kernel, against which candidates are checked.
        NvrtcError: NVRTC cannot be used, or cannot compile for this GPU.
        ModuleLoadError: A kernel could not be loaded onto the device
            (``GPUOutOfMemoryError`` where GPU memory is full).
        cupy.cuda.memory.OutOfMemoryError: The representative product's operands and
            outputs do not fit in GPU memory.
        CompilerClosed: ``compiler`` is closed.
        RuntimeError: ``compiler`` has not been opened (``async with``); there is no usable
            GPU, or ``device`` is not one of this machine's (CuPy's ``CUDARuntimeError``).
    """
    tune = functools.partial(
        _autotune, tuned=_tuned_dtypes(dtypes),  # checked before anything needs the GPU
        kinds=tuple(kinds), argmax=tuple(argmax), device=device, retune=retune,
        repeats=repeats, report=report,
    )  # fmt: skip
    if compiler is None:  # the process-wide one's methods run on its own event loop
        return await anyio.to_thread.run_sync(on_default, tune)
    return await tune(compiler)


async def _autotune(
    compiler: Compiler,
    *,
    tuned: list[np.dtype[np.generic]],
    kinds: tuple[str, ...],
    argmax: tuple[bool, ...],
    device: int,
    retune: bool,
    repeats: int,
    report: Callable[[dict[str, Any]], None] | None,
) -> dict[str, dict[str, Tile]]:
    import cupy

    with cupy.cuda.Device(device):
        name = _record_name(device)
    # The kernels and the record of the device's own target (see Compiler.target_for), which
    # need not be the compiler's default target.
    target = compiler.target_for(device)
    table = {kind: dict(variants) for kind, variants in tuned_tiles(device).items()}
    stored = None if retune else await compiler.load_record(name, arch=target)
    known = _parse(stored) if stored is not None else None
    wanted = [(kind, dtype, flag) for kind in kinds for dtype in tuned for flag in argmax]
    todo = []
    for kind, dtype, flag in wanted:
        if kind not in SHAPES:
            raise ValueError(f"unknown shape class {kind!r}; the classes are {tuple(SHAPES)}")
        variant = tile_variant(dtype, argmax=flag)
        if known is not None and variant in known.get(kind, {}):
            table[kind][variant] = known[kind][variant]
        else:
            todo.append((kind, dtype, flag))
    # Every candidate compiles in the background (as parallel as the compiler allows) while
    # the first ones are timed.
    compiler.prefetch(
        (
            tiled_spec(SEMIRINGS["maxplus"], dtype, argmax=flag, accumulate=False, tile=tile)
            for kind, dtype, flag in todo
            for tile in CANDIDATES[kind]
            if tile_fits(tile, dtype.itemsize, argmax=flag)
        ),
        arch=target,
    )
    for kind, dtype, flag in todo:
        variant = tile_variant(dtype, argmax=flag)
        with cupy.cuda.Device(device):
            best = await _tune_one(
                compiler, kind=kind, dtype=dtype, argmax=flag, device=device,
                repeats=repeats, report=report,
            )  # fmt: skip
        if best is not None:
            table[kind][variant] = best
    install(device, table)
    await compiler.save_record(name, json.dumps(table, sort_keys=True).encode(), arch=target)
    return table


async def _tune_one(
    compiler: Compiler,
    *,
    kind: str,
    dtype: np.dtype[Any],
    argmax: bool,
    device: int,
    repeats: int,
    report: Callable[[dict[str, Any]], None] | None,
) -> Tile | None:
    ring = "maxplus"  # the semirings' fast steps cost the same; max-plus stands for all three
    batch, m, n, k = SHAPES[kind]
    shape_a, shape_b = ((batch, m, k), (batch, k, n)) if batch > 1 else ((m, k), (k, n))
    a, b = random_operands(shape_a, dtype, ring), random_operands(shape_b, dtype, ring)
    generic = plan(a, b, ring, argmax=argmax, out=None, accumulate=False, tile=None)
    launch(generic, await compiler.get(generic.spec, device=device), None)
    want = (generic.c, generic.index) if argmax else generic.c
    _check_rows(a, b, want, argmax)
    variant = tile_variant(dtype, argmax=argmax)
    timings: list[tuple[float, Tile]] = []
    for tile in CANDIDATES[kind]:
        if not tile_fits(tile, dtype.itemsize, argmax=argmax):
            continue
        planned = plan(a, b, ring, argmax=argmax, out=None, accumulate=False, tile=tile)
        try:
            module = await compiler.get(planned.spec, device=device)
        except CompileError as exc:
            logger.info("tile %s of %s/%s does not compile: %s", tile, kind, variant, exc)
            continue
        launch(planned, module, None)
        if not _same((planned.c, planned.index) if argmax else planned.c, want, argmax):
            logger.warning("tile %s of %s/%s gives a wrong result: skipped", tile, kind, variant)
            continue
        seconds = timed(lambda: launch(planned, module, None), repeats)  # noqa: B023 (called now)
        timings.append((seconds, tile))
        if report is not None:
            report(
                {
                    "class": kind,
                    "variant": variant,
                    "tile": list(tile),
                    "seconds": seconds,
                    "pairs_per_s": batch * m * n * k / seconds,
                }
            )
    return min(timings)[1] if timings else None


def _check_rows(a: Any, b: Any, got: Any, argmax: bool) -> None:
    """Sample rows of the generic kernel's result against the NumPy reference."""
    import cupy

    a2, b2 = (a[0], b[0]) if a.ndim == 3 else (a, b)
    values = got[0] if argmax else got
    v2 = values[0] if values.ndim == 3 else values
    rows = np.random.default_rng().choice(a2.shape[0], size=min(8, a2.shape[0]), replace=False)
    want = numpy_matmul(cupy.asnumpy(a2[rows]), cupy.asnumpy(b2), "maxplus", argmax=argmax)
    if argmax:
        i2 = got[1][0] if got[1].ndim == 3 else got[1]
        ok = np.array_equal(cupy.asnumpy(v2[rows]), want[0]) and np.array_equal(
            cupy.asnumpy(i2[rows]), want[1]
        )
    else:
        ok = np.array_equal(cupy.asnumpy(v2[rows]), want)
    if not ok:
        raise AssertionError("the generic kernel disagrees with the reference: not tuning")


def _same(got: Any, want: Any, argmax: bool) -> bool:
    import cupy

    if argmax:
        return bool(cupy.array_equal(got[0], want[0]) and cupy.array_equal(got[1], want[1]))
    return bool(cupy.array_equal(got, want))
