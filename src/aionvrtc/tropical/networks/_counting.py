"""The NumPy reference's other semirings over the same steps: counting the assignments that
attain each value (``einsum(..., count=True)``: exact at any size, past int64 by residues,
_residues), and the k best values with their counts (``top=k``, within int64). The walks back
through a counted contraction (every optimal assignment, samples) are _walks'."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..products import Semiring, check_size, combine, entry_counts, max_bytes_bound
from ._contraction import (
    Step,
    Term,
    align,
    blocks,
    in_block,
    joint_indices,
    reduction,
)
from ._residues import INT64_MAX, Joined, moduli

__all__ = [
    "MAX_TOP",
    "best",
    "check_top",
    "count_along",
    "counted",
    "weighted_residues",
]


def counted(
    ring: Semiring,
    made: dict[int, Term],
    steps: Sequence[Step],
    output: str,
    sizes: Mapping[str, int],
    *,
    kept: dict[int, Term] | None = None,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """``einsum(..., count=True)`` along ``steps``: each operand paired with its counts (1 for
    an entry, 0 for the zero or a NaN), each step contracted in the counting semiring. Each
    step's values go into ``kept`` too, by number, where it is given.

    A cell's count is at most the number of assignments of the summed indices: within int64,
    or where the counts turn out to fit (checked exactly: _times, _sum), they are int64
    throughout; past it, the network is counted once modulo each of the primes that bound
    needs (_residues), the counts joined in Python's integers one prime at a time."""
    try:
        return count_along(ring, dict(made), steps, output, sizes, kept=kept, modulus=None)
    except OverflowError:  # (only where the bound passes int64: a count is at most it)
        pass
    primes = moduli(math.prod(n for c, n in sizes.items() if c not in output))
    value, residue = count_along(  # (each run takes the operands from a copy: it pops them)
        ring, dict(made), steps, output, sizes, kept=kept, modulus=primes[0]
    )
    total = Joined(primes, residue.shape)
    total.add(residue)
    for prime in primes[1:]:
        total.add(count_along(ring, dict(made), steps, output, sizes, kept=None, modulus=prime)[1])
    return value, total.counts()


