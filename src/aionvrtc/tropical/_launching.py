"""Launching a plan: the kernel's module on the plan's device, its arguments, grid and block."""

from __future__ import annotations

import functools
from typing import Any

import anyio.to_thread
import numpy as np

from .._actor import Compiler
from .._cuda import Module
from .._spec import KernelSpec
from .._sync import default_compiler
from ._planning import BackwardPlan, Plan, cupy_module, strides

__all__ = ["first_error", "launch", "launch_backward", "module", "module_sync"]

_THREADS = 256
_TILE = 64
_MAX_GRID_YZ = 65535


async def module(spec: KernelSpec, device: int, compiler: Compiler | None) -> Module:
    """``spec``'s module on ``device`` from ``compiler`` (default: the process-wide one)."""
    if compiler is not None:
        return await compiler.get(spec, device=device)
    # A loaded module is served here; the first use of a kernel on a device may compile it, so
    # off this event loop. (default_compiler() is a lock and a check once started; its first
    # call, as before, starts the Compiler's thread from here.)
    compiler = default_compiler()
    loaded = compiler.loaded(spec, device=device)
    if loaded is not None:
        return loaded
    return await anyio.to_thread.run_sync(functools.partial(compiler.get_sync, spec, device=device))


def first_error(group: BaseExceptionGroup[Exception]) -> BaseException:
    """The first error of a task group of kernel fetches: the first that failed stopped the
    others, so it is raised as ``compiler.get`` would, not as a group of one (a failure is
    rarely more than one error repeated)."""
    first: BaseException = group.exceptions[0]
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    return first


def module_sync(spec: KernelSpec, device: int, compiler: Compiler | None) -> Module:
    """``module`` for code that is not async."""
    if compiler is None:
        compiler = default_compiler()
    return compiler.get_sync(spec, device=device)


def launch(plan: Plan, module: Module, stream: Any) -> None:
    """Enqueue ``plan``'s kernel (from ``module``) on ``stream``."""
    cupy = cupy_module()
    sab, sam, sak = plan.a_strides
    sbb, sbk, sbn = plan.b_strides
    c3 = plan.c if plan.batched else plan.c[None]
    scb, scm, scn = (s // c3.itemsize for s in c3.strides)
    if plan.index is not None:
        i3 = plan.index if plan.batched else plan.index[None]
        sib, sim, sin = (s // 4 for s in i3.strides)
        index_arg: Any = plan.index
    else:
        sib = sim = sin = 0
        index_arg = np.uint64(0)  # a null pointer
    sizes = (np.int64(plan.m), np.int64(plan.n), np.int64(plan.k), np.int64(plan.batch))
    if plan.rows:
        # The skinny kernel computes C' = A' B'; wide products run transposed (A' = B^T,
        # B' = A^T, C' = C^T: the products commute). Strides are (batch, rows, columns).
        if plan.transposed:
            operands = (plan.b, plan.a, plan.c)
            each = (sbb, sbn, sbk, sab, sak, sam, scb, scn, scm)
            m, n = plan.n, plan.m
        else:
            operands = (plan.a, plan.b, plan.c)
            each = (sab, sam, sak, sbb, sbk, sbn, scb, scm, scn)
            m, n = plan.m, plan.n
        # Rows of A' load 16 bytes at a time, and rows of C' store four elements at a time,
        # where contiguous and aligned (see tropical_gemm_rows).
        loads = each[2] == 1 and _vectors(operands[0], each[0:2], 16 // plan.a.itemsize)
        stores = each[8] == 1 and _vectors(operands[2], each[6:8], 4)
        grid = (min(-(-m // _THREADS), 1 << 16), 1, min(plan.batch, _MAX_GRID_YZ))
        block: tuple[int, ...] = (_THREADS,)
        dims = (m, n, plan.k, plan.batch)
        args: tuple[Any, ...] = (
            *operands,
            *map(np.int64, (*dims, *each)),
            np.int32(loads | stores << 1),
        )
    elif plan.tile is not None:
        bm, bn, _, tm, tn, _ = plan.tile
        grid = _grid(plan, bm, bn)
        block = ((bm // tm) * (bn // tn),)
        # 16-byte loads need 16-byte aligned rows and batches.
        vector = 16 // plan.a.itemsize
        aligned = _vectors(plan.a, (sab, sam), vector) and _vectors(plan.b, (sbb, sbk), vector)
        args = (
            plan.a, plan.b, plan.c, index_arg, *sizes,
            np.int64(sab), np.int64(sam), np.int64(sbb), np.int64(sbk),
            np.int64(scb), np.int64(scm), np.int64(scn),
            np.int64(sib), np.int64(sim), np.int64(sin), np.int32(aligned),
        )  # fmt: skip
    else:
        grid = _grid(plan, _TILE, _TILE)
        block = (_THREADS,)
        args = (
            plan.a, plan.b, plan.c, index_arg, *sizes,
            np.int64(sab), np.int64(sam), np.int64(sak),
            np.int64(sbb), np.int64(sbk), np.int64(sbn),
            np.int64(scb), np.int64(scm), np.int64(scn),
            np.int64(sib), np.int64(sim), np.int64(sin),
        )  # fmt: skip
    function = module.get_function(plan.spec.name_expressions[0])
    with cupy.cuda.Device(plan.device):
        function(grid, block, args, stream=stream)


def _vectors(x: Any, strides: tuple[int, ...], width: int) -> bool:
    """Whether ``x`` can be read or written ``width`` elements at a time at offsets that are
    multiples of ``strides`` (in elements): its start and every stride aligned to the vector."""
    return bool(x.data.ptr % (width * x.itemsize) == 0 and all(s % width == 0 for s in strides))


def _grid(plan: Plan, bm: int, bn: int) -> tuple[int, int, int]:
    # Row tiles on x (up to 2**31 - 1); column tiles and batches beyond 65535 are looped over.
    return (
        -(-plan.m // bm),
        min(-(-plan.n // bn), _MAX_GRID_YZ),
        min(plan.batch, _MAX_GRID_YZ),
    )


def backward_blocks(plan: BackwardPlan) -> int:
    """The backward kernel's grid: a thread per output, up to 2**20 blocks (a grid-stride loop
    covers the rest); 0 for an empty product, which launches nothing."""
    total = plan.shapes.batch * plan.shapes.m * plan.shapes.n
    return max(1, min(-(-total // _THREADS), 1 << 20)) if total else 0


def launch_backward(plan: BackwardPlan, module: Module, stream: Any) -> None:
    """Enqueue ``plan``'s backward kernel (from ``module``) on ``stream``."""
    cupy = cupy_module()
    dims = plan.shapes
    g3 = plan.grad_c if dims.batched else plan.grad_c[None]
    i3 = plan.argmax if dims.batched else plan.argmax[None]
    grad_a, grad_b = plan.grads
    args = (
        plan.grad_c,
        plan.argmax,
        plan.a,
        plan.b,
        grad_a,
        grad_b,
        np.int64(dims.m),
        np.int64(dims.n),
        np.int64(dims.batch),
        *(np.int64(s // g3.itemsize) for s in g3.strides),
        *(np.int64(s // 4) for s in i3.strides),
        *(np.int64(s) for s in strides(plan.a)),
        *(np.int64(s) for s in strides(plan.b)),
        *(np.int64(s) for s in strides(grad_a)),
        *(np.int64(s) for s in strides(grad_b)),
    )
    function = module.get_function(plan.spec.name_expressions[0])
    with cupy.cuda.Device(plan.device):
        function((backward_blocks(plan),), (_THREADS,), args, stream=stream)
