"""Operand checks shared by the GPU API and the NumPy reference (same rules, same messages), and
the bound on a result's bytes that products and contractions are refused past."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._semirings import Semiring

__all__ = ["Shapes", "check_operands", "check_size"]


@dataclass(frozen=True, slots=True)
class Shapes:
    batch: int  # of the result; an operand's batch is this or 1 (broadcast)
    m: int
    k: int
    n: int
    batched: bool  # the result has a batch dimension (some operand is 3-D)


def check_operands(ring: Semiring, a: Any, b: Any) -> Shapes:
    """Validate NumPy or CuPy operands of C = A (x) B and return the product's dimensions."""
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must have one dtype, got {a.dtype} and {b.dtype}")
    ring.check_dtype(a.dtype, "a")
    if a.ndim not in (2, 3) or b.ndim not in (2, 3):
        raise ValueError(f"a and b must be 2-D or 3-D, got shapes {a.shape} and {b.shape}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"a's columns must match b's rows, got shapes {a.shape} and {b.shape}")
    batch_a = a.shape[0] if a.ndim == 3 else 1
    batch_b = b.shape[0] if b.ndim == 3 else 1
    if batch_a != batch_b and 1 not in (batch_a, batch_b):
        raise ValueError(f"batch sizes must match or be 1, got shapes {a.shape} and {b.shape}")
    return Shapes(
        batch=batch_b if batch_a == 1 else batch_a,
        m=a.shape[-2],
        k=a.shape[-1],
        n=b.shape[-1],
        batched=a.ndim == 3 or b.ndim == 3,
    )


def check_size(
    what: str, elements: int, *, itemsize: int, limit: int, bound: str, fix: str
) -> None:
    """Refuse a result of more than ``limit`` bytes, before anything is allocated: ``what``
    names it (einsum's output or a step's intermediate, matmul's output), ``bound`` says what
    ``limit`` is and ``fix`` what to do. ``elements`` is an exact Python int (math.prod of the
    sizes: NumPy's int64 would wrap past 2**63 and let a huge result through as a small or
    negative one)."""
    if elements * itemsize > limit:
        raise ValueError(
            f"{what} would hold {elements:,} elements ({elements * itemsize:,} bytes at "
            f"{itemsize} each), more than {bound}; {fix}"
        )
