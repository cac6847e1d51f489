"""The NumPy reference's sums over every valid assignment of a scalar network, not its best: the
polynomial of their sizes (exactly, by evaluation modulo primes and interpolation) and the
partition function (in floating point). An assignment is valid where none of its entries is the
semiring's zero (nor a NaN); its size is the ordinary sum of its entries."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import opt_einsum

from ..products import MAX_BYTES
from ._contraction import Network, prepare
from ._counting import counted, entry_counts, weighted_residues
from ._residues import Joined, moduli

__all__ = ["MAX_SPAN", "partition_function", "polynomial"]

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
    # Every size is low plus a multiple of `step` (a spin glass's energies step by 2): the
    # polynomial over x^low is one in y = x^step, of span / step fewer powers to evaluate.
    step = math.gcd(*(math.gcd(*np.unique(t[valid[k]] - t[valid[k]].min(initial=0)).tolist())
                      for k, t in sizes.items() if valid[k].any())) or 1  # fmt: skip
    if ((high - low) // step + 1) ** step >= 1 << 30:  # y's points 1, 2^step, ... past a prime
        step = 1
    span = (high - low) // step + 1
    if span > MAX_SPAN:
        raise ValueError(
            f"polynomial: the sizes span {low:,} to {high:,}, {span:,} powers, more than "
            f"{MAX_SPAN:,} (one contraction each): scale the weights to small integers"
        )
    primes = moduli(int(total))
    joined = Joined(primes, (span,))
    for p in primes:
        values = []
        points = list(range(1, span + 1))
        at_y = [x**step for x in points]  # distinct, each below every prime
        for point in points:
            weights = {k: _powers(t, point, p) for k, t in sizes.items()}
            at = weighted_residues(ring, level, steps, shape, weights=weights, modulus=p)
            values.append(at * pow(point, -low, p) % p)  # the polynomial over x^low
        joined.add(np.array(_interpolated(at_y, values, p), np.int64))
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
    """The natural log of the sum over every valid assignment of exp(beta * size), in float64:
    each operand and each step's result scaled by its largest element (the scales summed as
    logs), so that no sum overflows whatever beta and the sizes.

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
    scale = 0.0
    held: dict[int, tuple[np.ndarray[Any, Any], str]] = {}
    for k, (x, letters) in net.made.items():
        valid = entry_counts(net.ring, x)
        exponent = np.where(valid, float(beta) * np.where(valid, x, 0).astype(np.float64), -np.inf)
        top = float(exponent.max(initial=-np.inf))
        if top == -np.inf:
            return -math.inf
        scale += top
        held[k] = np.exp(exponent - top), letters
    n = len(net.made)
    for number, step in enumerate(net.steps):
        chosen = [held.pop(i) for i in step.operands]
        spec = ",".join(t for _, t in chosen) + "->" + step.keep
        # (opt_einsum's contract: NumPy's einsum takes ASCII letters alone)
        made = np.asarray(opt_einsum.contract(spec, *(x for x, _ in chosen)))
        top = float(np.max(made, initial=0.0))
        if top == 0.0:
            return -math.inf
        scale += math.log(top)
        held[n + number] = made / top, step.keep
    ((x, _),) = held.values()
    return scale + math.log(float(x))


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
