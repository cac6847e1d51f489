"""tropical.einsum: a planned contraction (_contraction) run as batched tropical products, and
the backtrace from each product's argmax to an assignment of every index."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.to_thread
import numpy as np

from .._actor import Compiler
from .._cuda import Module
from .._spec import KernelSpec
from ._classes import tuned_tiles
from ._contraction import (
    EinsumPlan,
    Step,
    Term,
    check_step,
    contiguous,
    einsum_plan,
    group_index,
    step_specs,
)
from ._launching import first_error, launch, module, module_sync
from ._planning import Plan, cupy_module, plan
from ._semirings import Semiring
from ._semirings import semiring as lookup
from ._subscripts import check_dtypes, check_output

__all__ = ["backtrace", "einsum", "einsum_products", "einsum_sync"]

# A run's product argmaxes, by step: what backtrace reads.
_Trace = list[tuple[Step, Any]]

# The kernels write a product's argmax as an int32 k, so with argmax=True no product may sum
# over more than 2**31 values of k. (Everything else they index with 64-bit integers.)
ARGMAX_MAX_K = 2**31


async def einsum(
    subscripts: str,
    *operands: Any,
    semiring: str = "maxplus",
    argmax: bool = False,
    optimize: Any = "auto",
    out: Any = None,
    stream: Any = None,
    compiler: Compiler | None = None,
) -> Any:
    """The tropical einsum of CuPy arrays on the GPU (``reference.einsum``'s semantics), enqueued
    on ``stream`` (default: CuPy's current stream). Returns the result, a new array (or
    ``out``, filled); with ``argmax=True``, for a scalar result (an output of no indices,
    ``"ij,jk->"``), the pair (result, assignment): a dict giving every index a value at which
    the product of the operands' entries attains the result (this waits for the GPU).

    The order of the pairwise contractions comes from ``optimize`` (see ``einsum_plan``: an
    opt_einsum strategy, optimizer or path, or a plan from ``einsum_plan``, which also says
    which operands are copied). Each contraction is one batched tropical product over strided
    views; its kernel is fetched through ``compiler`` (default: aionvrtc's process-wide
    Compiler), compiled on first use. Planning runs in a worker thread unless ``optimize`` is
    a plan already. An output or intermediate larger than the device's memory, and with
    ``argmax=True`` a product over more than 2**31 values of k (its argmax is an int32), are
    refused with a ValueError before anything is allocated."""
    ring, arrays, device = _check(operands, semiring)
    if isinstance(optimize, EinsumPlan):
        planned = einsum_plan(subscripts, *arrays, optimize=optimize)
    else:
        planned = await anyio.to_thread.run_sync(
            functools.partial(einsum_plan, subscripts, *arrays, optimize=optimize)
        )
    _check_plan(planned, arrays[0].dtype, argmax=argmax, device=device)
    # The steps take their kernels from the tiles of now, those fetched here, even where
    # autotune installs others meanwhile (a kernel missing from `modules` would be fetched on
    # the event loop's thread, blocking it, or raising with a caller's Compiler).
    table = tuned_tiles(device)
    modules: dict[KernelSpec, Module] = {}

    async def fetch(spec: KernelSpec) -> None:
        modules[spec] = await module(spec, device, compiler)

    try:
        async with anyio.create_task_group() as tg:
            for spec in _specs(planned, ring, arrays, argmax=argmax, table=table):
                tg.start_soon(fetch, spec)
    except ExceptionGroup as group:
        raise first_error(group) from None
    stream = _stream(device, stream)

    def get(spec: KernelSpec) -> Module:
        try:
            return modules[spec]
        except KeyError:  # step_specs and the steps' planner disagree: a bug to report
            raise AssertionError(
                f"einsum: a step planned {spec.name_expressions[0]}, which its plan's kernels "
                f"({', '.join(s.name_expressions[0] for s in modules)}) do not include"
            ) from None

    result, trace = _run(
        planned, ring, arrays, get, argmax=argmax, out=out, stream=stream, table=table
    )
    if not argmax:
        return result
    assignment = await anyio.to_thread.run_sync(
        functools.partial(backtrace, planned, trace, device=device, stream=stream)
    )
    return result, assignment


def einsum_sync(
    subscripts: str,
    *operands: Any,
    semiring: str = "maxplus",
    argmax: bool = False,
    optimize: Any = "auto",
    out: Any = None,
    stream: Any = None,
    compiler: Compiler | None = None,
) -> Any:
    """``einsum`` for code that is not async; ``compiler``, if given, must run in a portal or
    this must be a worker thread of its event loop."""
    ring, arrays, device = _check(operands, semiring)
    planned = einsum_plan(subscripts, *arrays, optimize=optimize)
    _check_plan(planned, arrays[0].dtype, argmax=argmax, device=device)
    stream = _stream(device, stream)

    def get(spec: KernelSpec) -> Module:
        return module_sync(spec, device, compiler)

    result, trace = _run(planned, ring, arrays, get, argmax=argmax, out=out, stream=stream)
    if not argmax:
        return result
    return result, backtrace(planned, trace, device=device, stream=stream)


def einsum_products(
    subscripts: str, *operands: Any, semiring: str = "maxplus", optimize: Any = "auto"
) -> tuple[Any, list[tuple[Plan, Module]]]:
    """``einsum_sync``'s result and the products it launched, (plan, module) each, so that a
    benchmark can time the product kernels alone (``launch``) against the whole contraction."""
    ring, arrays, device = _check(operands, semiring)
    planned = einsum_plan(subscripts, *arrays, optimize=optimize)
    _check_plan(planned, arrays[0].dtype, argmax=False, device=device)
    stream = _stream(device, None)
    products: list[tuple[Plan, Module]] = []

    def get(spec: KernelSpec) -> Module:
        return module_sync(spec, device, None)

    result, _ = _run(
        planned, ring, arrays, get, argmax=False, out=None, stream=stream, products=products
    )
    return result, products


def _stream(device: int, stream: Any) -> Any:
    """``stream``, else CuPy's current stream on ``device``: resolved once, here, because the
    backtrace waits for it from a worker thread, whose current stream is another."""
    if stream is not None:
        return stream
    cupy = cupy_module()
    with cupy.cuda.Device(device):
        return cupy.cuda.get_current_stream()


def _check(operands: Sequence[Any], semiring: str) -> tuple[Semiring, list[Any], int]:
    cupy = cupy_module()
    ring = lookup(semiring)
    if not operands:
        raise ValueError("einsum needs at least one operand")
    for i, x in enumerate(operands):
        if not isinstance(x, cupy.ndarray):
            hint = ": move it with cupy.asarray(...)" if isinstance(x, np.ndarray) else ""
            raise TypeError(
                f"einsum operand {i} must be a cupy.ndarray, not "
                f"{type(x).__module__}.{type(x).__name__}{hint}"
            )
    arrays = list(operands)
    check_dtypes(ring, arrays)
    devices = sorted({x.device.id for x in arrays})
    if len(devices) > 1:
        raise ValueError(f"einsum operands are on devices {devices}; move them to one device")
    return ring, arrays, devices[0]


def _check_plan(planned: EinsumPlan, dtype: Any, *, argmax: bool, device: int) -> None:
    """Refuse, before anything is allocated or launched, what the run could not do."""
    if argmax and planned.output:
        raise ValueError(
            f"einsum argmax=True backtracks a scalar contraction, and {planned.subscripts!r} "
            f"has output indices {planned.output!r}; give it an output of no indices "
            "('ij,jk->') to find an assignment that attains it"
        )
    # No array larger than the device's memory can be allocated (one that fits may still
    # meet others in use: CuPy's OutOfMemoryError says so then). With argmax=True each result
    # has an int32 argmax beside it.
    limit = _device_bytes(device)
    bound = f"the {limit:,} bytes of device {device}'s memory"
    check_output(planned.output, planned.sizes, itemsize=dtype.itemsize, limit=limit, bound=bound)
    itemsize = dtype.itemsize + (4 if argmax else 0)
    if argmax:
        bound += " (an int32 argmax, 4 bytes, beside each element)"
    for number, step in enumerate(planned.steps):
        check_step(number, step, itemsize=itemsize, limit=limit, bound=bound)
        if argmax and step.first.shape[2] > ARGMAX_MAX_K:
            raise ValueError(
                f"einsum step {number} ({step.subscripts}) sums over {step.first.shape[2]:,} "
                f"values of its indices {''.join(step.k)!r} in one product, more than the "
                f"{ARGMAX_MAX_K:,} an int32 argmax (argmax=True) can number; pick an order "
                "that sums fewer at once (another optimize=), contract the network in slices, "
                "or run without argmax"
            )


@functools.cache
def _device_bytes(device: int) -> int:
    """The memory of ``device``, in bytes (it does not change while the process runs)."""
    _, total = cupy_module().cuda.Device(device).mem_info
    return int(total)


def _specs(
    planned: EinsumPlan, ring: Semiring, arrays: Sequence[Any], *, argmax: bool, table: Any
) -> list[KernelSpec]:
    if 0 in planned.sizes.values():
        return []
    return step_specs(planned, ring, arrays[0].dtype, argmax=argmax, table=table)


def _run(
    planned: EinsumPlan,
    ring: Semiring,
    arrays: Sequence[Any],
    get: Callable[[KernelSpec], Module],
    *,
    argmax: bool,
    out: Any,
    stream: Any,
    table: Any = None,
    products: list[tuple[Plan, Module]] | None = None,
) -> tuple[Any, _Trace]:
    """Enqueue the plan's steps, their kernels chosen from ``table`` (default: the device's
    tuned tiles now); the result (in ``out`` if given) and each step's argmax. ``products``
    collects each product launched."""
    cupy = cupy_module()
    sizes = planned.sizes
    dtype = arrays[0].dtype
    device = arrays[0].device.id
    shape = tuple(sizes[i] for i in planned.output)
    _check_out(out, dtype, shape, device)
    trace: _Trace = []
    with cupy.cuda.Device(device), stream:
        if 0 in sizes.values():
            if argmax:
                empty = next(i for i, n in sizes.items() if n == 0)
                raise ValueError(
                    f"einsum index {empty!r} has size 0: the sum is empty and no assignment "
                    "attains it"
                )
            result = out if out is not None else cupy.empty(shape, dtype)
            result.fill(ring.zero(dtype))
            return result, trace
        # Operands by number: the inputs, then each step's result (see Step).
        live: dict[int, tuple[Any, Term]] = dict(enumerate(zip(arrays, planned.terms, strict=True)))
        direct = False
        for count, step in enumerate(planned.steps):
            first, second = _operands(step, [live.pop(i) for i in step.operands], ring, sizes)
            b, m, _ = first.shape
            n = second.shape[2]
            last = count == len(planned.steps) - 1
            direct = last and out is not None and not planned.final_copy and out.flags.c_contiguous
            c = _strided(out, (b, m, n), (m * n, n, 1)) if direct else cupy.empty((b, m, n), dtype)
            index = cupy.empty((b, m, n), np.int32) if argmax else None
            product = plan(
                first, second, ring.name, argmax=argmax, out=(c, index) if argmax else c,
                accumulate=False, table=table,
            )  # fmt: skip
            loaded = get(product.spec)
            launch(product, loaded, stream)
            if products is not None:
                products.append((product, loaded))
            if argmax:
                trace.append((step, index))
            result = Term(step.result, contiguous([sizes[i] for i in step.result]))
            live[step.number] = (c, result)
        ((x, term),) = live.values()
        if direct:
            return out, trace  # the last product wrote it
        view = _nd(x, term, sizes).transpose([term.indices.index(i) for i in planned.output])
        if out is not None:
            cupy.copyto(out, view)
            return out, trace
        # A view over the term, not x.reshape(shape): CuPy reshapes to () as to (1,).
        return (view.copy() if planned.final_copy else view), trace


def _check_out(out: Any, dtype: Any, shape: tuple[int, ...], device: int) -> None:
    if out is None:
        return
    cupy = cupy_module()
    if not isinstance(out, cupy.ndarray):
        raise TypeError(f"out must be a cupy.ndarray, not {type(out).__name__}")
    if out.dtype != dtype or out.shape != shape or out.device.id != device:
        raise ValueError(
            f"out must be {dtype} of shape {shape} on device {device}, got {out.dtype} of "
            f"shape {out.shape} on device {out.device.id}"
        )


def _operands(
    step: Step, chosen: list[tuple[Any, Term]], ring: Semiring, sizes: Any
) -> tuple[Any, Any]:
    """A step's two 3-D operands: (first, second), or (first, ones) for a reduction."""
    if step.second is None:
        ((x, term),) = chosen
        dtype = x.dtype
        k = step.first.shape[2]
        ones = cupy_module().full(k, ring.one(dtype), dtype)
        return _read(x, term, step.first, sizes), _strided(ones, (1, k, 1), (0, 1, 1))
    if step.swapped:
        chosen = chosen[::-1]
    return _read(*chosen[0], step.first, sizes), _read(*chosen[1], step.second, sizes)


