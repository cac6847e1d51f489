"""What every run of a contraction shares, the eager, compiled and sliced alike: the operands
and ``out=`` checked, the stream resolved, the scalar rule of ``argmax=True`` and what a plan
may ask of the device (checked before anything is allocated), a plan's steps prepared, and the
assignment copied back from the GPU and read."""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..._compiler import Compiler
from ..._cuda import Module
from ..._spec import KernelSpec
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
    tables_version,
    tuned_tiles,
)
from ..products import semiring as lookup
from ._plan import EinsumPlan, check_step
from ._steps import Steps, prepared
from ._subscripts import check_dtypes, check_output

__all__ = [
    "ARGMAX_MAX_K",
    "KEPT_HOST_BYTES",
    "MAX_ASSIGNMENTS",
    "MAX_ASSIGNMENT_BYTES",
    "assignment",
    "at_hand",
    "check_arrays",
    "check_counted_plan",
    "check_out",
    "check_plan",
    "check_scalar",
    "copied_to",
    "copy_back",
    "device_bytes",
    "lane_stream",
    "resolved_stream",
    "steps_for",
]

# The kernels write a product's argmax as an int32 k, so with argmax=True no product may sum
# over more than 2**31 values of k. (Everything else they index with 64-bit integers.)
ARGMAX_MAX_K = 2**31
# With argmax=True, an assignment for each element of the result: the backtrace's blocks, one
# an element (a grid's x has at most 2**31 - 1), and pinned host memory for them all, copied
# back in one piece (a buffer of at most KEPT_HOST_BYTES is kept for the steps' next call; a
# larger one goes back to CuPy's pinned pool).
MAX_ASSIGNMENTS = 2**24
MAX_ASSIGNMENT_BYTES = 2**30
KEPT_HOST_BYTES = 2**20


def check_arrays(operands: Sequence[Any], semiring: str) -> tuple[Semiring, list[Any], int]:
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


def check_out(out: Any, dtype: Any, shape: tuple[int, ...], device: int) -> None:
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


def resolved_stream(device: int, stream: Any) -> Any:
    """``stream``, else CuPy's current stream on ``device``: resolved once, here, because the
    backtrace waits for it from a worker thread, whose current stream is another."""
    if stream is not None:
        return stream
    cupy = cupy_module()
    with cupy.cuda.Device(device):
        return cupy.cuda.get_current_stream()


def check_scalar(planned: EinsumPlan, what: str) -> None:
    """``what`` (a sliced or spread run) keeps the argmaxes of one winner: a scalar's only."""
    if planned.output:
        raise ValueError(
            f"{what} with argmax=True backtracks a scalar contraction, and "
            f"{planned.subscripts!r} has output indices {planned.output!r}; give it an output "
            "of no indices ('ij,jk->'), or run it whole on one device for an assignment of "
            "each element"
        )


def check_plan(planned: EinsumPlan, dtype: Any, *, argmax: bool, device: int) -> None:
    """Refuse, before anything is allocated or launched, what the run could not do."""
    # No array larger than the device's memory can be allocated (one that fits may still
    # meet others in use: CuPy's OutOfMemoryError says so then). With argmax=True each result
    # has an int32 argmax beside it.
    limit = device_bytes(device)
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
    if argmax:
        check_elements(planned, limit, f"the {limit:,} bytes of device {device}'s memory")
    kept = 4 * sum(step.size for step in planned.steps) if argmax else 0
    if kept > limit:  # the walk back reads every step's argmax: all are kept to the end
        raise ValueError(
            f"einsum with argmax=True keeps an int32 argmax of every step's result for the walk "
            f"back: {kept:,} bytes for this plan, more than {bound}; contract it in (smaller) "
            "slices (memory_limit=: only the winning slice's argmaxes are kept), pick an order "
            "with smaller intermediates (optimize=), or run without argmax"
        )


