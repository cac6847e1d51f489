"""The k-best product on the GPU (tropical_top.cu): each element a list of up to k (value, count)
pairs, distinct values best first, on a last contiguous axis; the step of ``einsum(...,
top=k)`` (networks), which lays its operands out so (each value's list and its counts' alike).
"""

from __future__ import annotations

from typing import Any

from ..._compiler import Compiler
from ._counted import warp_per_output
from ._launching import THREADS, Packed, loaded, thread_blocks
from ._semirings import Semiring
from ._specs import TOP_BOUNDS, top_spec
from ._twins import Fetch, Work

__all__ = ["MAX_TOP_GPU", "top_lanes", "top_product"]

# The longest list the GPU keeps (its registers hold each output's).
MAX_TOP_GPU = TOP_BOUNDS[-1]


def top_product(
    operands: tuple[Any, Any, Any, Any],
    out: tuple[Any, Any],
    *,
    ring: Semiring,
    stream: Any,
    compiler: Compiler | None,
    standins: bool = True,
) -> Work[tuple[Any, Any]]:
    """Enqueue ``out`` = the k best of (a, counts of a) (x) (b, counts of b), ``operands``
    (a, b, counts of a, counts of b): CuPy views of shapes (batch, M, K, k) and (batch, K, N,
    k) (a batch of 1 broadcasts) whose last axis is contiguous and whose other strides are
    whole lists, each count array laid out as its values; ``out`` (values, counts) contiguous
    (batch, M, N, k). A count past 2^63 - 1 is -1 (the values stand). Returns ``out``.
    ``standins`` as ``matmul_work``'s: False, the kernel is always asked for (a Fetch)."""
    a, b, na, nb = operands
    values, counts = out
    k = a.shape[3]
    assert 1 <= k <= MAX_TOP_GPU
    assert b.shape[3] == values.shape[3] == k
    batch, m, n = values.shape[:3]
    kmax = next(bound for bound in TOP_BOUNDS if bound >= k)
    total = batch * m * n
    if total == 0:
        return out
    lanes = top_lanes(total, a.shape[2])
    spec = top_spec(ring, a.dtype, kmax=kmax, lanes=lanes)
    device = a.device.id
    lists = [_lists(x, batch) for x in (a, b, values)]
    grid = (thread_blocks(total * lanes), 1, 1)
    args = [0] * 6 + [m, n, a.shape[2], batch, k]
    args += [s for three in lists for s in three]
    launcher = Packed(spec, device, grid, (THREADS, 1, 1), args)
    found = loaded(spec, device, compiler) if standins else None
    if found is None:
        [found] = yield Fetch((spec,), device, compiler)
    pointers = [x.data.ptr for x in (a, na, b, nb, values, counts)]
    launcher.run_pointers(found, pointers, stream)
    return out


def top_lanes(outputs: int, k: int) -> int:
    """Threads per output list of a k-best product of ``outputs`` lists, each a sum over
    ``k``: a warp where a long sum goes into few outputs (as the counted products choose)."""
    return 32 if warp_per_output(outputs, k) else 1


def _lists(x: Any, batch: int) -> tuple[int, int, int]:
    """The strides of a 4-D array of lists in whole lists (batch, rows, columns): 0 along an
    axis of size 1 (the batch's broadcasts)."""
    each = [s // x.itemsize for s in x.strides]
    k = x.shape[3]
    assert k == 1 or each[3] == 1, (x.shape, x.strides)
    found = [0 if n == 1 else s // k for n, s in zip(x.shape[:3], each[:3], strict=True)]
    assert all(n == 1 or s % k == 0 for n, s in zip(x.shape[:3], each[:3], strict=True))
    return found[0], found[1], found[2]
