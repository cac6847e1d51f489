"""The pieces a plan is made of: an operand as the plan sees it (``Term``), how a step reads
one (``View``), and a step (``Step``: one batched tropical product), with the strides arithmetic
they share. Pure Python, below everything else that plans."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Step", "Strides", "Term", "View", "contiguous", "group_index", "input_terms"]

Strides = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Term:
    """An operand as the plan sees it: one distinct index per axis (a repeated index of an input
    is its diagonal, whose stride is the sum of its axes'), and their element strides."""

    indices: tuple[str, ...]
    strides: Strides


@dataclass(frozen=True, slots=True)
class View:
    """How a step reads one operand: copied first to C order over ``copy`` (else read in
    place), then viewed as 3-D with ``shape`` and element ``strides``."""

    copy: tuple[str, ...] | None
    shape: tuple[int, int, int]
    strides: tuple[int, int, int]

    @property
    def copied(self) -> int:
        """Elements its copy writes (0: read in place)."""
        return math.prod(self.shape) if self.copy is not None else 0


@dataclass(frozen=True, slots=True)
class Step:
    """One contraction. Operands are numbered: the inputs 0 to n-1, then each step's result
    ``number`` in turn; ``operands`` names the two it contracts, or one for a reduction of the
    operand's own indices (a product with a vector of the semiring's ones). The product runs
    over ``first`` (batch, m, k) and ``second`` (batch, k, n): the operands in path order, or
    swapped when that reads better. The result is contiguous over ``result``: the batch
    indices, then m's, then n's."""

    operands: tuple[int, ...]
    number: int
    subscripts: str  # the contraction in the caller's indices, e.g. "ij,jk->ik"
    swapped: bool
    batch: tuple[str, ...]
    m: tuple[str, ...]
    k: tuple[str, ...]
    n: tuple[str, ...]
    first: View
    second: View | None  # None: the vector of ones (a reduction)
    result: tuple[str, ...]
    split: str | None = None  # the batch index of K's parts (see _split), if K was cut

    @property
    def size(self) -> int:
        """Elements of the result."""
        return (
            self.first.shape[0] * self.first.shape[1] * (self.second.shape[2] if self.second else 1)
        )


def contiguous(shape: Sequence[int]) -> Strides:
    """C-order element strides."""
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= max(n, 1)
    return tuple(reversed(out))


def group_index(
    group: Sequence[str], assignment: Mapping[str, int], sizes: Mapping[str, int]
) -> int:
    """The position of ``assignment`` in a group merged in C order."""
    at = 0
    for i in group:
        at = at * sizes[i] + assignment[i]
    return at


def input_terms(inputs: Sequence[str], strides: Sequence[Strides]) -> list[Term]:
    """The inputs with their repeated indices taken as diagonals: a diagonal steps along all
    its axes at once, so its stride is their strides' sum (in elements or bytes alike)."""
    terms = []
    for letters, each in zip(inputs, strides, strict=True):
        distinct = tuple(dict.fromkeys(letters))
        summed = tuple(
            sum(s for s, c in zip(each, letters, strict=True) if c == d) for d in distinct
        )
        terms.append(Term(distinct, summed))
    return terms
