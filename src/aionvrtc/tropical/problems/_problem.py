"""A problem's network and what it means: ``Problem`` holds the network a builder made, answers
a property in the semiring that property needs (``solve``, on the CPU or a GPU), and reads an
assignment back in the problem's own terms (vertices, edges, spins), rescored from its input."""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

import anyio.to_thread

from ..networks import NetworkSubscripts
from ..products import MAX_BYTES, MAX_TOP_GPU
from ._contracting import Network
from ._properties import (
    ConfigsAll,
    ConfigsMax,
    ConfigsMin,
    Counted,
    CountingAll,
    CountingMax,
    CountingMin,
    GraphPolynomial,
    PartitionFunction,
    Property,
    SampleAll,
    SampleMax,
    SampleMin,
    SingleConfigMax,
    SingleConfigMin,
    SingleConfigsMax,
    SingleConfigsMin,
    SizeMax,
    SizeMin,
    Solution,
)
from ._reading import Array, Edge, Vertex

__all__ = ["Meaning", "Problem", "made", "total"]

T = TypeVar("T")
# What a GPU answers today: the value, and an assignment attaining it.
_ON_GPU = (
    SizeMax, SizeMin, CountingMax, CountingMin, CountingAll, SingleConfigMax, SingleConfigMin,
    ConfigsMax, ConfigsMin, ConfigsAll,
)  # fmt: skip
_PROPERTIES = (
    *_ON_GPU,
    CountingMax,
    CountingMin,
    CountingAll,
    ConfigsMax,
    ConfigsMin,
    ConfigsAll,
    GraphPolynomial,
    PartitionFunction,
    SampleMax,
    SampleMin,
    SampleAll,
    SingleConfigsMax,
    SingleConfigsMin,
)
# ln of float64's largest value: Z = e^x for x past it is infinite.
_LARGEST_LOG = math.log(sys.float_info.max)


def made(
    kind: str,
    terms: Sequence[str],
    operands: Sequence[Array],
    semiring: str,
    *,
    indices: Mapping[Any, str],
    meaning: Meaning,
    vertices: tuple[Vertex, ...] = (),
    edges: tuple[Edge, ...] = (),
    vertex_weights: tuple[float, ...] = (),
    edge_weights: tuple[float, ...] = (),
    variables: tuple[Any, ...] | None = None,
    domain: int = 2,
) -> Problem:
    """A builder's problem: its subscripts naming its semiring, its operands read-only (a
    tensor changed in place would no longer be the problem's, nor would its order); its
    variables the vertices unless given (a problem on no graph has none)."""
    for x in operands:
        x.setflags(write=False)
    article = "an" if kind[0] in "aeiou" else "a"
    subscripts = NetworkSubscripts(",".join(terms) + "->", semiring, f"{article} {kind} problem")
    return Problem(kind, subscripts, tuple(operands), semiring, vertices, edges, indices,
                   vertex_weights, edge_weights, vertices if variables is None else variables,
                   domain, meaning)  # fmt: skip


class Meaning(Protocol):
    """What a problem's configurations mean, from its input: each builder's own."""

    @property
    def noun(self) -> str:
        """What a variable is: ``"vertex"``, ``"edge"``, ``"set"``, ``"variable"``, ``"car"``."""
        ...

    def value(self, configuration: Mapping[Any, int]) -> float:
        """The objective at ``configuration`` (each variable's value), worked out from the
        input; ValueError where the configuration is not valid, naming why."""
        ...

    def answer(self, configuration: Mapping[Any, int]) -> Any:
        """``configuration`` in the problem's own terms."""
        ...


