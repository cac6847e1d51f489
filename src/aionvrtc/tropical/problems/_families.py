"""The problems of a family of sets: set packing (at most one chosen set holds each element)
and set covering (at least one does). Each set has an index (the problem's ``variables`` are
the sets' places in the family) and each element a tensor over the sets that hold it."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..products import SEMIRINGS
from ._constraints import at_least_one, at_most_one, check_joined
from ._problem import Problem, made, total
from ._reading import Array, Weights, check_bounded, checked_dtype, indices_of, weights_of

__all__ = ["set_covering", "set_packing"]


def _read_family(sets: object) -> tuple[tuple[Hashable, ...], ...]:
    """The family, each set checked: an iterable of hashable elements, not empty."""
    if isinstance(sets, (str, bytes, Mapping)) or not isinstance(sets, Iterable):
        raise TypeError(
            "sets must be a sequence of sets (each an iterable of hashable elements), got "
            f"{type(sets).__name__}"
        )
    family = []
    for place, members in enumerate(sets):
        if isinstance(members, (str, bytes)) or not isinstance(members, Iterable):
            raise TypeError(
                f"set {place} is a {type(members).__name__}, not an iterable of elements (a str "
                "is taken for no set: pass a list of its elements)"
            )
        try:
            made_set = tuple(dict.fromkeys(members))  # (each once, in order)
        except TypeError:
            raise TypeError(f"set {place} holds an element that is not hashable") from None
        if not made_set:
            raise ValueError(f"set {place} is empty: each set holds at least one element")
        family.append(made_set)
    if not family:
        raise ValueError("the family has no sets: pass at least one")
    return tuple(family)


def _holders(
    family: Sequence[tuple[Hashable, ...]], universe: Iterable[Hashable]
) -> dict[Hashable, list[int]]:
    """Each element of ``universe``, in order, and the places of the sets that hold it."""
    held: dict[Hashable, list[int]] = {e: [] for e in universe}
    for place, members in enumerate(family):
        for element in members:
            held[element].append(place)
    return held


def _network(
    family: Sequence[tuple[Hashable, ...]],
    held: Mapping[Hashable, list[int]],
    w: Sequence[float],
    *,
    constraint: Any,
    zero: Any,
    dtype: np.dtype[Any],
) -> tuple[dict[Hashable, str], list[str], list[Array]]:
    """Each set's ``[0, w]``, then each element's ``constraint`` over its sets (where it
    constrains: one set's ``at_most_one`` holds always, and is left out)."""
    places = tuple(range(len(family)))
    index = indices_of(places)
    terms = [index[s] for s in places]
    operands = [np.array([0, x], dtype) for x in w]
    for element, holders in held.items():
        if constraint is at_most_one and len(holders) < 2:
            continue
        check_joined(f"element {element!r}", len(holders), "sets")
        terms.append("".join(index[s] for s in holders))
        operands.append(constraint(len(holders), zero, dtype))
    return index, terms, operands


@dataclass(frozen=True, slots=True)
class _Packing:
    family: tuple[tuple[Hashable, ...], ...]
    weights: tuple[float, ...]
    noun: str = "set"
    ints: bool = False  # (an integer dtype: sums as ints)

    def value(self, configuration: Mapping[Any, int]) -> float:
        seen: dict[Hashable, int] = {}
        for place, members in enumerate(self.family):
            if configuration[place]:
                for element in members:
                    if element in seen:
                        raise ValueError(
                            f"sets {seen[element]} and {place} share element {element!r}: "
                            "packed sets are disjoint"
                        )
                    seen[element] = place
        return total([w for s, w in enumerate(self.weights) if configuration[s]], ints=self.ints)

    def answer(self, configuration: Mapping[Any, int]) -> Any:
        return [s for s, x in configuration.items() if x]


def set_packing(
    sets: Iterable[Iterable[Hashable]], weights: Weights = None, *, dtype: Any = "float32"
) -> Problem:
    """The maximum (weighted) set packing, as a max-plus network: sets of the family, no two
    of which share an element.

    Args:
        sets: The family: a sequence of sets, each an iterable of hashable elements (a set, a
            list, a tuple), none empty.
        weights: Each set's weight: None (1 each), a sequence in the family's order, or a
            mapping from a set's place in the family to its weight.
        dtype: As ``independent_set``.

    Returns:
        The problem; ``answer`` gives the places of the chosen sets in the family.

    Raises:
        TypeError: ``sets`` is not a sequence of iterables (a str, a dict), a set is a str or
            not iterable, an element is not hashable.
        ValueError: The family is empty, a set is empty, an element is in more than
            ``MAX_DEGREE + 1`` sets; ``weights`` or ``dtype`` as ``independent_set`` refuses
            them.
    """
    family = _read_family(sets)
    dtype = checked_dtype(dtype)
    places = tuple(range(len(family)))
    w = weights_of(None, places, weights, dtype, "weights", edges=False, noun="set")
    check_bounded(dtype, "weights", w)
    zero = SEMIRINGS["maxplus"].zero(dtype)
    held = _holders(family, dict.fromkeys(e for s in family for e in s))
    index, terms, operands = _network(
        family, held, w, constraint=at_most_one, zero=zero, dtype=dtype
    )
    return made(
        "set packing",
        terms,
        operands,
        "maxplus",
        indices=index,
        meaning=_Packing(family, w, ints=dtype.kind == "i"),
        variables=places,
    )


@dataclass(frozen=True, slots=True)
class _Covering:
    family: tuple[tuple[Hashable, ...], ...]
    universe: tuple[Hashable, ...]
    weights: tuple[float, ...]
    noun: str = "set"
    ints: bool = False  # (an integer dtype: sums as ints)

    def value(self, configuration: Mapping[Any, int]) -> float:
        chosen = [members for place, members in enumerate(self.family) if configuration[place]]
        covered = frozenset().union(*chosen)
        missing = next((e for e in self.universe if e not in covered), None)
        if missing is not None:
            raise ValueError(f"element {missing!r} is in no chosen set: the sets do not cover")
        return total([w for s, w in enumerate(self.weights) if configuration[s]], ints=self.ints)

    def answer(self, configuration: Mapping[Any, int]) -> Any:
        return [s for s, x in configuration.items() if x]


def set_covering(
    sets: Iterable[Iterable[Hashable]],
    weights: Weights = None,
    *,
    universe: Iterable[Hashable] | None = None,
    dtype: Any = "float32",
) -> Problem:
    """The minimum (weighted) set cover, as a min-plus network: sets of the family whose union
    is the universe.

    Args:
        sets: As ``set_packing``.
        weights: As ``set_packing``.
        universe: The elements to cover (each in some set); by default every element of the
            sets, in the order they first appear.
        dtype: As ``independent_set``.

    Returns:
        The problem; ``answer`` gives the places of the chosen sets in the family.

    Raises:
        TypeError: As ``set_packing``.
        ValueError: As ``set_packing``; an element of ``universe`` is in no set (nothing
            covers it), or a set holds an element not in ``universe``.
    """
    family = _read_family(sets)
    dtype = checked_dtype(dtype)
    places = tuple(range(len(family)))
    w = weights_of(None, places, weights, dtype, "weights", edges=False, noun="set")
    check_bounded(dtype, "weights", w)
    every = tuple(dict.fromkeys(e for s in family for e in s))
    wanted = every if universe is None else tuple(dict.fromkeys(universe))
    stray = next(((p, e) for p, s in enumerate(family) for e in s if e not in set(wanted)), None)
    if stray is not None:
        raise ValueError(
            f"set {stray[0]} holds {stray[1]!r}, which is not in the universe: leave it out, or "
            "add it to the universe"
        )
    bare = next((e for e in wanted if e not in set(every)), None)
    if bare is not None:
        raise ValueError(f"element {bare!r} of the universe is in no set: no cover exists")
    zero = SEMIRINGS["minplus"].zero(dtype)
    held = _holders(family, wanted)
    index, terms, operands = _network(
        family, held, w, constraint=at_least_one, zero=zero, dtype=dtype
    )
    return made(
        "set covering",
        terms,
        operands,
        "minplus",
        indices=index,
        meaning=_Covering(family, wanted, w, ints=dtype.kind == "i"),
        variables=places,
    )
