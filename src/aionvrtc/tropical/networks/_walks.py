"""Assignments walked back through a counted contraction (the NumPy reference's): every one
that attains a scalar contraction's value (``configurations``), and samples drawn uniformly from
them (``samples``), each step's result kept through the contraction and the walk following only
the branches that reach the value."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import opt_einsum

from ..products import MAX_BYTES, Semiring, check_size, combine, entry_counts, max_bytes_bound
from ._contraction import Step, Term, align, prepare
from ._counting import best, count_along, counted

__all__ = ["check_limit", "configurations", "samples", "top_configurations"]


def check_limit(limit: object) -> None:
    """``limit`` (the most assignments listed) as every listing takes it: an int >= 1, else
    TypeError or ValueError naming it."""
    if not isinstance(limit, int) or isinstance(limit, bool):
        raise TypeError(f"limit must be an int, got {type(limit).__name__}")
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")


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
    check_limit(limit)
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
    value, total = count_along(ring, dict(net.made), steps, "", sizes, kept=results, modulus=None,
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
        order = np.argsort(group.reshape(-1), kind="stable")
        starts = np.searchsorted(group.reshape(-1)[order], np.arange(len(keys) + 1))
        for number_in, key in enumerate(keys):
            members = order[starts[number_in] : starts[number_in + 1]]
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


def top_configurations(
    subscripts: str,
    *operands: Any,
    top: int,
    semiring: str = "maxplus",
    path: Sequence[Sequence[int]] | None = None,
    max_bytes: int = MAX_BYTES,
    limit: int = 10_000,
    first: bool = False,
) -> tuple[list[Any], str, list[np.ndarray[Any, Any]]]:
    """Every assignment that attains one of the ``top`` best values of a scalar contraction.

    The network is contracted once keeping each cell's ``top`` best (value, count) pairs, every
    step's lists kept; then each partial assignment is walked back from the last step to the
    first carrying the value each pending step result must take, extended at a step by the
    values of the indices it sums and the entries of its operands' lists whose product is that
    value. (An assignment among the best has every partial value among its cell's best: a
    partial value with ``top`` better ones at its cell would give ``top`` better totals, where
    the products are exact.) Counts as ``einsum(..., top=k)`` gives them: refused past
    ``limit`` before any row is made, and within int64.

    Args:
        subscripts: As ``einsum``; the output has no index.
        *operands: As ``einsum``.
        top: How many best values, as ``einsum``'s ``top``.
        semiring: As ``einsum``.
        path: As ``einsum``; by default opt_einsum's greedy order (pairwise steps, where the
            reference's left-to-right order may join every operand in one step).
        max_bytes: As ``einsum``, for the lists; and for the rows.
        limit: The most assignments returned, over all the values (default 10,000).
        first: One assignment of each value alone, the first the walk finds, however many
            there are (``limit`` is not checked).

    Returns:
        The triple (values, indices, rows): the best values, best first (fewer where fewer
        exist); the indices as ``configurations`` gives them; for each value an int64 array of
        one row per assignment attaining it, the rows in increasing order.

    Raises:
        ValueError: As ``einsum``; the output has an index; more than ``limit`` assignments.
        OverflowError: A count passes 2^63 - 1.
        TypeError: As ``einsum``.
    """
    check_limit(limit)
    if path is None:  # pairwise steps: a step of m operands walks top^m entries a cell
        shapes = [np.shape(x) for x in operands]
        path = opt_einsum.contract_path(subscripts, *shapes, shapes=True, optimize="greedy")[0]
    net = prepare(subscripts, operands, semiring, path, max_bytes, extra=(8, top))
    if net.output:
        raise ValueError(
            f"top_configurations takes a scalar contraction (subscripts ending in '->'), not "
            f"one with the output {net.output!r}"
        )
    ring, steps, sizes, n = net.ring, net.steps, net.sizes, len(net.made)
    lists: dict[int, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]] = {}
    values, counts = best(ring, dict(net.made), steps, "", sizes, top=top, max_bytes=max_bytes,
                          kept=lists)  # fmt: skip
    found = [(v, int(c)) for v, c in zip(values.tolist(), counts.tolist(), strict=True) if c]
    total = len(found) if first else sum(c for _, c in found)
    if total > limit and not first:
        raise ValueError(
            f"{total:,} assignments attain the {len(found)} best values, more than "
            f"limit={limit:,}: pass a larger limit, or count them alone with einsum(..., top=k)"
        )
    width = len(net.letters)
    check_size(f"top_configurations' rows ({total:,} assignments of {width} indices)",
               total * width, itemsize=8, limit=max_bytes, bound=max_bytes_bound(max_bytes),
               fix="count them alone with einsum(..., top=k)")  # fmt: skip
    column = {c: i for i, c in enumerate(net.letters)}
    letters = {k: t for k, (_, t) in net.made.items()}
    letters.update({n + i: step.keep for i, step in enumerate(steps)})
    last = n + len(steps) - 1
    # Each partial row: its values so far, and the value each pending step result must take.
    rows: list[tuple[np.ndarray[Any, Any], dict[int, Any], int]] = [
        (np.zeros(width, np.int64), {last: v}, place) for place, (v, _) in enumerate(found)
    ]
    for number in reversed(range(len(steps))):
        step = steps[number]
        extended = []
        for row, pending, place in rows:
            wanted = pending.pop(n + number)
            ways = _best_branches(ring, step, lists, letters, row, wanted=wanted, column=column,
                                  sizes=sizes)  # fmt: skip
            for summed, targets in ways[:1] if first else ways:
                made = row.copy()
                made[[column[c] for c in _summed(step)]] = summed
                after = dict(pending)
                after.update({k: t for k, t in targets.items() if k >= n})
                extended.append((made, after, place))
        rows = extended
    by_value: list[list[np.ndarray[Any, Any]]] = [[] for _ in found]
    for row, _, place in rows:
        by_value[place].append(row)
    listed = []
    for held in by_value:
        block = np.array(held, np.int64).reshape(len(held), width)
        listed.append(block[np.lexsort(block.T[::-1])] if width else block)
    return [v for v, _ in found], net.letters, listed


def _best_branches(
    ring: Semiring,
    step: Step,
    lists: Mapping[int, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]],
    letters: Mapping[int, str],
    row: np.ndarray[Any, Any],
    *,
    wanted: Any,
    column: Mapping[str, int],
    sizes: Mapping[str, int],
) -> list[tuple[tuple[int, ...], dict[int, Any]]]:
    """The ways ``step``'s result takes ``wanted`` at ``row``'s kept values: each the values of
    the indices it sums, and the value each operand takes there (one of its list's entries)."""
    summed = _summed(step)
    shape = [sizes[c] for c in summed]
    m = len(step.operands)
    product: Any = None
    alive: Any = None
    parts = []
    for place, k in enumerate(step.operands):
        values, counts = lists[k]
        held = letters[k]
        where = tuple(row[column[c]] if c in step.keep else slice(None) for c in held)
        rest = "".join(c for c in held if c not in step.keep)
        v = _listed_at(values[where], rest, summed, place, m)
        c = _listed_at(counts[where], rest, summed, place, m)
        parts.append(v)
        product = v if product is None else combine(ring, product, v)
        alive = (c > 0) if alive is None else alive & (c > 0)
    full = [*shape, *(lists[k][0].shape[-1] for k in step.operands)]
    product = np.broadcast_to(np.asarray(product), full)
    hits = np.argwhere(np.broadcast_to(alive, full) & (product == wanted))
    ways = []
    for hit in hits:
        summed_values = tuple(int(x) for x in hit[: len(shape)])
        targets = {
            k: np.broadcast_to(part, full)[tuple(hit)].item()
            for k, part in zip(step.operands, parts, strict=True)
        }
        ways.append((summed_values, targets))
    return ways


def _listed_at(
    x: np.ndarray[Any, Any], letters: str, summed: str, place: int, m: int
) -> np.ndarray[Any, Any]:
    """An operand's lists at a row's kept values (``letters`` left, then the list's axis)
    aligned to the summed indices, its list's axis at ``place`` of ``m`` after them."""
    order = sorted(range(len(letters)), key=lambda a: summed.index(letters[a]))
    x = x.transpose([*order, len(letters)])
    x = x[(*(slice(None) if c in letters else np.newaxis for c in summed), slice(None))]
    lead = x.shape[: len(summed)]
    return x.reshape(*lead, *(x.shape[-1] if i == place else 1 for i in range(m)))