def check_counted_plan(planned: EinsumPlan, dtype: Any, *, top: int | None, device: int) -> None:
    """Refuse, before anything is allocated, a counted run (``count=True``, or lists of the
    ``top`` best) whose output or an intermediate, with its int64 counts beside each value,
    would pass the device's memory."""
    limit = device_bytes(device)
    itemsize = (np.dtype(dtype).itemsize + 8) * (top or 1)
    each = "an int64 count beside each value" + (f", {top} of each in a list" if top else "")
    bound = f"the {limit:,} bytes of device {device}'s memory ({each})"
    check_output(planned.output, planned.sizes, itemsize=itemsize, limit=limit, bound=bound)
    for number, step in enumerate(planned.steps):
        check_step(number, step, itemsize=itemsize, limit=limit, bound=bound)


def check_elements(planned: EinsumPlan, limit: int, bound: str) -> None:
    """With argmax=True each element of the result gets an assignment of every index (a block
    of the backtrace each, its int64 values copied back to the host)."""
    elements = math.prod(planned.sizes[i] for i in planned.output)
    nbytes = elements * (len(planned.sizes) + 1) * 8
    if elements > MAX_ASSIGNMENTS or nbytes > min(limit, MAX_ASSIGNMENT_BYTES):
        raise ValueError(
            f"einsum with argmax=True finds an assignment of all {len(planned.sizes):,} "
            f"indices for each of the result's {elements:,} elements ({nbytes:,} bytes), more "
            f"than it takes ({MAX_ASSIGNMENTS:,} elements, {MAX_ASSIGNMENT_BYTES:,} bytes, "
            f"within {bound}); sum more indices (fewer in the output), or run without argmax"
        )


@functools.cache
def device_bytes(device: int) -> int:
    """The memory of ``device``, in bytes (it does not change while the process runs)."""
    _, total = cupy_module().cuda.Device(device).mem_info
    return int(total)


def steps_for(
    planned: EinsumPlan,
    ring: Semiring,
    dtype: Any,
    *,
    argmax: bool,
    device: int,
    reuse: bool = True,
) -> Steps | None:
    """``planned``'s steps, prepared once with the device's tiles of now (checked when first
    prepared: see _check_plan); None for a contraction with an index of size 0, whose result
    is the semiring's zero and launches nothing."""
    check = functools.partial(check_plan, planned, dtype, argmax=argmax, device=device)
    if 0 in planned.sizes.values():
        check()
        return None
    version = tables_version()  # (before the table: a table installed between is fetched next)
    return prepared(
        planned, ring, dtype, argmax=argmax, device=device, table=tuned_tiles(device),
        version=version, reuse=reuse, check=check,
    )  # fmt: skip


def copy_back(steps: Steps, at: int, stream: Any) -> Any:
    """Enqueue on ``stream`` the copy of the assignment (and the value's bytes) from the
    device address ``at`` to pinned host memory, returned (read it with ``assignment``)."""
    cupy = cupy_module()
    count = math.prod(steps.shape) * (len(steps.plan.sizes) + 1)
    try:  # one that ``assignment`` gave back (a pinned allocation took half this call's time)
        host = steps.hosts.pop()
    except IndexError:
        host = cupy.cuda.alloc_pinned_memory(count * 8)
    with OnDevice(steps.device):
        cupy.cuda.runtime.memcpyAsync(
            host.ptr, at, count * 8,
            cupy.cuda.runtime.memcpyDeviceToHost, stream.ptr,
        )  # fmt: skip
    return host


def assignment(steps: Steps, host: Any) -> dict[str, Any]:
    """The assignment ``copy_back`` brought to ``host``, once the copy is done (``host`` is
    taken again by a later copy: read nothing from it after this): each index's int for a
    scalar result, else each index's int64 array of the result's shape (each element's)."""
    names, numbers = steps.named
    indices = len(steps.plan.sizes)
    if not steps.shape:
        values = np.frombuffer(host, np.int64, count=indices)[numbers].tolist()
        steps.hosts.append(host)
        return dict(zip(names, values, strict=True))
    elements = math.prod(steps.shape)
    table = np.frombuffer(host, np.int64, count=elements * (indices + 1))
    by_index = table.reshape(elements, indices + 1)[:, numbers].T.copy()  # (host is reused)
    if elements * (indices + 1) * 8 <= KEPT_HOST_BYTES:  # (a large one: to CuPy's pool)
        steps.hosts.append(host)
    return {name: row.reshape(steps.shape) for name, row in zip(names, by_index, strict=True)}


