"""A NumPy implementation of the tropical products, for tests and as a CPU fallback.

Same semantics as the GPU kernels: integer infinities are the type's extremes and arithmetic
saturates; a float product that is NaN (-inf + inf) counts as the semiring's zero; the argmax
is the smallest k attaining the result, or -1 when the result is the semiring's zero (K = 0, or
no k contributes). Works in chunks of rows so memory stays bounded.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._semirings import Semiring, semiring
from ._shapes import check_operands

__all__ = ["matmul"]

# Elements of the (rows, K, N) product block evaluated at once.
CHUNK_ELEMENTS = 1 << 22


def _combine(ring: Semiring, a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> Any:
    """a (x) b elementwise (broadcasting), saturating for integers."""
    dtype = a.dtype
    if ring.name == "andor":
        return np.logical_and(a, b)
    if dtype.kind == "f":
        with np.errstate(invalid="ignore", over="ignore"):
            out = a + b if ring.mul == "+" else a * b
        return np.where(np.isnan(out), ring.zero(dtype), out)
    info = np.iinfo(dtype)
    lowest, highest = dtype.type(info.min), dtype.type(info.max)
    a, b = np.broadcast_arrays(a, b)
    if ring.mul == "*":
        with np.errstate(divide="ignore", over="ignore"):
            limit = np.where(a != 0, highest // np.where(a != 0, a, 1), highest)
            return np.where((a != 0) & (b > limit), highest, a * b)
    with np.errstate(over="ignore"):
        s = a + b  # wraps; the overflow test below sees it
    overflow = ((a ^ s) & (b ^ s)) < 0
    s = np.where(overflow, np.where(a < 0, lowest, highest), s)
    if ring.name == "maxplus":
        s = np.where(s == lowest, lowest + 1, s)  # a finite sum stays finite
        return np.where((a == lowest) | (b == lowest), lowest, s)
    s = np.where(s == highest, highest - 1, s)
    return np.where((a == highest) | (b == highest), highest, s)


def _product(
    ring: Semiring, a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    m, k = a.shape
    n = b.shape[1]
    zero = ring.zero(a.dtype)
    value = np.full((m, n), zero, dtype=a.dtype)
    index = np.full((m, n), -1, dtype=np.int32)
    if k == 0 or m == 0 or n == 0:
        return value, index
    rows = max(1, CHUNK_ELEMENTS // max(1, k * n))
    for start in range(0, m, rows):
        block = _combine(ring, a[start : start + rows, :, None], b[None, :, :])  # (r, K, N)
        if ring.name == "andor":
            best = block.any(axis=1)
        elif ring.maximise:  # the reduction starts from zero, as in the kernels
            best = np.maximum(block.max(axis=1), zero)
        else:
            best = np.minimum(block.min(axis=1), zero)
        first = np.argmax(block == best[:, None, :], axis=1).astype(np.int32)
        value[start : start + rows] = best
        index[start : start + rows] = np.where(best == zero, -1, first)
    return value, index


def matmul(a: Any, b: Any, semiring: str = "maxplus", *, argmax: bool = False) -> Any:
    """C = A (x) B over ``semiring`` on NumPy arrays; with ``argmax=True``, (C, argmax).

    2-D or 3-D (a leading batch dimension; a batch of 1 broadcasts) operands of one dtype.
    """
    ring = _semiring(semiring)
    a, b = np.asarray(a), np.asarray(b)
    shapes = check_operands(ring, a, b)
    a3, b3 = (x if x.ndim == 3 else x[None] for x in (a, b))
    batch = shapes.batch
    pairs = [
        _product(ring, a3[i if a3.shape[0] > 1 else 0], b3[i if b3.shape[0] > 1 else 0])
        for i in range(batch)
    ]
    m, n = shapes.m, shapes.n
    value = np.stack([p[0] for p in pairs]) if pairs else np.empty((0, m, n), a.dtype)
    index = np.stack([p[1] for p in pairs]) if pairs else np.empty((0, m, n), np.int32)
    if not shapes.batched:
        value, index = value[0], index[0]
    return (value, index) if argmax else value


_semiring = semiring