def count_along(
    ring: Semiring,
    made: dict[int, Term],
    steps: Sequence[Step],
    output: str,
    sizes: Mapping[str, int],
    *,
    kept: dict[int, Term] | None,
    modulus: int | None,
    weights: Mapping[int, np.ndarray[Any, Any]] | None = None,
    tallies: dict[int, np.ndarray[Any, Any]] | None = None,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """``counted``'s contraction, its counts int64 or residues modulo ``modulus``. With
    ``weights`` (residues modulo ``modulus``, one array per operand), an entry counts for its
    weight rather than for 1: each count is the sum over the assignments that attain the value
    of the product of their entries' weights. With ``tallies``, the counts are float64, each
    step's scaled by its largest (what sampling weighs branches by: the product of a step's
    operands' counts, whose ratios a factor on an operand leaves alone), and each operand's and
    step's go into it, by number."""
    n = len(made)
    kind = np.float64 if tallies is not None else np.int64
    counts: dict[int, np.ndarray[Any, Any]] = {
        k: entry_counts(ring, x).astype(kind) for k, (x, _) in made.items()
    }
    if weights is not None:
        counts = {k: np.where(c, weights[k], 0) for k, c in counts.items()}
    if tallies is not None:
        tallies.update(counts)
    for number, step in enumerate(steps):
        chosen = [made.pop(i) for i in step.operands]
        taken = [counts.pop(i) for i in step.operands]
        value, tally = _contractcount_along(
            ring, chosen, taken, step.keep, sizes, number=number, modulus=modulus
        )
        made[n + number], counts[n + number] = (value, step.keep), tally
        if kept is not None:
            kept[n + number] = value, step.keep
        if tallies is not None:  # (float counts scaled: a branch's odds are unchanged)
            top = float(np.max(tally, initial=0.0))
            tally = tally / top if top > 0 else tally
            counts[n + number] = tally
            tallies[n + number] = tally
    ((k, (x, letters)),) = made.items()
    if letters == output:
        return x, counts[k]
    return (
        np.ascontiguousarray(align(x, letters, output)),
        np.ascontiguousarray(align(counts[k], letters, output)),
    )


def weighted_residues(
    ring: Semiring,
    made: dict[int, Term],
    steps: Sequence[Step],
    sizes: Mapping[str, int],
    *,
    weights: Mapping[int, np.ndarray[Any, Any]],
    modulus: int,
) -> int:
    """A scalar network's sum, over the assignments attaining its value, of the product of
    their entries' ``weights`` (residues modulo the prime ``modulus``, below 2^31, one array
    per operand), modulo ``modulus``: for a network whose every entry is 0 (or the zero), the
    sum over every valid assignment."""
    return int(count_along(ring, dict(made), steps, "", sizes, kept=None, modulus=modulus,
                        weights=weights)[1])  # fmt: skip


def check_top(top: object, count: bool) -> None:
    if top is None:
        return
    if not isinstance(top, int) or isinstance(top, bool):
        raise TypeError(f"top must be an int (how many best values), got {type(top).__name__}")
    if not 1 <= top <= MAX_TOP:
        raise ValueError(f"top must be from 1 to {MAX_TOP}, got {top}")
    if count:
        raise ValueError("pass count=True or top=k, not both: top=k counts each of its values")


MAX_TOP = 64


def best(
    ring: Semiring,
    made: dict[int, Term],
    steps: Sequence[Step],
    output: str,
    sizes: Mapping[str, int],
    *,
    top: int,
    max_bytes: int,
    counting: bool = True,
    kept: dict[int, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]] | None = None,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """``einsum(..., top=k)`` along ``steps``: each operand as lists of k (value, count) pairs,
    its entry first, each step's products and sums kept to the k best distinct values. Without
    ``counting``, the values alone: each count held at 1 (attained) or 0, never overflowing.
    Every operand's and step's lists go into ``kept`` too, by number, where it is given."""
    n = len(made)
    for k, (x, held) in made.items():  # each operand's lists, checked before any is made
        check_size(f"einsum operand {k} ({held!r}) as lists of top={top}", x.size,
                   itemsize=(x.dtype.itemsize + 8) * top, limit=max_bytes,
                   bound=max_bytes_bound(max_bytes), fix="pass a smaller top")  # fmt: skip
    lists: dict[int, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]] = {}
    for k, (x, _) in made.items():
        values = np.full((*x.shape, top), ring.zero(x.dtype), x.dtype)
        counts = np.zeros((*x.shape, top), np.int64)
        entries = entry_counts(ring, x)
        values[..., 0] = np.where(entries, x, ring.zero(x.dtype))
        counts[..., 0] = entries
        lists[k] = values, counts
    if kept is not None:
        kept.update(lists)
    letters = {k: t for k, (_, t) in made.items()}
    for number, step in enumerate(steps):
        chosen = [(*lists.pop(i), letters.pop(i)) for i in step.operands]
        lists[n + number] = _contract_best(
            ring, chosen, step.keep, sizes, top, number=number, counting=counting
        )
        letters[n + number] = step.keep
        if kept is not None:
            kept[n + number] = lists[n + number]
    ((k, (values, counts)),) = lists.items()
    if letters[k] == output:
        return values, counts
    order = [letters[k].index(c) for c in output] + [len(output)]
    return (
        np.ascontiguousarray(values.transpose(order)),
        np.ascontiguousarray(counts.transpose(order)),
    )


