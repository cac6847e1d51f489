"""tropical.Batcher: products that concurrent tasks ask for at the same moment, run as one
batched launch.

A 256^3 product fills 4 of an H100's 132 SMs, and each launch costs the host more than the GPU
takes to run it; so a server's concurrent requests are served faster by one launch of the whole
batch (64 x 256^3 min-plus with argmax on an H100: 0.33 ms, against 1.96 ms launched one by one;
benchmarks/launch.py). The first
request of a layout (shapes, strides, dtype, semiring, argmax, device, stream) opens a group and
lets the event loop run the other ready tasks, whose requests of that layout join it; it then
launches the group as one batched product and hands each member its own slice. A task that is
alone (no other task asked since its last request) launches at once, as ``matmul`` would.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
import numpy as np

from ..._compiler import Compiler
from .._bounded import keep
from ._calls import matmul, matmul_sync
from ._joining import Group, Joiner, Member
from ._launching import load_soon, loaded, module
from ._plan_cache import MAX_PLANS, Product, find, planned_product, ready
from ._product_plan import batch_specs, cupy_module
from ._shape_classes import tuned_tiles
from ._twins import warm_modules

__all__ = ["Batcher", "BatcherStats"]


@dataclass(frozen=True, slots=True)
class BatcherStats:
    """What a Batcher has done, counted since it was made (``Batcher.stats``).

    Attributes:
        requests: Products asked for through ``Batcher.matmul``, not counting those refused
            as invalid.
        launches: Launches made for them: a batch of many requests is one launch, any other
            request one.
        alone: Requests launched at once because no other task had asked since the same
            task's previous request.
        standins: Launches made on a kernel standing in for their own, which was not loaded
            yet (a new batch size's, say) and loaded meanwhile in the background.
        rejected: Requests refused with ``QueueFull`` because ``max_queue`` requests were
            waiting (not counted in ``requests``).
    """

    requests: int
    launches: int
    alone: int
    standins: int = 0
    rejected: int = 0


class Batcher:
    """Products requested by concurrent tasks within a moment, run as one batched launch.

    ``await batcher.matmul(a, b, semiring, argmax=...)`` returns what ``tropical.matmul`` would
    (C, or (C, argmax)), enqueued on ``stream`` (default: CuPy's current stream) without
    synchronising. Requests of one layout (2-D operands of the same shapes, strides and dtype,
    the same semiring and argmax, on one device and stream) that tasks make while a group is
    open join it, up to ``max_batch``. A group is open while the tasks that are ready to run
    make their requests (one pass of the event loop), and ``max_delay`` seconds more if given
    (for requests that arrive apart, at the cost of their latency); a task that is alone (no
    other task has asked since its last request) is not held at all. Operands of other devices
    or streams never share a launch.

    Each result is a view into the group's batched output, so it keeps that buffer alive
    (``.copy()`` it to keep only its own). A request that is cancelled while its group waits
    is still computed, and nothing of it reaches the others; an invalid request raises in its
    own task before it joins; an error of the batched launch (out of memory, a kernel that
    cannot compile) reaches the members of that group. Requests of 3-D operands run as
    ``matmul`` runs them. A batch whose kernel is not loaded yet (a size that moves it to
    another shape class) runs at once on a loaded kernel that computes it too, while its own
    loads in the Compiler's background lane (``stats().standins``); a layout's first request
    queues its kernels of every batch size to load so, and ``warm`` loads them all ahead. The
    Batcher has no task of its own: usable from any task of one event loop, asyncio or trio,
    without a context manager.

    Args:
        compiler: The Compiler that fetches the kernels. Default: aionvrtc's process-wide
            Compiler.
        max_batch: The most requests one launch serves (1: each launched alone). Kept as the
            attribute ``max_batch``.
        max_delay: Seconds a group stays open past one pass of the event loop, waiting for
            more requests, unless it fills first (0: not at all), as Triton's
            ``max_queue_delay_microseconds`` and Ray Serve's ``batch_wait_timeout_s`` hold a
            batch. Kept, as a float, as the attribute ``max_delay``.
        max_queue: The most requests that may wait in this Batcher at once (in a group not
            launched yet, or whose kernel is being fetched); one more is refused at once with
            ``QueueFull``, as Triton's ``max_queue_size`` refuses past it, rather than wait
            behind them. Default None: no bound. Kept as the attribute ``max_queue``.

    Raises:
        ValueError: ``max_batch`` is not a positive int, ``max_delay`` is not a finite
            number of seconds >= 0, or ``max_queue`` is neither a positive int nor None.
    """

    def __init__(
        self,
        compiler: Compiler | None = None,
        *,
        max_batch: int = 64,
        max_delay: float = 0.0,
        max_queue: int | None = None,
    ) -> None:
        self._compiler = compiler
        self._joiner = Joiner(
            "Batcher", max_batch, max_delay, max_queue,
            interrupted="the batched launch of this product was interrupted: its leading task "
            "was cancelled while the kernel was being fetched; ask again",
        )  # fmt: skip
        self._requests = self._launches = self._alone = self._standins = 0
        self._seen: dict[Product, None] = {}  # layouts whose batch kernels were asked for

    @property
    def max_batch(self) -> int:
        """The most requests one launch serves."""
        return self._joiner.max_batch

    @property
    def max_delay(self) -> float:
        """Seconds a group stays open past one pass of the event loop."""
        return self._joiner.max_delay

    @property
    def max_queue(self) -> int | None:
        """The most requests that may wait at once (None: no bound)."""
        return self._joiner.max_queue

    async def warm(
        self,
        m: int,
        n: int,
        k: int,
        semiring: str = "maxplus",
        dtype: Any = "float32",
        *,
        argmax: bool = False,
        device: int | None = None,
    ) -> int:
        """Compile and load, ahead of serving, every kernel this Batcher launches for products
        of M x K and K x N operands: at each batch size up to ``max_batch`` (``batch_specs``,
        with the device's tuned tiles), as Triton runs a model's warm-up before it reports
        ready. A warm-up: never a hot compile (``Compiler.start_serving``), and overtaken by
        live requests. Each kernel is then launched once on scratch operands (up to
        ``max_batch`` of them, freed after), so that the first burst waits neither for the
        driver's loading of its code nor for CuPy's compiling of the stacking of operands.

        Args:
            m: Rows of A and C.
            n: Columns of B and C.
            k: Columns of A, rows of B.
            semiring: ``"maxplus"``, ``"minplus"``, ``"maxmul"`` or ``"andor"``.
            dtype: The element type: a NumPy dtype, type or name such as ``"float32"``.
            argmax: The requests ask for the argmax.
            device: The CUDA device. Default: CuPy's current device.

        Returns:
            How many kernels are loaded on ``device`` for them (a few: a batch size takes a
            kernel of its own only where it moves the batch to another shape class).

        Raises:
            ValueError: ``semiring`` is not one of the four; ``dtype`` is not one it takes; a
                size is below 1.
            CompileError, NvrtcError, ModuleLoadError: As ``Compiler.warm`` raises them.
            CompilerClosed: The Batcher's compiler is closed.
            RuntimeError: The Batcher's compiler has not been opened (``async with``).
        """
        if device is None:
            device = int(cupy_module().cuda.runtime.getDevice())
        specs = batch_specs(
            m, n, k, semiring, dtype, argmax=argmax, max_batch=self.max_batch,
            table=tuned_tiles(device),
        )  # fmt: skip
        loaded = await warm_modules(specs, device, self._compiler)
        # Each kernel launched once (the driver loads a module's code on its first launch),
        # and CuPy's stacking of operands compiled and its memory pool grown for the batch:
        # what else a first burst would wait for. In a worker thread: CuPy compiles on first
        # use, and this waits for the GPU.
        dtype = np.dtype(dtype)
        run = functools.partial(
            self._exercise, m, n, k, semiring, dtype=dtype, argmax=argmax, device=device
        )
        await anyio.to_thread.run_sync(run)
        return loaded

    def _exercise(
        self, m: int, n: int, k: int, semiring: str, *, dtype: Any, argmax: bool, device: int
    ) -> None:
        cupy = cupy_module()
        with cupy.cuda.Device(device):
            a, b = cupy.empty((m, k), dtype), cupy.empty((k, n), dtype)
            matmul_sync(a, b, semiring, argmax=argmax, compiler=self._compiler)
            for size in dict.fromkeys((2, self.max_batch)) if self.max_batch > 1 else ():
                # Operands of separate allocations, stacked as a burst's are (CuPy takes
                # another way, and kernel, for many arrays than for two); a shared B and a
                # B of each request's own.
                batch = _gather([cupy.empty((m, k), dtype) for _ in range(size)])
                bs = _gather([cupy.empty((k, n), dtype) for _ in range(size)])
                for right in (b, bs):
                    matmul_sync(batch, right, semiring, argmax=argmax, compiler=self._compiler)
                del batch, bs
            cupy.cuda.Device(device).synchronize()

    def stats(self) -> BatcherStats:
        """What this Batcher has done so far.

        Returns:
            The counts of requests, launches and requests launched alone, as of now.
        """
        return BatcherStats(
            self._requests, self._launches, self._alone, self._standins, self._joiner.rejected
        )

    async def matmul(
        self, a: Any, b: Any, semiring: str = "maxplus", *, argmax: bool = False, stream: Any = None
    ) -> Any:
        """C = A (x) B as ``tropical.matmul`` computes it, launched with the products that
        other tasks ask for at the same moment (see Batcher).

        Args:
            a: The left operand: a CuPy array of shape (M, K), or (batch, M, K).
            b: The right operand: a CuPy array of shape (K, N), or (batch, K, N), of ``a``'s
                dtype and on ``a``'s device.
            semiring: ``"maxplus"``, ``"minplus"``, ``"maxmul"`` or ``"andor"``, as for
                ``tropical.matmul``.
            argmax: Also compute the int32 index of the winning k (as ``tropical.matmul``).
            stream: The CuPy stream the work is enqueued on; only requests of one stream share
                a launch. Default: CuPy's current stream.

        Returns:
            C, or the pair (C, argmax) with ``argmax=True``, enqueued on ``stream`` without
            synchronising. A batched request's arrays are views into the group's output.

        Raises:
            TypeError: An operand is not a CuPy array, or the dtypes do not fit (as for
                ``tropical.matmul``); raised in this task, before the request joins a group.
            ValueError: The semiring, shapes or devices do not fit (as for
                ``tropical.matmul``); raised in this task, before the request joins a group.
            cupy.cuda.memory.OutOfMemoryError: The outputs (or the stacked operands of a
                batch) do not fit in GPU memory.
            CompileError: NVRTC refused the kernel. This and the next four come from the
                kernel's first use on a device only; in a batch, they reach every member of
                its group.
            NvrtcError: NVRTC cannot be used, or cannot compile for this GPU.
            ModuleLoadError: The kernel could not be loaded onto the device
                (``GPUOutOfMemoryError`` where GPU memory is full).
            CompilerClosed: The Batcher's compiler is closed.
            RuntimeError: The Batcher's compiler has not been opened (``async with``).
            QueueFull: ``max_queue`` requests are waiting in this Batcher; raised at once,
                before the request joins anything.
            AionvrtcError: The task that led this request's group was cancelled while the
                kernel was being fetched, so the batch was not launched: ask again.
        """
        product, made = find(a, b, semiring, argmax=argmax, out=None, accumulate=False)
        joiner = self._joiner
        joiner.admit()
        try:
            self._requests += 1
            if product.launch is None or len(product.shape) != 2 or self.max_batch == 1:
                self._launches += 1
                return await matmul(
                    a, b, semiring, argmax=argmax, stream=stream, compiler=self._compiler
                )
            if product not in self._seen:
                self._load_batches(product)
            if stream is None:
                stream = cupy_module().cuda.get_current_stream(product.device)
            key = (product, stream.ptr)
            if joiner.alone(key):
                self._alone += 1
                self._launches += 1
                c, index = made if made is not None else product.outputs(None)
                await self._run(product, (a, b, c, index), stream)
                return (c, index) if argmax else c
            member = Member((a, b))
            await joiner.join(key, member, lambda: (product, semiring, stream), self._launch)
            if member.error is not None:
                raise member.error
            return member.result
        finally:
            joiner.waiting -= 1

    def _load_batches(self, product: Product) -> None:
        """At a layout's first request, its kernel at every batch size up to ``max_batch``
        (``batch_specs``) queued to load in the background (those not loaded yet), as ``warm``
        loads them ahead: a burst that comes later runs on its own kernel, not a stand-in
        (one of fewer, larger tiles, which runs the batch slower)."""
        keep(self._seen, product, None, MAX_PLANS)
        layout = product.layout
        assert layout is not None  # (product.launch is)
        specs = batch_specs(
            layout.m, layout.n, layout.k, layout.ring.name, layout.dtype, argmax=product.argmax,
            max_batch=self.max_batch, table=tuned_tiles(product.device),
        )  # fmt: skip
        load_soon(specs, product.device, self._compiler)

    async def _launch(self, group: Group[tuple[Product, str, Any]]) -> None:
        """Launch ``group`` as one product, each member's result its slice (an error reaches
        every member: Joiner.join)."""
        members = group.members
        product, semiring, stream = group.about
        self._launches += 1
        if len(members) == 1:
            (member,) = members
            c, index = product.outputs(None)
            await self._run(product, (*member.asked, c, index), stream)
            member.result = (c, index) if product.argmax else c
            return
        cupy = cupy_module()
        with cupy.cuda.Device(product.device), stream:
            a = _gather([m.asked[0] for m in members])
            # A squaring's B is its A: stacked once.
            same = all(m.asked[1] is m.asked[0] for m in members)
            b = a if same else _gather([m.asked[1] for m in members])
        if a.ndim == 2 and b.ndim == 2:
            # All ask for the same product: each still gets a result of its own.
            a = cupy.ndarray((len(members), *a.shape), a.dtype, a.data, strides=(0, *a.strides))
        batched, c, index = planned_product(
            a, b, semiring, argmax=product.argmax, out=None, accumulate=False
        )
        await self._run(batched, (a, b, c, index), stream)
        values = _slices(c)
        if index is None:
            for member, value in zip(members, values, strict=True):
                member.result = value
        else:
            for member, value, where in zip(members, values, _slices(index), strict=True):
                member.result = (value, where)

    async def _run(self, product: Product, operands: Any, stream: Any) -> None:
        launch = product.launch
        assert launch is not None
        found = loaded(launch.spec, launch.device, self._compiler)
        if found is None:
            # A kernel that can stand in runs the batch now; else its own is fetched.
            standin = ready(product, self._compiler)
            if standin is not None:
                launch, found = standin
                self._standins += launch is not product.launch  # (its own, loaded meanwhile)
            else:
                found = await module(launch.spec, launch.device, self._compiler)
        launch.run(found, operands, stream)

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"<Batcher max_batch={self.max_batch} max_delay={self.max_delay}: {s.requests} "
            f"requests in {s.launches} launches>"
        )


def _slices(x: Any) -> list[Any]:
    """x[0], x[1], ... of a new (C-contiguous) batched output, made as arrays over its memory:
    half the host time of indexing, for each member of every batch."""
    ndarray = cupy_module().ndarray
    shape, dtype, step, memory = x.shape[1:], x.dtype, x.strides[0], x.data
    return [ndarray(shape, dtype, memory + i * step) for i in range(len(x))]


def _gather(arrays: list[Any]) -> Any:
    """One operand for a batch of requests' operands, copying only where it must: the same
    array for all (it broadcasts), the views at a constant stride that a previous batch's
    outputs are (its C, in order), else a stacked copy."""
    first = arrays[0]
    start = first.data.ptr
    if all(x.data.ptr == start for x in arrays):
        return first
    step = arrays[1].data.ptr - start
    memory = first.data.mem
    if (
        step > 0
        and step % first.itemsize == 0
        and all(
            x.data.mem is memory and x.data.ptr == start + i * step for i, x in enumerate(arrays)
        )
    ):
        shape = (len(arrays), *first.shape)
        return cupy_module().ndarray(shape, first.dtype, first.data, strides=(step, *first.strides))
    return cupy_module().stack(arrays)
