"""The tensors of the constraints the problems share: at most one of some 0/1 variables at 1
(a matching's edges at a vertex, the packed sets holding an element), at least one (a vertex
dominated, an element covered), each entry 0 where it holds and the semiring's zero where it
does not; and the bound on how many variables one such tensor joins."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._reading import Array

__all__ = ["MAX_DEGREE", "at_least_one", "at_most_one", "check_joined"]

# A tensor joining d 0/1 variables holds 2^d elements: 128 MiB of float32 at 25 (a maximal
# independent set's vertex with 24 neighbours, with itself).
MAX_DEGREE = 24


def at_most_one(count: int, zero: Any, dtype: np.dtype[Any]) -> Array:
    """0 where at most one of ``count`` variables is 1, ``zero`` elsewhere."""
    ones = np.indices((2,) * count).sum(axis=0) if count else np.zeros((), np.int64)
    tensor: Array = np.where(ones <= 1, dtype.type(0), zero).astype(dtype)
    return tensor


def at_least_one(count: int, zero: Any, dtype: np.dtype[Any]) -> Array:
    """0 where at least one of ``count`` variables is 1, ``zero`` where none is."""
    tensor = np.zeros((2,) * count, dtype)
    tensor[(0,) * count] = zero
    return tensor


def check_joined(owner: str, count: int, what: str) -> None:
    """Refuse a tensor of more than ``MAX_DEGREE + 1`` variables (2^count elements)."""
    if count > MAX_DEGREE + 1:
        raise ValueError(
            f"{owner} joins {count} {what}: its tensor would hold 2^{count} elements, and "
            f"{MAX_DEGREE + 1} at most are taken (tropical.problems.MAX_DEGREE + 1)"
        )
