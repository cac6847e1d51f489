"""The problems of no graph: satisfiability (CNF clauses over numbered variables, the most
weight of satisfied clauses) and the binary paint shop (a sequence of cars each twice, the
fewest color changes)."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._constraints import check_joined
from ._problem import Problem, made, total
from ._reading import Array, Weights, check_bounded, checked_dtype, indices_of, weights_of

__all__ = ["paint_shop", "satisfiability"]


def _read_clauses(
    clauses: object, variables: int | None
) -> tuple[tuple[tuple[int, ...], ...], int]:
    """The clauses, each a tuple of nonzero ints within ``variables`` (worked out where None)."""
    if isinstance(clauses, (str, bytes, Mapping)) or not isinstance(clauses, Iterable):
        raise TypeError(
            "clauses must be a sequence of clauses, each a sequence of literals (+k for "
            f"variable k, -k for its negation), got {type(clauses).__name__}"
        )
    read = []
    for number, clause in enumerate(clauses):
        if isinstance(clause, (str, bytes)) or not isinstance(clause, Iterable):
            raise TypeError(
                f"clause {number} is a {type(clause).__name__}, not a sequence of literals"
            )
        literals = tuple(clause)
        if not literals:
            raise ValueError(f"clause {number} is empty: a clause holds at least one literal")
        for literal in literals:
            if isinstance(literal, bool) or not isinstance(literal, int | np.integer):
                raise TypeError(
                    f"clause {number} holds {literal!r}, not an int literal (+k "
                    "for variable k, -k for its negation)"
                )
            if literal == 0:
                raise ValueError(
                    f"clause {number} holds 0: literals are nonzero, +k for "
                    "variable k, -k for its negation"
                )
        read.append(tuple(int(x) for x in literals))
    if not read:
        raise ValueError("there are no clauses: pass at least one")
    largest = max(abs(x) for clause in read for x in clause)
    if variables is None:
        return tuple(read), largest
    if not isinstance(variables, int) or isinstance(variables, bool):
        raise TypeError(f"variables must be an int (how many), got {type(variables).__name__}")
    if variables < 1:
        raise ValueError(f"variables must be at least 1, got {variables}")
    for number, clause in enumerate(read):
        out = next((x for x in clause if abs(x) > variables), None)
        if out is not None:
            raise ValueError(
                f"literal {out} of clause {number} is out of range: there are "
                f"{variables} variables, numbered 1 to {variables}"
            )
    return tuple(read), variables


def _satisfied(clause: Sequence[int], truth: Mapping[int, int]) -> bool:
    return any(truth[abs(x)] == (x > 0) for x in clause)


@dataclass(frozen=True, slots=True)
class _Clauses:
    clauses: tuple[tuple[int, ...], ...]
    weights: tuple[float, ...]
    noun: str = "variable"
    ints: bool = False  # (an integer dtype: sums as ints)

    def value(self, configuration: Mapping[Any, int]) -> float:
        pairs = zip(self.clauses, self.weights, strict=True)
        return total(
            [w for clause, w in pairs if _satisfied(clause, configuration)], ints=self.ints
        )

    def answer(self, configuration: Mapping[Any, int]) -> Any:
        return {k: bool(x) for k, x in configuration.items()}


def satisfiability(
    clauses: Iterable[Iterable[int]],
    weights: Weights = None,
    *,
    variables: int | None = None,
    dtype: Any = "float32",
) -> Problem:
    """Weighted satisfiability of CNF clauses (maximum satisfiability), as a max-plus network:
    the largest total weight of the clauses an assignment of the variables satisfies, which is
    the sum of every weight where the formula is satisfiable.

    Clauses are DIMACS's: a clause is a sequence of literals, ``k`` for variable k true and
    ``-k`` for it false, the variables numbered from 1. Each clause carries a tensor over its
    variables (in the order they first appear in it): its weight where it is satisfied, 0
    elsewhere; a variable in no clause (below ``variables``) carries ``[0, 0]``, after them.

    Args:
        clauses: The clauses, as sequences of nonzero ints.
        weights: Each clause's weight: None (1 each), a sequence in the clauses' order, or a
            mapping from a clause's place to its weight.
        variables: How many variables there are (numbered 1 to ``variables``); by default the
            largest one a literal names.
        dtype: As ``independent_set``.

    Returns:
        The problem; its ``variables`` are the numbers 1 to n, and ``answer`` gives each
        variable's truth.

    Raises:
        TypeError: ``clauses`` is not a sequence of sequences (a str, a dict), a literal is not
            an int.
        ValueError: No clauses, an empty clause, a literal 0 or out of range of
            ``variables``; a clause of more than ``MAX_DEGREE + 1`` variables; ``weights`` or
            ``dtype`` as ``independent_set`` refuses them.
    """
    read, count = _read_clauses(clauses, variables)
    dtype = checked_dtype(dtype)
    w = weights_of(
        None, tuple(range(len(read))), weights, dtype, "weights", edges=False, noun="clause"
    )
    check_bounded(dtype, "weights", w)
    names = tuple(range(1, count + 1))
    index = indices_of(names)
    terms: list[str] = []
    operands: list[Array] = []
    for number, (clause, weight) in enumerate(zip(read, w, strict=True)):
        order = tuple(dict.fromkeys(abs(x) for x in clause))
        check_joined(f"clause {number}", len(order), "variables")
        truth = np.indices((2,) * len(order)).reshape(len(order), -1).T
        held = np.array([_satisfied(clause, dict(zip(order, row, strict=True))) for row in truth])
        terms.append("".join(index[v] for v in order))
        operands.append(np.where(held, weight, 0).astype(dtype).reshape((2,) * len(order)))
    used = {abs(x) for clause in read for x in clause}
    for v in names:
        if v not in used:
            terms.append(index[v])
            operands.append(np.zeros(2, dtype))
    return made(
        "satisfiability",
        terms,
        operands,
        "maxplus",
        indices=index,
        meaning=_Clauses(read, w, ints=dtype.kind == "i"),
        variables=names,
    )


@dataclass(frozen=True, slots=True)
class _PaintShop:
    sequence: tuple[Hashable, ...]
    noun: str = "car"
    ints: bool = False  # (an integer dtype: sums as ints)

    def colors(self, configuration: Mapping[Any, int]) -> list[int]:
        seen: set[Hashable] = set()
        painted = []
        for car in self.sequence:
            painted.append(configuration[car] if car not in seen else 1 - configuration[car])
            seen.add(car)
        return painted

    def value(self, configuration: Mapping[Any, int]) -> float:
        painted = self.colors(configuration)
        changes = [1 for a, b in itertools.pairwise(painted) if a != b]
        return total(changes, ints=self.ints)

    def answer(self, configuration: Mapping[Any, int]) -> Any:
        return self.colors(configuration)


def paint_shop(sequence: Iterable[Hashable], *, dtype: Any = "float32") -> Problem:
    """The binary paint shop, as a min-plus network: a sequence of cars, each in it twice, is
    painted one car at a time, each car once in each of two colors; the objective is the number
    of color changes along the sequence.

    A car's index is the color of its first time (0 or 1; the second is the other). Each two
    neighbours in the sequence carry a 2 x 2 tensor over their cars' indices: 1 where their
    colors differ, else 0 (a car next to itself: ``[1, 1]``, its colors always differ).

    Args:
        sequence: The cars, in order: any hashable values (a str is a sequence of its
            characters), each exactly twice.
        dtype: As ``independent_set``.

    Returns:
        The problem; its ``variables`` are the cars in the order they first appear, and
        ``answer`` gives each position's color.

    Raises:
        TypeError: ``sequence`` is not iterable, or a car is not hashable.
        ValueError: A car appears once or more than twice; the sequence is empty.
    """
    if not isinstance(sequence, Iterable):
        raise TypeError(f"sequence must be an iterable of cars, got {type(sequence).__name__}")
    cars = tuple(sequence)
    try:
        times = Counter(cars)
    except TypeError:
        raise TypeError("a car of the sequence is not hashable") from None
    if not cars:
        raise ValueError("the sequence is empty: pass each car twice")
    odd = next((car for car, n in times.items() if n != 2), None)
    if odd is not None:
        raise ValueError(
            f"car {odd!r} appears {times[odd]} time{'s' * (times[odd] != 1)}: "
            "each car appears twice in the sequence"
        )
    dtype = checked_dtype(dtype)
    names = tuple(times)  # (in the order they first appear)
    index = indices_of(names)
    first = []
    seen: set[Hashable] = set()
    for car in cars:
        first.append(car not in seen)
        seen.add(car)
    terms: list[str] = []
    operands: list[Array] = []
    for i in range(len(cars) - 1):
        a, b = cars[i], cars[i + 1]
        if a == b:
            terms.append(index[a])
            operands.append(np.ones(2, dtype))
            continue
        x = np.arange(2)[:, None] if first[i] else 1 - np.arange(2)[:, None]
        y = np.arange(2)[None, :] if first[i + 1] else 1 - np.arange(2)[None, :]
        terms.append(index[a] + index[b])
        operands.append((x != y).astype(dtype))
    return made(
        "paint shop",
        terms,
        operands,
        "minplus",
        indices=index,
        meaning=_PaintShop(cars, ints=dtype.kind == "i"),
        variables=names,
    )
