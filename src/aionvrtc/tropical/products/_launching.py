"""Launching a plan: the kernel's module on the plan's device, and each kernel's launch (grid,
block and arguments packed as the driver reads them) computed once, so that a repeated call only
writes its operands' pointers and calls cuLaunchKernel."""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from array import array
from collections.abc import Sequence
from typing import Any

import anyio.to_thread

from ..._compiler import Compiler
from ..._cuda import Module
from ..._exceptions import first_error
from ..._spec import KernelSpec
from ..._sync import default_compiler
from ._product_plan import BackwardPlan, Plan, cupy_module, strides

__all__ = [
    "THREADS",
    "BackwardLaunch",
    "Launch",
    "OnDevice",
    "Packed",
    "fill",
    "first_error",
    "launch",
    "load_soon",
    "loaded",
    "module",
    "module_sync",
    "thread_blocks",
    "tile_grid",
]

THREADS = 256  # a block's threads, for every product kernel but the tuned tiles
_TILE = 64
_MAX_GRID_YZ = 65535


def loaded(spec: KernelSpec, device: int, compiler: Compiler | None) -> Module | None:
    """``spec``'s module on ``device`` if ``compiler`` (default: the process-wide one) has it
    loaded already, else None: dict lookups, no task switch."""
    return (compiler if compiler is not None else default_compiler()).loaded(spec, device=device)


def load_soon(specs: Sequence[KernelSpec], device: int, compiler: Compiler | None) -> None:
    """Have ``specs`` loaded on ``device`` in the background, those not loaded there yet (the
    Compiler asks once while one loads, and again after a while where it failed for a passing
    reason): for a call that runs on a kernel standing in for one meanwhile."""
    try:
        (compiler if compiler is not None else default_compiler()).prefetch(specs, device=device)
    except Exception:  # (closed, or no way to its loop from here): the next call fetches it
        return


async def module(spec: KernelSpec, device: int, compiler: Compiler | None) -> Module:
    """``spec``'s module on ``device`` from ``compiler`` (default: the process-wide one)."""
    if compiler is not None:
        return await compiler.get(spec, device=device)
    # A loaded module is served here; the first use of a kernel on a device may compile it, so
    # off this event loop. (default_compiler() is a lock and a check once started; its first
    # call, as before, starts the Compiler's thread from here.)
    compiler = default_compiler()
    found = compiler.loaded(spec, device=device)
    if found is not None:
        return found
    return await anyio.to_thread.run_sync(functools.partial(compiler.get_sync, spec, device=device))


def module_sync(spec: KernelSpec, device: int, compiler: Compiler | None) -> Module:
    """``module`` for code that is not async."""
    if compiler is None:
        compiler = default_compiler()
    return compiler.get_sync(spec, device=device)


class Packed:
    """A kernel's launch with its arguments packed once: each argument in a 64-bit slot of one
    array (an int32 reads its slot's low half: the hosts of CUDA GPUs are little-endian) and
    cuLaunchKernel's array of their addresses beside it. A call writes its pointers into the
    first slots, and ``flags`` into the last where the kernel takes them, then launches. The
    lock keeps two threads from launching each other's pointers (cuLaunchKernel has copied the
    arguments when it returns)."""

    __slots__ = (
        "_addresses", "_function", "_lock", "_values", "block", "device", "grid", "shared", "spec",
    )  # fmt: skip

    def __init__(
        self,
        spec: KernelSpec,
        device: int,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        args: Sequence[int],
    ) -> None:
        self.spec, self.device, self.grid, self.block = spec, device, grid, block
        self.shared = 0  # dynamic shared memory, bytes
        self._values = array("q", args)
        base, _ = self._values.buffer_info()
        self._addresses = array("Q", [base + 8 * i for i in range(len(args))])
        self._function: tuple[weakref.ref[Module], int] | None = None
        self._lock = threading.Lock()

    def function(self, module: Module) -> int:
        """The kernel's CUfunction in ``module``, looked up once per module (held weakly: a
        closed Compiler's modules unload, whatever plans remain)."""
        known = self._function
        if known is not None and known[0]() is module:
            return known[1]
        pointer = int(module.get_function(self.spec.name_expressions[0]).ptr)
        self._function = (weakref.ref(module), pointer)
        return pointer

    def run_pointers(self, module: Module, pointers: Sequence[int], stream: Any) -> None:
        """Enqueue the kernel on ``stream`` with ``pointers`` in its first argument slots."""
        self._launch(module, pointers, stream, -1)

    def _launch(self, module: Module, pointers: Sequence[int], stream: Any, flags: int) -> None:
        function = self.function(module)
        with OnDevice(self.device):  # the module lives in this device's context
            handle = _handle(stream)
            values = self._values
            with self._lock:
                if len(pointers) <= 8:  # a product's few: slot by slot costs least
                    for slot, pointer in enumerate(pointers):
                        values[slot] = pointer
                else:  # a gather's hundreds: one copy
                    values[: len(pointers)] = array("q", pointers)
                if flags >= 0:
                    values[-1] = flags
                _driver().launchKernel(
                    function, *self.grid, *self.block, self.shared, handle,
                    self._addresses.buffer_info()[0], 0,
                )  # fmt: skip


