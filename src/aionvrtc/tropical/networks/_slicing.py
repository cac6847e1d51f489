"""Slicing a contraction to a memory budget: some contracted indices fixed to each of their
values in turn, the network contracted once per slice, the slices' results summed in the
semiring. A slice's operands are views of the caller's (an index fixed is an offset, the other
strides unchanged), so every slice has one plan, and one compiled program replays for all.

The indices are chosen greedily along the contraction's path, as cotengra's SliceFinder and
GenericTensorNetworks' slicer do: each round slices the index that shrinks the largest
intermediate most (ties: the one that adds least work), until it fits. Only indices the output
does not keep are sliced, so slices' results have the output's shape and are combined with
(+): max, min or or. Pure Python: no GPU needed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "Slicing",
    "TooSmall",
    "added",
    "best_slice",
    "complexity",
    "slicing_for",
    "sum_into",
    "view_at",
]


@dataclass(frozen=True, slots=True)
class Slicing:
    """The indices a contraction is sliced over, and the contraction of one slice."""

    indices: tuple[str, ...]
    sizes: tuple[int, ...]
    subscripts: str  # one slice's: the sliced indices left out of every operand

    @property
    def count(self) -> int:
        """How many slices: the product of the sliced indices' sizes."""
        return math.prod(self.sizes)

    def position(self, number: int) -> Any:
        """The sliced indices' values in slice ``number``, as a vector in ``indices``' order
        (the last index varies fastest)."""
        return np.array(np.unravel_index(number, self.sizes), np.int64)

    def values(self, number: int) -> dict[str, int]:
        """The sliced indices' values in slice ``number``, by index."""
        return dict(zip(self.indices, self.position(number).tolist(), strict=True))

    def views(self, inputs: Sequence[str], operands: Sequence[Any], number: int) -> list[Any]:
        """The operands of slice ``number``: each one indexed at its sliced axes (a view, for
        NumPy and CuPy alike)."""
        values = self.values(number)
        return [view_at(x, letters, values) for letters, x in zip(inputs, operands, strict=True)]

    def offsets(self, inputs: Sequence[str], strides: Sequence[Sequence[int]]) -> Any:
        """How far each operand's view moves (in the units of ``strides``, each operand's) per
        unit of each sliced index: a matrix (sliced index x operand), so that slice n's views
        start ``position(n) @ offsets`` from the operands' starts. O(indices x operands): no
        table of every slice."""
        steps = np.zeros((len(self.indices), len(inputs)), np.int64)
        for column, (letters, each) in enumerate(zip(inputs, strides, strict=True)):
            for letter, stride in zip(letters, each, strict=True):
                if letter in self.indices:
                    steps[self.indices.index(letter), column] += stride
        return steps

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.count))


def view_at(x: Any, letters: str, values: Mapping[str, int]) -> Any:
    """``x``, whose axes are ``letters``, at ``values`` of some of them (every axis of a
    repeated letter: its diagonal); ``x`` itself where it holds none."""
    if not any(letter in values for letter in letters):
        return x
    return x[tuple(values.get(letter, slice(None)) for letter in letters)]


def added(add: str, xp: Any) -> Any:
    """The semiring's (+), its ``add`` ("max", "min", "or"), as ``xp``'s (NumPy's or CuPy's)
    ufunc."""
    # fmax and fmin take the number over a NaN, as the reference does (the kernels make none).
    return {"max": xp.fmax, "min": xp.fmin, "or": xp.logical_or}[add]


def sum_into(add: str, xp: Any, total: Any, part: Any) -> None:
    """``total = total (+) part`` in place, (+) the semiring's ``add`` ("max", "min", "or"),
    with ``xp`` NumPy or CuPy."""
    added(add, xp)(total, part, out=total)


def best_slice(add: str, values: Any) -> int:
    """The first slice whose value is the sum of ``values`` (the slices' scalar results, on
    the host): the one whose assignment attains the whole contraction's value."""
    found = np.asarray(values)
    return int(np.argmin(found) if add == "min" else np.argmax(found))


