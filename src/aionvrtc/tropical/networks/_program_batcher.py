"""tropical.ProgramBatcher: concurrent calls of one compiled program joined into one replay of a
batched program, as ``Batcher`` joins products.

A server answering queries on one network (a graph's weighted independent set, each query with
its own weights) calls one ``EinsumProgram`` from many tasks; each replay is a few microseconds
of the GPU's time behind tens of the host's. Joined, the queries of a moment run as one replay
of the network over a batch (``einsum_program(..., batch=)``, as JAX's ``vmap`` batches a
function): each operand that differs between them gathered from its own query, the others read
once. Batched programs are made for powers of two up to ``max_batch`` (and ``max_batch``), a
group padded up to the next, as vLLM pads a batch to the sizes it captured.

A batch whose program is not made yet never waits for it: its queries run one by one on the
program itself while the batched one is planned, compiled (a warm-up, never a hot compile) and
captured in the background; ``warm`` makes them all ahead.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import numpy as np

from ..._compiler import Compiler
from ..._cuda import synchronize
from ..products import Group, Joiner, Member, OnDevice, cupy_module, run_async
from ._programs import EinsumProgram, make_program
from ._runs import resolved_stream

__all__ = ["ProgramBatcher", "ProgramBatcherStats"]

log = logging.getLogger("aionvrtc.tropical")

# A batched program whose making failed for a passing reason is made again after this long.
RETRY_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class ProgramBatcherStats:
    """What a ProgramBatcher has done, counted since it was made (``ProgramBatcher.stats``).

    Attributes:
        requests: Calls of ``ProgramBatcher.run``, not counting those refused as invalid.
        replays: Replays made for them: a batch of many calls is one replay of a batched
            program, any other call one of the program itself.
        alone: Calls run at once on the program itself because no other task had called
            since the same task's previous call (or ``max_batch`` is 1).
        standins: Calls of a batch run one by one on the program itself because the batched
            program of their size was not made yet (it is made meanwhile, in the background).
        rejected: Calls refused with ``QueueFull`` because ``max_queue`` were waiting (not
            counted in ``requests``).
        padded: Queries' places in batched replays that no call filled (a group of 37 runs in
            the program of 64: 27 padded).
    """

    requests: int
    replays: int
    alone: int
    standins: int
    rejected: int
    padded: int


class _Fetch:
    """A replay's result, read back to the host once the GPU is done with it: by the first of
    its calls to find it done, for all of them."""

    __slots__ = ("_done", "_host", "_reader", "_result")

    def __init__(self, result: Any, stream: Any, reader: Any, device: int) -> None:
        self._result, self._reader, self._host = result, reader, None
        with OnDevice(device):  # (an event of the stream's device)
            self._done = cupy_module().cuda.Event(block=False, disable_timing=True)
            self._done.record(stream)

    async def read(self) -> Any:
        await synchronize(self._done)
        if self._host is None:  # (the replay is done: no wait for the streams' later work)
            self._host = self._result.get(stream=self._reader)
            self._result = None
        return self._host


class _Later:
    """One call's row of a replay's result (None: the whole result), read back when asked."""

    __slots__ = ("_fetch", "_row")

    def __init__(self, fetch: _Fetch, row: int | None) -> None:
        self._fetch, self._row = fetch, row

    async def read(self) -> Any:
        host = await self._fetch.read()
        return host if self._row is None else host[self._row, ...]


class _Failed:
    """A batched program's making that failed: when, and whether for good (a ValueError or
    TypeError: one past the device's memory, say, fails again)."""

    __slots__ = ("at", "error", "lasting")

    def __init__(self, error: BaseException) -> None:
        self.at, self.error = time.monotonic(), error
        self.lasting = isinstance(error, ValueError | TypeError)


