"""A planned tropical einsum (``EinsumPlan``): its order, each step as one batched product over
strided views of its operands, its slicing; what it costs (complexities, copies) and which
kernels it launches; and the bounds a plan's arrays are checked against. The planning itself,
which makes these, is _planner's."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..._spec import KernelSpec
from ..products import DeviceFigures, Semiring, check_size, choose
from ..products import semiring as lookup
from ._kernel_specs import backtrace_spec, einsum_spec, many_spec
from ._rows import read_in_place, scanned
from ._slicing import Slicing, complexity
from ._terms import Step, Term, View

__all__ = [
    "ADDRESSABLE",
    "ADDRESSABLE_BYTES",
    "ORDER_FIX",
    "WIDEST",
    "EinsumPlan",
    "StepCost",
    "check_step",
    "read_in_place",
    "step_spec",
    "step_specs",
]

# The most bytes an array of a plan may hold: what any kernel can address. Sizes, strides and
# offsets are 64-bit (long long in the kernels, byte strides in CuPy), and a plan from shapes
# serves any dtype, so its results are counted at 8 bytes an element (float64, int64: the
# widest): 2**60 elements. Checked as each step is planned, which keeps every stride a
# machine-size integer; einsum checks the tighter bound, the device's memory, when it runs.
ADDRESSABLE_BYTES = 2**63 - 1
WIDEST = 8
ADDRESSABLE = (
    f"the {ADDRESSABLE_BYTES:,} bytes a 64-bit offset addresses (a plan counts {WIDEST} bytes "
    "an element, the widest dtype)"
)

# What to do about an intermediate over a bound (the plan's, or the device's in einsum).
ORDER_FIX = (
    "pick an order with smaller intermediates (optimize='auto-hq', 'random-greedy' or a "
    "cotengra HyperOptimizer; einsum_plan(...).largest_intermediate compares them), or contract "
    "the network in slices (fix an index by indexing the operands)"
)


@dataclass(frozen=True, slots=True)
class StepCost:
    """The least one step of a plan must do, whatever the kernel: its add+max pairs and the
    elements it must move through device memory.

    Attributes:
        pairs: (x)-and-(+) pairs: batch * M * N * K.
        elements: Elements read and written: each operand read once (a broadcast counted
            once), the result written once, and a copy of an operand read and written.
    """

    pairs: int
    elements: int

    def bound(self, figures: DeviceFigures, dtype: Any) -> float:
        """The least time the step can take on a device of ``figures``.

        Args:
            figures: The device's ceilings (``tropical.device_figures``).
            dtype: The element type.

        Returns:
            Seconds: the longer of its pairs at the probe's rate and its bytes at the copy's.

        Raises:
            KeyError: ``dtype`` is not one of the kernels' element types.
        """
        return figures.bound(self.pairs, self.elements * np.dtype(dtype).itemsize, dtype)


@dataclass(frozen=True, slots=True)
class EinsumPlan:
    """A planned tropical einsum, from ``einsum_plan``: pass it as ``optimize=`` to run it on
    operands of the same shapes (other strides are re-planned along the same path).

    ``print(plan)`` shows the order, each step as a batched product, the largest intermediate
    and the copies. Plans are frozen values: equal where they do the same, and hashable (a
    dict key, a set member).

    Attributes:
        subscripts: The subscripts it was planned for, as given.
        inputs: Each operand's indices, one character per axis, in order.
        output: The output's indices (NumPy's implicit output where ``subscripts`` has no
            ``->``).
        sizes: Each index's size, by index. A long sum over few outputs that is cut in parts
            adds an index of its own for them: a private-use character (U+E000 on) that no
            operand names.
        path: The contraction order, in opt_einsum's format: each entry the positions, in the
            list of operands left, of the one or two it contracts; they leave the list and
            their result joins its end.
        terms: The inputs as planned, each with its distinct ``indices`` (a repeated index is
            its diagonal, whose stride is the sum of its axes') and their element ``strides``.
        steps: The steps, in order, each one batched product C[b, m, n] = (+)_k A[b, m, k] (x)
            B[b, k, n]: ``operands`` (the numbers of the one or two it contracts: the inputs 0
            to n-1, then each step's result in turn), ``subscripts`` (in the caller's
            indices), ``batch``, ``m``, ``k`` and ``n`` (its groups of indices), ``first`` and
            ``second`` (its operands as 3-D views, each with its ``shape``, its element
            ``strides`` and ``copy``, the order of a copy made first, or None; ``second`` is
            None for a sum within one operand) and ``size`` (the elements of its result). A
            path entry may take two steps: a sum within one operand first, or a long sum cut
            in parts, then their sum.
        final_copy: Whether the last result is copied once more at the end: its order is not
            the output's, or it is still an input (``einsum`` returns a new array, never a
            view of an operand).
        layouts: The operands' (shape, byte strides, item size) it was planned for,
            ``((), (), 0)`` for a shape. Not compared: plans that do the same are equal.
        key: One name for what the plan does (equal plans, equal keys), which what runs it
            keys its caches by: the planning process's token and a number in that process.
            Not compared.
        slicing: Where the contraction runs in slices (``memory_limit=``, or a planner that
            sliced): its ``indices``, their ``sizes``, ``count`` (the slices) and
            ``subscripts`` (one slice's contraction: the sliced indices left out of every
            operand). None where it is not sliced. ``steps`` are the whole network's even then.
    """

    subscripts: str
    inputs: tuple[str, ...]
    output: str
    sizes: Mapping[str, int]
    path: tuple[tuple[int, ...], ...]  # opt_einsum's format
    terms: tuple[Term, ...]  # the inputs as planned
    steps: tuple[Step, ...]
    final_copy: bool  # the result's order is not the output's: one more copy at the end
    # The arrays' (shape, byte strides) it was planned for (not part of what it does).
    layouts: tuple[tuple[Any, ...], ...] = field(
        default=(), compare=False
    )  # (shape, strides, size)
    # One name for what the plan does (equal plans, equal keys): what runs key their caches by,
    # hashed in O(1) where the plan itself hashes in O(steps). A number of this process and the
    # process's own token: a plan pickled in another process keeps that process's token, so its
    # number never names a plan of this one.
    key: tuple[str, int] = field(default=("", -1), compare=False)
    # Where the contraction runs in slices (memory_limit=, or a planner that sliced): which
    # indices, and the contraction of one slice. Its steps above are the whole network's.
    slicing: Slicing | None = None

    def __hash__(self) -> int:
        # Over two of the fields compared (equal plans hash equal, as they must), which tell
        # plans apart in all but their slicing: hashing every step took 6-25 ms for 4,700 of
        # them, these 0.1 ms (the subscripts' hash is cached on the str). Not cached on the
        # plan: a hash pickled into another process (a cluster's task) would be wrong there.
        return hash((self.subscripts, self.path))

    @property
    def space_complexity(self) -> float:
        """log2 of the elements of the largest intermediate along the path, of one slice where
        sliced: cotengra's ``contraction_width``, GenericTensorNetworks' ``sc``."""
        largest, _ = self._complexity()
        return math.log2(largest) if largest else 0.0

    @property
    def time_complexity(self) -> float:
        """log2 of the products (x) of all the path's steps, of every slice: each step's joint
        index space, as GenericTensorNetworks' ``tc`` counts it (cotengra's
        ``contraction_cost`` is the same where every index is in two tensors or more; it sums
        an index of one tensor away before, and counts less)."""
        _, products = self._complexity()
        total = products * (self.slicing.count if self.slicing is not None else 1)
        return math.log2(total) if total else 0.0

    def _complexity(self) -> tuple[int, int]:
        sliced = self.slicing.indices if self.slicing is not None else ()
        return complexity(self.inputs, self.output, self.sizes, self.path, sliced)

    @property
    def copies(self) -> int:
        """Operands copied before a product (no strided view could read them; a small step
        reads them as they lie instead: ``in_place``), plus the final reordering if any: the
        statistic to keep at zero."""
        return sum(v.copy is not None for v in self._copied_reads()) + self.final_copy

    @property
    def copied_elements(self) -> int:
        """Elements those copies write."""
        final = math.prod(self.sizes[i] for i in self.output) if self.final_copy else 0
        return final + sum(v.copied for v in self._copied_reads())

    def _copied_reads(self) -> list[View]:
        """The views of the steps that a product reads (not the steps read in place)."""
        in_place = self.in_place  # (bound once: the property walks every step)
        return [
            v
            for n, s in enumerate(self.steps)
            if n not in in_place
            for v in (s.first, s.second)
            if v is not None
        ]

    @property
    def in_place(self) -> frozenset[int]:
        """The steps whose product would copy an operand and that run instead as a row of the
        kernel of small products (``tropical_many``), reading their operands as they lie: a
        short sum over few outputs."""
        return frozenset(n for n in range(len(self.steps)) if read_in_place(self, n))

    @property
    def largest_intermediate(self) -> int:
        """Elements of the largest result of a step (the memory the contraction needs)."""
        return max((step.size for step in self.steps), default=0)

    @property
    def live_elements(self) -> int:
        """The most elements of intermediates alive at once when the steps run in order (each
        result from its step to its last reader, and the copies the step reads), over the
        plan's ``steps`` (of the whole network where sliced: a slice's own plan gives a
        slice's): the intermediates' peak live set, which a compiled program's arena
        (``EinsumProgram.arena_bytes``) comes near, times the itemsize."""
        in_place, last_read = self.in_place, {}
        for n, step in enumerate(self.steps):
            for operand in step.operands:
                last_read[operand] = n
        live: dict[int, int] = {}
        peak = 0
        for n, step in enumerate(self.steps):
            views = () if n in in_place else (step.first, step.second)
            copies = sum(v.copied for v in views if v is not None)
            peak = max(peak, sum(live.values()) + copies + step.size)
            for operand in step.operands:
                if last_read[operand] == n:
                    live.pop(operand, None)
            live[step.number] = step.size
        return peak

    @property
    def products(self) -> int:
        """(x) operations over all steps: batch * M * N * K summed."""
        return sum(s.size * s.first.shape[2] for s in self.steps)

    def kernel_specs(
        self,
        semiring: str = "maxplus",
        dtype: Any = "float32",
        *,
        argmax: bool = False,
        program: bool = False,
    ) -> list[KernelSpec]:
        """The kernels that a run of this plan launches with the default tiles.

        The steps' products (``kernel_spec``'s choice), the strided copy where the plan copies,
        the backtrace with ``argmax``, and with ``program`` what a compiled program adds (its
        gather, its launch of many small steps). To compile them ahead of use, or for a named
        arch on a machine without a GPU. A device whose tiles ``autotune`` tuned runs
        products of its own tiles instead.

        Args:
            semiring: The semiring's name: ``"maxplus"``, ``"minplus"``, ``"maxmul"`` or
                ``"andor"``.
            dtype: The operands' dtype: a name such as ``"float32"``, or a NumPy type or dtype.
            argmax: The kernels of a run with ``argmax=True``.
            program: The kernels of ``einsum_program``'s compiled program of this plan.

        Returns:
            The kernels' specs, each once, to pass to ``Compiler.compile`` or ``Compiler.get``.

        Raises:
            ValueError: ``semiring`` is not one of ``SEMIRINGS``, or ``dtype`` is not a dtype
                that it takes.
        """
        ring = lookup(semiring)
        kind = ring.check_dtype(dtype)
        specs = step_specs(self, ring, kind, argmax=argmax, table=None, program=program)
        if self.copies:
            specs.append(einsum_spec("copy", kind.itemsize))
        if argmax:
            specs.append(backtrace_spec(ring, kind))
        if program:
            specs.append(einsum_spec("gather", kind.itemsize))
        if program or self.in_place:
            specs.append(many_spec(ring, kind, argmax=argmax))
        return specs

    def planned_for(self, subscripts: str, operands: Sequence[Any]) -> bool:
        """Whether the plan was made for these subscripts and operands' shapes and strides.

        A check in O(operands) for each run of a reused plan (re-planning is O(indices)). A
        plan made from shapes was made for no arrays: it says False.

        Args:
            subscripts: The subscripts of the run.
            operands: The run's operands, in order.

        Returns:
            True where ``subscripts`` is the plan's, as given, and every operand has the shape,
            byte strides and item size that the plan was made for.

        Raises:
            TypeError: ``operands`` has no length (an iterator), where ``subscripts`` is the
                plan's.
        """
        if subscripts != self.subscripts or len(operands) != len(self.layouts):
            return False
        # Byte strides and the item size: element strides are what the steps read with.
        return all(
            getattr(x, "shape", None) == shape
            and getattr(x, "strides", None) == strides
            and getattr(x, "itemsize", None) == itemsize
            for x, (shape, strides, itemsize) in zip(operands, self.layouts, strict=True)
        )

    def shapes(self) -> list[tuple[int, ...]]:
        """The input shapes the plan is for.

        Returns:
            Each operand's shape, in order, from ``sizes``.
        """
        return [tuple(self.sizes[i] for i in letters) for letters in self.inputs]

    def step_costs(self) -> list[StepCost]:
        """What each step must do at least: its pairs and the elements it moves (``StepCost``);
        of one slice, where the plan is sliced (each step with the sliced indices fixed).

        Returns:
            One StepCost per step, in order; the final reordering copy, if any, is the last
            step's.
        """
        sliced = self.slicing
        fixed = dict(zip(sliced.indices, sliced.sizes, strict=True)) if sliced else {}

        def part(letters: str) -> int:  # how much smaller a slice's share of these letters is
            return math.prod(fixed.get(i, 1) for i in set(letters))

        costs = []
        for number, step in enumerate(self.steps):
            ins, out = step.subscripts.split("->")
            reads = [v for v in (step.first, step.second) if v is not None]
            terms = ins.split(",")
            elements = step.size // part(out)
            for view, letters in zip(reads, terms[::-1] if step.swapped else terms, strict=True):
                elements += (_distinct(view) + 2 * view.copied) // part(letters)
            if self.final_copy and number == len(self.steps) - 1:
                elements += 2 * step.size // part(out)
            pairs = step.size * step.first.shape[2] // part(ins.replace(",", ""))
            costs.append(StepCost(pairs, elements))
        return costs

    def roofline(self, figures: DeviceFigures, dtype: Any = "float32") -> float:
        """The least time the contraction can take on a device of ``figures``: each step at the
        longer of its pairs at the probe's rate and its bytes at the copy's, summed, times the
        slices where sliced.

        Args:
            figures: The device's ceilings (``tropical.device_figures``).
            dtype: The operands' element type.

        Returns:
            Seconds.

        Raises:
            KeyError: ``dtype`` is not one of the kernels' element types.
        """
        each = sum(cost.bound(figures, dtype) for cost in self.step_costs())
        return each * (self.slicing.count if self.slicing is not None else 1)

    def report(self, figures: DeviceFigures | None = None, dtype: Any = "float32") -> str:
        """``str(plan)`` with each step's pairs and elements moved (a slice's, where sliced), and
        with ``figures`` its bound and the plan's roofline.

        Args:
            figures: The device's ceilings (``tropical.device_figures``), or None.
            dtype: The element type the bounds are counted for.

        Returns:
            The text, a line a step.

        Raises:
            KeyError: ``dtype`` is not one of the kernels' element types.
        """
        lines = str(self).splitlines()
        head = len(lines) - len(self.steps)
        costs = self.step_costs()
        for number, cost in enumerate(costs):
            extra = f"; {cost.pairs:,} pairs, {cost.elements:,} elements"
            if figures is not None:
                extra += f", bound {cost.bound(figures, dtype) * 1e6:.3g} us"
            lines[head + number] += extra
        if figures is not None:
            lines.insert(
                head,
                f"  roofline on {figures.gpu}, {np.dtype(dtype).name}: "
                f"{self.roofline(figures, dtype) * 1e3:.4g} ms"
                + (f", {self.slicing.count:,} slices of the steps below" if self.slicing else ""),
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        lines = [
            f"einsum {self.subscripts}: {len(self.steps)} step(s), largest intermediate "
            f"{self.largest_intermediate:,} elements, {self.products:,} products, "
            f"{self.copies} copies ({self.copied_elements:,} elements); space complexity "
            f"{self.space_complexity:.2f}, time complexity {self.time_complexity:.2f} (log2)"
        ]
        if self.slicing is not None:
            sliced = zip(self.slicing.indices, self.slicing.sizes, strict=True)
            indices = ", ".join(f"{i!r} ({n})" for i, n in sliced)
            lines.append(
                f"  in {self.slicing.count:,} slices over {indices}, each {self.slicing.subscripts}"
            )
        in_place = self.in_place
        for number, step in enumerate(self.steps):
            b, m, k = step.first.shape  # a split K: its parts as the batch, one part's length
            n = step.second.shape[2] if step.second is not None else 1
            copied = sum(v is not None and v.copy is not None for v in (step.first, step.second))
            lines.append(
                f"  {step.operands} {step.subscripts}: batch {b} x {m} x {n} over {k}"
                + (", read in place" if number in in_place else "")
                + (f", {copied} copied" if copied and number not in in_place else "")
            )
        return "\n".join(lines)


def _distinct(view: View) -> int:
    """The elements a view reads, each once (an axis of stride 0 is a broadcast)."""
    return math.prod(n for n, stride in zip(view.shape, view.strides, strict=True) if stride)


def check_step(number: int, step: Step, *, itemsize: int, limit: int, bound: str) -> None:
    """``check_size`` for the result of ``step``, step ``number`` of its plan."""
    if step.size * itemsize <= limit:
        return  # without building the message: einsum checks each step of a plan on every run
    check_size(
        f"einsum intermediate {''.join(step.result)!r} of step {number} ({step.subscripts})",
        step.size,
        itemsize=itemsize,
        limit=limit,
        bound=bound,
        fix=ORDER_FIX,
    )


def step_specs(
    plan: EinsumPlan, ring: Semiring, dtype: Any, *, argmax: bool, table: Any, program: bool
) -> list[KernelSpec]:
    """The distinct kernels of ``plan``'s steps, with ``table``'s tiles (None: the defaults),
    as a compiled program runs them where ``program`` (its scanned steps keep no argmax)."""
    rows = plan.in_place
    found = {
        step_spec(s, ring, dtype, argmax=argmax and not (program and scanned(plan, s)),
                  table=table): None
        for n, s in enumerate(plan.steps)
        if n not in rows
    }  # fmt: skip
    return list(found)


def step_spec(step: Step, ring: Semiring, dtype: Any, *, argmax: bool, table: Any) -> KernelSpec:
    """The kernel ``matmul``'s planner picks for ``step``'s product (same rules)."""
    b, m, k = step.first.shape
    n = step.second.shape[2] if step.second is not None else 1
    second_n = step.second.strides[2] if step.second is not None else 1
    spec, *_ = choose(
        ring, dtype, m, n, k, batch=b, argmax=argmax, accumulate=False,
        rowmajor=step.first.strides[2] == 1 and second_n == 1, tile="auto", table=table,
    )  # fmt: skip
    return spec
