"""Counts beside a product's values: which entries count, the modulus and the checks of the
``counts=`` and ``modulus=`` arguments, shared by the GPU products and the NumPy reference (same
rules, same messages)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._semirings import Semiring

__all__ = ["MAX_MODULUS", "barrett", "check_count_arrays", "check_counted", "entry_counts"]

# Residues below 2^31: a product of two fits in 62 bits, so the kernels multiply in 64.
MAX_MODULUS = 1 << 31


def entry_counts(ring: Semiring, x: Any) -> Any:
    """True where an entry counts for an assignment: it is neither the zero nor a NaN."""
    zero = ring.zero(x.dtype)
    return (x != zero) & (x == x)  # noqa: PLR0124  # x == x is False for a NaN


def check_counted(counts: Any, modulus: Any, *, argmax: bool) -> bool:
    """Whether a product counts (``counts`` not None), its ``counts`` and ``modulus`` checked
    as far as they can be without the operands: True, or a pair; an int from 2 to 2^31 - 1
    where counting; never with ``argmax``."""
    if modulus is not None:
        if not isinstance(modulus, int) or isinstance(modulus, bool):
            raise TypeError(
                f"modulus must be an int (a prime below 2^31), got {type(modulus).__name__}"
            )
        if not 2 <= modulus < MAX_MODULUS:
            raise ValueError(
                "modulus must be from 2 to 2^31 - 1 (a prime: residues modulo several are "
                f"joined by the Chinese remainder theorem), got {modulus}"
            )
        if counts is None:
            raise ValueError("modulus is for counts: pass counts=True (or counts of a and b)")
    if counts is None:
        return False
    if counts is not True and not (isinstance(counts, tuple) and len(counts) == 2):
        raise TypeError(
            "counts must be True (each entry of a and b counts once) or a pair (counts of a, "
            f"counts of b) of int64 arrays of their shapes, got {type(counts).__name__}"
        )
    if argmax:
        raise ValueError(
            "pass counts= or argmax=True, not both: a counted product has no argmax (take the "
            "argmax from the product without counts)"
        )
    return True


def check_count_arrays(counts: tuple[Any, Any], a: Any, b: Any) -> None:
    """Each of ``counts`` int64 and of its operand's shape."""
    for given, operand, what in ((counts[0], a, "a"), (counts[1], b, "b")):
        if given.dtype != np.int64 or given.shape != operand.shape:
            raise ValueError(
                f"the counts of {what} must be int64 of {what}'s shape {operand.shape}, got "
                f"{given.dtype} of shape {given.shape}"
            )


def barrett(modulus: int | None) -> tuple[int, int]:
    """The kernels' (p, mu) arguments: 0 and 0 for exact counts, else p and floor(2^64 / p)
    as a signed 64-bit slot (the kernel reads it unsigned)."""
    if modulus is None:
        return 0, 0
    mu = (1 << 64) // modulus
    return modulus, mu - (1 << 64) if mu >= 1 << 63 else mu
