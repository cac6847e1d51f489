"""The backtrace of a contraction's argmaxes to an assignment of every index, as a program of
64-bit integers that a GPU block follows for each element of the result (``einsum_backtrace``
in kernels/tropical_einsum.cu) and ``follow`` follows on the host, for tests without a GPU.
An element's output indices are known from its position (``output_digits``); a scalar
contraction has one element and none.

From the last product back, the indices a product keeps are known (a later product summed
them), so its argmax is read at their position and names the winning value of the indices it
summed (tropical back-propagation). The program, for each product from the last:

    where, known, (index, stride) * known, split, part, summed, (index, size) * summed

``where`` locates the product's int32 argmax (a byte offset, or what the caller's ``read``
takes); the argmax's position is the sum of the known indices' values times their strides in it
(it is C-contiguous over the product's result); a K that was cut in parts (``split``, else -1)
adds the winning part times ``part``; the digits of the winner, last index first, are the
summed indices' values. Indices are numbered in the order of the plan's ``sizes``.

A product whose argmax was not kept (``Scan``: where a large product's argmax costs more than
finding it again at the one position the walk asks) has ``where`` -1, and after its digits the
``Scan``'s fields: the winner is found by scanning its K again at that position.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ._plan import EinsumPlan
from ._terms import contiguous

__all__ = [
    "Scan",
    "assignment_of",
    "assignment_order",
    "backtrace_code",
    "backtrace_program",
    "follow",
    "output_digits",
    "output_values",
]


@dataclass(frozen=True, slots=True)
class Scan:
    """A product (+)_k A[b, m, k] (x) B[b, k, n] whose argmax the backtrace finds by scanning k
    at the position it reaches (the first best k, as the products' argmaxes): A and B at byte
    offsets ``a`` and ``b`` from the walk's base, with these element strides, its result C
    contiguous over (b, m, n)."""

    a: int
    b: int
    m: int
    n: int
    k: int
    a_strides: tuple[int, int, int]
    b_strides: tuple[int, int, int]

    def words(self) -> list[int]:
        return [self.a, self.b, self.m, self.n, self.k, *self.a_strides, *self.b_strides]

    @classmethod
    def of(cls, words: Sequence[int]) -> Scan:
        a, b, m, n, k, *strides = words
        return cls(a, b, m, n, k, (strides[0], strides[1], strides[2]),
                   (strides[3], strides[4], strides[5]))  # fmt: skip


_SCAN_WORDS = 11  # Scan.words()


def backtrace_code(plan: EinsumPlan, where: Sequence[int | Scan]) -> list[int]:
    """The program for ``plan``, each step's argmax located by ``where`` (one per step), or
    found again by its ``Scan``."""
    return backtrace_program(plan, where)[0]


def backtrace_program(plan: EinsumPlan, where: Sequence[int | Scan]) -> tuple[list[int], list[int]]:
    """``backtrace_code``, and the kernel's schedule: the steps by depth in the contraction
    tree (the last step's 0, a step's one more than its reader's), as the offsets at which each
    depth's steps start in the list that follows them, how many of each depth's are scanned
    (they come first), then each step's offset in the code."""
    number = {index: n for n, index in enumerate(plan.sizes)}
    code: list[int] = []
    offsets = [0] * len(plan.steps)
    for position, step, at in reversed(
        list(zip(range(len(where)), plan.steps, where, strict=True))
    ):
        offsets[position] = len(code)
        strides = contiguous([plan.sizes[i] for i in step.result])
        code += [-1 if isinstance(at, Scan) else at, len(step.result)]
        for index, stride in zip(step.result, strides, strict=True):
            code += [number[index], stride]
        if step.split is not None:
            code += [number[step.split], step.first.shape[2]]
        else:
            code += [-1, 0]
        code.append(len(step.k))
        for index in reversed(step.k):
            code += [number[index], plan.sizes[index]]
        if isinstance(at, Scan):
            code += at.words()
    inputs = len(plan.terms)
    depth = [0] * len(plan.steps)
    for position in reversed(range(len(plan.steps))):
        for operand in plan.steps[position].operands:
            if operand >= inputs:  # the step that made it is one deeper
                depth[operand - inputs] = depth[position] + 1
    by_depth: list[list[int]] = [[] for _ in range(max(depth, default=-1) + 1)]
    for position, d in enumerate(depth):
        by_depth[d].append(position)
    starts, scans, order = [0], [], []
    for group in by_depth:  # each depth's Scans first (the block takes them one by one)
        group.sort(key=lambda position: not isinstance(where[position], Scan))
        starts.append(starts[-1] + len(group))
        scans.append(sum(isinstance(where[position], Scan) for position in group))
        order += [offsets[position] for position in group]
    return code, starts + scans + order


def output_digits(plan: EinsumPlan) -> list[int]:
    """The output's indices as (number, size) pairs, its last first: the digits into which the
    kernel's block of element e (of the C-ordered result) reads e's position."""
    number = {index: n for n, index in enumerate(plan.sizes)}
    words: list[int] = []
    for index in reversed(plan.output):
        words += [number[index], plan.sizes[index]]
    return words


def output_values(digits: Sequence[int], element: int) -> dict[int, int]:
    """Each output index's value (by number) at ``element`` of the C-ordered result, read from
    ``output_digits`` as the kernel reads them."""
    values = {}
    for d in range(0, len(digits), 2):
        element, values[digits[d]] = divmod(element, digits[d + 1])
    return values


def follow(
    code: Sequence[int],
    steps: int,
    indices: int,
    read: Callable[[int, int], int],
    scan: Callable[[Scan, int], int] | None = None,
    *,
    start: dict[int, int] | None = None,
) -> list[int]:
    """The walk the kernel makes: each index's value, ``read(where, position)`` giving an
    argmax, ``scan(product, position)`` a ``Scan``'s, from the output indices' values
    ``start`` (``output_values``: none for a scalar contraction)."""
    assignment = [0] * indices
    for index, value in (start or {}).items():
        assignment[index] = value
    c = 0
    for _ in range(steps):
        where, known = code[c], code[c + 1]
        c += 2
        at = 0
        for _ in range(known):
            at += assignment[code[c]] * code[c + 1]
            c += 2
        split, part, summed = code[c : c + 3]
        end = c + 3 + 2 * summed
        if where >= 0:
            won = read(where, at)
        else:
            assert scan is not None
            won = scan(Scan.of(code[end : end + _SCAN_WORDS]), at)
            end += _SCAN_WORDS
        won = max(won, 0)  # -1: the semiring's zero, which every assignment attains
        if split >= 0:
            won += assignment[split] * part
        for d in range(c + 3, c + 3 + 2 * summed, 2):
            won, assignment[code[d]] = divmod(won, code[d + 1])
        c = end
    return assignment


def assignment_of(plan: EinsumPlan, values: Sequence[int]) -> dict[str, int]:
    """The assignment of the inputs' indices, from every index's value (numbered as ``sizes``):
    the output's indices at the element's position, the others as the walk found them."""
    names, numbers = assignment_order(plan)
    return dict(zip(names, (int(values[n]) for n in numbers), strict=True))


def assignment_order(plan: EinsumPlan) -> tuple[tuple[str, ...], list[int]]:
    """The inputs' indices, as ``assignment_of`` names them, and each one's number: made once
    per plan by what reads assignments again and again (the 15x15 king's graph's 225 indices
    took 0.1-0.2 ms to name per call, a fifth of the contraction)."""
    number = {index: n for n, index in enumerate(plan.sizes)}
    names = tuple(dict.fromkeys("".join(plan.inputs)))
    return names, [number[i] for i in names]
