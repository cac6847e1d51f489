"""The NumPy contraction of tensor networks in the tropical semirings
(``tropical.reference.einsum``): the oracle of ``tropical.einsum``, and a CPU fallback, along a
given order or left to right."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..products import MAX_BYTES
from ._contraction import align, contract, prepare
from ._counting import best, check_top, counted
from ._walks import configurations, samples, top_configurations

__all__ = ["configurations", "einsum", "samples", "top_configurations", "top_values"]


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
            are. Exact at any size: in int64, and where a count passes 2^63 - 1, again
            modulo as many primes below 2^31 as the number of assignments of the summed
            indices needs (one contraction each), joined by the Chinese remainder theorem
            (those Python ints are not counted in ``max_bytes``). Along any order the counts
            are those of the definition where the products are exact (integers that do not
            saturate, floats holding integers, the zero as the only infinity): where rounding
            or an infinity makes two products equal, an order that sums an index early tells
            them apart as the definition would not.
        top: The ``top`` best distinct values of each output cell (the largest for max-plus,
            max-times and and-or, the smallest for min-plus), best first, each with how many
            assignments attain it, counted as ``count=True`` counts (in int64: past 2^63 - 1,
            refused); a cell of fewer distinct values is padded with the zero, of count 0.
            From 1 (``count=True``'s value and count, on an axis of 1) to 64.

    Returns:
        The result, of the operands' dtype, with one axis per output index (0-d for
        ``"->"``-style outputs). With ``count=True`` the pair (result, counts), the counts an
        int64 array of the result's shape, or an array of Python's ints (dtype object) where
        one passes 2^63 - 1. With ``top=k`` the pair (values, counts), each with
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
        OverflowError: With ``top=``, a count (of the output, or of an intermediate) would
            pass 2^63 - 1.
        TypeError: ``top`` is not an int.
        ValueError: ``top`` is not from 1 to 64, or is given with ``count=True``.
    """
    check_top(top, count)
    # With counts, each element also holds an int64 count (or residue); with top=k, k of each.
    extra = (8 if count or top else 0, top or 1)
    net = prepare(subscripts, operands, semiring, path, max_bytes, extra=extra)
    ring, made, steps, output, sizes = net.ring, net.made, net.steps, net.output, net.sizes
    if count:
        return counted(ring, made, steps, output, sizes)
    if top is not None:
        return best(ring, made, steps, output, sizes, top=top, max_bytes=max_bytes)
    n = len(made)
    for number, step in enumerate(steps):
        chosen = [made.pop(i) for i in step.operands]
        made[n + number] = contract(ring, chosen, step.keep, sizes), step.keep
    ((x, letters),) = made.values()
    return np.ascontiguousarray(align(x, letters, output)) if letters != output else x


def top_values(
    subscripts: str,
    *operands: Any,
    top: int,
    semiring: str = "maxplus",
    path: Sequence[Sequence[int]] | None = None,
    max_bytes: int = MAX_BYTES,
) -> Any:
    """``einsum(..., top=k)``'s values alone: the k best distinct values of each output cell,
    padded with the zero, without counting the assignments that reach them (so that no count
    past 2^63 - 1 refuses them). Arguments and errors as ``einsum``'s (no OverflowError)."""
    check_top(top, False)
    net = prepare(subscripts, operands, semiring, path, max_bytes, extra=(8, top))
    ring, made, steps, output, sizes = net.ring, net.made, net.steps, net.output, net.sizes
    return best(ring, made, steps, output, sizes, top=top, max_bytes=max_bytes, counting=False)[0]