def at_hand(
    steps: Steps, device: int, compiler: Compiler | None
) -> Work[tuple[list[Module | None], dict[int, tuple[Packed, Module]]]]:
    """The kernels of a run of ``steps`` on ``device``, none compiled in front of the run that
    it can do without: each one loaded at once (by ``steps.specs``); for one not loaded, its
    ops (by number) run on a loaded kernel that computes the same product (``instead``, with
    its module: a ``Batcher`` and ``matmul`` do the same) while their own loads in the
    background. Only a kernel with an op that nothing loaded stands in for (a copy, say, or a
    new process's first product) is fetched, compiled where new, before the run."""
    modules = [loaded(spec, device, compiler) for spec in steps.specs]
    missing = [number for number, module in enumerate(modules) if module is None]
    if not missing:
        return modules, {}
    standins = steps.standins_made(missing)
    if standins is None:
        standins = yield Offload(functools.partial(steps.standins, missing))
    instead: dict[int, tuple[Packed, Module]] = {}
    needed: list[int] = []
    later: list[KernelSpec] = []
    for kernel in missing:
        found: dict[int, tuple[Packed, Module]] = {}
        for op in steps.users[kernel]:
            standin = _first_loaded(standins[op], device, compiler)
            if standin is None:
                needed.append(kernel)
                break
            found[op] = standin
        else:
            instead.update(found)
            later.append(steps.specs[kernel])
    if later:
        load_soon(later, device, compiler)
    if needed:
        fetched = yield Fetch([steps.specs[kernel] for kernel in needed], device, compiler)
        for kernel, module in zip(needed, fetched, strict=True):
            modules[kernel] = module
    return modules, instead


def _first_loaded(
    launches: Sequence[Packed], device: int, compiler: Compiler | None
) -> tuple[Packed, Module] | None:
    for launch in launches:
        module = loaded(launch.spec, device, compiler)
        if module is not None:
            return launch, module
    return None


def copied_to(arrays: Sequence[Any], place: int, stream: Any) -> tuple[list[Any], Any]:
    """The operands copied to device ``place`` (C order), after the work queued on ``stream``
    (the operands' device's), and the stream of ``place`` that copied them, on which all of
    that device's share is allocated and run: memory CuPy's pool hands out again on that
    stream is reused only after the work queued there."""
    cupy = cupy_module()
    source = arrays[0].device.id
    with OnDevice(source), stream:
        runs = [cupy.ascontiguousarray(x) for x in arrays]  # (the operands themselves, mostly)
        ready = stream.record()
    there = lane_stream(place)
    with OnDevice(place), there:
        there.wait_event(ready)
        copies = [cupy.empty(x.shape, x.dtype) for x in arrays]
        for x, y in zip(runs, copies, strict=True):
            if x.size:
                y.data.copy_from_device_async(x.data, x.nbytes, there)
        copied = there.record()
    with OnDevice(source):
        stream.wait_event(copied)  # the contiguous runs go back to the pool after the copies
    return copies, there


_lane_streams = threading.local()


def lane_stream(device: int) -> Any:
    """This thread's stream for its share of a sliced run on ``device``: one for the thread's
    life, not one a call (CuPy's pool keeps memory freed on a stream for that stream)."""
    found: dict[int, Any] = getattr(_lane_streams, "by_device", None) or {}
    _lane_streams.by_device = found
    if device not in found:
        with OnDevice(device):
            found[device] = cupy_module().cuda.Stream(non_blocking=True)
    return found[device]
