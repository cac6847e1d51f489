"""The NumPy reference's sums over every valid assignment of a scalar network, not its best: the
polynomial of their sizes (exactly, by evaluation modulo primes and interpolation) and the
partition function (in floating point). An assignment is valid where none of its entries is the
semiring's zero (nor a NaN); its size is the ordinary sum of its entries."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..products import MAX_BYTES, entry_counts
from ._contraction import Network, align, blocks, in_block, joint_indices, prepare
from ._counting import counted, weighted_residues
from ._residues import Joined, moduli

__all__ = ["MAX_SPAN", "partition_function", "polynomial"]

# Integers below this are exact in float64: the sizes' bound.
_EXACT = float(1 << 53)
# The most sizes a polynomial spans (its degree less its lowest power, plus 1): one contraction
# per size and prime.
MAX_SPAN = 4096


def polynomial(
    subscripts: str,
    *operands: Any,
    semiring: str = "maxplus",
    path: Sequence[Sequence[int]] | None = None,
    max_bytes: int = MAX_BYTES,
) -> dict[int, int]:
    """How many valid assignments of a scalar network have each size: the polynomial
    sum over them of x^size (a graph's independence polynomial, for ``independent_set``'s
    network of unit weights), exact at any size.

    Its span is bounded by two tropical contractions (the largest size and the smallest); then,
    modulo each of as many primes below 2^31 as the count of every valid assignment needs, the
    polynomial is evaluated at one point per size (the network counted with each entry weighted
    by the point to its size, in int64) and interpolated; the primes' coefficients are joined
    by the Chinese remainder theorem.

    Args:
        subscripts: As ``einsum``; the output has no index (``"...->"``).
        *operands: As ``einsum``: every entry that is not the semiring's zero an integer.
        semiring: The semiring whose zero marks an invalid entry: ``"maxplus"`` or
            ``"minplus"``.
        path: As ``einsum``.
        max_bytes: As ``einsum``, for each result with its counts.

    Returns:
        Each size that some valid assignment has, in increasing order, mapped to how many have
        it (Python's ints); empty where none is valid.

    Raises:
        ValueError: As ``einsum``; the output has an index; the semiring is neither max-plus
            nor min-plus; an entry is not an integer; the sizes span more than ``MAX_SPAN``.
        TypeError: As ``einsum``.
    """
    net = _scalar(subscripts, operands, semiring, path, max_bytes, what="polynomial")
    ring = net.ring
    valid = {k: entry_counts(ring, x) for k, (x, _) in net.made.items()}
    sizes: dict[int, np.ndarray[Any, Any]] = {}
    for k, (x, letters) in net.made.items():
        held = np.where(valid[k], x, 0)
        if not np.all(np.abs(held.astype(np.float64)) < _EXACT):  # (an infinity, 1e20, NaN)
            raise ValueError(
                f"polynomial: operand {k} ({letters!r}) holds an entry of 2^53 or more in "
                "absolute value: scale the weights to small integers"
            )
        if not np.array_equal(held, np.round(held)):
            raise ValueError(
                f"polynomial: operand {k} ({letters!r}) holds an entry that is not an integer: "
                "a polynomial's powers are integers (integer weights)"
            )
        sizes[k] = held.astype(np.int64)
    # Every valid entry 0: every valid assignment attains the value, 0, and is counted.
    level = {k: (np.where(valid[k], x.dtype.type(0), x), t) for k, (x, t) in net.made.items()}
    steps, shape = net.steps, net.sizes
    _, total = counted(ring, dict(level), steps, "", shape)
    if not int(total):
        return {}
    low, high = _ends(net, valid, sizes, path)
    # Each entry as its operand's least valid entry plus a multiple u of `step`, the gcd of all
    # their differences (a spin glass's energies step by 2): a size is the sum of the least
    # entries, `base`, plus step times the sum of the u's, and the polynomial is one in x^step
    # over those sums, of (high - low) / step + 1 powers, evaluated at z^u.
    least = {k: int(t[valid[k]].min()) if valid[k].any() else 0 for k, t in sizes.items()}
    step = math.gcd(*(math.gcd(*np.unique(t[valid[k]] - least[k]).tolist())
                      for k, t in sizes.items() if valid[k].any())) or 1  # fmt: skip
    units = {k: np.where(valid[k], (t - least[k]) // step, 0) for k, t in sizes.items()}
    lowest = (low - sum(least.values())) // step  # the least sum of u's
    span = (high - low) // step + 1
    if span > MAX_SPAN:
        raise ValueError(
            f"polynomial: the sizes run from {low:,} to {high:,} in steps of {step:,}, {span:,} "
            f"powers, more than {MAX_SPAN:,} (one contraction each): scale the weights down"
        )
    primes = moduli(int(total))
    joined = Joined(primes, (span,))
    points = list(range(1, span + 1))  # (distinct, each below every prime)
    for p in primes:
        values = []
        for z in points:
            weights = {k: _powers(u, z, p) for k, u in units.items()}
            at = weighted_residues(ring, level, steps, shape, weights=weights, modulus=p)
            values.append(at * pow(z, -lowest, p) % p)  # over z^lowest: a polynomial from z^0
        joined.add(np.array(_interpolated(points, values, p), np.int64))
    counts = joined.counts()
    return {low + i * step: int(c) for i, c in enumerate(counts) if int(c)}


def partition_function(
    subscripts: str,
    *operands: Any,
    beta: float,
    semiring: str = "maxplus",
    path: Sequence[Sequence[int]] | None = None,
    max_bytes: int = MAX_BYTES,
) -> float:
    """The natural log of the sum over every valid assignment of exp(beta * size), in float64
    and in log space: each step takes the logs of its operands, and the largest log of each
    block of its sums out before their exponentials (log-sum-exp), so that no sum overflows
    and none that matters underflows, whatever beta and the sizes.

    Args:
        subscripts: As ``einsum``; the output has no index.
        *operands: As ``einsum``.
        beta: A finite float (a negative one weighs the smallest sizes most).
        semiring: The semiring whose zero marks an invalid entry.
        path: As ``einsum``.
        max_bytes: As ``einsum``.

    Returns:
        ln Z, a float: ``-inf`` where no assignment is valid.

    Raises:
        ValueError: As ``einsum``; the output has an index; ``beta`` is not finite.
        TypeError: As ``einsum``; ``beta`` is not a real number.
    """
    if isinstance(beta, bool) or not isinstance(beta, (int, float, np.floating, np.integer)):
        raise TypeError(f"beta must be a real number, got {type(beta).__name__}")
    if not math.isfinite(beta):
        raise ValueError(f"beta must be finite, got {beta}")
    net = _scalar(subscripts, operands, semiring, path, max_bytes, what="partition_function")
    logs: dict[int, tuple[np.ndarray[Any, Any], str]] = {}
    for k, (x, letters) in net.made.items():
        valid = entry_counts(net.ring, x)
        sized = float(beta) * np.where(valid, x, 0).astype(np.float64)
        logs[k] = np.where(valid, sized, -np.inf), letters
    n = len(net.made)
    for number, step in enumerate(net.steps):
        chosen = [logs.pop(i) for i in step.operands]
        logs[n + number] = _log_sum(chosen, step.keep, net.sizes), step.keep
    ((x, _),) = logs.values()
    return float(x)


def _log_sum(
    terms: Sequence[tuple[np.ndarray[Any, Any], str]], out: str, sizes: Mapping[str, int]
) -> np.ndarray[Any, Any]:
    """One step in log space: ln of the sum over the summed indices of exp of the sum of the
    terms' logs, block by block (each block's largest log taken out before its exponentials,
    the blocks joined by logaddexp), so that nothing overflows or underflows that matters."""
    joint = joint_indices((t for _, t in terms), out)
    shape = [sizes[c] for c in joint]
    result = np.full([sizes[c] for c in out], -np.inf)
    if 0 in shape:
        return result
    aligned = [align(x, letters, joint) for x, letters in terms]
    summed = tuple(range(len(out), len(joint)))
    with np.errstate(divide="ignore", invalid="ignore"):
        for block in blocks(shape):
            total: Any = in_block(aligned[0], block)
            for x in aligned[1:]:
                total = total + in_block(x, block)
            within = [len(range(size)[cut]) for size, cut in zip(shape, block, strict=True)]
            total = np.broadcast_to(total, within)
            top = np.max(total, axis=summed, keepdims=True) if summed else total
            shift = np.where(np.isfinite(top), top, 0.0)
            part = np.log(np.sum(np.exp(total - shift), axis=summed, keepdims=True)) + shift
            where = block[: len(out)]
            result[where] = np.logaddexp(result[where], part.reshape(result[where].shape))
    return result


def _scalar(
    subscripts: str,
    operands: Sequence[Any],
    semiring: str,
    path: Sequence[Sequence[int]] | None,
    max_bytes: int,
    *,
    what: str,
) -> Network:
    if semiring not in ("maxplus", "minplus"):
        raise ValueError(
            f"{what} takes a max-plus or min-plus network (its zero marks an invalid entry), "
            f"not {semiring!r}"
        )
    net = prepare(subscripts, operands, semiring, path, max_bytes, extra=(8, 1))
    if net.output:
        raise ValueError(
            f"{what} takes a scalar contraction (subscripts ending in '->'), not one with the "
            f"output {net.output!r}"
        )
    return net


def _ends(
    net: Network,
    valid: dict[int, np.ndarray[Any, Any]],
    sizes: dict[int, np.ndarray[Any, Any]],
    path: Sequence[Sequence[int]] | None,
) -> tuple[int, int]:
    """The smallest and the largest size of a valid assignment: two tropical contractions of
    the sizes in float64 (exact: integers below 2^53 that a bound on the sizes keeps)."""
    from ._reference import einsum

    bound = sum(int(np.abs(t).max(initial=0)) for t in sizes.values())
    if bound >= 1 << 53:
        raise ValueError(
            f"polynomial: the sizes reach {bound:,} in absolute value: scale the weights to "
            "small integers"
        )
    ends = []
    for ring, zero in (("minplus", np.inf), ("maxplus", -np.inf)):
        held = [np.where(valid[k], t.astype(np.float64), zero) for k, t in sizes.items()]
        spec = ",".join(letters for _, letters in net.made.values()) + "->"
        ends.append(int(einsum(spec, *held, semiring=ring, path=path)))
    return ends[0], ends[1]


def _powers(sizes: np.ndarray[Any, Any], x: int, p: int) -> np.ndarray[Any, Any]:
    """x^size modulo p for each size (negative ones by x's inverse)."""
    distinct, where = np.unique(sizes, return_inverse=True)
    table = np.array([pow(x, int(s), p) for s in distinct], np.int64)
    return table[where].reshape(sizes.shape)


def _interpolated(points: Sequence[int], values: Sequence[int], p: int) -> list[int]:
    """The coefficients, lowest first, of the polynomial of degree len(points) - 1 through
    (points, values) modulo the prime p (Newton's divided differences)."""
    n = len(points)
    table = list(values)
    for level in range(1, n):
        for i in range(n - 1, level - 1, -1):
            gap = pow(points[i] - points[i - level], -1, p)
            table[i] = (table[i] - table[i - 1]) * gap % p
    coefficients = [table[n - 1]]
    for i in range(n - 2, -1, -1):  # Horner's rule over the Newton basis: c (x - x_i) + t_i
        made = [0] * (len(coefficients) + 1)
        for j, c in enumerate(coefficients):
            made[j + 1] = (made[j + 1] + c) % p
            made[j] = (made[j] - points[i] * c) % p
        made[0] = (made[0] + table[i]) % p
        coefficients = made
    return coefficients