# Whether this thread has a CUDA context current: the launches call the driver, which needs
# one, and a thread's runtime binds it only at the runtime's first call there that needs it (a
# thread whose arrays all came from CuPy's pool may never have made one).
_bound = threading.local()


class OnDevice:
    """``device`` current within, the one before restored: CuPy's ``Device`` context costs
    more than the check where the device is current already, as on every hot call. A thread's
    first use also makes the device's context current for the driver's calls."""

    __slots__ = ("_before", "_device")

    def __init__(self, device: int) -> None:
        self._device = device
        self._before = -1

    def __enter__(self) -> None:
        runtime = _runtime()
        before = runtime.getDevice()
        if before != self._device:
            runtime.setDevice(self._device)  # (which makes its primary context current)
            self._before = before
        elif not getattr(_bound, "done", False):
            runtime.setDevice(self._device)
            runtime.free(0)  # the usual way to have the runtime bind the context here
            _bound.done = True

    def __exit__(self, *exc: object) -> None:
        if self._before >= 0:
            _runtime().setDevice(self._before)


@functools.cache
def _driver() -> Any:
    from cupy_backends.cuda.api import driver

    return driver


@functools.cache
def _runtime() -> Any:
    from cupy_backends.cuda.api import runtime

    return runtime


def _handle(stream: Any) -> int:
    """``stream``'s CUstream, or that of CuPy's current stream (of the current device)."""
    return int((stream if stream is not None else cupy_module().cuda.get_current_stream()).ptr)


