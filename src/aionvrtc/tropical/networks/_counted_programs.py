"""Counted contractions compiled (``counted_program``): a plan's counted run (_counted)
captured once as a CUDA graph, replayed per call.

The eager counted run launches each step from Python (a counted product's checks and
arguments, its operands' copies and fills: tens of microseconds a step), which outweighs the
GPU's work in a network of thousands of small steps. The launches are the same from call to
call, so a program runs them once (every kernel fetched, its own form; CuPy's kernels
compiled), then captures a second run. The run's arrays come from a memory pool of the
program's own: an array the run drops goes back to that pool and is handed to the run's next
allocation that fits, on the same stream, so the program holds about the run's peak live set
rather than every intermediate, and no one else is handed memory that its graph writes. A call
copies the operands into the program's inputs, replays the graph on the caller's stream and
copies the result and its counts out.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections.abc import Callable, Generator, Sequence
from typing import Any

import numpy as np

from ..._compiler import Compiler
from ..._cuda import Module
from .._bounded import keep
from ..products import (
    Offload,
    OnDevice,
    Semiring,
    Wait,
    Work,
    cupy_module,
    loaded,
    run_async,
    run_sync,
)
from ..products import semiring as lookup
from ._counted import check_top_on_gpu, count_bound, counted_runs, exact_counts, on_stream
from ._plan import EinsumPlan
from ._planner import planned_for
from ._programs import program_arguments, settle
from ._residues import INT64_MAX
from ._runs import check_counted_plan, resolved_stream
from ._subscripts import check_semiring

__all__ = [
    "MAX_COUNTED_PROGRAMS",
    "CountedProgram",
    "clear_counted_programs",
    "counted_program",
    "counted_program_sync",
]

# Counted programs kept in the process, the least recently used dropped first: each holds its
# memory pool (about its run's peak live set) on its device.
MAX_COUNTED_PROGRAMS = 16

_programs: dict[Any, CountedProgram] = {}


class CountedProgram:
    """A counted tropical einsum compiled for one device, from ``counted_program``.

    ``run`` (async) or ``run_sync`` with operands of the shapes and dtype it was made for (or
    with none to read ``inputs`` as they are):
    (the result, its counts) as ``einsum(..., count=True)`` gives them, or with ``top`` (the
    ``top`` best values, their counts) as ``einsum(..., top=k)`` does, in new arrays. A call
    copies the operands into ``inputs``, replays the graph of the counted run's launches and
    copies the result out. Counts are exact: where one passes 2^63 - 1 the call counts again
    modulo primes, eagerly (``einsum(..., count=True)``'s way), and returns Python's ints in a
    NumPy array; with ``top`` such a count is -1 and the values stand. Calls on any streams
    are ordered among themselves (a call waits for the previous one's work), and from any
    threads.

    Made by ``counted_program``, which caches programs; the constructor's arguments are what
    it captured.

    Args:
        planned: The plan it runs (unsliced).
        ring: The semiring.
        top: The length of each element's list of best values, or None: the value and its
            count.
        inputs: The bound input buffers, C-contiguous CuPy arrays in ``pool``.
        output: The bound result (values, counts), in ``pool``.
        graph: The captured graph of the counted run over ``inputs`` into ``output``.
        modules: The loaded modules whose kernels ``graph`` launches (held: a module dropped
            by its Compiler would be unloaded under the graph).
        pool: The CuPy memory pool that holds every buffer the graph reads and writes.
        compiler: The Compiler that fetched the kernels (the recount past int64 fetches its
            own through it).

    Attributes:
        plan: The ``EinsumPlan`` it runs.
        semiring: The semiring's name.
        top: The length of each element's list of best values, or None.
        dtype: The NumPy dtype of the operands and the result.
        device: The number of the device it runs on.
        shape: The result's shape (with ``top``, the lists' axis last).
        inputs: The bound input buffers, one per operand: C-contiguous CuPy arrays the program
            owns.
        output: The bound result and its counts, CuPy arrays the program owns, which every
            call overwrites.
        nbytes: The device memory the program holds, in bytes: its inputs, its result and the
            run's intermediates, each reused once the run is done with it.

    Raises:
        cupy.cuda.runtime.CUDARuntimeError: The output's device is not one this process sees
            (the program's event is made there).
    """

    def __init__(
        self,
        planned: EinsumPlan,
        ring: Semiring,
        top: int | None,
        *,
        inputs: Sequence[Any],
        output: tuple[Any, Any],
        graph: Any,
        modules: Sequence[Module],
        pool: Any,
        compiler: Compiler | None,
    ) -> None:
        cupy = cupy_module()
        self.plan, self.semiring, self.top = planned, ring.name, top
        self._ring, self._compiler = ring, compiler
        self.inputs, self.output = tuple(inputs), output
        self.dtype = np.dtype(output[0].dtype)
        self.device, self.shape = output[0].device.id, tuple(output[0].shape)
        self._graph, self._pool, self._modules = graph, pool, tuple(modules)
        with OnDevice(self.device):  # (a pool counts the bytes of the current device)
            self.nbytes = int(pool.total_bytes())
            self._done = cupy.cuda.Event(block=False, disable_timing=True)
        # The pool goes back to the device only once the last call's work is done.
        weakref.finalize(self, settle, self._done, [pool, graph, self.inputs, output])
        self._last: int | None = None  # the stream of the last call
        self._lock = threading.Lock()

    async def run(self, *operands: Any, stream: Any = None) -> tuple[Any, Any]:
        """The counted contraction of ``operands`` (CuPy arrays of the shapes and dtype the
        program was made for, on its device, in any layout).

        Args:
            *operands: One CuPy array per input.
            stream: The CuPy stream to enqueue on (default: the current stream of the
                program's device).

        Returns:
            (the result, its counts) in new arrays, as ``einsum(..., count=True)`` or
            ``top=k`` returns them.

        Raises:
            TypeError: An operand is not a CuPy array.
            ValueError: Not one operand per input, or one of another shape, dtype or device.
            aionvrtc.AionvrtcError: A kernel of the recount past int64 could not be
                fetched.
        """
        return await run_async(self._call(operands, stream))

    def run_sync(self, *operands: Any, stream: Any = None) -> tuple[Any, Any]:
        """``run`` for code that is not async.

        Args:
            *operands: One CuPy array per input.
            stream: The CuPy stream to enqueue on (default: the device's current stream).

        Returns:
            (the result, its counts) in new arrays.

        Raises:
            TypeError: An operand is not a CuPy array.
            ValueError: Not one operand per input, or one of another shape, dtype or device.
            aionvrtc.AionvrtcError: A kernel of the recount past int64 could not be fetched.
        """
        return run_sync(self._call(operands, stream))

    def _call(self, operands: Sequence[Any], stream: Any) -> Work[tuple[Any, Any]]:
        operands = operands or self.inputs
        self._check(operands)
        stream = resolved_stream(self.device, stream)
        value, count = self._replay(operands, stream)
        if self.top is not None or count_bound(self.plan) <= INT64_MAX:
            return value, count
        on = on_stream(self.device, stream)
        with on():  # copies laid out as the plan reads them (the next call refills the inputs)
            arrays = [cupy_module().array(x, order="C", copy=True) for x in operands]
        again = counted_runs(self.plan, self._ring, arrays, top=None, stream=stream, on=on,
                             compiler=self._compiler)  # fmt: skip
        return value, (yield from exact_counts(self.plan, count, again, stream=stream, on=on))

    def _check(self, operands: Sequence[Any]) -> None:
        cupy = cupy_module()
        if len(operands) != len(self.inputs):
            raise ValueError(
                f"this counted program takes {len(self.inputs)} operands, got {len(operands)}"
            )
        for i, (x, bound) in enumerate(zip(operands, self.inputs, strict=True)):
            if not isinstance(x, cupy.ndarray):
                raise TypeError(f"operand {i} must be a CuPy array, not {type(x).__name__}")
            if x.shape != bound.shape or x.dtype != bound.dtype or x.device.id != self.device:
                raise ValueError(
                    f"operand {i} is {x.dtype}{list(x.shape)} on device {x.device.id}; this "
                    f"program takes {bound.dtype}{list(bound.shape)} on device {self.device} "
                    "(make another with counted_program)"
                )

    def _replay(self, operands: Sequence[Any], stream: Any) -> tuple[Any, Any]:
        """The operands copied in, the graph replayed and the result copied out, on
        ``stream`` after the previous call's work."""
        cupy = cupy_module()
        with self._lock, OnDevice(self.device), stream:
            if self._last is not None:  # (two streams may share a handle: always)
                stream.wait_event(self._done)
            for x, bound in zip(operands, self.inputs, strict=True):
                if x.data.ptr != bound.data.ptr or x.strides != bound.strides:
                    cupy.copyto(bound, x)
            self._graph.launch(stream)
            value, count = (x.copy() for x in self.output)
            self._done.record(stream)
            self._last = stream.ptr
        return value, count


async def counted_program(
    subscripts: str,
    *operands: Any,
    semiring: str = "maxplus",
    top: int | None = None,
    optimize: Any = "auto",
    dtype: Any = None,
    device: int | None = None,
    compiler: Compiler | None = None,
) -> CountedProgram:
    """``einsum(..., count=True)`` (or ``top=k``) compiled once for operands of these shapes
    and dtype on one device.

    The plan (``optimize``, as ``einsum``'s) is run once with counts, every kernel fetched
    through ``compiler``, then its launches are captured as a CUDA graph over memory the
    program owns (each intermediate's memory reused once the run is done with it). Programs
    are cached in the process per (plan, semiring, dtype, top, device), up to
    MAX_COUNTED_PROGRAMS, least recently used dropped first: asking again returns the same
    program. It pays where a network is counted more than a few times: a replay launches once
    where ``einsum(..., count=True)`` launches every step from Python.

    Args:
        subscripts: NumPy's einsum grammar, as ``einsum`` takes it.
        *operands: CuPy arrays (their shapes, dtype and device; NumPy arrays give their shapes
            and dtype), or shapes (tuples of ints) with ``dtype=``: one per operand.
        semiring: ``"maxplus"``, ``"minplus"``, ``"maxmul"`` or ``"andor"``.
        top: Keep each element's ``top`` best distinct values with their counts (1 to 16),
            as ``einsum(..., top=k)``; None: the value and its count.
        optimize: The order, as ``einsum_plan`` takes it. A sliced plan is refused: a program
            contracts the whole network at once.
        dtype: The operands' dtype: needed with shapes; with arrays, None or theirs.
        device: The number of the device to run on (default: the CuPy arrays', else the
            current device).
        compiler: The Compiler that fetches the kernels (default: aionvrtc's process-wide
            Compiler).

    Returns:
        The program: the cached one where it was asked for before.

    Raises:
        TypeError: As ``einsum_program``: the subscripts, the operands or ``dtype`` are not of
            a kind it takes; ``top`` is not an int.
        ValueError: As ``einsum_program``: bad arguments, what ``einsum_plan`` refuses, a
            sliced plan or an index of size 0; ``top`` below 1 or past 16; the counted
            intermediates larger than the device's memory.
        cupy.cuda.memory.OutOfMemoryError: The device has not the program's memory free.
        RuntimeError: ``compiler`` is not open yet (``async with Compiler(...)``).
        aionvrtc.AionvrtcError: A kernel could not be fetched (see ``einsum_program``).
    """
    made = make_counted_program(subscripts, operands, semiring=semiring, top=top,
                                optimize=optimize, dtype=dtype, device=device,
                                compiler=compiler)  # fmt: skip
    return await run_async(made)


def counted_program_sync(
    subscripts: str,
    *operands: Any,
    semiring: str = "maxplus",
    top: int | None = None,
    optimize: Any = "auto",
    dtype: Any = None,
    device: int | None = None,
    compiler: Compiler | None = None,
) -> CountedProgram:
    """``counted_program`` for code that is not async: compile the program in this thread.

    ``compiler``, if given, must run in a portal or this must be a worker thread of its event
    loop.

    Args:
        subscripts: NumPy's einsum grammar, as ``einsum`` takes it.
        *operands: CuPy arrays, or shapes (tuples of ints) with ``dtype=``: one per operand.
        semiring: ``"maxplus"``, ``"minplus"``, ``"maxmul"`` or ``"andor"``.
        top: Each element's ``top`` best values with their counts (1 to 16); None: the value
            and its count.
        optimize: The order, as ``einsum_plan`` takes it (not a sliced plan).
        dtype: The operands' dtype: needed with shapes.
        device: The number of the device to run on (default: the CuPy arrays', else the
            current device).
        compiler: The Compiler that fetches the kernels (default: aionvrtc's process-wide
            Compiler).

    Returns:
        As ``counted_program``: the program, the cached one where it was asked for before.

    Raises:
        TypeError: As ``counted_program``.
        ValueError: As ``counted_program``.
        cupy.cuda.memory.OutOfMemoryError: The device has not the program's memory free.
        RuntimeError: ``compiler`` is not open yet, or a kernel must be fetched through a
            ``compiler`` without a portal from a thread that is not a worker thread of its
            event loop.
        aionvrtc.AionvrtcError: A kernel could not be fetched.
    """
    made = make_counted_program(subscripts, operands, semiring=semiring, top=top,
                                optimize=optimize, dtype=dtype, device=device,
                                compiler=compiler)  # fmt: skip
    return run_sync(made)


def clear_counted_programs() -> None:
    """Drop every cached counted program (their memory goes back once their calls are done)."""
    _programs.clear()


def make_counted_program(
    subscripts: str,
    operands: Sequence[Any],
    *,
    semiring: str,
    top: int | None,
    optimize: Any,
    dtype: Any,
    device: int | None,
    compiler: Compiler | None,
) -> Work[CountedProgram]:
    """The body of ``counted_program`` and ``counted_program_sync`` (see _twins)."""
    ring = lookup(semiring)
    check_semiring(subscripts, semiring)
    check_top_on_gpu(top, False)
    shapes, kind, where = program_arguments(operands, dtype, device, caller="counted_program")
    ring.check_dtype(kind)
    planned = yield from planned_for(subscripts, shapes, optimize)
    if planned.slicing is not None:
        raise ValueError(
            f"counted_program: the plan is sliced ({planned.slicing.count:,} slices over "
            f"{', '.join(planned.slicing.indices)}) and a program counts the whole network at "
            "once; pass the plan to einsum(..., count=True), or plan without memory_limit="
        )
    empty = [i for i, n in planned.sizes.items() if n == 0]
    if empty:
        raise ValueError(
            f"counted_program: index {empty[0]!r} has size 0, so the result is the semiring's "
            "zero counted by none and nothing is launched; call einsum(..., count=True)"
        )
    check_counted_plan(planned, kind, top=top, device=where)
    key = (planned, ring.name, kind, top, where, id(compiler) if compiler else None)
    found = _programs.pop(key, None)
    if found is not None:
        _programs[key] = found  # the most recently used last
        return found
    program = yield from _made(planned, ring, kind, top=top, device=where, compiler=compiler)
    keep(_programs, key, program, MAX_COUNTED_PROGRAMS)
    return program


def _made(
    planned: EinsumPlan,
    ring: Semiring,
    dtype: np.dtype[Any],
    *,
    top: int | None,
    device: int,
    compiler: Compiler | None,
) -> Work[CountedProgram]:
    """The program: a warm run over its inputs (every kernel fetched, its own form), then a
    second run captured, both on a stream and a memory pool of its own."""
    cupy = cupy_module()
    pool = cupy.cuda.MemoryPool()
    with OnDevice(device):
        stream = cupy.cuda.Stream(non_blocking=True)

    @contextlib.contextmanager
    def on() -> Any:
        # Entered only around array work (never across a yield): other tasks' allocations
        # meanwhile are not the program's.
        with OnDevice(device), stream, cupy.cuda.using_allocator(pool.malloc):
            yield

    with on():  # (any values: every launch is the same whatever they are)
        inputs = [cupy.full(shape, ring.one(dtype), dtype) for shape in planned.shapes()]
    run = counted_runs(planned, ring, inputs, top=top, stream=stream, on=on, compiler=compiler,
                       standins=False)  # fmt: skip
    yield from run(None)
    yield Wait(stream)
    # Capturing runs the whole plan's Python (milliseconds to a second): off the loop.
    captured = yield Offload(
        functools.partial(_capture, run(None), device=device, stream=stream, on=on,
                          compiler=compiler)
    )  # fmt: skip
    graph, output, modules = captured
    return CountedProgram(planned, ring, top, inputs=inputs, output=output, graph=graph,
                          modules=modules, pool=pool, compiler=compiler)  # fmt: skip


def _capture(
    run: Generator[Any, Any, tuple[Any, Any]],
    *,
    device: int,
    stream: Any,
    on: Callable[[], contextlib.AbstractContextManager[Any]],
    compiler: Compiler | None,
) -> tuple[Any, tuple[Any, Any], list[Module]]:
    """The counted ``run`` (not started yet) captured from ``stream``: (the graph, the result
    and its counts it writes, the modules it launches). Every kernel is loaded (the warm run
    fetched them), so the run asks for nothing: a request is an error here."""
    modules: list[Module] = []
    # A thread's first OnDevice on its current device binds the context (a cudaFree): here,
    # not in the capture.
    with OnDevice(device), OnDevice(device), on():
        stream.begin_capture()
        try:
            output = _loaded_only(run, compiler, modules)
        except BaseException:
            with contextlib.suppress(Exception):  # (an invalidated capture says so again)
                stream.end_capture()
            raise
        graph = stream.end_capture()
        graph.upload(stream)
    stream.synchronize()
    return graph, output, modules


def _loaded_only(
    work: Generator[Any, Any, tuple[Any, Any]], compiler: Compiler | None, modules: list[Module]
) -> Any:
    """``work`` driven without waiting on anything: a fetch answered from the loaded modules,
    each added to ``modules`` (RuntimeError where one is not loaded), any other request
    refused."""
    try:
        request = next(work)
        while True:
            specs = getattr(request, "specs", None)  # (a Fetch's)
            if specs is None:
                work.close()
                raise RuntimeError(f"a counted program's capture cannot wait ({request!r})")
            found = [loaded(spec, request.device, compiler) for spec in specs]
            if any(module is None for module in found):
                work.close()
                raise RuntimeError("a counted program's kernel was unloaded before its capture")
            modules.extend(found)  # type: ignore[arg-type]  # (none is None: checked)
            request = work.send(found)
    except StopIteration as done:
        return done.value
