"""What ``Problem.solve`` answers: one small frozen class per property, after
GenericTensorNetworks.jl's (``SizeMax(k)``, ``CountingAll()``, ``ConfigsMax()``, ...), each
naming what it returns; and the results that are not plain numbers (``Counted``, ``Solution``).

"Size" is the problem's objective (a set's weight, a cut's weight, a spin glass's energy), "Max"
and "Min" its largest and smallest: an independent set's optimum is ``SizeMax``, a spin glass's
ground state ``SizeMin``, whichever semiring the problem's own network is in.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Literal, TypeVar

from ..networks import MAX_TOP, check_limit

__all__ = [
    "MAX_K",
    "ConfigsAll",
    "ConfigsMax",
    "ConfigsMin",
    "Counted",
    "CountingAll",
    "CountingMax",
    "CountingMin",
    "GraphPolynomial",
    "PartitionFunction",
    "Property",
    "SampleAll",
    "SampleMax",
    "SampleMin",
    "SingleConfigMax",
    "SingleConfigMin",
    "SingleConfigsMax",
    "SingleConfigsMin",
    "SizeMax",
    "SizeMin",
    "Solution",
]

T = TypeVar("T")
Sense = Literal["max", "min", "all", "every"]
# The most best values a property keeps (the NumPy reference's top=, a list of k per element).
MAX_K = MAX_TOP


@dataclass(frozen=True, slots=True)
class Counted:
    """A value of the objective and how many configurations attain it.

    Attributes:
        value: The value.
        count: How many configurations attain it: a Python int, exact at any size.
    """

    value: float
    count: int


@dataclass(frozen=True, slots=True)
class Solution:
    """A configuration and what it means.

    Attributes:
        value: The objective at ``configuration``, worked out again from the problem's input
            (``Problem.value``), in float64.
        configuration: Each variable's value, in the order of ``Problem.variables``.
        answer: The configuration in the problem's own terms (``Problem.answer``): the vertices
            of the set (independent sets, dominating sets), the vertices on one side (max
            cut), each vertex's spin, -1 or +1 (spin glass) or color (coloring), the edges
            matched, the sets' places, each variable's truth, each position's color.
    """

    value: float
    configuration: dict[Hashable, int]
    answer: Any


class Property(Generic[T]):
    """A question ``Problem.solve`` answers, ``T`` the type of its answer.

    Attributes:
        sense: ``"max"`` or ``"min"``: the end of the objective asked about; ``"all"`` for a
            property of every valid configuration alike (a count, a list); ``"every"`` for a
            sum over them of their sizes (a polynomial, a partition function).
    """

    __slots__ = ()
    sense: ClassVar[Sense]


def _k(k: object) -> None:
    if not isinstance(k, int) or isinstance(k, bool):
        raise TypeError(f"k must be an int (how many best values), got {type(k).__name__}")
    if not 1 <= k <= MAX_K:
        raise ValueError(f"k must be from 1 to {MAX_K}, got {k}")


@dataclass(frozen=True, slots=True)
class _Ranked(Property[T]):
    """A property of the ``k`` best values (``k`` checked)."""

    k: int = 1

    def __post_init__(self) -> None:
        _k(self.k)


@dataclass(frozen=True, slots=True)
class SizeMax(_Ranked[list[float]]):
    """The ``k`` largest distinct values of the objective, largest first (fewer where fewer
    exist): for ``k=1``, the maximum.

    Attributes:
        k: How many, from 1 to ``MAX_K`` (64).
    """

    sense: ClassVar[Sense] = "max"


@dataclass(frozen=True, slots=True)
class SizeMin(_Ranked[list[float]]):
    """The ``k`` smallest distinct values of the objective, smallest first (fewer where fewer
    exist): for ``k=1``, the minimum.

    Attributes:
        k: How many, from 1 to ``MAX_K`` (64).
    """

    sense: ClassVar[Sense] = "min"


@dataclass(frozen=True, slots=True)
class CountingMax(_Ranked[list[Counted]]):
    """The ``k`` largest distinct values of the objective, largest first, each with how many
    configurations attain it. For ``k=1`` the count is exact at any size (past 2^63 - 1 by
    residues modulo primes, joined by the Chinese remainder theorem); for more, within int64.

    Attributes:
        k: How many, from 1 to ``MAX_K`` (64).
    """

    sense: ClassVar[Sense] = "max"


@dataclass(frozen=True, slots=True)
class CountingMin(_Ranked[list[Counted]]):
    """``CountingMax`` at the other end: the ``k`` smallest values, smallest first, with their
    counts.

    Attributes:
        k: How many, from 1 to ``MAX_K`` (64).
    """

    sense: ClassVar[Sense] = "min"


@dataclass(frozen=True, slots=True)
class CountingAll(Property[int]):
    """How many valid configurations there are (independent sets, maximal independent sets,
    cuts, spin configurations), exact at any size."""

    sense: ClassVar[Sense] = "all"


@dataclass(frozen=True, slots=True)
class SingleConfigMax(Property[Solution]):
    """One configuration of the largest objective."""

    sense: ClassVar[Sense] = "max"


@dataclass(frozen=True, slots=True)
class SingleConfigMin(Property[Solution]):
    """One configuration of the smallest objective."""

    sense: ClassVar[Sense] = "min"


@dataclass(frozen=True, slots=True)
class SingleConfigsMax(_Ranked[list[Solution]]):
    """One configuration of each of the ``k`` largest values, largest first: the first that the
    walk back through the k best lists finds (GenericTensorNetworks.jl's ``SingleConfigMax(k)``).

    Attributes:
        k: How many of the largest values, from 1 to ``MAX_K`` (64).
    """

    sense: ClassVar[Sense] = "max"


@dataclass(frozen=True, slots=True)
class SingleConfigsMin(_Ranked[list[Solution]]):
    """``SingleConfigsMax`` at the other end: one configuration of each of the ``k`` smallest
    values, smallest first.

    Attributes:
        k: How many of the smallest values, from 1 to ``MAX_K`` (64).
    """

    sense: ClassVar[Sense] = "min"


@dataclass(frozen=True, slots=True)
class ConfigsMax(Property[list[Solution]]):
    """Every configuration of the largest objective (of the ``k`` largest values, largest
    first), each value's in increasing order of their values read as a row (variable by
    variable); refused past ``limit``, saying how many there are, before any is listed.

    Attributes:
        limit: The most configurations returned, over all the values (default 10,000).
        k: How many of the largest values, from 1 to ``MAX_K`` (64); past 1, the counts are
            within int64 (as ``CountingMax(k)``'s).
    """

    limit: int = 10_000
    k: int = 1
    sense: ClassVar[Sense] = "max"

    def __post_init__(self) -> None:
        check_limit(self.limit)
        _k(self.k)


@dataclass(frozen=True, slots=True)
class ConfigsMin(Property[list[Solution]]):
    """``ConfigsMax`` at the other end: every configuration of the smallest objective (of the
    ``k`` smallest values, smallest first).

    Attributes:
        limit: The most configurations returned, over all the values (default 10,000).
        k: How many of the smallest values, from 1 to ``MAX_K`` (64).
    """

    limit: int = 10_000
    k: int = 1
    sense: ClassVar[Sense] = "min"

    def __post_init__(self) -> None:
        check_limit(self.limit)
        _k(self.k)


@dataclass(frozen=True, slots=True)
class ConfigsAll(Property[list[Solution]]):
    """Every valid configuration, whatever its objective; refused past ``limit`` as
    ``ConfigsMax`` is.

    Attributes:
        limit: The most configurations returned (default 10,000).
    """

    limit: int = 10_000
    sense: ClassVar[Sense] = "all"

    def __post_init__(self) -> None:
        check_limit(self.limit)


@dataclass(frozen=True, slots=True)
class GraphPolynomial(Property[dict[int, int]]):
    """The polynomial of sizes, exactly: each size a valid configuration has, mapped to how many
    have it (for unit weights: the independence polynomial of an independent set, the cut
    polynomial of a max cut; a spin glass's energies). Sizes must be integers (integer
    weights). Evaluated modulo primes at one point per size and interpolated, the primes'
    coefficients joined by the Chinese remainder theorem, so any count is exact."""

    sense: ClassVar[Sense] = "every"


@dataclass(frozen=True, slots=True)
class PartitionFunction(Property[float]):
    """Z, the sum over the valid configurations of exp(-beta * energy), in float64: the energy
    is the size for a problem whose optimum is the smallest (spin glass, the smallest maximal
    independent set), its negative for one whose optimum is the largest (independent set, max
    cut), so that a large beta favours the optimum in both.

    Attributes:
        beta: The inverse temperature, a finite real number.
        log: Return ln Z instead, which never overflows (Z passes float64's range past about
            e^709: asked for then, Z raises an OverflowError).

    Raises:
        TypeError: ``beta`` is not a real number.
        ValueError: ``beta`` is not finite.
    """

    beta: float
    log: bool = False
    sense: ClassVar[Sense] = "every"

    def __post_init__(self) -> None:
        if isinstance(self.beta, bool) or not isinstance(self.beta, numbers.Real):
            raise TypeError(f"beta must be a real number, got {type(self.beta).__name__}")
        if not math.isfinite(self.beta):
            raise ValueError(f"beta must be finite, got {self.beta}")


@dataclass(frozen=True, slots=True)
class _Drawn(Property[list[Solution]]):
    """Configurations drawn at random (``count`` checked)."""

    count: int
    seed: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.count, int) or isinstance(self.count, bool):
            raise TypeError(
                f"count must be an int (how many samples), got {type(self.count).__name__}"
            )
        if self.count < 1:
            raise ValueError(f"count must be at least 1, got {self.count}")


@dataclass(frozen=True, slots=True)
class SampleMax(_Drawn):
    """Configurations of the largest objective drawn uniformly at random, with replacement,
    without listing them all (the count of each branch weighs it: any number of optima).

    Attributes:
        count: How many, at least 1.
        seed: What ``numpy.random.default_rng`` takes (None: fresh entropy).
    """

    sense: ClassVar[Sense] = "max"


@dataclass(frozen=True, slots=True)
class SampleMin(_Drawn):
    """``SampleMax`` at the other end: configurations of the smallest objective.

    Attributes:
        count: How many, at least 1.
        seed: What ``numpy.random.default_rng`` takes (None: fresh entropy).
    """

    sense: ClassVar[Sense] = "min"


@dataclass(frozen=True, slots=True)
class SampleAll(_Drawn):
    """Valid configurations drawn uniformly at random, whatever their objective.

    Attributes:
        count: How many, at least 1.
        seed: What ``numpy.random.default_rng`` takes (None: fresh entropy).
    """

    sense: ClassVar[Sense] = "all"
