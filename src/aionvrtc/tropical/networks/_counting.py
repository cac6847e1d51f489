"""The NumPy reference's other semirings over the same steps: counting the assignments that
attain each value (``einsum(..., count=True)``: exact at any size, past int64 by residues,
_residues), the k best values with their counts (``top=k``, within int64), and every
assignment attaining a scalar contraction (``configurations``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..products import MAX_BYTES, Semiring, check_size, combine, max_bytes_bound
from ._contraction import (
    Step,
    Term,
    align,
    blocks,
    in_block,
    joint_indices,
    prepare,
    reduction,
)
from ._residues import INT64_MAX, Joined, moduli

__all__ = [
    "MAX_TOP",
    "best",
    "check_top",
    "configurations",
    "counted",
    "samples",
    "weighted_residues",
]


def configurations(
    subscripts: str,
    *operands: Any,
    semiring: str = "maxplus",
    path: Sequence[Sequence[int]] | None = None,
    max_bytes: int = MAX_BYTES,
    limit: int = 10_000,
    first: bool = False,
) -> tuple[Any, str, np.ndarray[Any, Any]]:
    """Every assignment of the indices that attains a scalar contraction's value: for a graph
    problem's network, every optimal configuration.

    The bounded method: the network is contracted once in the counting semiring
    (``einsum(..., count=True)``: the value, the count of the assignments attaining it, and each
    step's result kept); then, from the last step back to the first, each partial assignment is
    extended by the values of the indices a step sums at which its operands' product attains
    the step's value, so only branches that reach the value are followed: the work past the
    contraction is about the number of assignments times the number of steps. Exact where
    ``count=True`` is. Every step's result is kept through the contraction (``max_bytes``
    bounds each, not their sum), and let go once the walk back has passed it. The count is
    known before the walk: past ``limit``, or where the rows would pass ``max_bytes``, the
    call is refused before any row is made.

    Args:
        subscripts: As ``einsum``; the output has no index (``"...->"``).
        *operands: As ``einsum``.
        semiring: As ``einsum``.
        path: As ``einsum``.
        max_bytes: As ``einsum``, for the results with their counts; and the most bytes the
            rows may hold (8 per index of each assignment). The walk holds up to three times
            the rows' bytes at its peak: the rows, their next extension, and the sorted copy.
        limit: The most assignments returned (default 10,000). Past it the call raises a
            ValueError saying how many there are.
        first: Return one assignment alone, the first the walk finds, however many there are
            (``limit`` is not checked): a walk of one row.

    Returns:
        The triple (value, indices, rows): the value as ``einsum`` gives it; the indices, a
        str, each once, in the order they first appear in ``subscripts``; an int64 array of
        one row per assignment and one column per index, the rows in increasing order. No
        rows where the value is the semiring's zero.

    Raises:
        ValueError: As ``einsum``; the output has an index; ``limit`` is below 1; more than
            ``limit`` assignments attain the value, or their rows would hold more than
            ``max_bytes`` (the message says how many).
        TypeError: As ``einsum``; ``limit`` is not an int.
    """
    if not isinstance(limit, int) or isinstance(limit, bool):
        raise TypeError(f"limit must be an int, got {type(limit).__name__}")
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    net = prepare(subscripts, operands, semiring, path, max_bytes, extra=(8, 1))
    if net.output:
        raise ValueError(
            f"configurations takes a scalar contraction (subscripts ending in '->'), not one "
            f"with the output {net.output!r}: the assignments of a cell are those of the "
            "network with the output's indices fixed to it (slice the operands there)"
        )
    ring, steps, sizes, n = net.ring, net.steps, net.sizes, len(net.made)
    results: dict[int, Term] = dict(net.made)  # every operand and step result, by number
    value, counts = counted(ring, dict(net.made), steps, "", sizes, kept=results)
    count, width = int(counts), len(net.letters)
    if first:
        count = min(count, 1)
    elif count > limit:
        raise ValueError(
            f"{count:,} assignments attain the value {value}, more than limit={limit:,}: "
            "pass a larger limit, or count them alone with einsum(..., count=True)"
        )
    check_size(f"configurations' rows ({count:,} assignments of {width} indices)",
               count * width, itemsize=8, limit=max_bytes, bound=max_bytes_bound(max_bytes),
               fix="count them alone with einsum(..., count=True)")  # fmt: skip
    column = {c: i for i, c in enumerate(net.letters)}
    # Partial assignments, one per row; a column is read once the step that fixes it is walked.
    rows = np.zeros((1 if count else 0, width), np.int64)
    for number in reversed(range(len(steps))):
        step = steps[number]
        target, keep = results[n + number]
        at = [column[c] for c in keep]
        hits = [_attaining(ring, step, results, row, cell=target[tuple(row[at])], column=column,
                           sizes=sizes) for row in rows]  # fmt: skip
        if first:
            hits = [h[:1] for h in hits]
        rows = np.repeat(rows, [len(h) for h in hits], axis=0)
        if hits:
            summed = _summed(step)
            rows[:, [column[c] for c in summed]] = np.concatenate(hits)
        # The walk has passed this step's result, and the operands (not step results) that
        # this step alone takes: no step left to walk reads them.
        del results[n + number]
        for k in step.operands:
            if k < n:
                del results[k]
    if width:  # the rows in increasing order (lexsort's last key is its first)
        rows = rows[np.lexsort(rows.T[::-1])]
    return value, net.letters, rows


def samples(
    subscripts: str,
    *operands: Any,
    count: int,
    seed: Any = None,
    semiring: str = "maxplus",
    path: Sequence[Sequence[int]] | None = None,
    max_bytes: int = MAX_BYTES,
) -> tuple[Any, str, np.ndarray[Any, Any]]:
    """Assignments drawn uniformly at random, with replacement, from those that attain a scalar
    contraction's value, without listing them: the network is counted once (each step's values
    and counts kept, the counts in float64), then each sample is walked from the last step back
    to the first as ``configurations`` walks, taking at each step one of the branches that
    attain its value with a probability proportional to the assignments below it (the product
    of its operands' counts). Uniform up to float64's rounding of the counts (a relative error
    of about 2^-53 a step).

    Args:
        subscripts: As ``einsum``; the output has no index.
        *operands: As ``einsum``.
        count: How many samples, at least 1.
        seed: What ``numpy.random.default_rng`` takes (None: fresh entropy).
        semiring: As ``einsum``.
        path: As ``einsum``.
        max_bytes: As ``einsum``, for each result with its counts, and for the rows.

    Returns:
        The triple (value, indices, rows), as ``configurations`` gives it, one row a sample, in
        the order drawn; no rows where the value is the semiring's zero.

    Raises:
        ValueError: As ``einsum``; the output has an index; ``count`` is below 1.
        TypeError: As ``einsum``; ``count`` is not an int.
    """
    if not isinstance(count, int) or isinstance(count, bool):
        raise TypeError(f"count must be an int, got {type(count).__name__}")
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    rng = np.random.default_rng(seed)
    net = prepare(subscripts, operands, semiring, path, max_bytes, extra=(8, 2))
    if net.output:
        raise ValueError(
            f"samples takes a scalar contraction (subscripts ending in '->'), not one with the "
            f"output {net.output!r}"
        )
    ring, steps, sizes, width = net.ring, net.steps, net.sizes, len(net.letters)
    check_size(f"samples' rows ({count:,} samples of {width} indices)", count * width,
               itemsize=8, limit=max_bytes, bound=max_bytes_bound(max_bytes),
               fix="draw fewer at a time")  # fmt: skip
    results: dict[int, Term] = dict(net.made)
    tallies: dict[int, np.ndarray[Any, Any]] = {}
    value, total = _counted(ring, dict(net.made), steps, "", sizes, kept=results, modulus=None,
                            tallies=tallies)  # fmt: skip
    column = {c: i for i, c in enumerate(net.letters)}
    rows = np.zeros((count if total > 0 else 0, width), np.int64)
    for number in reversed(range(len(steps))):
        step, n = steps[number], len(net.made)
        target, keep = results[n + number]
        at, summed = [column[c] for c in keep], _summed(step)
        shape = [sizes[c] for c in summed]
        fixed = np.array([column[c] for c in summed], np.int64)  # the columns the step fixes
        # The rows that agree on the indices the step keeps share its branches: one draw each.
        keys, group = np.unique(rows[:, at], axis=0, return_inverse=True)
        for number_in, key in enumerate(keys):
            members = np.flatnonzero(group.reshape(-1) == number_in)
            weights = _branches(ring, step, (results, tallies), rows[members[0]],
                                target[tuple(key)], column=column, shape=shape)  # fmt: skip
            chosen = rng.choice(weights.size, size=len(members), p=weights / weights.sum())
            picked = np.stack(np.unravel_index(chosen, shape), axis=1) if shape else chosen[:, None]
            if summed:
                rows[np.ix_(members, fixed)] = picked
    return value, net.letters, rows


def _branches(
    ring: Semiring,
    step: Step,
    kept: tuple[Mapping[int, Term], Mapping[int, np.ndarray[Any, Any]]],
    row: np.ndarray[Any, Any],
    cell: Any,
    *,
    column: Mapping[str, int],
    shape: Sequence[int],
) -> np.ndarray[Any, Any]:
    """Over the values of the indices ``step`` sums (flat, in the order of ``_summed``), its
    kept indices at their values in ``row``: the assignments below each that attain ``cell``
    (the product of its operands' counts where their product attains it, else 0); ``kept``:
    every operand's and step's values and counts, by number."""
    results, tallies = kept
    summed = _summed(step)
    product: Any = None
    weight: Any = None
    for k in step.operands:
        x, letters = results[k]
        where = tuple(row[column[c]] if c in step.keep else slice(None) for c in letters)
        rest = "".join(c for c in letters if c not in step.keep)
        part = align(np.asarray(x[where]), rest, summed)
        many = align(np.asarray(tallies[k][where]), rest, summed)
        product = part if product is None else combine(ring, product, part)
        weight = many if weight is None else weight * many
    product = np.broadcast_to(np.asarray(product), shape)
    weight = np.broadcast_to(np.asarray(weight), shape)
    hits = (product == cell) & entry_counts(ring, product)
    return np.where(hits, weight, 0.0).ravel()


def _summed(step: Step) -> str:
    """The indices ``step`` sums away, each once, in the order they first appear."""
    return "".join(dict.fromkeys(c for t in step.inputs for c in t if c not in step.keep))


def _attaining(
    ring: Semiring,
    step: Step,
    results: Mapping[int, Term],
    row: np.ndarray[Any, Any],
    *,
    cell: Any,
    column: Mapping[str, int],
    sizes: Mapping[str, int],
) -> np.ndarray[Any, Any]:
    """The values of the indices ``step`` sums (a row each, in the order of ``_summed``) at
    which, its kept indices at their values in ``row``, the product of its operands attains
    ``cell`` (never the zero)."""
    summed = _summed(step)
    product: Any = None
    for k in step.operands:
        x, letters = results[k]
        picked = x[tuple(row[column[c]] if c in step.keep else slice(None) for c in letters)]
        part = align(np.asarray(picked), "".join(c for c in letters if c not in step.keep),
                      summed)  # fmt: skip
        product = part if product is None else combine(ring, product, part)
    product = np.broadcast_to(np.asarray(product), [sizes[c] for c in summed])
    return np.argwhere((product == cell) & entry_counts(ring, product))


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
        return _counted(ring, dict(made), steps, output, sizes, kept=kept, modulus=None)
    except OverflowError:  # (only where the bound passes int64: a count is at most it)
        pass
    primes = moduli(math.prod(n for c, n in sizes.items() if c not in output))
    value, residue = _counted(  # (each run takes the operands from a copy: it pops them)
        ring, dict(made), steps, output, sizes, kept=kept, modulus=primes[0]
    )
    total = Joined(primes, residue.shape)
    total.add(residue)
    for prime in primes[1:]:
        total.add(_counted(ring, dict(made), steps, output, sizes, kept=None, modulus=prime)[1])
    return value, total.counts()


def _counted(
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
    of the product of their entries' weights. With ``tallies``, the counts are float64 (close,
    never overflowing: what sampling weighs branches by), and each operand's and step's go
    into it, by number."""
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
        value, tally = _contract_counted(
            ring, chosen, taken, step.keep, sizes, number=number, modulus=modulus
        )
        made[n + number], counts[n + number] = (value, step.keep), tally
        if kept is not None:
            kept[n + number] = value, step.keep
        if tallies is not None:
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
    return int(_counted(ring, dict(made), steps, "", sizes, kept=None, modulus=modulus,
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
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """``einsum(..., top=k)`` along ``steps``: each operand as lists of k (value, count) pairs,
    its entry first, each step's products and sums kept to the k best distinct values. Without
    ``counting``, the values alone: each count held at 1 (attained) or 0, never overflowing."""
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
    letters = {k: t for k, (_, t) in made.items()}
    for number, step in enumerate(steps):
        chosen = [(*lists.pop(i), letters.pop(i)) for i in step.operands]
        lists[n + number] = _contract_best(
            ring, chosen, step.keep, sizes, top, number=number, counting=counting
        )
        letters[n + number] = step.keep
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


def entry_counts(ring: Semiring, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """True where an entry counts for an assignment: it is neither the zero nor a NaN."""
    zero = ring.zero(x.dtype)
    return np.asarray((x != zero) & (x == x))  # noqa: PLR0124  # x == x is False for a NaN


def _contract_counted(
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