def _strided(x: Any, shape: Sequence[int], strides: Sequence[int]) -> Any:
    """A view of ``x`` from its first element, with element ``strides``."""
    cupy = cupy_module()
    return cupy.lib.stride_tricks.as_strided(
        x, shape=tuple(shape), strides=tuple(s * x.itemsize for s in strides)
    )


def _nd(x: Any, term: Term, sizes: Any) -> Any:
    """``x`` with one axis per index of ``term`` (its diagonals taken)."""
    return _strided(x, [sizes[i] for i in term.indices], term.strides)


def _read(x: Any, term: Term, view: Any, sizes: Any) -> Any:
    """The 3-D operand of a product: ``x`` viewed, or first copied to the order that can be."""
    if view.copy is not None:
        axes = [term.indices.index(i) for i in view.copy]
        x = _nd(x, term, sizes).transpose(axes).copy()  # C order (ascontiguousarray: 0-d to 1-d)
    return _strided(x, view.shape, view.strides)


def backtrace(planned: EinsumPlan, trace: _Trace, *, device: int, stream: Any) -> dict[str, int]:
    """An assignment of every index attaining a scalar contraction's value: from the last
    product back, the output indices of each step are known, and its argmax at them names
    the winning value of the indices it summed (tropical back-propagation). Waits for
    ``stream``."""
    cupy = cupy_module()
    sizes = planned.sizes
    assignment: dict[str, int] = {}
    with cupy.cuda.Device(device):
        stream.synchronize()
        for step, index in reversed(trace):
            at = tuple(group_index(g, assignment, sizes) for g in (step.batch, step.m, step.n))
            # -1: the value is the semiring's zero, which every assignment attains.
            won = max(int(index[at]), 0)
            if step.split is not None:  # the winner's offset within its part of K
                won += assignment[step.split] * step.first.shape[2]
            for i in reversed(step.k):
                won, assignment[i] = divmod(won, sizes[i])
    # Every index of an input was summed by some product (a scalar contraction outputs none).
    return {i: assignment[i] for i in dict.fromkeys("".join(planned.inputs))}