@dataclass(frozen=True, slots=True, eq=False)
class Problem:
    """A problem as a tropical tensor network, the questions it answers (``solve``), and the
    way back from an assignment.

    ``problem.solve(property)`` answers one property (``SizeMax()``, ``CountingAll()``,
    ``ConfigsMin()``, ...) in the semiring it needs, on the CPU (the NumPy reference) or on a
    GPU (``device=``). The network is einsum's too: ``await tropical.einsum(problem.subscripts,
    *map(cupy.asarray, problem.operands), semiring=problem.semiring)`` contracts it on the GPU,
    ``tropical.reference.einsum`` with the same arguments on the CPU, the scalar being the
    problem's optimum; in another semiring the subscripts are refused (their tensors hold this
    semiring's zero where a configuration is forbidden, and would answer no question).

    Attributes:
        kind: ``"independent set"``, ``"max cut"``, ``"spin glass"``, ``"maximal independent
            set"``, ``"coloring"``, ``"dominating set"``, ``"matching"``, ``"set packing"``,
            ``"set covering"``, ``"satisfiability"`` or ``"paint shop"``.
        subscripts: The network's subscripts, one index per variable
            (``opt_einsum.get_symbol(i)`` for the i-th of ``variables``), ``"->"`` at the end:
            a scalar contraction. A str that names its semiring
            (``networks.NetworkSubscripts``).
        operands: The tensors, read-only NumPy arrays of ``dtype``, one per term of
            ``subscripts``.
        semiring: The semiring to contract in: ``"maxplus"`` or ``"minplus"``.
        vertices: The graph's vertices, in the order of their indices (empty for a problem
            of no graph: set packing, set covering, satisfiability, paint shop).
        edges: The graph's edges, as given.
        indices: Each variable's index in ``subscripts``.
        vertex_weights: The weight (or field) of each vertex, in the order of ``vertices``.
        edge_weights: The weight (or coupling) of each edge, in the order of ``edges``.
        variables: What the indices stand for, in their order: the vertices (the edges for
            matching, the sets' places in the family for set packing and covering, the
            variables' numbers for satisfiability, the cars for the paint shop).
        domain: How many values each variable takes: 2, or q for coloring.
        meaning: What a configuration means, from the input: its value (``value``, checked)
            and its answer (``answer``).
    """

    kind: str
    subscripts: str
    operands: tuple[Array, ...]
    semiring: str
    vertices: tuple[Vertex, ...]
    edges: tuple[Edge, ...]
    indices: Mapping[Any, str]
    vertex_weights: tuple[float, ...]
    edge_weights: tuple[float, ...]
    variables: tuple[Any, ...]
    domain: int
    meaning: Meaning

    def configuration(self, assignment: Mapping[str, int] | Sequence[int]) -> dict[Any, int]:
        """Each variable's value in an assignment of the network's indices: for the graph
        problems, each vertex's 0 or 1 (a color from 0 to q - 1 for coloring; each edge's for
        matching, each set's for set packing and covering, each variable's for satisfiability,
        each car's first color for the paint shop).

        Args:
            assignment: What ``tropical.einsum(..., argmax=True)`` gives: a mapping from each
                index to its value; or one value per variable, in the order of ``variables``.
                A row of ``reference.configurations`` is in the order of its indices, which is
                not always that of ``variables``: pass ``dict(zip(indices, row))``.

        Returns:
            A dict from each variable to its value.

        Raises:
            ValueError: An index of a variable is missing from ``assignment``, a sequence has
                another length than ``variables``, or a value is not one a variable takes (0 or
                1; from 0 to q - 1 for coloring).
        """
        noun, names = self.meaning.noun, self.variables
        plural = "vertices" if noun == "vertex" else f"{noun}s"
        if isinstance(assignment, Mapping):
            missing = [v for v in names if self.indices[v] not in assignment]
            if missing:
                raise ValueError(
                    f"the assignment has no value for the index of {noun} {missing[0]!r} "
                    f"({self.indices[missing[0]]!r}) and {len(missing) - 1} more: pass the "
                    "assignment of this problem's network, as einsum(..., argmax=True) gives it"
                )
            values = [assignment[self.indices[v]] for v in names]
        else:
            values = list(assignment)
            if len(values) != len(names):
                raise ValueError(
                    f"the configuration has {len(values)} values for {len(names)} {plural}: "
                    f"pass one value per {noun}, in the order of problem.variables"
                )
        taken = range(self.domain)
        bad = next((i for i, x in enumerate(values) if x not in taken), None)
        if bad is not None:
            most = "0 or 1" if self.domain == 2 else f"from 0 to {self.domain - 1}"
            raise ValueError(
                f"{noun} {names[bad]!r} has the value {values[bad]!r}: each {noun}'s is {most}"
            )
        return {v: int(x) for v, x in zip(names, values, strict=True)}

    def selected(self, assignment: Mapping[str, int] | Sequence[int]) -> list[Vertex]:
        """The vertices whose value is 1: the set (independent set, maximal independent set),
        one side of the cut (max cut), the spins up (spin glass); in the order of ``vertices``.

        Args:
            assignment: As ``configuration`` takes it.

        Returns:
            The vertices at 1.

        Raises:
            ValueError: As ``configuration``.
        """
        return [v for v, x in self.configuration(assignment).items() if x]

    def cut(self, assignment: Mapping[str, int] | Sequence[int]) -> list[Edge]:
        """The edges whose ends have different values: the cut (max cut), the unsatisfied
        ferromagnetic bonds (spin glass); in the order of ``edges``.

        Args:
            assignment: As ``configuration`` takes it.

        Returns:
            The edges cut.

        Raises:
            ValueError: As ``configuration``.
        """
        x = self.configuration(assignment)
        return [(u, v) for u, v in self.edges if x[u] != x[v]]

    def spins(self, assignment: Mapping[str, int] | Sequence[int]) -> dict[Vertex, int]:
        """Each vertex's spin, -1 (value 0) or +1 (value 1).

        Args:
            assignment: As ``configuration`` takes it.

        Returns:
            A dict from each vertex to its spin.

        Raises:
            ValueError: As ``configuration``.
        """
        return {v: 2 * x - 1 for v, x in self.configuration(assignment).items()}

    def value(self, assignment: Mapping[str, int] | Sequence[int]) -> float:
        """The problem's objective at an assignment, computed from the graph (not from the
        network): what the contraction gives where the assignment attains it.

        The weight of the set (independent set, maximal independent set), the weight of the
        cut (max cut), the energy sum of J_uv s_u s_v + h_v s_v (spin glass): an exact int for
        an integer dtype (whose weights are ints), else the correctly rounded float64 sum. For
        integer weights this is the contraction's value exactly; for weights that are not
        integers the contraction, summed in the operands' dtype in another order, can differ
        in its last bits (compare with a tolerance).

        Args:
            assignment: As ``configuration`` takes it.

        Returns:
            The objective: an int (integer dtypes), else a float.

        Raises:
            ValueError: As ``configuration``; or the set is not independent (two of its
                vertices share an edge), or for the maximal independent set not maximal (a
                vertex outside it has no neighbour in it).
        """
        return self.meaning.value(self.configuration(assignment))

    def answer(self, configuration: Mapping[Any, int]) -> Any:
        """A configuration in the problem's own terms.

        Args:
            configuration: Each variable's value, as ``configuration`` gives it.

        Returns:
            The vertices of the set (independent sets, dominating sets), the vertices on the
            side at 1 (max cut: ``cut`` names the edges), each vertex's spin (spin glass) or
            color (coloring), the edges matched (matching), the sets chosen, by their place in
            the family (set packing, set covering), each variable's truth (satisfiability),
            each position's color (paint shop).

        Raises:
            KeyError: ``configuration`` lacks a variable.
        """
        return self.meaning.answer(configuration)

    def solve(
        self,
        wanted: Property[T],
        *,
        device: int | None = None,
        optimize: Any = "auto",
        max_bytes: int = MAX_BYTES,
    ) -> T:
        """Answer one property of the problem: its best values, their counts, the count of
        every valid configuration, one or every best configuration.

        Each property's network is the problem's own in the semiring it needs (``SizeMin`` of
        an independent set is contracted in min-plus), along one order found once
        (``einsum_plan(..., optimize=optimize)``). On the CPU the NumPy reference contracts it
        (counts exact at any size); on a GPU ``tropical.einsum`` does, for the properties its
        kernels compute today: ``SizeMax(k)``, ``SizeMin(k)``, ``CountingMax(k)``,
        ``CountingMin(k)`` for k up to 16 (``einsum(..., top=k)``; with k=1 the counts come
        from ``einsum(..., count=True)``, exact at any size), ``CountingAll()``,
        ``SingleConfigMax()``, ``SingleConfigMin()``, and every best configuration:
        ``ConfigsMax(limit)``, ``ConfigsMin(limit)`` and ``ConfigsAll(limit)``
        (``tropical.configurations``: the counted contraction and the walk back on the GPU).

        Args:
            wanted: The property: ``SizeMax(k)``, ``SizeMin(k)``, ``CountingMax(k)``,
                ``CountingMin(k)``, ``CountingAll()``, ``SingleConfigMax()``,
                ``SingleConfigMin()``, ``ConfigsMax(limit)``, ``ConfigsMin(limit)``,
                ``ConfigsAll(limit)``, ``GraphPolynomial()``, ``PartitionFunction(beta)``,
                ``SampleMax(count)``, ``SampleMin(count)``, ``SampleAll(count)``.
            device: None: on the CPU. A GPU's number: there (CuPy), for the properties above.
            optimize: The contraction order, as ``einsum_plan`` takes it (a strategy's name, an
                optimizer, a path, a plan); on a GPU its slicing too (a cotengra optimizer
                with ``slicing_opts``, or a plan made with ``memory_limit=``).
            max_bytes: On the CPU, the most bytes one intermediate may hold (with its counts,
                or its k best), as ``reference.einsum`` takes it.

        Returns:
            The property's answer, of the type it names: a list of values (``Size*``), of
            ``Counted`` pairs (``Counting*``), an int (``CountingAll``), a ``Solution``
            (``SingleConfig*``), a list of them (``Configs*``, ``Sample*``: in the order
            drawn), a dict from size to count
            (``GraphPolynomial``), a float (``PartitionFunction``).

        Raises:
            TypeError: ``wanted`` is not a property; ``max_bytes`` is not an int.
            ValueError: A property the GPU does not compute yet, with ``device``; an
                intermediate past ``max_bytes``; more configurations than ``limit``.
            OverflowError: ``CountingMax(k)``/``CountingMin(k)`` with k > 1, a count past
                2^63 - 1 (``k=1`` counts exactly at any size); ``PartitionFunction(beta)``, Z
                past float64's range (``log=True`` gives ln Z).
        """
        self._check(wanted, device)
        network = self.network(wanted.sense, optimize)
        if device is None:
            return self._on_cpu(wanted, network, max_bytes)
        k = getattr(wanted, "k", 1)
        if k > 1:  # the k best: lists on the GPU
            best = network.top_on_gpu(device, k)
            if isinstance(wanted, SizeMax | SizeMin):
                return cast(T, [value for value, _ in best])
            if any(count < 0 for _, count in best):
                raise OverflowError(
                    f"{wanted!r}: a count passes 2^63 - 1, more than int64 holds; "
                    f"{type(wanted).__name__}() counts the best value exactly at any size"
                )
            return cast(T, [Counted(v, c) for v, c in best])
        if isinstance(wanted, CountingMax | CountingMin | CountingAll):
            best = network.counted_on_gpu(device)
            if isinstance(wanted, CountingAll):
                return cast(T, sum(c for _, c in best))
            return cast(T, [Counted(v, c) for v, c in best])
        if isinstance(wanted, ConfigsMax | ConfigsMin | ConfigsAll):
            letters, rows = network.rows_on_gpu(device, wanted.limit)
            return cast(T, _in_order(self._solutions(letters, rows)))
        argmax = isinstance(wanted, SingleConfigMax | SingleConfigMin)
        return self._from_gpu(wanted, *network.on_gpu(device, argmax=argmax))

    async def solve_async(
        self,
        wanted: Property[T],
        *,
        device: int | None = None,
        optimize: Any = "auto",
        max_bytes: int = MAX_BYTES,
    ) -> T:
        """``solve`` for an event loop, which it never blocks: the call runs in a worker thread
        (the planning, the CPU's contractions, a GPU's copies and its wait for the result).
        Cancelled, it returns at once and the thread's work runs to its end, its answer
        dropped.

        Args:
            wanted: As ``solve``.
            device: As ``solve``.
            optimize: As ``solve``.
            max_bytes: As ``solve``.

        Returns:
            As ``solve``.

        Raises:
            TypeError: As ``solve``, before the thread starts.
            ValueError: As ``solve``; a property the GPU does not compute, before the thread.
            OverflowError: As ``solve``.
        """
        self._check(wanted, device)
        run = functools.partial(
            self.solve, wanted, device=device, optimize=optimize, max_bytes=max_bytes
        )
        return await anyio.to_thread.run_sync(run, abandon_on_cancel=True)

    def network(self, sense: str = "every", optimize: Any = "auto") -> Network:
        """The problem's network for a property's sense, in the semiring it needs, with its plan.

        Args:
            sense: ``"max"``, ``"min"``, ``"all"`` or ``"every"``: see ``Property.sense``.
            optimize: The order, as ``einsum_plan`` takes it.

        Returns:
            The network: its subscripts, operands, semiring and plan.

        Raises:
            ValueError: ``sense`` is not one of the four; what ``einsum_plan`` refuses.
        """
        own = Network.planned(self.subscripts, self.operands, self.semiring, optimize)
        return own.towards(sense)

    def _check(self, wanted: object, device: int | None) -> None:
        if not isinstance(wanted, _PROPERTIES):
            raise TypeError(
                f"solve takes a property such as problems.SizeMax() or problems.CountingAll(), "
                f"got {type(wanted).__name__}"
            )
        if device is None:
            return
        if not isinstance(device, int) or isinstance(device, bool):
            raise TypeError(f"device must be a GPU's number or None, got {type(device).__name__}")
        k = getattr(wanted, "k", 1)
        ranked = isinstance(wanted, SizeMax | SizeMin | CountingMax | CountingMin)
        if not isinstance(wanted, _ON_GPU) or k > (MAX_TOP_GPU if ranked else 1):
            raise ValueError(
                f"{wanted!r} runs on the CPU (device=None): a GPU's kernels find the k best "
                f"values (up to {MAX_TOP_GPU}) with their counts and a configuration attaining "
                "the best (SizeMax(k), SizeMin(k), CountingMax(k), CountingMin(k), "
                "CountingAll(), SingleConfigMax(), SingleConfigMin()) and every configuration "
                "of the best (ConfigsMax(limit), ConfigsMin(limit), ConfigsAll(limit)); every "
                "configuration of the k best, samples and the sums come from the NumPy reference"
            )

    def _on_cpu(self, wanted: Property[T], network: Network, max_bytes: int) -> T:
        if isinstance(wanted, SizeMax | SizeMin):
            return cast(T, network.values(wanted.k, max_bytes))
        if isinstance(wanted, CountingMax | CountingMin):
            return cast(T, [Counted(v, c) for v, c in network.best(wanted.k, max_bytes)])
        if isinstance(wanted, CountingAll):
            return cast(T, sum(c for _, c in network.best(1, max_bytes)))
        if isinstance(wanted, GraphPolynomial):
            return cast(T, network.polynomial(max_bytes))
        if isinstance(wanted, PartitionFunction):
            # exp(-beta * energy): the energy is minus the size where the optimum is the largest.
            sign = 1 if self.semiring == "maxplus" else -1
            log_z = network.log_partition(sign * wanted.beta, max_bytes)
            if wanted.log:
                return cast(T, log_z)
            if log_z > _LARGEST_LOG:
                raise OverflowError(
                    f"Z = e^{log_z:.6g} passes float64's range: ask PartitionFunction(beta, "
                    "log=True) for ln Z"
                )
            return cast(T, math.exp(log_z))
        if isinstance(wanted, SampleMax | SampleMin | SampleAll):
            letters, rows = network.drawn(wanted.count, wanted.seed, max_bytes)
            if not len(rows):
                raise ValueError(f"no configuration of this {self.kind} problem is valid")
            return cast(T, self._solutions(letters, rows))
        if isinstance(wanted, SingleConfigsMax | SingleConfigsMin):
            letters, blocks = network.top_rows(wanted.k, None, max_bytes)
            return cast(T, [self._solutions(letters, block[:1])[0] for block in blocks])
        if isinstance(wanted, SingleConfigMax | SingleConfigMin):
            letters, rows = network.rows(None, max_bytes)
            if not len(rows):
                raise ValueError(f"no configuration of this {self.kind} problem is valid")
            return cast(T, self._solutions(letters, rows[:1])[0])
        assert isinstance(wanted, ConfigsMax | ConfigsMin | ConfigsAll)
        if not isinstance(wanted, ConfigsAll) and wanted.k > 1:
            letters, blocks = network.top_rows(wanted.k, wanted.limit, max_bytes)
            # Each value's configurations in order, the best value's first.
            return cast(
                T, [s for block in blocks for s in _in_order(self._solutions(letters, block))]
            )
        letters, rows = network.rows(wanted.limit, max_bytes)
        return cast(T, _in_order(self._solutions(letters, rows)))

    def _from_gpu(self, wanted: Property[T], value: Any, assignment: Any) -> T:
        if isinstance(wanted, SizeMax | SizeMin):
            return cast(T, [] if value is None else [value])
        if assignment is None:
            raise ValueError(f"no configuration of this {self.kind} problem is valid")
        return cast(T, self._solution(assignment))

    def _solutions(self, letters: str, rows: Array) -> list[Solution]:
        """A Solution of each row of the values of the indices ``letters``, in the rows' order."""
        return [self._solution(dict(zip(letters, row, strict=True))) for row in rows.tolist()]

    def _solution(self, assignment: Mapping[str, int]) -> Solution:
        configuration = self.configuration(assignment)
        value = self.value(list(configuration.values()))
        return Solution(value, configuration, self.answer(configuration))


def total(terms: Iterable[float], *, ints: bool) -> float:
    """The exact sum of ints (an int: integer dtypes' weights are ints), else the correctly
    rounded sum of floats (a float, 0.0 for none)."""
    listed = list(terms)
    if ints:
        return sum(int(t) for t in listed)
    return math.fsum(listed)


def _in_order(found: list[Solution]) -> list[Solution]:
    """Solutions in increasing order of their configurations read variable by variable."""
    return sorted(found, key=lambda s: tuple(s.configuration.values()))
