"""The NumPy contraction of tensor networks in the tropical semirings
(``tropical.reference.einsum``): the oracle of ``tropical.einsum``, and a CPU fallback, along a
given order or left to right."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..products import (
    CHUNK_ELEMENTS,
    MAX_BYTES,
    Semiring,
    check_max_bytes,
    check_size,
    combine,
    max_bytes_bound,
)
from ..products import semiring as lookup
from ._subscripts import (
    MAX_NDIM,
    check_dtypes,
    check_output,
    index_sizes,
    parse_subscripts,
)
from ._terms import input_terms

__all__ = ["configurations", "einsum"]

# One operand with its subscripts: an array and one letter per axis.
_Term = tuple[np.ndarray[Any, Any], str]


@dataclass(frozen=True, slots=True)
class _Step:
    """One contraction of ``einsum``: the operands it takes, by number (the inputs 0 to n-1,
    then step i's result n + i), their indices, and the indices its result keeps."""

    operands: tuple[int, ...]
    inputs: tuple[str, ...]
    keep: str

    @property
    def subscripts(self) -> str:
        return ",".join(self.inputs) + "->" + self.keep


def einsum(
    subscripts: str,
    *operands: Any,
    semiring: str = "maxplus",
    path: Sequence[Sequence[int]] | None = None,
    max_bytes: int = MAX_BYTES,
    count: bool = False,
    top: int | None = None,
) -> Any:
    """The tropical einsum of NumPy arrays: the oracle of ``tropical.einsum``, and a CPU fallback.

    ``out[o] = zero (+) ... (+) (x_1[...] (x) x_2[...] (x) ... x_n[...])``, the (+)-sum running
    over every value of the indices that are not in the output.

    (+) and (x) are the semiring's, with ``matmul``'s rules: integers saturate, their extremes
    are the infinities, and a NaN product (-inf + inf, 0 * inf) counts as the zero; the products
    are formed in operand order, left to right (float (x) is not associative). Every output
    cell starts from the zero, so an empty sum gives the zero and a NaN input counts as the zero.

    Small contractions (the joint space of all indices fits in ``CHUNK_ELEMENTS``) are evaluated
    in one broadcast; larger ones operand by operand, left to right, in blocks of at most
    ``CHUNK_ELEMENTS`` products. No result (the output, an intermediate) may hold more than
    ``max_bytes``, nor one broadcast join more indices than a NumPy array has dimensions: the
    order is worked out first, and a contraction past either is refused with a ValueError
    before any work.

    Args:
        subscripts: NumPy's grammar over the letters a-z, A-Z and any non-ASCII character
            (``opt_einsum.get_symbol(i)`` names the i-th, for networks of many indices):
            ``"ij,jk->ik"`` (matmul), ``"ii->i"`` (a diagonal), ``"ii->"`` (the trace),
            ``"ij->i"`` (a sum within one operand), ``"i,j->ij"`` (an outer product), ``",->"``
            (0-d operands). Without ``->`` the output is the indices that appear exactly once,
            sorted by character (upper case first), as in ``numpy.einsum``. No ellipsis, and no
            broadcasting: an index has one size everywhere.
        *operands: The tensors, one per operand of ``subscripts``: NumPy arrays (or what
            ``numpy.asarray`` takes) that share one dtype that the semiring takes.
        semiring: ``"maxplus"``, ``"minplus"``, ``"maxmul"`` or ``"andor"``.
        path: Contract the operands two at a time in this order instead (opt_einsum's format,
            as ``tropical.einsum_plan(...).path`` gives it: the two leave the list of operands
            and their product joins its end), for networks too large to contract left to
            right; exact where (x) is (integers, booleans, floats holding integers).
        max_bytes: The most bytes that one result (the output, an intermediate) may hold
            (default ``MAX_BYTES``, 1 GiB); with ``count=True``, its counts as well.
        count: Also count, for each output cell, the assignments of the summed indices whose
            product attains the cell's value (0 where the value is the semiring's zero: an
            entry equal to the zero, or a NaN, counts for no assignment). For a scalar
            contraction of a graph problem's network: how many optimal configurations there
            are. Counted in int64; a count past 2^63 - 1 is refused with an OverflowError.
            Along any order the counts are those of the definition where the products are
            exact (integers that do not saturate, floats holding integers, the zero as the
            only infinity): where rounding or an infinity makes two products equal, an order
            that sums an index early tells them apart as the definition would not.
        top: The ``top`` best distinct values of each output cell (the largest for max-plus,
            max-times and and-or, the smallest for min-plus), best first, each with how many
            assignments attain it, counted as ``count=True`` counts; a cell of fewer distinct
            values is padded with the zero, of count 0. From 1 (``count=True``'s value and
            count, on an axis of 1) to 64.

    Returns:
        The result, of the operands' dtype, with one axis per output index (0-d for
        ``"->"``-style outputs). With ``count=True`` the pair (result, counts), the counts an
        int64 array of the result's shape. With ``top=k`` the pair (values, counts), each with
        a last axis of k after the output's.

    Raises:
        TypeError: ``subscripts`` is not a str; ``max_bytes`` is not an int; the operands'
            dtypes differ, or the semiring does not take theirs.
        ValueError: ``semiring`` is not one of ``SEMIRINGS``; the subscripts are malformed (an
            ellipsis, more than one ``->``, a character that is not an index, an output index
            repeated or in no operand, another count of operands than given) or name more than
            64 indices for an operand or the output; an operand's dimensions are not the ones
            its subscripts name; an index has two sizes.
        ValueError: A step of ``path`` names no operand, or a position outside the operands
            left, or the path leaves more than one; the output or an intermediate would hold
            more than ``max_bytes``; a step would join more indices in one broadcast than a
            NumPy array has dimensions (64).
        OverflowError: With ``count=True`` or ``top=``, a count (of the output, or of an
            intermediate) would pass 2^63 - 1.
        TypeError: ``top`` is not an int.
        ValueError: ``top`` is not from 1 to 64, or is given with ``count=True``.
    """
    _check_top(top, count)
    # With counts, each element also holds an int64 count; with top=k, k of each.
    extra = (8 if count or top else 0, top or 1)
    net = _prepare(subscripts, operands, semiring, path, max_bytes, extra=extra)
    ring, made, steps, output, sizes = net.ring, net.made, net.steps, net.output, net.sizes
    if count:
        return _counted(ring, made, steps, output, sizes)
    if top is not None:
        return _best(ring, made, steps, output, sizes, top=top, max_bytes=max_bytes)
    n = len(made)
    for number, step in enumerate(steps):
        chosen = [made.pop(i) for i in step.operands]
        made[n + number] = _contract(ring, chosen, step.keep, sizes), step.keep
    ((x, letters),) = made.values()
    return np.ascontiguousarray(_align(x, letters, output)) if letters != output else x


@dataclass(frozen=True, slots=True)
class _Network:
    """A checked contraction, ready to run: its operands one axis per distinct index, by
    number, and the steps of its order."""

    ring: Semiring
    made: dict[int, _Term]
    steps: list[_Step]
    output: str
    sizes: dict[str, int]
    letters: str  # every index, in the order it first appears


def _prepare(
    subscripts: str,
    operands: Sequence[Any],
    semiring: str,
    path: Sequence[Sequence[int]] | None,
    max_bytes: int,
    *,
    extra: tuple[int, int] = (0, 1),
) -> _Network:
    """What every form of ``einsum`` checks before any work: the subscripts, the operands, the
    order, and each result's bytes, an element taking ``extra`` = (bytes beside the value, how
    many of each) of it."""
    ring = lookup(semiring)
    inputs, output = parse_subscripts(subscripts, len(operands))
    check_max_bytes(max_bytes)
    arrays = [np.asarray(x) for x in operands]
    check_dtypes(ring, arrays)
    sizes = index_sizes(inputs, arrays)
    itemsize = (arrays[0].dtype.itemsize + extra[0]) * extra[1]
    bound = max_bytes_bound(max_bytes)
    check_output(output, sizes, itemsize=itemsize, limit=max_bytes, bound=bound)
    distinct = ["".join(dict.fromkeys(letters)) for letters in inputs]
    if path is not None:
        steps = _along(distinct, output, path)
        fix = (
            "pass a path with smaller intermediates (tropical.einsum_plan(subscripts, *shapes, "
            "optimize='auto-hq').path), or contract the network in slices"
        )
    else:
        steps = _left_to_right(distinct, output, sizes)
        fix = (
            "without path= the reference contracts left to right: pass path= (tropical."
            "einsum_plan(subscripts, *shapes, optimize='auto-hq').path) for an order with "
            "smaller intermediates, or contract the network in slices"
        )
    for number, step in enumerate(steps):
        joint = dict.fromkeys("".join(step.inputs))
        if len(joint) > MAX_NDIM:
            raise ValueError(
                f"einsum step {number} ({step.subscripts}) broadcasts {len(joint)} indices at "
                f"once, more than the {MAX_NDIM} dimensions a NumPy array has; {fix}"
            )
        elements = math.prod(sizes[i] for i in step.keep)
        what = f"einsum intermediate {step.keep!r} of step {number} ({step.subscripts})"
        check_size(what, elements, itemsize=itemsize, limit=max_bytes, bound=bound, fix=fix)
    made = dict(
        enumerate(
            _distinct_axes(x, letters, sizes) for x, letters in zip(arrays, inputs, strict=True)
        )
    )
    letters = "".join(dict.fromkeys("".join(inputs)))
    return _Network(ring, made, steps, output, dict(sizes), letters)


def configurations(
    subscripts: str,
    *operands: Any,
    semiring: str = "maxplus",
    path: Sequence[Sequence[int]] | None = None,
    max_bytes: int = MAX_BYTES,
    limit: int = 10_000,
) -> tuple[Any, str, np.ndarray[Any, Any]]:
    """Every assignment of the indices that attains a scalar contraction's value: for a graph
    problem's network, every optimal configuration.

    The bounded method: the network is contracted once for the value (keeping each step's
    result) and once for the count of the assignments attaining it (``einsum(..., count=True)``);
    then, from the last step back to the first, each partial assignment is extended by the
    values of the indices a step sums at which its operands' product attains the step's value,
    so only branches that reach the value are followed: the work past the two contractions is
    about the number of assignments times the number of steps. Exact where ``count=True`` is.
    Every step's result is kept until the end (``max_bytes`` bounds each, not their sum).

    Args:
        subscripts: As ``einsum``; the output has no index (``"...->"``).
        *operands: As ``einsum``.
        semiring: As ``einsum``.
        path: As ``einsum``.
        max_bytes: As ``einsum``, for the results with their counts.
        limit: The most assignments returned (default 10,000). Past it the call says how many
            there are, and returns none.

    Returns:
        The triple (value, indices, rows): the value as ``einsum`` gives it; the indices, a
        str, each once, in the order they first appear in ``subscripts``; an int64 array of
        one row per assignment and one column per index, the rows in increasing order. No
        rows where the value is the semiring's zero.

    Raises:
        ValueError: As ``einsum``; the output has an index; ``limit`` is below 1; more than
            ``limit`` assignments attain the value (the message says how many).
        TypeError: As ``einsum``; ``limit`` is not an int.
        OverflowError: The count passes 2^63 - 1.
    """
    if not isinstance(limit, int) or isinstance(limit, bool):
        raise TypeError(f"limit must be an int, got {type(limit).__name__}")
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    net = _prepare(subscripts, operands, semiring, path, max_bytes, extra=(8, 1))
    if net.output:
        raise ValueError(
            f"configurations takes a scalar contraction (subscripts ending in '->'), not one "
            f"with the output {net.output!r}: the assignments of a cell are those of the "
            "network with the output's indices fixed to it (slice the operands there)"
        )
    ring, steps, sizes, n = net.ring, net.steps, net.sizes, len(net.made)
    value, count = _counted(ring, dict(net.made), steps, "", sizes)
    if count > limit:
        raise ValueError(
            f"{int(count):,} assignments attain the value {value}, more than limit={limit:,}: "
            "pass a larger limit, or count them alone with einsum(..., count=True)"
        )
    columns = np.zeros((0, len(net.letters)), np.int64)
    if count == 0:
        return value, net.letters, columns
    results: dict[int, _Term] = dict(net.made)
    made = dict(net.made)
    for number, step in enumerate(steps):
        chosen = [made.pop(i) for i in step.operands]
        made[n + number] = results[n + number] = (
            _contract(ring, chosen, step.keep, sizes),
            step.keep,
        )
    partial: list[dict[str, int]] = [{}]
    for number in reversed(range(len(steps))):
        step = steps[number]
        target, keep = results[n + number]
        grown = []
        for fixed in partial:
            cell = target[tuple(fixed[c] for c in keep)]
            grown += [
                fixed | more for more in _attaining(ring, step, results, fixed, cell, sizes=sizes)
            ]
        partial = grown
    rows = np.array([[fixed[c] for c in net.letters] for fixed in partial], np.int64)
    if not len(partial):
        return value, net.letters, columns
    if net.letters:  # the rows in increasing order (lexsort's last key is its first)
        rows = rows[np.lexsort(rows.T[::-1])]
    return value, net.letters, rows


def _attaining(
    ring: Semiring,
    step: _Step,
    results: Mapping[int, _Term],
    fixed: Mapping[str, int],
    cell: Any,
    *,
    sizes: Mapping[str, int],
) -> list[dict[str, int]]:
    """The values of the indices ``step`` sums at which, its kept indices at ``fixed``, the
    product of its operands attains ``cell`` (never the zero)."""
    summed = "".join(dict.fromkeys(c for t in step.inputs for c in t if c not in step.keep))
    product: Any = None
    for k in step.operands:
        x, letters = results[k]
        picked = x[tuple(fixed[c] if c in step.keep else slice(None) for c in letters)]
        part = _align(np.asarray(picked), "".join(c for c in letters if c not in step.keep),
                      summed)  # fmt: skip
        product = part if product is None else combine(ring, product, part)
    product = np.broadcast_to(np.asarray(product), [sizes[c] for c in summed])
    hits = np.argwhere((product == cell) & _entry_counts(ring, product))
    return [dict(zip(summed, map(int, at), strict=True)) for at in hits]


def _counted(
    ring: Semiring,
    made: dict[int, _Term],
    steps: Sequence[_Step],
    output: str,
    sizes: Mapping[str, int],
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """``einsum(..., count=True)`` along ``steps``: each operand paired with its counts (1 for
    an entry, 0 for the zero or a NaN), each step contracted in the counting semiring."""
    n = len(made)
    counts: dict[int, np.ndarray[Any, Any]] = {
        k: _entry_counts(ring, x).astype(np.int64) for k, (x, _) in made.items()
    }
    for number, step in enumerate(steps):
        chosen = [made.pop(i) for i in step.operands]
        tallies = [counts.pop(i) for i in step.operands]
        value, tally = _contract_counted(ring, chosen, tallies, step.keep, sizes, number=number)
        made[n + number], counts[n + number] = (value, step.keep), tally
    ((k, (x, letters)),) = made.items()
    if letters == output:
        return x, counts[k]
    return (
        np.ascontiguousarray(_align(x, letters, output)),
        np.ascontiguousarray(_align(counts[k], letters, output)),
    )


def _check_top(top: object, count: bool) -> None:
    if top is None:
        return
    if not isinstance(top, int) or isinstance(top, bool):
        raise TypeError(f"top must be an int (how many best values), got {type(top).__name__}")
    if not 1 <= top <= _MAX_TOP:
        raise ValueError(f"top must be from 1 to {_MAX_TOP}, got {top}")
    if count:
        raise ValueError("pass count=True or top=k, not both: top=k counts each of its values")


_MAX_TOP = 64


def _best(
    ring: Semiring,
    made: dict[int, _Term],
    steps: Sequence[_Step],
    output: str,
    sizes: Mapping[str, int],
    *,
    top: int,
    max_bytes: int,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """``einsum(..., top=k)`` along ``steps``: each operand as lists of k (value, count) pairs,
    its entry first, each step's products and sums kept to the k best distinct values."""
    n = len(made)
    for k, (x, held) in made.items():  # each operand's lists, checked before any is made
        check_size(f"einsum operand {k} ({held!r}) as lists of top={top}", x.size,
                   itemsize=(x.dtype.itemsize + 8) * top, limit=max_bytes,
                   bound=max_bytes_bound(max_bytes), fix="pass a smaller top")  # fmt: skip
    lists: dict[int, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]] = {}
    for k, (x, _) in made.items():
        values = np.full((*x.shape, top), ring.zero(x.dtype), x.dtype)
        counts = np.zeros((*x.shape, top), np.int64)
        entries = _entry_counts(ring, x)
        values[..., 0] = np.where(entries, x, ring.zero(x.dtype))
        counts[..., 0] = entries
        lists[k] = values, counts
    letters = {k: t for k, (_, t) in made.items()}
    for number, step in enumerate(steps):
        chosen = [(*lists.pop(i), letters.pop(i)) for i in step.operands]
        lists[n + number] = _contract_best(ring, chosen, step.keep, sizes, top, number=number)
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
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """One step with lists of ``top`` (value, count) pairs on a last axis: the pairs of each
    product formed two lists at a time, kept to the best, then merged over the summed indices
    and over the blocks."""
    joint = out + "".join(dict.fromkeys(c for *_, s in terms for c in s if c not in out))
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
    for block in _blocks(shape, weight=top * top):
        pick = (*block, slice(None))

        def part(x: np.ndarray[Any, Any], pick: tuple[slice, ...] = pick) -> Any:
            return x[tuple(b if n > 1 else slice(None) for b, n in zip(pick, x.shape, strict=True))]

        v, c = part(aligned[0][0]), part(aligned[0][1])
        for x, m in aligned[1:]:
            pv = combine(ring, v[..., :, None], part(x)[..., None, :])
            pc = _times(c[..., :, None], part(m)[..., None, :], what)
            v, c = _kept(ring, pv.reshape(*pv.shape[:-2], -1), pc.reshape(*pc.shape[:-2], -1), top)
        where = block[: len(out)]
        lead = v.shape[: len(out)]
        v = np.concatenate([values[where], v.reshape(*lead, -1)], axis=-1)
        c = np.concatenate([counts[where], c.reshape(*lead, -1)], axis=-1)
        values[where], counts[where] = _kept(ring, v, c, top, what=what)
    return values, counts


def _listed(x: np.ndarray[Any, Any], letters: str, joint: str) -> np.ndarray[Any, Any]:
    """``_align`` for an array with a last axis of list entries, kept last."""
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
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The ``top`` best distinct values along the last axis, best first, each with the sum of
    its counts (the zero, and pairs of count 0, count for nothing); padded with the zero."""
    zero = ring.zero(values.dtype)
    counts = np.where(_entry_counts(ring, values), counts, 0)
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
    if np.sum(c, axis=-1, dtype=np.float64).max(initial=0.0) > _CHECK_ABOVE:
        exact = np.zeros((len(v), top), object)
        np.add.at(exact, (rows[keep], group[keep]), c[keep].astype(object))
        _fits(exact, what)
    out_c = np.zeros((len(v), top), np.int64)
    np.add.at(out_c, (rows[keep], group[keep]), c[keep])
    out_c[out_v == zero] = 0
    return out_v.reshape(*lead, top), out_c.reshape(*lead, top)


def _entry_counts(ring: Semiring, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """True where an entry counts for an assignment: it is neither the zero nor a NaN."""
    zero = ring.zero(x.dtype)
    return np.asarray((x != zero) & (x == x))  # noqa: PLR0124  # x == x is False for a NaN


def _contract_counted(
    ring: Semiring,
    terms: Sequence[_Term],
    tallies: Sequence[np.ndarray[Any, Any]],
    out: str,
    sizes: Mapping[str, int],
    *,
    number: int,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """``_contract`` in the counting semiring: the value as ``_contract`` gives it, and the
    number of assignments of the summed indices whose product attains it, block by block."""
    joint = out + "".join(dict.fromkeys(c for _, s in terms for c in s if c not in out))
    dtype = terms[0][0].dtype
    zero = ring.zero(dtype)
    add: np.ufunc = np.logical_or if ring.name == "andor" else np.fmax if ring.maximise else np.fmin
    result = np.full([sizes[c] for c in out], zero, dtype=dtype)
    tally = np.zeros([sizes[c] for c in out], dtype=np.int64)
    shape = [sizes[c] for c in joint]
    if 0 in shape:
        return result, tally
    aligned = [_align(x, letters, joint) for x, letters in terms]
    counted = [_align(c, letters, joint) for c, (_, letters) in zip(tallies, terms, strict=True)]
    summed = tuple(range(len(out), len(joint)))
    what = f"einsum step {number}"
    for block in _blocks(shape):

        def part(x: np.ndarray[Any, Any], block: tuple[slice, ...] = block) -> Any:
            return x[
                tuple(b if n > 1 else slice(None) for b, n in zip(block, x.shape, strict=True))
            ]

        product, many = part(aligned[0]), part(counted[0])
        for x, c in zip(aligned[1:], counted[1:], strict=True):
            product = combine(ring, product, part(x))
            many = _times(many, part(c), what)
        many = np.where(_entry_counts(ring, np.asarray(product)), many, 0)
        if summed:
            best = add.reduce(product, axis=summed, keepdims=True)
            hits = np.where((product == best) & (many > 0), many, 0)
            best, many = best.squeeze(axis=summed), _sum(hits, summed, what)
        where = block[: len(out)]
        new = add(result[where], best if summed else product)
        kept = np.where(result[where] == new, tally[where], 0)
        tally[where] = _sum(np.stack([kept, np.where((best if summed else product) == new,
                                                     many, 0)]), (0,), what)  # fmt: skip
        result[where] = new
    tally[~_entry_counts(ring, result)] = 0
    return result, tally


# Past this a product or sum of int64 counts is checked again in Python's integers: below it
# the float64 estimate (relative error 2^-53 a step) cannot hide an overflow.
_CHECK_ABOVE = float(1 << 62)
_INT64_MAX = (1 << 63) - 1


def _times(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any], what: str) -> np.ndarray[Any, Any]:
    """a * b of int64 counts, exact, or OverflowError."""
    if np.multiply(a, b, dtype=np.float64).max(initial=0.0) > _CHECK_ABOVE:
        # ndarray.astype(object) holds Python's ints (a NumPy scalar's would stay int64)
        exact = np.multiply(np.asarray(a).astype(object), np.asarray(b).astype(object))
        _fits(exact, what)
    return np.asarray(np.multiply(a, b))


def _sum(x: np.ndarray[Any, Any], axes: tuple[int, ...], what: str) -> np.ndarray[Any, Any]:
    """The sum of int64 counts over ``axes``, exact, or OverflowError."""
    if np.sum(x, axis=axes, dtype=np.float64).max(initial=0.0) > _CHECK_ABOVE:
        _fits(np.sum(np.asarray(x).astype(object), axis=axes), what)
    return np.asarray(np.sum(x, axis=axes, dtype=np.int64))


def _fits(exact: Any, what: str) -> None:
    if max(np.ravel(exact), default=0) > _INT64_MAX:
        raise OverflowError(
            f"{what}: a count of assignments passes 2^63 - 1, more than int64 holds; count "
            "the network in parts (fix some of its indices, and add the parts' counts in "
            "Python's integers)"
        )


def _left_to_right(inputs: Sequence[str], output: str, sizes: Mapping[str, int]) -> list[_Step]:
    """``einsum``'s order without a path: all operands in one broadcast when that is small;
    else, by distributivity, each index summed as soon as no later operand (nor the output)
    needs it: first each operand's own, then operand by operand. Exact, floats included,
    because x -> x (x) c is monotone (for max-times: on non-negative inputs, where it is
    defined)."""
    n = len(inputs)
    if n == 1 or (math.prod(sizes.values()) <= CHUNK_ELEMENTS and len(sizes) <= MAX_NDIM):
        return [_Step(tuple(range(n)), tuple(inputs), output)]
    steps: list[_Step] = []
    owners = Counter(i for letters in inputs for i in letters)  # operands holding each index
    terms: list[tuple[int, str]] = []  # each operand's number and indices after its own sums
    for k, letters in enumerate(inputs):
        keep = "".join(i for i in letters if owners[i] > 1 or i in output)
        if keep == letters:
            terms.append((k, letters))
        else:
            steps.append(_Step((k,), (letters,), keep))
            terms.append((n + len(steps) - 1, keep))
    later = Counter(i for _, letters in terms[1:] for i in letters)  # in operands not yet taken
    acc = terms[0]
    for k, term in enumerate(terms[1:], start=1):
        later.subtract(term[1])
        joint = dict.fromkeys(acc[1] + term[1])
        last = k == n - 1
        keep = output if last else "".join(i for i in joint if later[i] > 0 or i in output)
        steps.append(_Step((acc[0], term[0]), (acc[1], term[1]), keep))
        acc = (n + len(steps) - 1, keep)
    return steps


def _along(inputs: Sequence[str], output: str, path: Sequence[Sequence[int]]) -> list[_Step]:
    """The steps of ``path`` (opt_einsum's format), each keeping what later steps need."""
    n = len(inputs)
    live = [(k, letters) for k, letters in enumerate(inputs)]
    steps: list[_Step] = []
    for number, step in enumerate(path):
        positions = sorted({int(p) for p in step})
        if not positions or positions[-1] >= len(live) or positions[0] < 0:
            raise ValueError(f"einsum path step {number} {tuple(step)} names no live operands")
        chosen = [live[p] for p in positions]
        live = [t for i, t in enumerate(live) if i not in positions]
        later = set(output).union(*(letters for _, letters in live))
        joint = dict.fromkeys("".join(letters for _, letters in chosen))
        keep = "".join(x for x in joint if x in later) if live else output
        steps.append(_Step(tuple(k for k, _ in chosen), tuple(t for _, t in chosen), keep))
        live.append((n + number, keep))
    if len(live) != 1:
        raise ValueError(f"einsum path leaves {len(live)} operands, not one")
    if not steps and live[0][1] != output:  # one operand, its own sums still to do
        steps.append(_Step((0,), (live[0][1],), output))
    return steps


def _distinct_axes(x: np.ndarray[Any, Any], letters: str, sizes: Mapping[str, int]) -> _Term:
    """``x`` with its repeated indices taken as diagonals: one axis per distinct letter."""
    distinct = "".join(dict.fromkeys(letters))
    if distinct == letters:
        return x, letters
    (term,) = input_terms([letters], [x.strides])
    view = np.lib.stride_tricks.as_strided(
        x, shape=[sizes[d] for d in distinct], strides=term.strides, writeable=False
    )
    return view, distinct


def _contract(
    ring: Semiring, terms: Sequence[_Term], out: str, sizes: Mapping[str, int]
) -> np.ndarray[Any, Any]:
    """The zero (+) the sum over the indices not in ``out`` of the terms' product (left to
    right), one axis per letter of ``out``, broadcast over all the terms' indices in blocks."""
    joint = out + "".join(dict.fromkeys(c for _, s in terms for c in s if c not in out))
    dtype = terms[0][0].dtype
    zero = ring.zero(dtype)
    # fmax / fmin skip NaN: a NaN input counts as the zero, as a NaN product does.
    add: np.ufunc = np.logical_or if ring.name == "andor" else np.fmax if ring.maximise else np.fmin
    result = np.full([sizes[c] for c in out], zero, dtype=dtype)
    shape = [sizes[c] for c in joint]
    if 0 in shape:  # nothing to sum: every cell (if any) is the empty sum
        return result
    aligned = [_align(x, letters, joint) for x, letters in terms]
    summed = tuple(range(len(out), len(joint)))
    for block in _blocks(shape):
        # An operand lacking an index has a broadcast axis of size 1 there: take all of it.
        parts = [
            x[tuple(b if n > 1 else slice(None) for b, n in zip(block, x.shape, strict=True))]
            for x in aligned
        ]
        product = parts[0]
        for part in parts[1:]:
            product = combine(ring, product, part)
        if summed:
            product = add.reduce(product, axis=summed)
        where = block[: len(out)]
        result[where] = add(result[where], product)  # (+) into the cells, from the zero
    return result


def _align(x: np.ndarray[Any, Any], letters: str, joint: str) -> np.ndarray[Any, Any]:
    """A view of ``x`` with one axis per letter of ``joint``, of size 1 where ``x`` lacks it."""
    x = x.transpose(sorted(range(len(letters)), key=lambda a: joint.index(letters[a])))
    return x[tuple(slice(None) if c in letters else np.newaxis for c in joint)]


def _blocks(shape: Sequence[int], weight: int = 1) -> Iterator[tuple[slice, ...]]:
    """Slices cutting ``shape`` (no size 0 in it) into blocks of at most ``CHUNK_ELEMENTS``
    elements, each weighing ``weight`` (a block of them is that many times the memory): single
    indices of the leading axes, a run of one axis, the trailing axes whole."""
    if not shape:
        yield ()
        return
    chunk = max(1, CHUNK_ELEMENTS // weight)
    axis = next(a for a in range(len(shape)) if math.prod(shape[a + 1 :]) <= chunk)
    step = max(1, chunk // math.prod(shape[axis + 1 :]))
    rest = (slice(None),) * (len(shape) - axis - 1)
    for head in itertools.product(*(range(n) for n in shape[:axis])):
        for start in range(0, shape[axis], step):
            yield (*(slice(i, i + 1) for i in head), slice(start, start + step), *rest)