class Launch(Packed):
    """A product's launch, from its plan; the pointers (a, b, c, argmax) are each call's."""

    __slots__ = ("_checks", "_order")

    def __init__(
        self,
        spec: KernelSpec,
        device: int,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        args: Sequence[int],
        *,
        order: tuple[int, ...],
        checks: tuple[tuple[int, tuple[tuple[int, int], ...]], ...] | None,
    ) -> None:
        super().__init__(spec, device, grid, block, args)
        # Which of (a, b, c, argmax, null) each pointer slot takes; the last argument's bits
        # (None: the kernel has no such argument), each (bit, ((slot, bytes its pointer must be
        # a multiple of), ...)), set where all hold.
        self._order, self._checks = order, checks

    @classmethod
    def of(cls, plan: Plan) -> Launch:
        """``plan``'s kernel, grid and arguments, for any operands laid out as its own (its
        layout alone is read: a plan without its arrays will do, ``Plan.unbound``)."""
        sab, sam, sak = plan.a_strides
        sbb, sbk, sbn = plan.b_strides
        scb, scm, scn = plan.c_strides
        sib, sim, sin = plan.index_strides or (0, 0, 0)
        sizes = (plan.m, plan.n, plan.k, plan.batch)
        item = plan.dtype.itemsize
        order: tuple[int, ...] = (0, 1, 2, 3 if plan.index_strides is not None else 4)
        checks: list[tuple[int, tuple[tuple[int, int], ...]]] = []
        if plan.rows:
            # The skinny kernel computes C' = A' B'; wide products run transposed (A' = B^T,
            # B' = A^T, C' = C^T: the products commute). Strides are (batch, rows, columns).
            if plan.transposed:
                order = (1, 0, 2)
                each = (sbb, sbn, sbk, sab, sak, sam, scb, scn, scm)
                m, n = plan.n, plan.m
            else:
                order = (0, 1, 2)
                each = (sab, sam, sak, sbb, sbk, sbn, scb, scm, scn)
                m, n = plan.m, plan.n
            # Rows of A' load 16 bytes at a time, and rows of C' store four elements at a time,
            # where contiguous and aligned (see tropical_gemm_rows).
            if each[2] == 1 and all(s % (16 // item) == 0 for s in each[0:2]):
                checks.append((1, ((0, 16),)))
            if each[8] == 1 and all(s % 4 == 0 for s in each[6:8]):
                checks.append((2, ((2, 4 * item),)))
            grid = (min(-(-m // THREADS), 1 << 16), 1, min(plan.batch, _MAX_GRID_YZ))
            return cls(
                plan.spec, plan.device, grid, (THREADS, 1, 1),
                [0, 0, 0, m, n, plan.k, plan.batch, *each, 0], order=order, checks=tuple(checks),
            )  # fmt: skip
        if plan.tile is not None:
            bm, bn, _, tm, tn, _ = plan.tile
            # 16-byte loads need 16-byte aligned rows and batches.
            if all(s % (16 // item) == 0 for s in (sab, sam, sbb, sbk)):
                checks.append((1, ((0, 16), (1, 16))))
            args = [0, 0, 0, 0, *sizes, sab, sam, sbb, sbk, scb, scm, scn, sib, sim, sin, 0]
            block = ((bm // tm) * (bn // tn), 1, 1)
            grid = tile_grid(plan.m, plan.n, plan.batch, bm, bn)
            return cls(plan.spec, plan.device, grid, block, args, order=order,
                       checks=tuple(checks))  # fmt: skip
        args = [
            0, 0, 0, 0, *sizes, sab, sam, sak, sbb, sbk, sbn, scb, scm, scn, sib, sim, sin,
        ]  # fmt: skip
        return cls(
            plan.spec,
            plan.device,
            tile_grid(plan.m, plan.n, plan.batch, _TILE, _TILE),
            (THREADS, 1, 1),
            args,
            order=order,
            checks=None,
        )

    def run(self, module: Module, operands: tuple[Any, Any, Any, Any], stream: Any) -> None:
        """Enqueue C = A (x) B, ``operands`` (a, b, c, argmax or None), on ``stream`` (None:
        CuPy's current stream of the plan's device), with ``module`` holding the kernel."""
        a, b, c, index = operands
        pointers = (a.data.ptr, b.data.ptr, c.data.ptr, 0 if index is None else index.data.ptr)
        self.run_pointers(module, pointers, stream)

    def run_pointers(self, module: Module, pointers: Sequence[int], stream: Any) -> None:
        """``run`` with the operands' addresses, (a, b, c, argmax or 0)."""
        pointers = (*pointers, 0)
        ordered = [pointers[i] for i in self._order]
        flags = -1
        if self._checks is not None:
            flags = 0
            for bit, needs in self._checks:
                if all(ordered[slot] % size == 0 for slot, size in needs):
                    flags |= bit
        self._launch(module, ordered, stream, flags)


def launch(plan: Plan, module: Module, stream: Any) -> None:
    """Enqueue ``plan``'s kernel (from ``module``) on ``stream``, writing its outputs.

    The launch is computed from the plan at each call (``matmul`` keeps it per layout) and
    takes no checks beyond the plan's; the work is not synchronised.

    Args:
        plan: The product, from ``plan``: operands, outputs and kernel.
        module: The module that holds ``plan.spec``'s kernel, loaded on the plan's device
            (``await compiler.get(plan.spec, device=plan.device)``).
        stream: The CuPy stream to enqueue on. None: CuPy's current stream of the plan's
            device.

    Raises:
        KeyError: ``module`` does not hold the plan's kernel (it is another spec's).
        RuntimeError: The driver refused the launch (CuPy's ``CUDADriverError``): ``module``
            was loaded on another device, or the product is empty (M, N or the batch 0:
            ``matmul`` launches nothing for those).
    """
    Launch.of(plan).run(module, (plan.a, plan.b, plan.c, plan.index), stream)


def fill(device: int, stream: Any, arrays: Sequence[tuple[Any, Any]]) -> None:
    """Fill each (array, value) of ``arrays`` on ``stream`` (None: CuPy's current one) of
    ``device``, the array None skipped: what a product with no kernel to run leaves."""
    cupy = cupy_module()
    with cupy.cuda.Device(device), stream if stream is not None else contextlib.nullcontext():
        for x, value in arrays:
            if x is not None:
                x.fill(value)


def tile_grid(m: int, n: int, batch: int, bm: int, bn: int) -> tuple[int, int, int]:
    """The grid of a product in ``bm`` x ``bn`` tiles of C: row tiles on x (up to 2**31 - 1);
    column tiles and batches beyond 65535 are looped over."""
    return -(-m // bm), min(-(-n // bn), _MAX_GRID_YZ), min(batch, _MAX_GRID_YZ)


def thread_blocks(total: int) -> int:
    """The grid of a kernel with a thread per each of ``total`` outputs: up to 2**20 blocks of
    ``THREADS`` (a grid-stride loop covers the rest)."""
    return max(1, min(-(-total // THREADS), 1 << 20))


class BackwardLaunch(Packed):
    """A backward's launch, from its plan: the pointers (grad_c, argmax, a, b, grad_a, grad_b)
    are each call's, and its gradients are made per call in one zeroed allocation."""

    __slots__ = ("_offset", "_size", "a_shape", "b_shape", "dtype", "empty")

    def __init__(self, plan: BackwardPlan) -> None:
        dims = plan.shapes
        g3 = plan.grad_c if dims.batched else plan.grad_c[None]
        i3 = plan.argmax if dims.batched else plan.argmax[None]
        # The gradients are C-contiguous, shaped as a and b.
        args = [
            0, 0, 0, 0, 0, 0, dims.m, dims.n, dims.batch,
            *(s // g3.itemsize for s in g3.strides), *(s // 4 for s in i3.strides),
            *strides(plan.a), *strides(plan.b),
            *_contiguous(plan.a.shape), *_contiguous(plan.b.shape),
        ]  # fmt: skip
        total = dims.batch * dims.m * dims.n
        super().__init__(plan.spec, plan.device, (thread_blocks(total), 1, 1),
                         (THREADS, 1, 1), args)  # fmt: skip
        self.empty = total == 0  # nothing flows back: the gradients stay zero
        self.a_shape, self.b_shape, self.dtype = plan.a.shape, plan.b.shape, plan.a.dtype
        # grad_b starts at a 256-byte boundary after grad_a, as an allocation of its own would.
        item = plan.a.itemsize
        self._offset = -(-plan.a.size * item // 256) * 256
        self._size = self._offset + plan.b.size * item

    def gradients(self, stream: Any) -> tuple[Any, Any]:
        """Zeroed (grad_a, grad_b) on the plan's device, zeroed in order on ``stream``."""
        cupy = cupy_module()
        with OnDevice(self.device):
            memory = cupy.cuda.alloc(self._size)
            if self._size:
                _runtime().memsetAsync(memory.ptr, 0, self._size, _handle(stream))
        grad_a = cupy.ndarray(self.a_shape, self.dtype, memory)
        grad_b = cupy.ndarray(self.b_shape, self.dtype, memory + self._offset)
        return grad_a, grad_b

    def run(self, module: Module, operands: tuple[Any, ...], stream: Any) -> None:
        """Enqueue the backward kernel on ``stream``: ``operands`` (grad_c, argmax, a, b,
        grad_a, grad_b), the kernel adding into the last two."""
        pointers = [x.data.ptr for x in operands]
        self._launch(module, pointers, stream, -1)


def _contiguous(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """Element strides (batch, rows, columns), as ``strides`` gives, of a C-contiguous array."""
    rows, columns = shape[-2:]
    batched = len(shape) == 3 and shape[0] != 1
    return (rows * columns if batched else 0), columns, 1
