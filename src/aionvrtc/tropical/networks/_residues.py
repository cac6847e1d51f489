"""Exact counts of any size from fixed-width integers: a count contracted once modulo each of
several primes below 2^31 (each product of two residues fits in an int64), the residues joined
by the Chinese remainder theorem in Python's integers at the end. As many primes as a bound on
the count needs; a contraction's arithmetic stays in int64, as it would on the GPU."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["INT64_MAX", "joined", "moduli"]

INT64_MAX = (1 << 63) - 1
# Below 2^31: a product of two residues (< 2^62) and a sum of 2^32 of them fit in an int64.
_BELOW = 1 << 31


def _prime(n: int) -> bool:
    """Whether ``n`` < 3,215,031,751 is prime (Miller-Rabin with the bases 2, 3, 5 and 7,
    which decide every number below that bound)."""
    if n < 2:
        return False
    for p in (2, 3, 5, 7):
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in (2, 3, 5, 7):
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


@functools.cache
def _primes(count: int) -> tuple[int, ...]:
    """The ``count`` largest primes below 2^31, descending."""
    found: list[int] = []
    n = _BELOW - 1
    while len(found) < count:
        if _prime(n):
            found.append(n)
        n -= 2  # (2^31 - 1 is odd, and so is every candidate after it)
    return tuple(found)


def moduli(bound: int) -> tuple[int, ...]:
    """The fewest primes below 2^31 whose product passes ``bound`` (the largest a count can
    be): its residues modulo them name it."""
    count = max(1, math.ceil((bound.bit_length() + 1) / 30))  # (each prime is over 2^30)
    return _primes(count)


def joined(residues: Sequence[np.ndarray[Any, Any]], primes: Sequence[int]) -> np.ndarray[Any, Any]:
    """The counts whose residues modulo ``primes`` are ``residues`` (int64 arrays of one
    shape), by the Chinese remainder theorem: an int64 array where every count fits, else an
    array of Python's ints (dtype object)."""
    product = math.prod(primes)
    total = np.zeros(np.shape(residues[0]), dtype=object)
    for r, p in zip(residues, primes, strict=True):
        rest = product // p
        # (asarray: arithmetic on a 0-d object array gives back a bare int)
        total = np.asarray(total + np.asarray(r).astype(object) * (rest * pow(rest, -1, p)))
    total = np.asarray(total % product, dtype=object)
    if max(np.ravel(total), default=0) <= INT64_MAX:
        return total.astype(np.int64)
    return total