def _contract_best(
    ring: Semiring,
    terms: Sequence[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], str]],
    out: str,
    sizes: Mapping[str, int],
    top: int,
    *,
    number: int,
    counting: bool,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """One step with lists of ``top`` (value, count) pairs on a last axis: the pairs of each
    product formed two lists at a time, kept to the best, then merged over the summed indices
    and over the blocks."""
    joint = joint_indices((s for *_, s in terms), out)
    dtype = terms[0][0].dtype
    zero = ring.zero(dtype)
    values = np.full([*(sizes[c] for c in out), top], zero, dtype=dtype)
    counts = np.zeros([*(sizes[c] for c in out), top], dtype=np.int64)
    shape = [sizes[c] for c in joint]
    if 0 in shape:
        return values, counts
    aligned = [(_listed(v, t, joint), _listed(c, t, joint)) for v, c, t in terms]
    what = f"einsum step {number}"
    # A product of two lists is top^2 pairs for each element of the block.
    for block in blocks(shape, weight=top * top):
        pick = (*block, slice(None))  # each list whole
        v, c = in_block(aligned[0][0], pick), in_block(aligned[0][1], pick)
        for x, m in aligned[1:]:
            pv = combine(ring, v[..., :, None], in_block(x, pick)[..., None, :])
            pc = _times(c[..., :, None], in_block(m, pick)[..., None, :], what)
            v, c = _kept(ring, pv.reshape(*pv.shape[:-2], -1), pc.reshape(*pc.shape[:-2], -1), top,
                         counting=counting)  # fmt: skip
        where = block[: len(out)]
        lead = v.shape[: len(out)]
        v = np.concatenate([values[where], v.reshape(*lead, -1)], axis=-1)
        c = np.concatenate([counts[where], c.reshape(*lead, -1)], axis=-1)
        values[where], counts[where] = _kept(ring, v, c, top, what=what, counting=counting)
    return values, counts


def _listed(x: np.ndarray[Any, Any], letters: str, joint: str) -> np.ndarray[Any, Any]:
    """``align`` for an array with a last axis of list entries, kept last."""
    order = sorted(range(len(letters)), key=lambda a: joint.index(letters[a]))
    x = x.transpose([*order, len(letters)])
    return x[(*(slice(None) if c in letters else np.newaxis for c in joint), slice(None))]


