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

__all__ = ["INT64_MAX", "Joined", "moduli"]

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
    primes = _primes(-(-(bound.bit_length() + 1) // 30))  # enough: each is over 2^30
    count, product = 1, primes[0]
    while product <= bound:
        product *= primes[count]
        count += 1
    return primes[:count]


class Joined:
    """Counts joined from their residues modulo ``primes`` (the Chinese remainder theorem),
    one prime's residues at a time (``add``): one array of Python's ints held, whatever the
    number of primes."""

    def __init__(self, primes: Sequence[int], shape: tuple[int, ...]) -> None:
        self.primes, self.shape = tuple(primes), shape
        self._product = math.prod(self.primes)
        # Flat: arithmetic on a 0-d array of objects gives back a bare int.
        self._total = np.zeros(math.prod(shape), dtype=object)
        self._added = 0

    def add(self, residues: np.ndarray[Any, Any]) -> None:
        """The counts' residues modulo the next prime (int64, of ``shape``)."""
        p = self.primes[self._added]
        rest = self._product // p
        self._total += np.asarray(residues).reshape(-1).astype(object) * (rest * pow(rest, -1, p))
        self._total %= self._product
        self._added += 1

    def counts(self) -> np.ndarray[Any, Any]:
        """The counts: an int64 array where every one fits, else an array of Python's ints
        (dtype object)."""
        assert self._added == len(self.primes)
        total = self._total.reshape(self.shape)
        if max(self._total, default=0) <= INT64_MAX:
            return total.astype(np.int64)
        return total
