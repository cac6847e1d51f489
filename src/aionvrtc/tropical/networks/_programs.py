"""Compiled contractions: a planned einsum's launches captured once as a CUDA graph over buffers
the program owns, replayed per call.

A call gathers the caller's operands into the bound inputs with one launch (their addresses are
the launch's arguments, so the graph never changes), replays the graph, and copies the result
out (with argmax=True the assignment too, found by a kernel in the graph: one copy back). The
graph's steps run on as many branches as the contraction tree has (its capture forks a stream
per branch and joins them by events), so independent steps run side by side on the GPU.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, NamedTuple

import anyio
import anyio.to_thread
import numpy as np

from ..._compiler import Compiler
from ..._cuda import Module, synchronize
from ..._spec import KernelSpec
from .._bounded import keep
from ..products import (
    Fetch,
    Offload,
    OnDevice,
    Packed,
    Semiring,
    Work,
    cupy_module,
    load_soon,
    loaded,
    numpy_dtype,
    run_async,
    run_sync,
)
from ..products import semiring as lookup
from ._batched import batched_network, check_batch
from ._fusion import grouped_plan
from ._kernel_specs import einsum_spec, many_spec
from ._lifetimes import LANES, lanes
from ._plan import EinsumPlan
from ._planner import planned_for
from ._rows import THREADS, Group, many_blocks, many_row
from ._runs import assignment, check_out, copy_back, resolved_stream, steps_for
from ._schedule import Arena, Schedule, arena, schedule
from ._steps import (
    MAX_GATHER,
    MAX_STEPS,
    Op,
    Steps,
    backtrace_launch,
    resolve,
    steps_key,
    walks,
)
from ._subscripts import check_semiring

__all__ = [
    "MAX_PROGRAMS",
    "MAX_PROGRAM_BYTES",
    "EinsumProgram",
    "clear_programs",
    "einsum_program",
    "einsum_program_sync",
    "make_program",
    "program_arguments",
    "settle",
]

# Programs kept in the process, the least recently used dropped first past either bound (the
# bytes: of each device's programs): each holds its buffers (the inputs, every intermediate at
# once, the result) on its device.
MAX_PROGRAMS = 64
MAX_PROGRAM_BYTES = 1 << 30

_ALIGN = 256
_THREADS = 256
_SHAPE = operator.attrgetter("shape")
_STRIDES = operator.attrgetter("strides")
_DTYPE = operator.attrgetter("dtype")
_DEVICE = operator.attrgetter("data.device_id")
_POINTER = operator.attrgetter("data.ptr")
# The groups of steps of a level that are small run in one launch of tropical_many (one per
# size class), each reading its operands as they are: a group of several steps (see _fusion),
# a tiny lone step, and one that would copy an operand first (_fusion.read_in_place).
_MAX_GRID_Y = 65535


class Batch(NamedTuple):
    """A program over a batch of queries: ``size`` of them, the operands at ``operands`` with a
    leading axis of ``size`` (the plan's index ``symbol``, which leads the result too), the
    others shared by every query."""

    size: int
    operands: tuple[int, ...]
    symbol: str


def _aligned(nbytes: int) -> int:
    return -(-max(nbytes, 1) // _ALIGN) * _ALIGN


class _Layout(NamedTuple):
    """Where a program keeps its inputs, its result and its arena (its steps' buffers placed
    by their lifetimes: ``_schedule``) in its one allocation of ``nbytes``."""

    sizes: list[int]  # each input's bytes
    offsets: list[int]  # and where it starts
    output_at: int
    arena_at: int
    nbytes: int


def _layout(steps: Steps, placed: Arena) -> _Layout:
    """The layout of a program of ``steps`` whose arena is ``placed``."""
    item = steps.dtype.itemsize
    sizes = [int(np.prod(shape, dtype=np.int64)) * item for shape in steps.plan.shapes()]
    offsets, end = [], 0
    for nbytes in sizes:
        offsets.append(end)
        end += _aligned(nbytes)
    arena_at = end + _aligned(int(np.prod(steps.shape, dtype=np.int64)) * item)
    return _Layout(sizes, offsets, end, arena_at, arena_at + placed.nbytes)


class EinsumProgram:
    """A tropical einsum compiled for one device, from ``einsum_program``.

    ``run`` (async) or ``run_sync`` with operands of the shapes and dtype it was made for, or
    with none to read ``inputs`` in place. A call gathers the operands into ``inputs`` with one
    launch, replays the graph of the contraction's launches, and copies the result out.

    ``inputs`` are the bound input buffers (C-contiguous CuPy arrays the program owns): write
    into them and call without operands to skip the gather. ``output`` is the bound result;
    pass it as ``out=`` to skip the copy out (it holds the next call's result then). Calls on
    any streams are ordered among themselves (a call waits for the previous one's work), and
    from any threads.

    Made by ``einsum_program``, which caches programs; the constructor's arguments are what it
    prepared and fetched.

    Args:
        steps: The contraction's prepared launches, for one plan, semiring, dtype, argmax and
            device.
        modules: The loaded modules of the kernels of ``steps``, in the order of its specs.
        gather: The loaded module of the gather kernel, which copies the operands into
            ``inputs``.
        many: The loaded module of ``tropical_many``, the kernel that runs many small steps in
            one launch.
        semiring: The semiring's name.
        batch: For a program over a batch of queries, its size, the varying operands and the
            batch's index in the plan (``einsum_program(..., batch=)``).
        made: The units its graph launches, in order (``_schedule.schedule`` of the plan).
        placed: Where the buffers of ``steps`` (prepared without reuse) lie in its arena,
            by their lifetimes along ``made`` (``_schedule.arena``).

    Attributes:
        plan: The ``EinsumPlan`` it runs.
        semiring: The semiring's name.
        argmax: Whether a call also returns an assignment that attains the result.
        dtype: The NumPy dtype of the operands and the result.
        device: The number of the device it runs on.
        shape: The result's shape.
        inputs: The bound input buffers, one per operand: C-contiguous CuPy arrays the program
            owns.
        output: The bound result, a CuPy array the program owns, which every call overwrites.
        nbytes: The device memory the program holds, in bytes: its inputs, its result and its
            arena.
        arena_bytes: The arena's bytes: the intermediates (results, argmaxes, copies and the
            assignment), two of them sharing bytes where the graph orders every use of one
            before the other's (about the peak live set: compare ``plan.live_elements``).
        launches: The kernels its graph runs (a chain of small steps takes one, and a level's
            small groups share one per size).
        copies: How many of those launches copy an operand (a small step reads its operands as
            they are).
        batch: The queries of a batched program (``einsum_program(..., batch=)``), else None.
        batched: The positions of the operands that vary from query to query in a batched
            program (they lead with the batch's axis), else ().

    Raises:
        cupy.cuda.memory.OutOfMemoryError: The device has not ``nbytes`` free for the
            program's buffers.
    """

    def __init__(
        self,
        steps: Steps,
        modules: Sequence[Module],
        gather: Module,
        many: Module,
        semiring: str,
        *,
        batch: Batch | None = None,
        made: Schedule,
        placed: Arena,
    ) -> None:
        cupy = cupy_module()
        planned = steps.plan
        self.plan, self.semiring, self.argmax = planned, semiring, steps.argmax
        self._batch = batch
        self.batch = batch.size if batch is not None else None
        self.batched = batch.operands if batch is not None else ()
        self.dtype, self.device, self.shape = steps.dtype, steps.device, steps.shape
        # The modules are held: the graph launches their kernels.
        self._steps, self._modules, self._gather = steps, tuple(modules), gather
        self._many_module, self._many_module_spec = (
            many,
            many_spec(lookup(semiring), self.dtype, argmax=self.argmax),
        )
        self._tables: list[Any] = []  # the tiny steps' tables, which the graph reads
        self._depends: list[tuple[int, ...]] = []
        shapes = planned.shapes()
        self._made, self._placed, self.arena_bytes = made, placed, placed.nbytes
        sizes, offsets, output_at, arena_at, self.nbytes = _layout(steps, placed)
        with OnDevice(self.device):
            self._memory = cupy.cuda.alloc(self.nbytes)
            base = self._memory.ptr
            self.inputs = tuple(
                cupy.ndarray(shape, self.dtype, self._memory + at)
                for shape, at in zip(shapes, offsets, strict=True)
            )
            self.output = cupy.ndarray(self.shape, self.dtype, self._memory + output_at)
            self._arena = base + arena_at
            if self.argmax:
                self._assignment_at = self._arena + placed.at(steps.assignment)
            self._shapes = [tuple(s) for s in shapes]
            self._strides = [x.strides for x in self.inputs]
            self._bound = [x.data.ptr for x in self.inputs]
            self._types = {cupy.ndarray}
            # The last call's operands, if laid out as the inputs (held weakly), and their sources.
            self._seen: tuple[list[weakref.ref[Any]], tuple[list[int], list[Any]] | None] = (
                [],
                None,
            )
            self._dtypes = {self.dtype}
            self._devices = {self.device}
            # The tables are written on the capture's stream, before its first launches.
            stream = cupy.cuda.Stream(non_blocking=True)
            with stream:
                self._gathers = self._gather_launches(list(zip(offsets, sizes, strict=True)))
            self._member_gathers: list[tuple[Packed, Any]] | None = None  # (run_members)
            self._varying = frozenset(batch.operands if batch is not None else ())
            # A query's operand's C strides, each input's (without the batch's axis).
            self._query_strides = [
                x.strides[1:] if batch is not None and i in batch.operands else x.strides
                for i, x in enumerate(self.inputs)
            ]
            self._rows = (offsets, sizes)
            self._graph = self._capture(stream)
            self._done = cupy.cuda.Event(block=False, disable_timing=True)
        # The buffers go back to CuPy's pool only once the last call's work is done (a call
        # does not wait for the GPU; the program may be dropped right after one).
        weakref.finalize(self, settle, self._done, [self._memory, self._tables, self._gathers])
        self._last: int | None = None  # the stream of the last call
        self._lock = threading.Lock()

    def _gather_launches(self, rows: Sequence[tuple[int, int]]) -> list[tuple[Packed, Any]]:
        """One gather launch per MAX_GATHER rows (each a source's (offset, bytes) in the
        program's memory), each with its (destination, elements) table on the device."""
        cupy = cupy_module()
        item, base = self.dtype.itemsize, self._memory.ptr
        spec = einsum_spec("gather", item)
        launches = []
        offsets, sizes = [at for at, _ in rows], [nbytes for _, nbytes in rows]
        for start in range(0, len(offsets), MAX_GATHER):
            chunk = range(start, min(start + MAX_GATHER, len(offsets)))
            table = cupy.asarray(
                np.array([[base + offsets[i], sizes[i] // item] for i in chunk], np.int64)
            )
            longest = max(sizes[i] // item for i in chunk)
            blocks = max(1, min(-(-longest // _THREADS), 1024))
            packed = Packed(
                spec, self.device, (blocks, len(chunk), 1), (_THREADS, 1, 1),
                [0, len(chunk), *([0] * MAX_GATHER)],
            )  # fmt: skip
            launches.append((packed, table))
        return launches

    def _capture(self, stream: Any) -> Any:
        """The graph, captured from ``stream`` (and the streams it forks), after one run of
        every launch on it; the small steps' tables written on it first."""
        with stream:
            units = self._units()
        self.launches = sum(len(ops) for ops in units)
        self.copies = sum(
            launcher.spec.name_expressions[0].startswith("einsum_copy")
            for ops in units
            for launcher, _, _ in ops
        )
        # Once outside the capture: every kernel's function is looked up, every launch checked.
        for ops in units:
            for launcher, loaded_module, pointers in ops:
                launcher.run_pointers(loaded_module, pointers, stream)
        stream.synchronize()
        lanes = _Lanes(self._depends, stream)
        stream.begin_capture()
        try:
            for number, ops in enumerate(units):
                on = lanes(number)
                for launcher, loaded_module, pointers in ops:
                    launcher.run_pointers(loaded_module, pointers, on)
            lanes.join()
        finally:
            graph = stream.end_capture()
        graph.upload(stream)
        stream.synchronize()
        return graph

    def _units(self) -> list[list[tuple[Packed, Module, list[int]]]]:
        """The launches of each unit of the schedule (``_schedule``), in order, each after
        those in ``_depends``; the final reordering and the backtrace last (after every
        unit), the backtrace walking the groups (a grouped step's argmax numbers all that
        its steps sum)."""
        steps, placed = self._steps, self._placed
        bound = [x.data.ptr for x in self.inputs]
        result = self.output.data.ptr
        by_step: dict[int, list[Op]] = {}
        for op in steps.ops:
            by_step.setdefault(op.step, []).append(op)

        def launches(ops: Sequence[Op]) -> list[tuple[Packed, Module, list[int]]]:
            return [self._backtrace(op, bound, result) if walks(op.launcher) else
                    (op.launcher, self._modules[op.module],
                     resolve(placed.moved(op.sources), bound, self._arena, result))
                    for op in ops]  # fmt: skip

        units = [
            self._many(unit.groups, bound, result)
            if unit.many
            else launches(by_step.get(unit.groups[0].root, []))
            for unit in self._made.units
        ]
        self._depends = list(self._made.depends)
        ends = by_step.get(len(steps.plan.steps), [])  # after the last step: joins every stream
        units.append(launches(ends))
        return units

    def _backtrace(
        self, op: Op, inputs: Sequence[int], result: int
    ) -> tuple[Packed, Module, list[int]]:
        """The backtrace's launch ``op`` made again over the arena as placed, walking the
        schedule's groups where steps ran as one."""
        steps, placed, made = self._steps, self._placed, list(self._made.made)
        walked, found = steps.plan, list(steps.argmaxes)
        if len(made) < len(steps.plan.steps):
            walked = grouped_plan(steps.plan, made)
            found = [steps.argmaxes[group.root] for group in made]
        where = [placed.where(w) for w in found]
        launcher, sources, tables = backtrace_launch(
            walked, where, self.device, placed.at(steps.assignment), ring=lookup(self.semiring),
            dtype=self.dtype,
        )  # fmt: skip
        self._tables += tables
        # (Its sources name the arena's base and the assignment as placed: not moved again.)
        return launcher, self._modules[op.module], resolve(sources, inputs, self._arena, result)

    def _many(
        self, made: Sequence[Group], inputs: Sequence[int], result: int
    ) -> list[tuple[Packed, Module, list[int]]]:
        """Launches of ``tropical_many`` for the groups ``made`` (one per 65,535: a grid's
        rows), each reading its leaves as they are (no copy), their tables kept."""
        steps = self._steps
        planned = steps.plan
        rows = []
        moved = self._placed.moved
        for group in made:
            leaves = [steps.operands[o] for o in group.leaves]
            addresses = resolve(moved([at for at, _ in leaves]), inputs, self._arena, result)
            c, index = resolve(moved(steps.writes[group.root]), inputs, self._arena, result)
            rows.append(
                many_row(
                    planned, group, [(a, t) for a, (_, t) in zip(addresses, leaves, strict=True)],
                    c, index,
                )
            )  # fmt: skip
        blocks = max(many_blocks(planned, group) for group in made)
        launches = []
        for start in range(0, len(rows), _MAX_GRID_Y):
            chunk = rows[start : start + _MAX_GRID_Y]
            table = cupy_module().asarray(np.array(chunk, np.int64))
            self._tables.append(table)
            launcher = Packed(
                self._many_module_spec, self.device, (blocks, len(chunk), 1), (THREADS, 1, 1),
                [0],
            )  # fmt: skip
            launches.append((launcher, self._many_module, [table.data.ptr]))
        return launches

    def run_sync(self, *operands: Any, out: Any = None, stream: Any = None) -> Any:
        """Replay the program on ``operands``, or on ``inputs`` as they are.

        With ``argmax=True`` it waits for the GPU to copy the assignment back.

        Args:
            *operands: CuPy arrays of the program's shapes, dtype and device, one per operand
                (one that is not C-contiguous is copied first). With none, ``inputs`` are
                read as they are.
            out: A CuPy array to receive the result, of the result's dtype and shape on the
                program's device; ``output`` itself skips the copy out. None: a new array.
            stream: The CuPy stream to enqueue on (default: CuPy's current stream of the
                program's device).

        Returns:
            The result, a new array or ``out``; with ``argmax=True`` the pair (result,
            assignment), the assignment a dict giving every index of the subscripts a value at
            which the product of the operands' entries attains the result (an int64 array of
            the result's shape for each index, where the result has indices: see ``einsum``).

        Raises:
            TypeError: An operand, or ``out``, is not a ``cupy.ndarray``.
            ValueError: The operands are not as many as the program's inputs, or one of them,
                or ``out``, has another dtype, shape or device than the program's.
            cupy.cuda.memory.OutOfMemoryError: The device has no memory left for a new result
                or for the contiguous copy of an operand.
        """
        stream = resolved_stream(self.device, stream)
        result, host = self._enqueue(operands, out, stream)
        if host is None:
            return result
        stream.synchronize()
        return result, self._assignment(host)

    async def run(self, *operands: Any, out: Any = None, stream: Any = None) -> Any:
        """``run_sync`` for async code: replay the program on ``operands``, or on ``inputs``.

        With ``argmax=True`` it waits for the assignment without blocking the event loop,
        shielded from cancellation: the copy back must land before its buffer is let go.

        Args:
            *operands: CuPy arrays of the program's shapes, dtype and device, one per operand.
                With none, ``inputs`` are read as they are.
            out: A CuPy array to receive the result (``output``: no copy out). None: a new
                array.
            stream: The CuPy stream to enqueue on (default: CuPy's current stream of the
                program's device).

        Returns:
            As ``run_sync``: the result, or with ``argmax=True`` the pair (result, assignment).

        Raises:
            TypeError: As ``run_sync``: an operand, or ``out``, is not a ``cupy.ndarray``.
            ValueError: As ``run_sync``: the operands' count, or an operand's or ``out``'s
                dtype, shape or device, is not the program's.
            cupy.cuda.memory.OutOfMemoryError: As ``run_sync``: no memory left on the device
                for a new result or an operand's contiguous copy.
        """
        stream = resolved_stream(self.device, stream)
        result, host = self._enqueue(operands, out, stream)
        return await self._answered(result, host, stream)

    async def _answered(self, result: Any, host: Any, stream: Any) -> Any:
        """A replay's answer: its result, and with ``argmax`` its assignment once its copy to
        ``host`` has landed (awaited without blocking the loop)."""
        if host is None:
            return result
        with anyio.CancelScope(shield=True):  # the copy into `host` must land before it is freed
            await synchronize(stream)
        return result, self._assignment(host)

    async def run_members(self, members: Sequence[Sequence[Any]], stream: Any = None) -> Any:
        """One replay of a batched program for up to ``batch`` queries, each given as the
        operands of the program before batching (check them with that program's ``check``
        first: nothing is checked here): each batched operand gathered from its own query (a
        query past the last is the last again), the shared ones from the first.
        ``ProgramBatcher`` joins concurrent calls this way.

        Args:
            members: The queries' operands, one sequence per query, 1 to ``batch`` of them.
            stream: The CuPy stream to enqueue on (default: CuPy's current stream of the
                program's device).

        Returns:
            The result of the whole batch (leading axis ``batch``; a query's is its row), or
            with ``argmax=True`` the pair (result, assignment) of the batch, each index's
            array leading the batch too.

        Raises:
            ValueError: The program is not batched, or ``members`` are none or more than
                ``batch``.
        """
        self._check_count("run_members", len(members))
        stream = resolved_stream(self.device, stream)
        addresses: list[list[int]] = []
        held: list[Any] = []
        cupy = cupy_module()
        varying = self._varying
        # The members' operands by input (a transposition in C: a query may have hundreds).
        columns = list(zip(*members, strict=True))
        with OnDevice(self.device):
            for i, strides in enumerate(self._query_strides):
                column = columns[i] if i in varying else columns[i][:1]
                # Laid out as a query's input (a C-level check of all at once), else copied.
                if list(map(_STRIDES, column)).count(strides) != len(column):
                    with stream:
                        column = tuple(cupy.ascontiguousarray(x) for x in column)
                    held += column
                addresses.append(list(map(_POINTER, column)))
        return await self._run_addresses(addresses, len(members), stream, held)

    async def run_addresses(
        self, addresses: Sequence[Sequence[int]], count: int, stream: Any = None
    ) -> Any:
        """``run_members`` for queries given by their operands' device addresses, unchecked:
        where a caller has them without an array per operand (``ProgramBatcher`` with
        ``stacked=True``: a query's operands as rows of one array).

        Args:
            addresses: For each input, in order: the ``count`` queries' addresses of it (an
                input in ``batched``), or the one address every query reads (any other). Each
                the address of a C-contiguous array of the query's operand's shape, the
                program's dtype and device, its memory not reused before the replay reads it
                (freed, if at all, in the order of ``stream``: as CuPy frees an array).
            count: How many queries, 1 to ``batch`` (the rows past the last read it again).
            stream: The CuPy stream to enqueue on (default: CuPy's current stream of the
                program's device).

        Returns:
            As ``run_members``.

        Raises:
            ValueError: The program is not batched, ``count`` is not 1 to ``batch``, or
                ``addresses`` has not an entry per input, or an entry not as many addresses
                as its input takes.
        """
        self._check_count("run_addresses", count)
        varying = self._varying
        if len(addresses) != len(self.inputs):
            got: str | None = f"{len(addresses)} inputs' addresses"
        else:
            got = next(
                (
                    f"{len(column)} for input {i}"
                    for i, column in enumerate(addresses)
                    if len(column) != (count if i in varying else 1)
                ),
                None,
            )
        if got is not None:
            raise ValueError(
                f"run_addresses takes, for each of the {len(self.inputs)} inputs, {count} "
                f"addresses (the inputs {sorted(varying)}) or one (the others); got {got}"
            )
        return await self._run_addresses(addresses, count, resolved_stream(self.device, stream), [])

    def _check_count(self, what: str, count: int) -> None:
        batch = self._batch
        if batch is None or not 1 <= count <= batch.size:
            raise ValueError(
                f"{what} takes 1 to {batch.size} queries, got {count}"
                if batch is not None
                else f"{what} needs a batched program (einsum_program(..., batch=))"
            )

    async def _run_addresses(
        self, addresses: Sequence[Sequence[int]], count: int, stream: Any, held: list[Any]
    ) -> Any:
        """The replay of ``run_members`` and ``run_addresses`` (``held``: copies of operands,
        kept until enqueued)."""
        batch = self._batch
        assert batch is not None  # (checked by the callers)
        pointers: list[int] = []
        padding = batch.size - count
        for i, column in enumerate(addresses):
            pointers += column
            if padding and i in self._varying:  # (the rows past the last query read it again)
                pointers += [column[-1]] * padding
        with OnDevice(self.device):
            if self._member_gathers is None:  # (its tables written on the stream it runs on)
                with stream:
                    self._member_gathers = self._gather_launches(self._member_rows(batch))
            with self._lock:
                result, host = self._launch(
                    (pointers, held), None, stream, self.output.nbytes, self._member_gathers
                )
        return await self._answered(result, host, stream)

    def _member_rows(self, batch: Batch) -> list[tuple[int, int]]:
        """The gather's rows of ``run_members``: each batched input a row per query."""
        offsets, sizes = self._rows
        rows = []
        for i, (at, nbytes) in enumerate(zip(offsets, sizes, strict=True)):
            if i in batch.operands:
                part = nbytes // batch.size
                rows += [(at + q * part, part) for q in range(batch.size)]
            else:
                rows.append((at, nbytes))
        return rows

    def _assignment(self, host: Any) -> dict[str, Any]:
        found = assignment(self._steps, host)
        if self._batch is not None:
            del found[self._batch.symbol]  # (the batch's own index: the query's number)
        return found

    def check(self, operands: Sequence[Any], *, positions: Sequence[int] | None = None) -> None:
        """Refuse ``operands`` as ``run`` would: raise unless they are as many as the
        program's inputs (or ``positions``), each a ``cupy.ndarray`` of its input's shape, the
        program's dtype and device (in any memory order: ``run`` copies one that is not
        C-contiguous).

        Args:
            operands: The operands of one call (of a batched program: with the batch's axes).
            positions: The inputs ``operands`` are, in order (a call's own, where the others
                were checked once: ``ProgramBatcher``'s shared operands). None: all of them.

        Raises:
            TypeError: An operand is not a ``cupy.ndarray``.
            ValueError: The operands are not as many as the inputs (as ``positions``), or one
                has another dtype, shape or device than the program's; a position is not an
                input's.
        """
        count = len(self._shapes)
        if (
            positions is not None
            and positions
            and not 0 <= min(positions) <= max(positions) < count
        ):
            raise ValueError(
                f"positions must be the program's inputs' (0 to {count - 1}: "
                f"{self.plan.subscripts}), got {list(positions)}"
            )
        shapes = self._shapes if positions is None else [self._shapes[p] for p in positions]
        if len(operands) != len(shapes):
            raise ValueError(
                f"this einsum program takes {count} operands ({self.plan.subscripts}), got "
                f"{len(operands)}"
                if positions is None
                else f"the operands at positions {list(positions)} of this einsum program "
                f"({self.plan.subscripts}) are {len(shapes)}, got {len(operands)}"
            )
        if not self._alike(operands, shapes):
            cupy = cupy_module()
            numbers = range(len(shapes)) if positions is None else positions
            for i, x, shape in zip(numbers, operands, shapes, strict=True):
                if (
                    type(x) is not cupy.ndarray
                    or x.shape != shape
                    or x.dtype != self.dtype
                    or x.data.device_id != self.device
                ):
                    self._refuse(i, x, shape)

    def _alike(self, operands: Sequence[Any], shapes: list[tuple[int, ...]]) -> bool:
        """Whether ``operands`` are CuPy arrays of ``shapes``, the inputs' dtype and device,
        checked a property at a time over all of them (loops in C: a network has hundreds
        of operands, each checked on every call)."""
        try:
            return (
                set(map(type, operands)) == self._types
                and list(map(_SHAPE, operands)) == shapes
                and set(map(_DTYPE, operands)) == self._dtypes
                and set(map(_DEVICE, operands)) == self._devices
            )
        except AttributeError:
            return False

    def _sources(self, operands: Sequence[Any], stream: Any) -> tuple[list[int], list[Any]] | None:
        """The operands' addresses, or None where all are the bound inputs (nothing to
        gather); and any contiguous copies made of them (held until enqueued)."""
        if not operands:
            return None
        if len(operands) != len(self.inputs):
            self.check(operands)
        # The previous call's arrays again (an optimisation loop writing them in place): their
        # addresses, dtype and device cannot have changed, and their shapes are compared.
        seen, sources = self._seen  # (one tuple: another thread may replace it meanwhile)
        if (
            len(seen) == len(operands)
            and all(map(operator.is_, operands, map(operator.call, seen)))
            and list(map(_SHAPE, operands)) == self._shapes
        ):
            return sources
        # Operands laid out as the bound inputs (see _alike).
        alike = self._alike(operands, self._shapes)
        if alike and list(map(_STRIDES, operands)) == self._strides:
            pointers = list(map(_POINTER, operands))
            sources = (pointers, []) if pointers != self._bound else None
            self._seen = (list(map(weakref.ref, operands)), sources)
            return sources
        if not alike:
            self.check(operands)  # (raises)
        cupy = cupy_module()
        pointers, held = [], []
        for x in operands:
            if not x.flags.c_contiguous:  # (the gather reads an operand as one run)
                with stream:
                    x = cupy.ascontiguousarray(x)  # noqa: PLW2901
                held.append(x)
            pointers.append(x.data.ptr)
        return (pointers, held) if pointers != self._bound else None

    def replay(self, pointers: list[int], out: Any, stream: Any) -> Any:
        """Replay the program on operands given by their addresses, unchecked.

        Gather from ``pointers``, replay, copy out into ``out`` on ``stream``, after the
        previous call's work: a sliced einsum's slices, each from its operands' addresses.
        Nothing is checked, and no assignment is returned, even by a program made with
        ``argmax=True``.

        Args:
            pointers: The device addresses of the operands, one per input: C-contiguous
                arrays of the program's shapes, dtype and device.
            out: A CuPy array to receive the result (``output``: no copy). None: a new array.
            stream: The CuPy stream to enqueue on.

        Returns:
            The result: ``out``, or a new array where ``out`` is None.

        Raises:
            cupy.cuda.memory.OutOfMemoryError: ``out`` is None and the device has no memory
                left for a new result.
        """
        with OnDevice(self.device), self._lock:
            # (No assignment: none is returned, and a copy back into pinned memory dropped
            # at once could land in memory the pool has handed to another call.)
            return self._launch((pointers, []), out, stream, self.output.nbytes, assign=False)[0]

    def _refuse(self, i: int, x: Any, shape: tuple[int, ...]) -> None:
        cupy = cupy_module()
        if not isinstance(x, cupy.ndarray):
            raise TypeError(
                f"einsum program operand {i} must be a cupy.ndarray, not "
                f"{type(x).__module__}.{type(x).__name__}"
            )
        raise ValueError(
            f"einsum program operand {i} must be {self.dtype} of shape {shape} on device "
            f"{self.device} (as the program was made), got {x.dtype} of shape {x.shape} on "
            f"device {x.data.device_id}; make a program for these with einsum_program"
        )

    def _enqueue(self, operands: Sequence[Any], out: Any, stream: Any) -> tuple[Any, Any]:
        if out is not None and out is not self.output:
            check_out(out, self.dtype, self.shape, self.device)
        nbytes = self.output.nbytes
        with OnDevice(self.device):
            sources = self._sources(operands, stream)
            with self._lock:
                return self._launch(sources, out, stream, nbytes)

    def _launch(
        self,
        sources: Any,
        out: Any,
        stream: Any,
        nbytes: int,
        gathers: Any = None,
        *,
        assign: bool = True,
    ) -> tuple[Any, Any]:
        """Gather (by ``gathers``, default the inputs'), replay, copy out (the assignment too,
        with argmax and ``assign``): enqueued on ``stream``, after the previous call's work."""
        cupy = cupy_module()
        runtime = cupy.cuda.runtime
        handle = stream.ptr
        if self._last is not None:  # the previous call's buffers are this one's (on any
            stream.wait_event(self._done)  # stream: a new stream may reuse a freed one's handle)
        if sources is not None:
            pointers, _held = sources
            for n, (packed, table) in enumerate(gathers or self._gathers):
                chunk = pointers[n * MAX_GATHER : (n + 1) * MAX_GATHER]
                packed.run_pointers(self._gather, [table.data.ptr, len(chunk), *chunk], stream)
        runtime.graphLaunch(self._graph.graphExec, handle)
        if out is self.output:
            result = out
        elif out is not None and out.flags.c_contiguous:
            runtime.memcpyAsync(
                out.data.ptr, self.output.data.ptr, nbytes, runtime.memcpyDeviceToDevice,
                handle,
            )  # fmt: skip
            result = out
        elif out is not None:
            with stream:
                cupy.copyto(out, self.output)
            result = out
        else:
            with stream:  # (allocated on the stream it is written on)
                result = cupy.ndarray(self.shape, self.dtype)
            runtime.memcpyAsync(
                result.data.ptr, self.output.data.ptr, nbytes,
                runtime.memcpyDeviceToDevice, handle,
            )  # fmt: skip
        host = (
            copy_back(self._steps, self._assignment_at, stream) if self.argmax and assign else None
        )
        self._done.record(stream)
        self._last = handle
        return result, host

    def __repr__(self) -> str:
        return (
            f"<EinsumProgram {self.plan.subscripts} {self.semiring} {self.dtype} "
            f"argmax={self.argmax}{f' batch={self.batch}' if self.batch else ''} on device "
            f"{self.device}: {len(self.plan.steps)} steps, "
            f"{self.nbytes:,} bytes>"
        )


def settle(done: Any, held: list[Any]) -> None:
    """Wait for a program's last call before its buffers (``held``) go back to the pool."""
    with contextlib.suppress(Exception):  # (the process ends, the GPU is lost)
        done.synchronize()
    held.clear()


class _Lanes:
    """The streams a capture launches each step on: a step goes on its first operand's
    producer's stream where that is the stream's last step (a branch goes on), else on the
    stream least recently used; it waits for the events of producers on other streams. The
    ops after the last step join every stream."""

    def __init__(self, depends: Sequence[tuple[int, ...]], main: Any) -> None:
        cupy = cupy_module()
        self._depends = depends
        self._main = main
        self._streams = [main] + [cupy.cuda.Stream(non_blocking=True) for _ in range(LANES - 1)]
        self._lane = lanes(depends, LANES)
        self._events: dict[int, Any] = {}
        self._current = -1
        self._forked = False

    def _event(self, stream: Any) -> Any:
        event = cupy_module().cuda.Event(block=False, disable_timing=True)
        event.record(stream)
        return event

    def __call__(self, step: int) -> Any:
        if step == self._current:
            return self._stream_of(step)
        if not self._forked:  # the other streams join the capture from the main one
            fork = self._event(self._main)
            for stream in self._streams[1:]:
                stream.wait_event(fork)
            self._forked = True
        self._close()
        self._current = step
        if step >= len(self._lane):  # after the last step: every stream joins
            self.join()
            return self._main
        stream = self._stream_of(step)
        for before in self._depends[step]:
            if self._lane[before] != self._lane[step]:
                stream.wait_event(self._events[before])
        return stream

    def _stream_of(self, step: int) -> Any:
        return self._main if step >= len(self._lane) else self._streams[self._lane[step]]

    def _close(self) -> None:
        if 0 <= self._current < len(self._lane):
            self._events[self._current] = self._event(self._stream_of(self._current))

    def join(self) -> None:
        """Every stream's work before the main stream's next (a capture ends joined)."""
        self._close()
        self._current = len(self._lane)
        if self._forked:
            for stream in self._streams[1:]:
                self._main.wait_event(self._event(stream))


# -- making programs, cached -------------------------------------------------------------------

_programs: OrderedDict[Any, EinsumProgram] = OrderedDict()
# Each program's bytes by its key, made or not: a sliced einsum asks again on every call.
_sizes: dict[Any, int] = {}
_cache_lock = threading.Lock()


def clear_programs() -> None:
    """Forget every cached program (those held elsewhere stay usable)."""
    with _cache_lock:
        _programs.clear()


def _cached(key: Any) -> EinsumProgram | None:
    with _cache_lock:
        found = _programs.get(key)
        if found is not None:
            _programs.move_to_end(key)
        return found


def _keep(key: Any, program: EinsumProgram) -> None:
    if program.nbytes > MAX_PROGRAM_BYTES:
        return
    with _cache_lock:
        _programs[key] = program
        _programs.move_to_end(key)
        while len(_programs) > MAX_PROGRAMS:
            _programs.popitem(last=False)
        # The bytes are bounded per device: a program holds its own device's memory alone. (A
        # bound over all of them made the programs of a sliced einsum over two GPUs, each
        # within it, evict each other: both made again for every call.)
        same = [k for k, p in _programs.items() if p.device == program.device]  # oldest first
        held = sum(_programs[k].nbytes for k in same)
        for k in same:
            if held <= MAX_PROGRAM_BYTES:
                break
            held -= _programs.pop(k).nbytes


def program_arguments(
    operands: Sequence[Any], dtype: Any, device: int | None, *, caller: str = "einsum_program"
) -> tuple[list[tuple[int, ...]], np.dtype[Any], int]:
    """Shapes, dtype and device from arrays, or shapes with ``dtype`` (and ``device``); an
    error names ``caller``."""
    cupy = cupy_module()
    if not operands:
        raise ValueError(f"{caller} needs at least one operand (an array or a shape)")
    arrays = [x for x in operands if hasattr(x, "shape") and hasattr(x, "dtype")]
    if arrays and len(arrays) != len(operands):
        raise TypeError(f"{caller} takes arrays, or shapes with dtype=, not both")
    given = None if dtype is None else numpy_dtype(dtype, "dtype")  # ValueError naming it
    if arrays:
        dtypes = {np.dtype(x.dtype) for x in arrays}
        if len(dtypes) > 1 or (given is not None and given not in dtypes):
            raise ValueError(
                f"{caller} operands have dtypes {sorted(map(str, dtypes))}"
                + (f" and dtype={given} was given" if given is not None else "")
                + "; give one dtype"
            )
        devices = sorted({x.device.id for x in arrays if isinstance(x, cupy.ndarray)})
        if len(devices) > 1:
            raise ValueError(f"{caller} operands are on devices {devices}; use one")
        if device is None:
            device = devices[0] if devices else cupy.cuda.Device().id
        return [tuple(x.shape) for x in arrays], dtypes.pop(), device
    if given is None:
        raise TypeError(f"{caller} of shapes needs dtype= (or pass arrays)")
    for i, x in enumerate(operands):
        # NumPy's integers too: shapes are often worked out with NumPy.
        if not isinstance(x, tuple | list) or not all(
            isinstance(n, int | np.integer) and not isinstance(n, bool | np.bool_) for n in x
        ):
            shown = repr(x)[:80]
            raise TypeError(
                f"{caller} operand {i} must be an array or a shape tuple of ints, not {shown}"
            )
    return (
        [tuple(int(n) for n in x) for x in operands],
        given,
        cupy.cuda.Device().id if device is None else device,
    )


async def einsum_program(
    subscripts: str,
    *operands: Any,
    semiring: str = "maxplus",
    argmax: bool = False,
    optimize: Any = "auto",
    dtype: Any = None,
    device: int | None = None,
    compiler: Compiler | None = None,
    batch: int | None = None,
    batched: Sequence[int] | None = None,
) -> EinsumProgram:
    """``einsum`` compiled once for operands of these shapes and dtype on one device.

    The plan (``optimize``, as ``einsum``'s), its kernels fetched through ``compiler``, its
    launches captured as a CUDA graph over buffers the program owns. Programs are cached in the
    process per (plan, semiring, dtype, argmax, device), up to MAX_PROGRAMS and
    MAX_PROGRAM_BYTES of each device's memory, least recently used dropped first: asking again
    returns the same program. It pays where a network is contracted more than a few times: a
    replay launches once where ``einsum`` launches every step.

    Args:
        subscripts: NumPy's einsum grammar, as ``einsum`` takes it.
        *operands: CuPy arrays (their shapes, dtype and device; NumPy arrays give their shapes
            and dtype), or shapes (tuples of ints) with ``dtype=``: one per operand.
        semiring: ``"maxplus"``, ``"minplus"``, ``"maxmul"`` or ``"andor"``.
        argmax: Make a program whose calls also return an assignment that attains the result
            (of each element, for a result with indices: see ``einsum``).
        optimize: The order, as ``einsum_plan`` takes it. A sliced plan is refused: a program
            contracts the whole network at once.
        dtype: The operands' dtype: needed with shapes; with arrays, None or theirs.
        device: The number of the device to run on (default: the CuPy arrays', else the
            current device).
        compiler: The Compiler that fetches the kernels (default: aionvrtc's process-wide
            Compiler).
        batch: Make a program over a batch of this many queries, as JAX's ``vmap`` batches
            a function: ``operands`` are one query's, the operands at ``batched`` take a
            leading axis of ``batch`` in ``run`` (each query's own), the others are shared,
            and the result leads with the batch's axis (with ``argmax=True`` each index's
            assignment too: an array over the batch). The order is the query's own
            (``optimize`` plans one query); steps among shared operands alone run once.
            ``ProgramBatcher`` joins concurrent calls into such programs. None: one query.
        batched: With ``batch``, the positions of the operands that vary from query to query
            (such as ``[0, 3]``). None: all of them.

    Returns:
        The program: the cached one where it was asked for before.

    Raises:
        TypeError: ``subscripts`` is not a str; the operands mix arrays and shapes; shapes
            without ``dtype=``; an operand neither an array nor a tuple or list of Python ints;
            ``dtype`` is not a dtype NumPy knows (NumPy's "data type not understood");
            ``batched`` is not a sequence of ints.
        ValueError: No operands; arrays of more than one dtype, or not of ``dtype``; arrays on
            more than one device; ``semiring`` is not one of ``SEMIRINGS``, or ``dtype`` is not
            one it takes; what ``einsum_plan`` refuses (see there); ``batch`` is not a positive
            int; ``batched`` names an operand twice, none, or one that is not there.
        ValueError: The plan is sliced (``memory_limit=``, or cotengra's ``slicing_opts``: pass
            it to ``einsum`` instead); an index has size 0 (the result is the semiring's zero:
            call ``einsum``); the output or an intermediate is larger than the device's memory,
            or an operand copy has more than 32 axes that no view merges. With ``argmax=True``:
            more than 2**24 elements of the result (or their assignments past 1 GiB), a
            product over more than
            2**31 values of k, or the argmaxes that the walk back keeps larger than the
            device's memory.
        cupy.cuda.memory.OutOfMemoryError: The device has not the program's ``nbytes`` free.
        cupy.cuda.runtime.CUDARuntimeError: ``device`` is not a device this process sees.
        RuntimeError: ``compiler`` is not open yet (``async with Compiler(...)``).
        aionvrtc.AionvrtcError: A kernel could not be fetched: ``compiler`` is closed
            (``CompilerClosed``), NVRTC cannot be used (``NvrtcError``) or failed
            (``CompileError``), or the module cannot be loaded on the device
            (``ModuleLoadError``; ``GPUOutOfMemoryError`` where the GPU is full).
    """
    program = await run_async(
        make_program(
            subscripts,
            operands,
            semiring=semiring,
            argmax=argmax,
            optimize=optimize,
            dtype=dtype,
            device=device,
            compiler=compiler,
            batch=batch,
            batched=batched,
        )
    )
    assert program is not None  # (only_kept=False)
    return program


def einsum_program_sync(
    subscripts: str,
    *operands: Any,
    semiring: str = "maxplus",
    argmax: bool = False,
    optimize: Any = "auto",
    dtype: Any = None,
    device: int | None = None,
    compiler: Compiler | None = None,
    batch: int | None = None,
    batched: Sequence[int] | None = None,
) -> EinsumProgram:
    """``einsum_program`` for code that is not async: compile the program in this thread.

    ``compiler``, if given, must run in a portal or this must be a worker thread of its event
    loop.

    Args:
        subscripts: NumPy's einsum grammar, as ``einsum`` takes it.
        *operands: CuPy arrays, or shapes (tuples of ints) with ``dtype=``: one per operand.
        semiring: ``"maxplus"``, ``"minplus"``, ``"maxmul"`` or ``"andor"``.
        argmax: Make a program whose calls also return an assignment (of each element, for
            a result with indices).
        optimize: The order, as ``einsum_plan`` takes it (not a sliced plan).
        dtype: The operands' dtype: needed with shapes.
        device: The number of the device to run on (default: the CuPy arrays', else the
            current device).
        compiler: The Compiler that fetches the kernels (default: aionvrtc's process-wide
            Compiler).
        batch: A program over a batch of this many queries (see ``einsum_program``).
        batched: With ``batch``, the positions of the operands that vary (None: all).

    Returns:
        As ``einsum_program``: the program, the cached one where it was asked for before.

    Raises:
        TypeError: As ``einsum_program``: the subscripts, the operands or ``dtype`` are not of
            a kind it takes.
        ValueError: As ``einsum_program``: bad arguments, what ``einsum_plan`` refuses, and
            what a program cannot run on the device.
        cupy.cuda.memory.OutOfMemoryError: The device has not the program's ``nbytes`` free.
        cupy.cuda.runtime.CUDARuntimeError: ``device`` is not a device this process sees.
        RuntimeError: ``compiler`` is not open yet, or a kernel must be fetched through a
            ``compiler`` without a portal (``Compiler.use_portal``) from a thread that is not
            a worker thread of its event loop.
        aionvrtc.AionvrtcError: As ``einsum_program``: a kernel could not be fetched.
    """
    program = run_sync(
        make_program(
            subscripts,
            operands,
            semiring=semiring,
            argmax=argmax,
            optimize=optimize,
            dtype=dtype,
            device=device,
            compiler=compiler,
            batch=batch,
            batched=batched,
        )
    )
    assert program is not None  # (only_kept=False)
    return program


def make_program(
    subscripts: str,
    operands: Sequence[Any],
    *,
    semiring: str,
    argmax: bool,
    optimize: Any,
    dtype: Any,
    device: int | None,
    compiler: Compiler | None,
    only_kept: bool = False,
    batch: int | None = None,
    batched: Sequence[int] | None = None,
) -> Work[EinsumProgram | None]:
    """The body of ``einsum_program`` and ``einsum_program_sync`` (see _twins); with
    ``only_kept``, None where the cache would not keep the program (past MAX_PROGRAM_BYTES), or
    where its kernels are not all loaded yet (they load in the background meanwhile): a
    sliced einsum then launches the slices' prepared steps, where a program made again for
    every call would cost its capture each time (0.3 s for a slice of 4,703 steps)."""
    ring = lookup(semiring)
    check_semiring(subscripts, semiring)
    shapes, kind, where = program_arguments(operands, dtype, device)
    ring.check_dtype(kind)
    asked = None if batch is None else check_batch(batch, batched, len(shapes))
    planned = yield from planned_for(subscripts, shapes, optimize)
    if planned.slicing is not None:  # a program holds every intermediate of the whole network
        raise ValueError(
            f"einsum_program: the plan is sliced ({planned.slicing.count:,} slices over "
            f"{', '.join(planned.slicing.indices)}) and a program contracts the whole network "
            "at once; pass the plan to einsum (optimize=plan), which replays one program per "
            "slice, or plan without memory_limit= or cotengra's slicing_opts"
        )
    queries = None
    if asked is not None:  # the query's network over the batch, along the query's order
        size, varying = asked
        made, made_shapes, symbol = batched_network(planned, shapes, size, varying)
        planned = yield from planned_for(made, made_shapes, list(planned.path))
        queries = Batch(size, varying, symbol)
    key = (steps_key(planned, ring, kind, argmax=argmax, device=where, reuse=False), queries)
    found = _cached(key)
    if found is not None:
        return found
    if only_kept and _sizes.get(key, 0) > MAX_PROGRAM_BYTES:  # known: without preparing again
        return None
    # A sliced run waits for no kernel it can do without: it launches its slices' steps (on
    # stand-ins where their own are not loaded) while the program's load, and a later run
    # replays the program. Its gather and row kernels are known before its steps are prepared.
    around = _around(ring, np.dtype(kind), argmax)
    if only_kept and any(loaded(spec, where, compiler) is None for spec in around):
        load_soon(around, where, compiler)
        return None
    steps, made, placed = yield Offload(
        functools.partial(_steps, planned, ring.name, kind, argmax, where)
    )
    nbytes = _layout(steps, placed).nbytes
    keep(_sizes, key, nbytes, MAX_STEPS)
    if only_kept and nbytes > MAX_PROGRAM_BYTES:
        return None
    specs = _specs(steps, ring)
    if only_kept and any(loaded(spec, where, compiler) is None for spec in specs):
        load_soon(specs, where, compiler)
        return None
    *modules, gather, many = yield Fetch(specs, where, compiler)
    # Preparing the launches and capturing them takes milliseconds to a second: off the loop.
    program = yield Offload(
        functools.partial(
            EinsumProgram,
            steps,
            modules,
            gather,
            many,
            ring.name,
            batch=queries,
            made=made,
            placed=placed,
        )
    )
    _keep(key, program)
    return program  # type: ignore[no-any-return]


def _specs(steps: Steps, ring: Semiring) -> list[KernelSpec]:
    """A program's kernels: its steps', then its gather and its launch of many small steps."""
    return [*steps.specs, *_around(ring, steps.dtype, steps.argmax)]


def _around(ring: Semiring, dtype: np.dtype[Any], argmax: bool) -> list[KernelSpec]:
    """A program's kernels beside its steps': its gather, its launch of many small steps."""
    return [einsum_spec("gather", dtype.itemsize), many_spec(ring, dtype, argmax=argmax)]


def _steps(
    planned: EinsumPlan, ring: str, dtype: Any, argmax: bool, device: int
) -> tuple[Steps, Schedule, Arena]:
    """A program's steps (prepared without reuse), its schedule, and its arena placed by
    lifetimes along it (Python, O(steps) to prepare and about O(buffers^2) to place: off the
    loop)."""
    steps = steps_for(planned, lookup(ring), dtype, argmax=argmax, device=device, reuse=False)
    if steps is None:
        empty = next(i for i, n in planned.sizes.items() if n == 0)
        raise ValueError(
            f"einsum_program: index {empty!r} has size 0, so the result is the semiring's zero "
            "and nothing is launched; call einsum for it"
        )
    made = schedule(planned)
    return steps, made, arena(steps, made)