def _kept(
    ring: Semiring,
    values: np.ndarray[Any, Any],
    counts: np.ndarray[Any, Any],
    top: int,
    *,
    what: str = "einsum",
    counting: bool = True,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The ``top`` best distinct values along the last axis, best first, each with the sum of
    its counts (the zero, and pairs of count 0, count for nothing); padded with the zero.
    Without ``counting`` each count is held at 1 (the counts given are 0 or 1 then: their sums
    stay far from overflowing)."""
    zero = ring.zero(values.dtype)
    counts = np.where(entry_counts(ring, values), counts, 0)
    values = np.where(counts > 0, values, zero)
    lead, width = values.shape[:-1], values.shape[-1]
    flat_v, flat_c = values.reshape(-1, width), counts.reshape(-1, width)
    order = np.argsort(flat_v, axis=-1, kind="stable")
    if ring.maximise:
        order = order[:, ::-1]
    v = np.take_along_axis(flat_v, order, axis=-1)
    c = np.take_along_axis(flat_c, order, axis=-1)
    starts = np.ones(v.shape, bool)
    starts[:, 1:] = v[:, 1:] != v[:, :-1]
    group = np.cumsum(starts, axis=-1) - 1
    rows = np.broadcast_to(np.arange(len(v))[:, None], v.shape)
    keep = group < top
    out_v = np.full((len(v), top), zero, values.dtype)
    out_v[rows[keep & starts], group[keep & starts]] = v[keep & starts]
    if counting and np.sum(c, axis=-1, dtype=np.float64).max(initial=0.0) > _CHECK_ABOVE:
        exact = np.zeros((len(v), top), object)
        np.add.at(exact, (rows[keep], group[keep]), c[keep].astype(object))
        _fits(exact, what)
    out_c = np.zeros((len(v), top), np.int64)
    np.add.at(out_c, (rows[keep], group[keep]), c[keep])
    out_c[out_v == zero] = 0
    if not counting:
        np.minimum(out_c, 1, out=out_c)
    return out_v.reshape(*lead, top), out_c.reshape(*lead, top)


def _contractcount_along(
    ring: Semiring,
    terms: Sequence[Term],
    tallies: Sequence[np.ndarray[Any, Any]],
    out: str,
    sizes: Mapping[str, int],
    *,
    number: int,
    modulus: int | None = None,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """``contract`` in the counting semiring: the value as ``contract`` gives it, and the
    number of assignments of the summed indices whose product attains it (modulo
    ``modulus``, where given), block by block."""
    joint = joint_indices((s for _, s in terms), out)
    dtype = terms[0][0].dtype
    zero = ring.zero(dtype)
    add = reduction(ring)
    result = np.full([sizes[c] for c in out], zero, dtype=dtype)
    tally = np.zeros([sizes[c] for c in out], dtype=tallies[0].dtype)
    shape = [sizes[c] for c in joint]
    if 0 in shape:
        return result, tally
    aligned = [align(x, letters, joint) for x, letters in terms]
    counted = [align(c, letters, joint) for c, (_, letters) in zip(tallies, terms, strict=True)]
    summed = tuple(range(len(out), len(joint)))
    what = f"einsum step {number}"
    for block in blocks(shape):
        product, many = in_block(aligned[0], block), in_block(counted[0], block)
        for x, c in zip(aligned[1:], counted[1:], strict=True):
            product = combine(ring, product, in_block(x, block))
            many = _times(many, in_block(c, block), what, modulus)
        many = np.where(entry_counts(ring, np.asarray(product)), many, 0)
        if summed:
            best = add.reduce(product, axis=summed, keepdims=True)
            hits = np.where((product == best) & (many > 0), many, 0)
            best, many = best.squeeze(axis=summed), _sum(hits, summed, what, modulus)
        where = block[: len(out)]
        new = add(result[where], best if summed else product)
        kept = np.where(result[where] == new, tally[where], 0)
        tally[where] = _sum(np.stack([kept, np.where((best if summed else product) == new,
                                                     many, 0)]), (0,), what, modulus)  # fmt: skip
        result[where] = new
    tally[~entry_counts(ring, result)] = 0
    return result, tally


# Past this a product or sum of int64 counts is checked again in Python's integers: below it
# the float64 estimate (relative error 2^-53 a step) cannot hide an overflow.
_CHECK_ABOVE = float(1 << 62)


def _times(
    a: np.ndarray[Any, Any], b: np.ndarray[Any, Any], what: str, modulus: int | None = None
) -> np.ndarray[Any, Any]:
    """a * b of int64 counts, exact, or OverflowError; modulo ``modulus`` where given (of
    residues below 2^31: the product fits). Float counts (sampling's) multiply as floats."""
    if np.asarray(a).dtype.kind == "f":
        return np.asarray(np.multiply(a, b))
    if modulus is not None:
        return np.asarray(np.multiply(a, b) % modulus)
    if np.multiply(a, b, dtype=np.float64).max(initial=0.0) > _CHECK_ABOVE:
        # ndarray.astype(object) holds Python's ints (a NumPy scalar's would stay int64)
        exact = np.multiply(np.asarray(a).astype(object), np.asarray(b).astype(object))
        _fits(exact, what)
    return np.asarray(np.multiply(a, b))


def _sum(
    x: np.ndarray[Any, Any], axes: tuple[int, ...], what: str, modulus: int | None = None
) -> np.ndarray[Any, Any]:
    """The sum of int64 counts over ``axes``, exact, or OverflowError; modulo ``modulus``
    where given (of residues below 2^31 over a block: the sum fits). Float counts (sampling's)
    sum as floats."""
    if np.asarray(x).dtype.kind == "f":
        return np.asarray(np.sum(x, axis=axes))
    if modulus is not None:
        return np.asarray(np.sum(x, axis=axes, dtype=np.int64) % modulus)
    if np.sum(x, axis=axes, dtype=np.float64).max(initial=0.0) > _CHECK_ABOVE:
        _fits(np.sum(np.asarray(x).astype(object), axis=axes), what)
    return np.asarray(np.sum(x, axis=axes, dtype=np.int64))


def _fits(exact: Any, what: str) -> None:
    if max(np.ravel(exact), default=0) > INT64_MAX:
        raise OverflowError(
            f"{what}: a count of assignments passes 2^63 - 1, more than int64 holds; count "
            "the network in parts (fix some of its indices, and add the parts' counts in "
            "Python's integers)"
        )