def _sets(
    inputs: Sequence[str], output: str, path: Sequence[Sequence[int]]
) -> list[tuple[frozenset[str], frozenset[str]]]:
    """Each step's (joint indices, result indices) along ``path`` (opt_einsum's format): the
    result keeps those the output or a later operand holds. Slicing an index removes it from
    both, so one walk serves every slicing. Linear in the operands' indices: how many live
    operands hold each index is counted, not looked up."""
    live = [frozenset(term) for term in inputs]
    holders: dict[str, int] = {}
    for term in live:
        for i in term:
            holders[i] = holders.get(i, 0) + 1
    kept = frozenset(output)
    found = []
    for positions in path:
        chosen = [live[i] for i in positions]
        live = [term for i, term in enumerate(live) if i not in positions]
        joint = frozenset().union(*chosen)
        for term in chosen:
            for i in term:
                holders[i] -= 1
        result = frozenset(i for i in joint if i in kept or holders[i])
        for i in result:
            holders[i] += 1
        live.append(result)
        found.append((joint, result))
    return found


def complexity(
    inputs: Sequence[str],
    output: str,
    sizes: Mapping[str, int],
    path: Sequence[Sequence[int]],
    sliced: Sequence[str] = (),
) -> tuple[int, int]:
    """(the elements of the largest intermediate, the products of all steps) along ``path``,
    for one slice when indices are ``sliced``."""
    fixed = frozenset(sliced)
    largest = products = 0
    for joint, result in _sets(inputs, output, path):
        largest = max(largest, math.prod(sizes[i] for i in result - fixed))
        products += math.prod(sizes[i] for i in joint - fixed)
    return largest, products


def slicing_for(
    inputs: Sequence[str],
    output: str,
    sizes: Mapping[str, int],
    path: Sequence[Sequence[int]],
    *,
    elements: int,
    given: Sequence[str] = (),
) -> tuple[str, ...]:
    """The indices to slice so that no intermediate along ``path`` holds more than
    ``elements``, ``given`` first (a planner's choice); () if it fits as it is. Raises
    ``TooSmall`` with the fewest elements any slicing reaches if none does.

    Candidates are scored in log2 over a matrix of the steps' indices (a product per
    candidate: milliseconds for networks of hundreds of tensors); the sizes compared with
    ``elements`` are exact."""
    sliced = list(dict.fromkeys(given))
    steps = _sets(inputs, output, path)
    names = sorted(sizes)
    column = {name: n for n, name in enumerate(names)}
    joints = np.zeros((len(steps), len(names)))
    results = np.zeros((len(steps), len(names)))
    for row, (joint, result) in enumerate(steps):
        joints[row, [column[i] for i in joint]] = 1
        results[row, [column[i] for i in result]] = 1
    logs = np.log2([sizes[name] for name in names])
    contracted = {i for term in inputs for i in term} - set(output)

    def exact() -> tuple[int, list[frozenset[str]]]:
        fixed = frozenset(sliced)
        each = [math.prod(sizes[i] for i in result - fixed) for _, result in steps]
        largest = max(each, default=0)
        return largest, [steps[n][1] - fixed for n, size in enumerate(each) if size == largest]

    largest, widest = exact()
    while largest > elements:
        # Only an index of every largest intermediate can shrink the largest.
        candidates = sorted(frozenset.intersection(*widest) & contracted - set(sliced))
        if not candidates:  # slice every index that some largest intermediate holds
            candidates = sorted(frozenset().union(*widest) & contracted - set(sliced))
        if not candidates:
            raise TooSmall(largest)
        base = logs.copy()
        base[[column[i] for i in sliced]] = 0
        best = None
        for index in candidates:
            trial = base.copy()
            trial[column[index]] = 0
            # The largest (log2), then all slices' work: one slice's times the slices.
            score = (
                float((results @ trial).max()),
                float(np.exp2(joints @ trial).sum()) * sizes[index],
            )
            if best is None or score < best[0]:
                best = (score, index)
        assert best is not None
        sliced.append(best[1])
        largest, widest = exact()
    return tuple(sliced)


class TooSmall(ValueError):
    """No slicing fits: ``floor`` elements is the least the largest intermediate comes to."""

    def __init__(self, floor: int) -> None:
        super().__init__(floor)
        self.floor = floor