class ProgramBatcher:
    """Calls of ``program`` by concurrent tasks within a moment, run as one batched replay.

    ``await batcher.run(*operands)`` returns what ``program.run(*operands)`` would: the result
    (a view into the batch's result: ``.copy()`` it to keep only its own), or with a program
    made with ``argmax=True`` the pair (result, assignment). Calls on one stream that tasks
    make while a group is open join it, up to ``max_batch`` (see ``Batcher`` for the group's
    rules: one pass of the event loop, ``max_delay``, ``max_queue``). A group's operands that
    are the same array in every call are read once (shared); the others are each call's own
    (with ``stacked``, every own operand: each call's rows).

    Args:
        program: The program whose calls are joined (``einsum_program``; not a batched one).
        compiler: The Compiler that fetches the batched programs' kernels: pass the one
            ``program`` was made with. Default: aionvrtc's process-wide Compiler.
        max_batch: The most calls one replay serves (1: each run alone).
        max_delay: Seconds a group stays open past one pass of the event loop (0: not at
            all).
        max_queue: The most calls that may wait at once; one more is refused with
            ``QueueFull`` at once. None: no bound.
        shared: The operands that every call shares, by position (``{3: edges, ...}``): a
            call then passes only the others, in order, and a batch reads these once (the
            graph's tensors, where each query brings its own weights). None: a call passes
            all of them.
        stacked: A call passes its own operands (those not ``shared``; all of one shape) as
            one array, stacked on a new leading axis: a graph's vertex tensors as one
            ``(n, 2)`` array, as a JAX ``vmap`` user writes a query. A call then costs the
            host one array's check and address, not one per operand (tens of microseconds
            for a hundred operands). False: one array per operand.
        host: Each call gets its result on the host (a NumPy array; ``.copy()`` it to keep
            only its own), the batch's copied back once, after one wait for the GPU, where
            each call's own wait and copy would cost the host tens of microseconds a call
            (what a server answering on the network spends). False: on the GPU, not waited
            for.

    Attributes:
        program: The program.
        shared: The shared operands' positions, ascending.
        stacked: Whether a call passes its own operands as one array.
        host: Whether a call's result comes back on the host.
        sizes: The batch sizes of the batched programs, ascending: powers of two below
            ``max_batch``, then ``max_batch``.

    Raises:
        TypeError: ``program`` is not an ``EinsumProgram``; a key of ``shared`` is not an
            int, or its operand not a ``cupy.ndarray``.
        ValueError: ``program`` is batched already; a bound is not what ``Batcher`` takes; a
            shared operand's position is not the program's, or its dtype, shape or device;
            ``shared`` names every operand; ``stacked`` with own operands of many shapes.
    """

    def __init__(
        self,
        program: EinsumProgram,
        *,
        compiler: Compiler | None = None,
        max_batch: int = 64,
        max_delay: float = 0.0,
        max_queue: int | None = None,
        shared: Mapping[int, Any] | None = None,
        stacked: bool = False,
        host: bool = False,
    ) -> None:
        if not isinstance(program, EinsumProgram):
            raise TypeError(
                f"ProgramBatcher takes an EinsumProgram (from einsum_program), not "
                f"{type(program).__name__}"
            )
        if program.batch is not None:
            raise ValueError(
                f"ProgramBatcher takes the program of one query, and this one is batched "
                f"(batch={program.batch}); make it without batch="
            )
        self.program = program
        count = len(program.inputs)
        self._shared: dict[int, Any] = {}
        for position, x in (shared or {}).items():
            if isinstance(position, bool) or not isinstance(position, int | np.integer):
                raise TypeError(f"shared is keyed by operand positions (ints), not {position!r}")
            if not 0 <= position < count:
                raise ValueError(
                    f"shared names operand {position}, and the program takes {count} (0 to "
                    f"{count - 1})"
                )
            self._shared[int(position)] = x
        if count and len(self._shared) == count:
            raise ValueError(
                "shared names every operand of the program: a call would pass none (run the "
                "program itself for that: program.run())"
            )
        self.shared = tuple(sorted(self._shared))
        self._own = [p for p in range(count) if p not in self._shared]  # what a call passes
        self._template: list[Any] = [self._shared.get(p) for p in range(count)]
        if self._shared:  # checked as a call's would be: these with the program's first inputs
            program.check(self._merged(tuple(program.inputs[p] for p in self._own)))
            for position, x in self._shared.items():  # read as one run by every replay
                self._shared[position] = self._template[position] = cupy_module().ascontiguousarray(
                    x
                )
        self.stacked, self.host = stacked, host
        self._reading: Any = None  # (the stream of host=True's reads, made at the first)
        if stacked:
            self._stacking(program)
        self._compiler = compiler
        self._joiner = Joiner(
            "ProgramBatcher", max_batch, max_delay, max_queue,
            interrupted="the batched replay of this program was interrupted: its leading task "
            "was cancelled; ask again",
        )  # fmt: skip
        self.sizes = tuple(
            sorted({1 << n for n in range(max_batch.bit_length()) if 1 << n < max_batch}
                   | {max_batch})
        )  # fmt: skip
        # Batched programs by (varying operands, size): made, being made (None), or failed.
        self._made: dict[tuple[tuple[int, ...], int], EinsumProgram | _Failed | None] = {}
        self._requests = self._replays = self._alone = self._standins = self._padded = 0

    def _stacking(self, program: EinsumProgram) -> None:
        """What ``stacked=True`` calls need: the stack's shape, each own operand's offset in
        it, and the shared operands' addresses (every batch reads them)."""
        shapes = sorted({program.inputs[p].shape for p in self._own})
        if len(shapes) != 1:
            raise ValueError(
                f"stacked=True passes a call's own operands as one array, so they must share "
                f"a shape, and this program's have {len(shapes)}: {shapes}; pass the others "
                "as shared=, or call with one array per operand (stacked=False)"
            )
        self._stack_shape = (len(self._own), *shapes[0])
        row = int(np.prod(shapes[0], dtype=np.int64)) * program.dtype.itemsize
        self._offsets = np.arange(len(self._own), dtype=np.int64)[:, None] * row
        self._addresses: list[list[int]] = [
            [self._shared[p].data.ptr] if p in self._shared else []
            for p in range(len(program.inputs))
        ]

    @property
    def programs(self) -> dict[tuple[tuple[int, ...], int], EinsumProgram]:
        """The batched programs made so far, by (the varying operands' positions, size)."""
        return {k: p for k, p in self._made.items() if isinstance(p, EinsumProgram)}

    def stats(self) -> ProgramBatcherStats:
        """What this ProgramBatcher has done so far.

        Returns:
            The counts of calls, replays, calls run alone or one by one, refused and padded.
        """
        return ProgramBatcherStats(
            self._requests, self._replays, self._alone, self._standins, self._joiner.rejected,
            self._padded,
        )  # fmt: skip

    async def warm(self, batched: Sequence[int] | None = None) -> int:
        """Make, ahead of serving, the batched program of every size in ``sizes`` (a warm-up:
        its kernels never a hot compile), as Triton runs a model's warm-up before it reports
        ready.

        Args:
            batched: The positions of the operands that vary from call to call (the others
                being the same arrays in every call). None: all but the ``shared`` ones (with
                ``stacked``, the only choice).

        Returns:
            How many batched programs are made (``len(sizes)``, less 1: a group of one runs
            on the program itself).

        Raises:
            ValueError: ``stacked``, and ``batched`` names other operands than the calls' own.
            As ``einsum_program`` raises: a kernel that cannot be fetched, a batched program
            past the device's memory.
        """
        varying = tuple(self._own if batched is None else sorted(batched))
        if self.stacked and varying != tuple(self._own):
            raise ValueError(
                f"a stacked ProgramBatcher's batches vary in the calls' own operands "
                f"{self._own} alone (each call's stack), so warm makes those: pass no batched= "
                f"(got {list(varying)})"
            )
        made = 0
        for size in self.sizes:
            if size > 1:
                self._made[varying, size] = await self._make(varying, size)
                made += 1
        return made

    async def run(self, *operands: Any, stream: Any = None) -> Any:
        """``program.run(*operands)``, replayed with the calls that other tasks make at the
        same moment (see ProgramBatcher).

        Args:
            *operands: One query's operands, as ``program.run`` takes them: all of them, or
                with ``shared``, the others in order; with ``stacked``, one array of them.
            stream: The CuPy stream to enqueue on; only calls of one stream share a replay.
                Default: CuPy's current stream of the program's device.

        Returns:
            As ``program.run``: the result, or with ``argmax=True`` the pair (result,
            assignment); the result a NumPy array where ``host``.

        Raises:
            TypeError: An operand is not a ``cupy.ndarray``; raised in this task, before the
                call joins a group.
            ValueError: The operands are not the program's (count, dtype, shape, device);
                raised in this task, before the call joins a group.
            QueueFull: ``max_queue`` calls are waiting; raised at once.
            cupy.cuda.memory.OutOfMemoryError: No memory left for a result or an operand's
                contiguous copy; it reaches every call of the group.
        """
        program = self.program
        if not operands:
            raise ValueError(
                "ProgramBatcher.run takes a query's operands (a call without operands reads "
                "the program's bound inputs: call program.run() for that)"
            )
        stream = resolved_stream(program.device, stream)
        if self.stacked:
            operands = (self._stack(operands, stream),)
        elif self._shared:
            if len(operands) != len(self._own):
                raise ValueError(
                    f"this ProgramBatcher's calls pass {len(self._own)} operands (the "
                    f"program's {len(program.inputs)} less the {len(self._shared)} shared), "
                    f"got {len(operands)}"
                )
            program.check(operands, positions=self._own)  # (the shared ones: once, at first)
            operands = self._merged(operands)
        else:
            program.check(operands)
        joiner = self._joiner
        joiner.admit()
        try:
            self._requests += 1
            key: Hashable = stream.ptr
            if joiner.max_batch == 1 or joiner.alone(key):
                self._alone += 1
                self._replays += 1
                answer = await self._one(operands, stream)
                return await self._delivered(answer) if self.host else answer
            member = Member(operands)
            await joiner.join(key, member, lambda: stream, self._launch)
            if member.error is not None:
                raise member.error
            # (Read back in this task: a caller's cancellation reaches its call alone.)
            return await self._delivered(member.result) if self.host else member.result
        finally:
            joiner.waiting -= 1

    async def _launch(self, group: Group[Any]) -> None:
        """Replay ``group`` as one batched program, each member's result its row (an error
        reaches every member: Joiner.join)."""
        members, stream = group.members, group.about
        program = self.program
        if len(members) == 1:
            self._replays += 1
            members[0].result = await self._one(members[0].asked, stream)
            return
        if self.stacked:  # each own operand from each call's stack
            varying = tuple(self._own)
        else:  # the members' operands by input (a transposition in C: hundreds, maybe)
            columns = list(zip(*(m.asked for m in members), strict=True))
            varying = tuple(i for i in self._own if len(set(map(id, columns[i]))) > 1) or (
                self._own[0],
            )  # (all the same query: each still gets a result of its own)
        size = next(s for s in self.sizes if s >= len(members))
        batched = self._ready(varying, size)
        if batched is None:  # one by one on the program, while the batched one is made
            self._standins += len(members)
            for member in members:
                self._replays += 1
                member.result = await self._one(member.asked, stream)
            return
        self._replays += 1
        self._padded += size - len(members)
        if self.stacked:  # the addresses of every call's rows, at once
            bases = np.array([m.asked[0].data.ptr for m in members], np.int64)
            addresses = self._addresses.copy()
            for position, row in zip(self._own, (bases + self._offsets).tolist(), strict=True):
                addresses[position] = row
            done = await batched.run_addresses(addresses, len(members), stream)
        else:
            done = await batched.run_members([m.asked for m in members], stream)
        result, found = done if program.argmax else (done, None)
        # Each call's result: its row of the batch's, on the GPU, or read back to the host
        # (once, by the first call to find the GPU done: each in its own task).
        fetch = _Fetch(result, stream, self._reader(), program.device) if self.host else None
        rows: list[Any] = [
            _Later(fetch, q) if fetch is not None else result[q, ...] for q in range(len(members))
        ]
        if found is not None:
            names = list(found)
            if program.shape:  # each index's array of the query's result shape
                assignments = [{name: found[name][q] for name in names} for q in range(len(rows))]
            elif names:  # each index's int: the batch's values as one table, a row a query
                table = np.stack([found[name] for name in names], axis=1).tolist()
                assignments = [dict(zip(names, row, strict=True)) for row in table[: len(rows)]]
            else:  # (no index at all: a network of scalars)
                assignments = [{} for _ in rows]
            rows = list(zip(rows, assignments, strict=True))
        for member, answer in zip(members, rows, strict=True):
            member.result = answer

    async def _one(self, asked: Sequence[Any], stream: Any) -> Any:
        """One call replayed on the program itself: its answer (its result to be read back,
        where ``host``)."""
        done = await self.program.run(*self._operands(asked), stream=stream)
        return self._later(done, stream) if self.host else done

    def _reader(self) -> Any:
        """The stream that reads results back to the host (``host``): a stream of its own, so
        that a read waits for its replay alone, not for the groups launched after it."""
        if self._reading is None:
            with OnDevice(self.program.device):
                self._reading = cupy_module().cuda.Stream(non_blocking=True)
        return self._reading

    def _later(self, done: Any, stream: Any) -> Any:
        """A replay's answer of one call (``program.run``'s), its result to be read back."""
        result, found = done if self.program.argmax else (done, None)
        later = _Later(_Fetch(result, stream, self._reader(), self.program.device), None)
        return later if found is None else (later, found)

    async def _delivered(self, answer: Any) -> Any:
        """A call's answer with its result on the host (``host``)."""
        if self.program.argmax:
            later, assignment = answer
            return await later.read(), assignment
        return await answer.read()

    def _stack(self, operands: Sequence[Any], stream: Any) -> Any:
        """A ``stacked`` call's one array, checked (C-contiguous: a copy, where it is not)."""
        cupy = cupy_module()
        program = self.program
        if len(operands) != 1:
            raise ValueError(
                f"this ProgramBatcher (stacked=True) takes one array per call, its "
                f"{len(self._own)} own operands stacked (shape {self._stack_shape}), got "
                f"{len(operands)} operands"
            )
        (stack,) = operands
        if type(stack) is not cupy.ndarray:
            raise TypeError(
                f"ProgramBatcher.run (stacked=True) takes a cupy.ndarray, not "
                f"{type(stack).__module__}.{type(stack).__name__}"
            )
        if (
            stack.shape != self._stack_shape
            or stack.dtype != program.dtype
            or stack.data.device_id != program.device
        ):
            raise ValueError(
                f"ProgramBatcher.run (stacked=True) takes {program.dtype} of shape "
                f"{self._stack_shape} (the {len(self._own)} own operands stacked) on device "
                f"{program.device}, got {stack.dtype} of shape {stack.shape} on device "
                f"{stack.data.device_id}"
            )
        if not stack.flags.c_contiguous:  # (its rows are read at fixed offsets)
            with OnDevice(program.device), stream:
                stack = cupy.ascontiguousarray(stack)
        return stack

    def _operands(self, asked: Sequence[Any]) -> Sequence[Any]:
        """A call's operands as ``program.run`` takes them (a stack's rows, each an operand)."""
        return self._merged(list(asked[0])) if self.stacked else asked

    def _merged(self, own: Sequence[Any]) -> tuple[Any, ...]:
        """A call's operands with the shared ones in their places."""
        merged = self._template.copy()
        for position, x in zip(self._own, own, strict=True):
            merged[position] = x
        return tuple(merged)

    def _ready(self, varying: tuple[int, ...], size: int) -> EinsumProgram | None:
        """A batched program of ``size`` made for ``varying`` or more operands (one that
        gathers an operand each query shares reads it again for each); else None, and the one
        of ``varying`` is made in the background (once; again after RETRY_SECONDS where that
        failed for a passing reason)."""
        key = (varying, size)
        found = self._made.get(key, False)
        if isinstance(found, EinsumProgram):
            return found
        wanted = set(varying)
        for (more, made_size), made in self._made.items():
            if made_size == size and isinstance(made, EinsumProgram) and wanted <= set(more):
                return made
        if found is None or (
            isinstance(found, _Failed)
            and (found.lasting or time.monotonic() - found.at < RETRY_SECONDS)
        ):
            return None  # being made, or failed (for good, or a moment ago)
        self._made[key] = None
        token = anyio.lowlevel.current_token()
        threading.Thread(
            target=self._make_in_background, args=(key, token), daemon=True,
            name=f"aionvrtc batched program x{size}",
        ).start()  # fmt: skip
        return None

    def _make_in_background(self, key: tuple[tuple[int, ...], int], token: Any) -> None:
        """Make a batched program on the caller's event loop (through ``token``), from a
        thread of its own: the loop goes on serving meanwhile, and nothing awaits it."""
        try:
            made: EinsumProgram | _Failed | None = anyio.from_thread.run(
                functools.partial(self._make_unless_ended, *key), token=token
            )
            if made is None:  # the loop ended meanwhile: made again by a loop that asks
                self._made.pop(key, None)
                return
        except BaseException as exc:  # (the loop gone, a kernel that cannot compile)
            log.warning(
                "the batched program of %d queries of %s could not be made; its queries run "
                "one by one: %s", key[1], self.program.plan.subscripts, exc,
            )  # fmt: skip
            made = _Failed(exc)
        self._made[key] = made

    async def _make_unless_ended(self, varying: tuple[int, ...], size: int) -> EinsumProgram | None:
        """``_make``, or None where it is cancelled: the loop is ending (a task of its own,
        which nothing awaits: its cancellation would be reported as unhandled)."""
        try:
            return await self._make(varying, size)
        except anyio.get_cancelled_exc_class():
            return None

    async def _make(self, varying: tuple[int, ...], size: int) -> EinsumProgram:
        program = self.program
        made = await run_async(
            make_program(
                program.plan.subscripts, [x.shape for x in program.inputs],
                semiring=program.semiring, argmax=program.argmax, optimize=program.plan,
                dtype=program.dtype, device=program.device, compiler=self._compiler,
                batch=size, batched=varying,
            ),
            ahead=True,
        )  # fmt: skip
        assert made is not None  # (only_kept=False)
        return made

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"<ProgramBatcher max_batch={self._joiner.max_batch} of {self.program!r}: "
            f"{s.requests} calls in {s.replays} replays>"
        )
