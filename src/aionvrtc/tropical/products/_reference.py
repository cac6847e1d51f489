"""The NumPy product of the tropical semirings, with the kernels' semantics: ``matmul`` for the
tests' oracle and a CPU fallback (``tropical.reference.matmul``), and the pieces that the NumPy
contraction (``tropical.reference.einsum``) builds on: the semiring's (x) (``combine``), the
bound on a result's bytes and the chunk of work evaluated at once.

Integer infinities are the type's extremes and arithmetic saturates; a float product that is NaN
(-inf + inf) counts as the semiring's zero; the argmax is the smallest k attaining the result,
or -1 when the result is the semiring's zero (K = 0, or no k contributes). Works in chunks of
rows so memory stays bounded.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ._counts import check_count_arrays, check_counted, entry_counts
from ._semirings import Semiring
from ._semirings import semiring as lookup
from ._shapes import check_operands, check_size

__all__ = ["CHUNK_ELEMENTS", "MAX_BYTES", "check_max_bytes", "combine", "matmul", "max_bytes_bound"]

# Elements of the (rows, K, N) product block evaluated at once; for einsum, of one block of
# products, and the largest joint array over all indices that is contracted in one go.
CHUNK_ELEMENTS = 1 << 22

#: The most bytes one result of ``einsum`` (the output, or an intermediate) or ``matmul`` may hold
#: unless the call says otherwise (``max_bytes=``): 1 GiB. The reference is the tests' oracle and a
#: CPU fallback; at its pace (an outer product of 2**26 float32, 256 MiB, took 1.8 s on 2 CPUs) a
#: result of 1 GiB is a long wait already, and past it memory runs out before an answer comes (40
#: output indices of size 2: 18 s, then NumPy's MemoryError). A keyword rather than only this
#: constant, because the machine and the call decide what is reasonable, and changing a module's
#: constant changes it for every other caller in the process.
MAX_BYTES = 1 << 30


def combine(ring: Semiring, a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> Any:
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
    # The ufuncs and np.where broadcast a and b themselves, up to an array's 64 dimensions
    # (np.broadcast_arrays would stop at 32: einsum joins up to 64 indices in one broadcast).
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
    ring: Semiring,
    a: np.ndarray[Any, Any],
    b: np.ndarray[Any, Any],
    value: np.ndarray[Any, Any],
    index: np.ndarray[Any, Any],
) -> None:
    """value, index = A (x) B and its argmax, written into the (M, N) arrays given."""
    zero = ring.zero(a.dtype)
    value[...] = zero
    index[...] = -1
    for rows, block, best in _blocks(ring, a, b):
        first = np.argmax(block == best[:, None, :], axis=1).astype(np.int32)
        value[rows] = best
        index[rows] = np.where(best == zero, -1, first)


def _blocks(
    ring: Semiring, a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]
) -> Iterator[tuple[slice, np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
    """A (x) B a block of A's rows at a time (memory stays bounded): the rows, their (r, K, N)
    products and the sum of those over K. Nothing where a side is empty."""
    m, k = a.shape
    n = b.shape[1]
    if k == 0 or m == 0 or n == 0:
        return
    step = max(1, CHUNK_ELEMENTS // max(1, k * n))
    for start in range(0, m, step):
        block = combine(ring, a[start : start + step, :, None], b[None, :, :])  # (r, K, N)
        yield slice(start, start + step), block, _best(ring, block)


def _best(ring: Semiring, block: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The sum over axis 1 of (r, K, N) products, from the zero as in the kernels."""
    zero = ring.zero(block.dtype)
    if ring.name == "andor":
        return np.asarray(block.any(axis=1))
    if ring.maximise:
        return np.asarray(np.maximum(block.max(axis=1), zero))
    return np.asarray(np.minimum(block.min(axis=1), zero))


def _counted_product(
    ring: Semiring,
    operands: tuple[np.ndarray[Any, Any], ...],
    value: np.ndarray[Any, Any],
    count: np.ndarray[Any, Any],
    modulus: int | None,
) -> None:
    """value, count = (A, its counts) (x) (B, its counts), written into the (M, N) arrays
    given: each value's count the sum, over the k attaining it, of the product of the two
    entries' counts; exact with -1 past 2^63 - 1 (a negative count given stays -1), or modulo
    ``modulus``."""
    a, na, b, nb = operands
    value[...] = ring.zero(a.dtype)
    count[...] = 0
    for rows, block, best in _blocks(ring, a, b):
        hit = (block == best[:, None, :]) & entry_counts(ring, block)
        left, right = na[rows, :, None], nb[None, :, :]
        value[rows] = best
        count[rows] = np.where(entry_counts(ring, best), _ways(left, right, hit, modulus), 0)


def _residue(x: np.ndarray[Any, Any], modulus: int) -> np.ndarray[Any, Any]:
    """Counts modulo ``modulus`` as the kernels read them: a negative count (an exact one's
    -1, not a residue) by its 64 bits unsigned."""
    wrapped = (1 << 64) % modulus
    return np.asarray(np.where(x < 0, (x % modulus + wrapped) % modulus, x % modulus))


