"""An einsum plan's steps ready to launch: every kernel chosen, every launch's arguments packed,
every intermediate placed in one allocation (the arena), all once per (plan, semiring, dtype,
argmax, device, tiles). A run writes the operands', arena's and result's addresses into the
launches and enqueues them: no array object, view or plan is made per step.

The arena holds each step's result, its argmax (argmax=True), the copies a product reads from,
and the assignment; offsets are 256-byte aligned, as allocations of their own would be. An eager
run reuses the space of what no later step reads (its launches run in order on one stream); a
compiled program runs branches concurrently, so its steps are prepared with every block apart
and placed again by the lifetimes its graph's order gives them (``_schedule``).
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..._cuda import Module
from ..._spec import KernelSpec
from .._bounded import keep
from ..products import (
    Launch,
    OnDevice,
    Packed,
    Plan,
    Semiring,
    cupy_module,
    plan,
    standins,
    tables_version,
)
from ._backtrace import Scan, assignment_order, backtrace_program, output_digits
from ._kernel_specs import backtrace_spec, einsum_spec, many_spec
from ._plan import EinsumPlan
from ._rows import ROW_WORDS, THREADS, lone, many_blocks, many_row, read_in_place, scanned
from ._terms import Step, Term, contiguous

__all__ = [
    "ARENA",
    "INPUT",
    "MAX_STEPS",
    "VALUE",
    "Op",
    "Source",
    "Steps",
    "backtrace_launch",
    "known",
    "prepared",
    "resolve",
    "steps_key",
    "walks",
]

# Where an address comes from: an input's, the arena's or the result's plus an offset, or a
# value of its own (a persistent buffer's address, a count).
# (ROW: a row of the table of tropical_many's rows, while the steps are built.)
INPUT, ARENA, RESULT, VALUE, ROW = range(5)
Source = tuple[int, int]

_ALIGN = 256
_THREADS = 256
_MAX_DIMS = 32  # EINSUM_MAX_DIMS
MAX_GATHER = 448  # EINSUM_MAX_GATHER
# The backtrace's values (and its code) in dynamic shared memory: what any launch may ask (48
# KiB with the kernel's static shared memory, the scan's reduction: 32 values and their k, at
# most 2 KiB; a launch asking for more fails).
_SHARED = 48 * 1024 - 2 * 1024
# The backtrace's block (EINSUM_BACKTRACE_THREADS): a thread a product of one depth, and all of
# them to scan one again.
_BACKTRACE_THREADS = 256

# Prepared steps kept, oldest dropped first: each holds packed launches (a few hundred bytes a
# step), a vector of ones per reduction and the backtrace's program, no intermediate.
MAX_STEPS = 256


@dataclass(frozen=True, slots=True)
class Op:
    """One launch: its kernel (``module``: an index into ``Steps.specs``), where each of its
    leading arguments' addresses comes from, and the step it belongs to (the steps' count for
    what follows the last: the final reordering and the backtrace); a product's layout
    (``product``, without arrays), from which the launches of other kernels that compute it
    are made where a run finds its own kernel not loaded (``Steps.standins``)."""

    launcher: Packed
    module: int
    sources: tuple[Source, ...]
    step: int
    product: Plan | None = None


class _Arena:
    """Offsets in one allocation, first fit; space given back is taken again where ``reuse``."""

    def __init__(self, reuse: bool) -> None:
        self.end = 0  # the top of what is taken now
        self.size = 0  # the most it reached: the allocation's size
        self._free: list[tuple[int, int]] = []  # (offset, bytes), by offset
        self.reuses = reuse
        # Without reuse, every block taken or reserved: (offset, bytes aligned), by offset.
        self.blocks: list[tuple[int, int]] = []

    def take(self, nbytes: int) -> int:
        size = -(-max(nbytes, 1) // _ALIGN) * _ALIGN
        if not self.reuses:
            self.blocks.append((self.end, size))
        for n, (offset, free) in enumerate(self._free):
            if free >= size:
                if free == size:
                    del self._free[n]
                else:
                    self._free[n] = (offset + size, free - size)
                return offset
        offset, self.end = self.end, self.end + size
        self.size = max(self.size, self.end)
        return offset

    def reserve(self, nbytes: int) -> int:
        """Space no take() ever had nor will have (above the most taken)."""
        if not nbytes:
            return self.size
        offset = self.size
        self.size += -(-nbytes // _ALIGN) * _ALIGN
        if not self.reuses:
            self.blocks.append((offset, self.size - offset))
        self.end = self.size
        return offset

    def give(self, offset: int, nbytes: int) -> None:
        if not self.reuses:
            return
        size = -(-max(nbytes, 1) // _ALIGN) * _ALIGN
        at = bisect.bisect(self._free, (offset, size))
        self._free.insert(at, (offset, size))
        merged: list[tuple[int, int]] = []
        for start, length in self._free:
            if merged and merged[-1][0] + merged[-1][1] == start:
                merged[-1] = (merged[-1][0], merged[-1][1] + length)
            else:
                merged.append((start, length))
        if merged and merged[-1][0] + merged[-1][1] == self.end:  # the end shrinks back
            self.end = merged.pop()[0]
        self._free = merged


class Steps:
    """``planned`` ready to launch for inputs laid out as it was planned (``planned.terms``):
    ``specs`` the kernels to fetch, ``ops`` the launches in order, ``nbytes`` the arena's size,
    ``operands`` where each operand lies and how (numbered as Step.operands: the inputs, then
    each step's result), ``writes`` each step's result and argmax. With ``argmax`` the last
    op writes, for each element of the result in C order, every index's value at
    ``assignment`` in the arena (int64 each, numbered as the plan's ``sizes``), then the
    element's bytes (one int64 word); ``argmaxes`` are each step's argmax offset in
    the arena, or the ``Scan`` the backtrace makes instead (a program's large products).
    Prepared without ``reuse``, ``blocks`` are every block of the arena as (offset, bytes),
    by offset, each its own (a program places them anew: ``_schedule``)."""

    def __init__(
        self,
        planned: EinsumPlan,
        ring: Semiring,
        dtype: Any,
        *,
        argmax: bool,
        device: int,
        table: Any,
        reuse: bool,
    ) -> None:
        self.plan, self.dtype, self.argmax, self.device = planned, np.dtype(dtype), argmax, device
        self.table = table
        self.shape = tuple(planned.sizes[i] for i in planned.output)
        with OnDevice(device):
            # The vectors of ones and the backtrace's tables are written on a stream of their
            # own, waited for here (the launches read them on any stream; the caller's current
            # one may hold long work that they need not wait for).
            upload = cupy_module().cuda.Stream(non_blocking=True)
            with upload:
                made = _Builder(self, ring, table, reuse)
                for number, step in enumerate(planned.steps):
                    made.step(number, step)
                made.finish()
            upload.synchronize()
        self.specs = list(made.specs)
        self.ops = tuple(made.ops)
        # Each kernel's ops, and the stand-ins made so far, by op (see standins).
        self.users: tuple[list[int], ...] = tuple([] for _ in self.specs)
        for number, op in enumerate(self.ops):
            self.users[op.module].append(number)
        self._standins: dict[int, tuple[Launch, ...]] = {}
        # The rows of tropical_many, their addresses written per run (see enqueue).
        self._rows = np.array(made.rows, np.int64).reshape(-1, ROW_WORDS)
        self._rows_at = made.rows_at
        fixups = np.array(made.fixups, np.int64).reshape(-1, 4)
        self._at = (fixups[:, 0], fixups[:, 1])
        self._values = fixups[:, 3]
        self._kinds = tuple(fixups[:, 2] == kind for kind in (INPUT, ARENA, RESULT))
        self.nbytes = made.arena.size
        self.blocks = tuple(made.arena.blocks)
        self.assignment = made.assignment
        names, numbers = assignment_order(planned)  # (what reading an assignment needs, once)
        self.named = (names, np.array(numbers, np.intp))
        self.hosts: list[Any] = []  # pinned buffers an assignment was copied into, free again
        self.operands, self.writes = tuple(made.operands), tuple(made.writes)
        self.argmaxes = tuple(made.where)
        self._keep = made.keep  # persistent buffers the launches point at
        # Freed only once the device is done with every launch that may read them.
        weakref.finalize(self, _drain, device, self._keep)

    def standins(self, kernels: Sequence[int]) -> dict[int, tuple[Launch, ...]]:
        """For each op of ``kernels`` (indices into ``specs``), the launches of the other
        kernels that compute its product, fastest first as a rule (products' ``standins``;
        none for the copies, rows and backtrace): made once each, where a run first finds
        one of ``kernels`` not loaded. Python, O(those ops): off the event loop."""
        for kernel in kernels:
            for number in self.users[kernel]:
                if number not in self._standins:
                    product = self.ops[number].product
                    others = standins(product, self.table) if product is not None else []
                    self._standins[number] = tuple(Launch.of(other) for other in others)
        return {number: self._standins[number] for k in kernels for number in self.users[k]}

    def standins_made(self, kernels: Sequence[int]) -> dict[int, tuple[Launch, ...]] | None:
        """``standins(kernels)`` where all are made already (a lookup), else None."""
        try:
            return {number: self._standins[number] for k in kernels for number in self.users[k]}
        except KeyError:
            return None

    def enqueue(
        self,
        modules: Sequence[Module | None],
        inputs: Sequence[int],
        arena: int,
        result: int,
        stream: Any,
        *,
        marks: list[Any] | None = None,
        instead: Mapping[int, tuple[Packed, Module]] | None = None,
    ) -> None:
        """Enqueue every launch on ``stream``: ``modules`` by ``specs``, the inputs', arena's
        and result's addresses; first the rows of tropical_many, with this run's addresses.
        ``instead``: the ops (by number) that launch a stand-in, with its module, their own
        kernel not loaded (None in ``modules``). With ``marks`` (a profile:
        ``benchmarks/einsum_roofline.py``), a CUDA event recorded on ``stream`` before the
        first launch and after each one is appended to it."""
        if len(self._rows):
            table = self._rows.copy()
            at_input, at_arena, at_result = self._kinds
            addresses = self._values.copy()
            addresses[at_input] = np.asarray(inputs, np.int64)[self._values[at_input]]
            addresses[at_arena] += arena
            addresses[at_result] += result
            table[self._at] = addresses
            runtime = cupy_module().cuda.runtime
            # (From pageable memory: staged before the call returns, so `table` may go.)
            runtime.memcpyAsync(
                arena + self._rows_at, table.ctypes.data, table.nbytes,
                runtime.memcpyHostToDevice, stream.ptr,
            )  # fmt: skip
        if marks is not None:
            marks.append(_mark(stream))
        if instead:
            self._enqueue_standing_in(modules, instead, (inputs, arena, result), stream, marks)
            return
        for op in self.ops:
            op.launcher.run_pointers(
                modules[op.module],  # type: ignore[arg-type]  # (every one loaded here)
                resolve(op.sources, inputs, arena, result),
                stream,
            )
            if marks is not None:
                marks.append(_mark(stream))

    def _enqueue_standing_in(
        self,
        modules: Sequence[Module | None],
        instead: Mapping[int, tuple[Packed, Module]],
        addresses: tuple[Sequence[int], int, int],
        stream: Any,
        marks: list[Any] | None,
    ) -> None:
        """enqueue's launches where some run on stand-ins (the loop apart: the common one
        looks nothing up per op)."""
        for number, op in enumerate(self.ops):
            launcher, module = instead.get(number) or (op.launcher, modules[op.module])
            assert module is not None  # (a kernel not loaded has its ops in `instead`)
            launcher.run_pointers(module, resolve(op.sources, *addresses), stream)
            if marks is not None:
                marks.append(_mark(stream))


def _mark(stream: Any) -> Any:
    event = cupy_module().cuda.Event()
    event.record(stream)
    return event


def _drain(device: int, held: list[Any]) -> None:
    """Wait for ``device`` before ``held`` goes back to CuPy's pool (eager runs may still read
    it: they do not wait for the GPU)."""
    with contextlib.suppress(Exception), OnDevice(device):  # (the process ends, the GPU is lost)
        cupy_module().cuda.runtime.deviceSynchronize()
    held.clear()


def walks(launcher: Packed) -> bool:
    """Whether ``launcher`` is the backtrace's."""
    return launcher.spec.name_expressions[0].startswith("einsum_backtrace<")


def resolve(sources: Sequence[Source], inputs: Sequence[int], arena: int, result: int) -> list[int]:
    """The addresses (and values) ``sources`` name."""
    pointers = []
    for kind, value in sources:
        if kind == VALUE:
            pointers.append(value)
        elif kind == INPUT:
            pointers.append(inputs[value])
        else:
            pointers.append((arena if kind == ARENA else result) + value)
    return pointers


class _Builder:
    """Steps' launches made in order, each result placed in the arena, the operands it reads
    tracked by number (the inputs, then each step's result: see Step)."""

    def __init__(self, steps: Steps, ring: Semiring, table: Any, reuse: bool) -> None:
        cupy = cupy_module()
        planned = steps.plan
        self.steps, self.ring, self.table = steps, ring, table
        self.arena = _Arena(reuse)
        self.specs: dict[KernelSpec, int] = {}
        self.ops: list[Op] = []
        self.keep: list[Any] = []
        self.where: list[int | Scan] = []  # each step's argmax (its offset), or its Scan
        # Every operand by number, where it lies and its layout (a step's result: where the
        # step wrote it, contiguous over its indices), and where each step's result and argmax
        # go.
        self.operands: list[tuple[Source, Term]] = [
            ((INPUT, i), term) for i, term in enumerate(planned.terms)
        ]
        self.writes: list[tuple[Source, Source]] = []
        # The rows of tropical_many (read_in_place), their addresses as (row, column, kind,
        # value): a run writes them, its own addresses resolved, into the arena at rows_at.
        self.rows: list[list[int]] = []
        self.fixups: list[tuple[int, int, int, int]] = []
        self.assignment = -1
        self.ones: dict[int, Any] = {}
        # Products are planned on views of a small allocation: plan() and Launch.of read
        # shapes and strides only, and each run writes the real addresses.
        self.scratch = cupy.empty(_ALIGN, np.uint8)
        self.inputs = len(planned.terms)
        self.live: dict[int, tuple[Source, Term]] = dict(enumerate(self.operands))
        self.owned: dict[int, tuple[int, int]] = {}  # operand -> its result's (offset, bytes)
        self.last_read: dict[int, int] = {}
        for number, step in enumerate(planned.steps):
            for operand in step.operands:
                self.last_read[operand] = number

    def module(self, spec: KernelSpec) -> int:
        return self.specs.setdefault(spec, len(self.specs))

    def view(self, shape: Sequence[int], strides: Sequence[int], dtype: Any = None) -> Any:
        kind = self.steps.dtype if dtype is None else np.dtype(dtype)
        return cupy_module().ndarray(
            tuple(shape), kind, self.scratch.data,
            strides=tuple(s * kind.itemsize for s in strides),
        )  # fmt: skip

    def ones_of(self, k: int) -> int:
        """The address of a vector of ``k`` of the semiring's ones, kept."""
        if k not in self.ones:
            dtype = self.steps.dtype
            self.ones[k] = cupy_module().full(k, self.ring.one(dtype), dtype)
            self.keep.append(self.ones[k])
        return int(self.ones[k].data.ptr)

    def step(self, number: int, step: Step) -> None:
        planned, item = self.steps.plan, self.steps.dtype.itemsize
        chosen = [self.live.pop(o) for o in step.operands]
        if read_in_place(planned, number):
            self.row(number, step, chosen)
            return
        if step.swapped:
            chosen = chosen[::-1]
        temporary: list[tuple[int, int]] = []
        pointers: list[Source] = []
        arrays: list[Any] = []
        for (at, term), read in zip(chosen, (step.first, step.second), strict=False):
            assert read is not None
            source = at
            if read.copy is not None:
                nbytes = math.prod(read.shape) * item
                offset = self.arena.take(nbytes)
                temporary.append((offset, nbytes))
                self.copy(at, term, read.copy, (ARENA, offset), number)
                source = (ARENA, offset)
            pointers.append(source)
            arrays.append(self.view(read.shape, read.strides))
        if step.second is None:  # a reduction: times a vector of the semiring's ones
            k = step.first.shape[2]
            ones = (VALUE, self.ones_of(k))
            pointers.append(ones)
            arrays.append(self.view((1, k, 1), (0, 1, 1)))
        scan = self.scan(step, pointers)
        argmax = self.steps.argmax and scan is None
        c_at, index_at, out = self.outputs(number, step, arrays[1].shape[2], argmax)
        if scan is not None:
            self.where.append(scan)
        product = plan(
            arrays[0], arrays[1], self.ring.name, argmax=argmax, out=out, accumulate=False,
            table=self.table,
        )  # fmt: skip
        launch = Launch.of(product)
        self.ops.append(
            Op(launch, self.module(launch.spec), (*pointers, c_at, index_at), number,
               product.unbound())
        )  # fmt: skip
        self.writes.append((c_at, index_at))
        for offset, nbytes in temporary:
            self.arena.give(offset, nbytes)
        self.done(number, step, c_at)

    def done(self, number: int, step: Step, c_at: Source) -> None:
        """Step ``number`` launched, its result at ``c_at``: what it read last given back."""
        for operand in step.operands:
            if self.last_read.get(operand) == number and operand in self.owned:
                self.arena.give(*self.owned.pop(operand))
        result = Term(step.result, contiguous([self.steps.plan.sizes[i] for i in step.result]))
        self.operands.append((c_at, result))
        self.live[step.number] = (c_at, result)

    def row(self, number: int, step: Step, chosen: Sequence[tuple[Source, Term]]) -> None:
        """Step ``number`` as one row of tropical_many, reading ``chosen`` (its operands in
        path order) as they lie: a row of the table each run writes into the arena (its
        addresses are the run's), taken by a launch of its own."""
        planned = self.steps.plan
        n = step.second.shape[2] if step.second is not None else 1
        c_at, index_at, _ = self.outputs(number, step, n, self.steps.argmax)
        group = lone(planned, number)
        at = len(self.rows)
        self.rows.append(many_row(planned, group, [(0, t) for _, t in chosen], 0, 0))
        for column, source in ((0, c_at), (1, index_at), *enumerate((s for s, _ in chosen), 8)):
            self.fixups.append((at, column, *source))
        spec = many_spec(self.ring, self.steps.dtype, argmax=self.steps.argmax)
        launcher = Packed(
            spec, self.steps.device, (many_blocks(planned, group), 1, 1), (THREADS, 1, 1), [0]
        )
        self.ops.append(Op(launcher, self.module(spec), ((ROW, at),), number))
        self.writes.append((c_at, index_at))
        self.done(number, step, c_at)

    def scan(self, step: Step, pointers: Sequence[Source]) -> Scan | None:
        """The ``Scan`` of a step whose argmax the backtrace finds again (a compiled program's
        large product: see ``scanned``; eager runs reuse the space of what it reads)."""
        if not self.steps.argmax or self.arena.reuses or not scanned(self.steps.plan, step):
            return None
        assert step.second is not None
        (a_kind, a), (b_kind, b) = pointers[:2]
        assert a_kind == b_kind == ARENA, pointers  # (what scanned() asks)
        _, m, k = step.first.shape
        f, s = step.first.strides, step.second.strides
        return Scan(a, b, m, step.second.shape[2], k, (f[0], f[1], f[2]),
                    (s[0], s[1], s[2]))  # fmt: skip

    def outputs(self, number: int, step: Step, n: int, argmax: bool) -> tuple[Source, Source, Any]:
        """Where step ``number``'s result and argmax go, and the views plan() takes of them."""
        planned, item = self.steps.plan, self.steps.dtype.itemsize
        b, m, _ = step.first.shape
        if number == len(planned.steps) - 1 and not planned.final_copy:
            c_at: Source = (RESULT, 0)
        else:
            offset = self.arena.take(b * m * n * item)
            self.owned[step.number] = (offset, b * m * n * item)
            c_at = (ARENA, offset)
        c = self.view((b, m, n), (m * n, n, 1))
        if not argmax:
            return c_at, (VALUE, 0), c
        offset = self.arena.take(b * m * n * 4)  # kept for the backtrace
        self.where.append(offset)
        return c_at, (ARENA, offset), (c, self.view((b, m, n), (m * n, n, 1), np.int32))

    def copy(
        self, source: Source, term: Term, order: Sequence[str], target: Source, step: int
    ) -> None:
        """A copy of ``term`` (at ``source``) to C order over ``order`` (at ``target``)."""
        sizes, itemsize = self.steps.plan.sizes, self.steps.dtype.itemsize
        stride_of = dict(zip(term.indices, term.strides, strict=True))
        dims: list[tuple[int, int]] = []
        for i in order:  # size-1 axes dropped, axes that step as one merged
            if sizes[i] == 1:
                continue
            if dims and dims[-1][1] == stride_of[i] * sizes[i]:
                dims[-1] = (dims[-1][0] * sizes[i], stride_of[i])
            else:
                dims.append((sizes[i], stride_of[i]))
        if len(dims) > _MAX_DIMS:
            raise ValueError(
                f"einsum: an operand of {len(dims)} axes that no view merges is copied, and the "
                f"copy kernel takes at most {_MAX_DIMS}; pick another order (optimize=)"
            )
        total = math.prod(sizes[i] for i in order)
        padding = [0] * (_MAX_DIMS - len(dims))
        args = [0, 0, total, len(dims), *(d[0] for d in dims), *padding]
        args += [*(d[1] for d in dims), *padding]
        blocks = max(1, min(-(-total // _THREADS), 1 << 16))
        spec = einsum_spec("copy", itemsize)
        launcher = Packed(spec, self.steps.device, (blocks, 1, 1), (_THREADS, 1, 1), args)
        self.ops.append(Op(launcher, self.module(spec), (source, target), step))

    def finish(self) -> None:
        """The final reordering and the backtrace, after the last step; the rows' table past
        all else in the arena (it is written before the first launch)."""
        planned = self.steps.plan
        self.rows_at = self.arena.reserve(len(self.rows) * ROW_WORDS * 8)
        row_bytes = ROW_WORDS * 8
        self.ops = [
            dataclasses.replace(op, sources=((ARENA, self.rows_at + op.sources[0][1] * row_bytes),))
            if op.sources and op.sources[0][0] == ROW
            else op
            for op in self.ops
        ]
        ((source, term),) = self.live.values()
        end = len(planned.steps)
        if planned.final_copy:
            self.copy(source, term, planned.output, (RESULT, 0), end)
        if self.steps.argmax:
            # An assignment of every index and the value's bytes, for each element.
            indices, elements = len(planned.sizes), math.prod(self.steps.shape)
            self.assignment = self.arena.take(elements * (indices + 1) * 8)
            backtrace, sources, tables = backtrace_launch(
                planned, self.where, self.steps.device, self.assignment, ring=self.ring,
                dtype=self.steps.dtype,
            )  # fmt: skip
            self.keep += tables
            self.ops.append(Op(backtrace, self.module(backtrace.spec), sources, end))
        del self.scratch


def backtrace_launch(
    planned: EinsumPlan,
    where: Sequence[int | Scan],
    device: int,
    assignment: int,
    *,
    ring: Semiring,
    dtype: Any,
) -> tuple[Packed, tuple[Source, ...], list[Any]]:
    """The backtrace of ``planned``'s argmaxes (each step's at the arena offset in ``where``,
    or found again by its ``Scan``) into the arena at ``assignment``, a block for each element
    of the result: its launch, sources and tables (to keep while it may run). The values go in
    shared memory where they fit, and the code and schedule too, as int32, where all of them
    fit (see einsum_backtrace); the output's digits follow the schedule."""
    cupy = cupy_module()
    indices = len(planned.sizes)
    program, schedule = backtrace_program(planned, where)
    digits = output_digits(planned)
    depths = (len(schedule) - len(planned.steps) - 1) // 2
    words = len(program) + len(schedule)
    compact = max(map(abs, program), default=0) < 1 << 31 and (indices + words) * 4 <= _SHARED
    kind = np.int32 if compact else np.int64
    code, order = (cupy.asarray(np.asarray(x, kind)) for x in (program, schedule + digits))
    flags = 3 if compact else int(indices * 4 <= _SHARED)
    elements = math.prod(planned.sizes[i] for i in planned.output)
    launcher = Packed(
        backtrace_spec(ring, np.dtype(dtype)), device, (elements, 1, 1),
        (_BACKTRACE_THREADS, 1, 1), [0] * 12,
    )  # fmt: skip
    launcher.shared = 4 * (indices + words if compact else indices if flags else 0)
    sources = (
        (VALUE, code.data.ptr), (VALUE, order.data.ptr), (VALUE, depths), (ARENA, 0),
        (ARENA, assignment), (VALUE, indices), (RESULT, 0), (VALUE, np.dtype(dtype).itemsize),
        (VALUE, flags),
        (VALUE, len(program)), (VALUE, len(schedule)), (VALUE, len(planned.output)),
    )  # fmt: skip
    return launcher, sources, [code, order]


_prepared: dict[Any, Steps] = {}


def prepared(
    planned: EinsumPlan,
    ring: Semiring,
    dtype: Any,
    *,
    argmax: bool,
    device: int,
    table: Any,
    version: int | None = None,
    reuse: bool = True,
    check: Callable[[], None] | None = None,
) -> Steps:
    """``Steps`` for these, made once (the tiles' ``version``, default now's, is part of the
    key: ``table`` is that version's), after ``check`` (what the run refuses)."""
    key = steps_key(
        planned, ring, dtype, argmax=argmax, device=device, reuse=reuse, version=version
    )
    found = _prepared.get(key)
    if found is not None:
        return found
    if check is not None:
        check()
    made = Steps(planned, ring, dtype, argmax=argmax, device=device, table=table, reuse=reuse)
    keep(_prepared, key, made, MAX_STEPS)
    return made


def known(
    planned: EinsumPlan, ring: Semiring, dtype: Any, *, argmax: bool, device: int
) -> Steps | None:
    """``prepared``'s steps (eager, the tiles of now) where made already, else None: a lookup."""
    return _prepared.get(steps_key(planned, ring, dtype, argmax=argmax, device=device, reuse=True))


def steps_key(
    planned: EinsumPlan,
    ring: Semiring,
    dtype: Any,
    *,
    argmax: bool,
    device: int,
    reuse: bool,
    version: int | None = None,
) -> Any:
    """What is prepared for a run of ``planned`` (and a program compiled from it) depends on:
    the tiles' ``version`` (default: now's) included."""
    return (
        planned.key, ring.name, np.dtype(dtype), argmax, device, reuse,
        tables_version() if version is None else version,
    )  # fmt: skip