def _ways(
    left: np.ndarray[Any, Any],
    right: np.ndarray[Any, Any],
    hit: np.ndarray[Any, Any],
    modulus: int | None,
) -> np.ndarray[Any, Any]:
    """The sum over axis 1 of left * right where ``hit``: as the kernels count (Exact or
    Modular in tropical_counted.cu)."""
    if modulus is not None:
        each = _residue(left, modulus) * _residue(right, modulus) % modulus  # each below 2^62
        return np.asarray(np.sum(np.where(hit, each, 0), axis=1) % modulus)
    negative = hit & ((left < 0) | (right < 0))
    estimate = np.sum(np.where(hit, left.astype(np.float64) * right, 0.0), axis=1)
    if not negative.any() and estimate.max(initial=0.0) <= 2.0**62:
        return np.asarray(np.sum(np.where(hit, left * right, 0), axis=1))
    # In Python's integers: a count past 2^63 - 1 (or made from one) is -1, as on the GPU.
    exact = np.where(hit, left.astype(object) * right.astype(object), 0).sum(axis=1)
    over = negative.any(axis=1) | (exact > (1 << 63) - 1)
    return np.where(over, -1, exact).astype(np.int64)


def matmul(
    a: Any,
    b: Any,
    semiring: str = "maxplus",
    *,
    argmax: bool = False,
    counts: Any = None,
    modulus: int | None = None,
    max_bytes: int = MAX_BYTES,
) -> Any:
    """C = A (x) B over ``semiring`` on NumPy arrays; with ``argmax=True``, (C, argmax); with
    ``counts``, (C, the count of the ways each element of C is attained).

    2-D or 3-D (a leading batch dimension; a batch of 1 broadcasts) operands of one dtype.
    The result and its argmax (int32, kept with or without ``argmax``; int64 counts with
    ``counts``) may hold at most ``max_bytes`` together: a larger product is refused with a
    ValueError before anything is allocated. The counts are those of ``tropical.matmul``'s
    counted product (its semantics, in NumPy).

    Args:
        a: A, (M, K) or (batch, M, K): a NumPy array, or what ``numpy.asarray`` takes.
        b: B, (K, N) or (batch, K, N), of ``a``'s dtype.
        semiring: ``"maxplus"``, ``"minplus"``, ``"maxmul"`` or ``"andor"``.
        argmax: Also return the argmax: for each element of C the smallest k attaining it, or
            -1 where C is the semiring's zero (K = 0, or no k contributes).
        counts: Also return the counts: True (each entry of ``a`` and ``b`` counts once,
            except the zero and NaN), or the pair (counts of ``a``, counts of ``b``),
            non-negative int64 arrays of their shapes. Not with ``argmax``.
        modulus: With ``counts``, count modulo this int from 2 to 2^31 - 1 (a prime);
            default: exact counts, -1 where one passes 2^63 - 1.
        max_bytes: The most bytes the result and its argmax or counts may hold together
            (default ``MAX_BYTES``, 1 GiB, as ``einsum``).

    Returns:
        C, of the operands' dtype: (M, N), or (batch, M, N) where an operand is 3-D. With
        ``argmax=True`` the pair (C, argmax), the argmax int32 of C's shape; with ``counts``
        the pair (C, counts), the counts int64 of C's shape.

    Raises:
        TypeError: ``a`` and ``b`` have different dtypes, ``semiring`` does not take theirs, or
            ``max_bytes`` is not an int; ``counts`` is neither True nor a pair; ``modulus``
            is not an int.
        ValueError: ``semiring`` is not one of ``SEMIRINGS``; an operand is not 2-D or 3-D;
            ``a``'s columns do not match ``b``'s rows; the batch sizes differ and neither is 1;
            the result and its argmax would hold more than ``max_bytes``; ``counts`` with
            ``argmax``, or counts not int64 of their operand's shape; ``modulus`` out of
            range, or without ``counts``.
    """
    ring = lookup(semiring)
    a, b = np.asarray(a), np.asarray(b)
    shapes = check_operands(ring, a, b)
    counted = check_counted(counts, modulus, argmax=argmax)
    if counted:
        if counts is True:
            counts = (
                entry_counts(ring, a).astype(np.int64),
                entry_counts(ring, b).astype(np.int64),
            )
        counts = (np.asarray(counts[0]), np.asarray(counts[1]))
        check_count_arrays(counts, a, b)
    check_max_bytes(max_bytes)
    batch, m, n = shapes.batch, shapes.m, shapes.n
    check_size(
        f"matmul output ({batch} x {m:,} x {n:,} {a.dtype}, with its "
        f"{'int64 counts' if counted else 'int32 argmax'})",
        batch * m * n,
        itemsize=a.dtype.itemsize + (8 if counted else 4),
        limit=max_bytes,
        bound=max_bytes_bound(max_bytes),
        fix="compute it in blocks of rows (a[i:j]), or on the GPU (tropical.matmul)",
    )
    value = np.empty((batch, m, n), a.dtype)
    index = np.empty((batch, m, n), np.int64 if counted else np.int32)
    a3, b3 = (x if x.ndim == 3 else x[None] for x in (a, b))
    if counted:
        na3, nb3 = (x if x.ndim == 3 else x[None] for x in counts)
    for i in range(batch):
        left, right = (0 if x.shape[0] == 1 else i for x in (a3, b3))
        if counted:
            operands = (a3[left], na3[left], b3[right], nb3[right])
            _counted_product(ring, operands, value[i], index[i], modulus)
        else:
            _product(ring, a3[left], b3[right], value[i], index[i])
    if not shapes.batched:
        value, index = value[0], index[0]
    return (value, index) if argmax or counted else value


def check_max_bytes(max_bytes: int) -> None:
    if not isinstance(max_bytes, int) or isinstance(max_bytes, bool):
        raise TypeError(f"max_bytes must be an int (bytes), got {type(max_bytes).__name__}")


def max_bytes_bound(max_bytes: int) -> str:
    return f"max_bytes={max_bytes:,} (raise it where the machine has the memory)"
