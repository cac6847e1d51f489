"""The NumPy contraction's machinery, shared by ``reference.einsum`` and its counting forms:
a contraction checked before any work (``prepare``), its steps along a path or left to right,
and one step evaluated in blocks of bounded size."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..products import (
    CHUNK_ELEMENTS,
    Semiring,
    check_max_bytes,
    check_size,
    combine,
    max_bytes_bound,
)
from ..products import semiring as lookup
from ._subscripts import (
    MAX_NDIM,
    check_dtypes,
    check_output,
    check_semiring,
    index_sizes,
    parse_subscripts,
)
from ._terms import input_terms

__all__ = [
    "Network",
    "Step",
    "Term",
    "align",
    "along",
    "blocks",
    "contract",
    "distinct_axes",
    "in_block",
    "joint_indices",
    "left_to_right",
    "prepare",
    "reduction",
]

# One operand with its subscripts: an array and one letter per axis.
Term = tuple[np.ndarray[Any, Any], str]


@dataclass(frozen=True, slots=True)
class Step:
    """One contraction of ``einsum``: the operands it takes, by number (the inputs 0 to n-1,
    then step i's result n + i), their indices, and the indices its result keeps."""

    operands: tuple[int, ...]
    inputs: tuple[str, ...]
    keep: str

    @property
    def subscripts(self) -> str:
        return ",".join(self.inputs) + "->" + self.keep


@dataclass(frozen=True, slots=True)
class Network:
    """A checked contraction, ready to run: its operands one axis per distinct index, by
    number, and the steps of its order."""

    ring: Semiring
    made: dict[int, Term]
    steps: list[Step]
    output: str
    sizes: dict[str, int]
    letters: str  # every index, in the order it first appears


def prepare(
    subscripts: str,
    operands: Sequence[Any],
    semiring: str,
    path: Sequence[Sequence[int]] | None,
    max_bytes: int,
    *,
    extra: tuple[int, int] = (0, 1),
) -> Network:
    """What every form of ``einsum`` checks before any work: the subscripts, the operands, the
    order, and each result's bytes, an element taking ``extra`` = (bytes beside the value, how
    many of each) of it."""
    ring = lookup(semiring)
    check_semiring(subscripts, semiring)
    inputs, output = parse_subscripts(subscripts, len(operands))
    check_max_bytes(max_bytes)
    arrays = [np.asarray(x) for x in operands]
    check_dtypes(ring, arrays)
    sizes = index_sizes(inputs, arrays)
    itemsize = (arrays[0].dtype.itemsize + extra[0]) * extra[1]
    bound = max_bytes_bound(max_bytes)
    check_output(output, sizes, itemsize=itemsize, limit=max_bytes, bound=bound)
    distinct = ["".join(dict.fromkeys(letters)) for letters in inputs]
    if path is not None:
        steps = along(distinct, output, path)
        fix = (
            "pass a path with smaller intermediates (tropical.einsum_plan(subscripts, *shapes, "
            "optimize='auto-hq').path), or contract the network in slices"
        )
    else:
        steps = left_to_right(distinct, output, sizes)
        fix = (
            "without path= the reference contracts left to right: pass path= (tropical."
            "einsum_plan(subscripts, *shapes, optimize='auto-hq').path) for an order with "
            "smaller intermediates, or contract the network in slices"
        )
    for number, step in enumerate(steps):
        joint = dict.fromkeys("".join(step.inputs))
        if len(joint) > MAX_NDIM:
            raise ValueError(
                f"einsum step {number} ({step.subscripts}) broadcasts {len(joint)} indices at "
                f"once, more than the {MAX_NDIM} dimensions a NumPy array has; {fix}"
            )
        elements = math.prod(sizes[i] for i in step.keep)
        what = f"einsum intermediate {step.keep!r} of step {number} ({step.subscripts})"
        check_size(what, elements, itemsize=itemsize, limit=max_bytes, bound=bound, fix=fix)
    made = dict(
        enumerate(
            distinct_axes(x, letters, sizes) for x, letters in zip(arrays, inputs, strict=True)
        )
    )
    letters = "".join(dict.fromkeys("".join(inputs)))
    return Network(ring, made, steps, output, dict(sizes), letters)


def left_to_right(inputs: Sequence[str], output: str, sizes: Mapping[str, int]) -> list[Step]:
    """``einsum``'s order without a path: all operands in one broadcast when that is small;
    else, by distributivity, each index summed as soon as no later operand (nor the output)
    needs it: first each operand's own, then operand by operand. Exact, floats included,
    because x -> x (x) c is monotone (for max-times: on non-negative inputs, where it is
    defined)."""
    n = len(inputs)
    if n == 1 or (math.prod(sizes.values()) <= CHUNK_ELEMENTS and len(sizes) <= MAX_NDIM):
        return [Step(tuple(range(n)), tuple(inputs), output)]
    steps: list[Step] = []
    owners = Counter(i for letters in inputs for i in letters)  # operands holding each index
    terms: list[tuple[int, str]] = []  # each operand's number and indices after its own sums
    for k, letters in enumerate(inputs):
        keep = "".join(i for i in letters if owners[i] > 1 or i in output)
        if keep == letters:
            terms.append((k, letters))
        else:
            steps.append(Step((k,), (letters,), keep))
            terms.append((n + len(steps) - 1, keep))
    later = Counter(i for _, letters in terms[1:] for i in letters)  # in operands not yet taken
    acc = terms[0]
    for k, term in enumerate(terms[1:], start=1):
        later.subtract(term[1])
        joint = dict.fromkeys(acc[1] + term[1])
        last = k == n - 1
        keep = output if last else "".join(i for i in joint if later[i] > 0 or i in output)
        steps.append(Step((acc[0], term[0]), (acc[1], term[1]), keep))
        acc = (n + len(steps) - 1, keep)
    return steps


def along(inputs: Sequence[str], output: str, path: Sequence[Sequence[int]]) -> list[Step]:
    """The steps of ``path`` (opt_einsum's format), each keeping what later steps need."""
    n = len(inputs)
    live = [(k, letters) for k, letters in enumerate(inputs)]
    steps: list[Step] = []
    for number, step in enumerate(path):
        positions = sorted({int(p) for p in step})
        if not positions or positions[-1] >= len(live) or positions[0] < 0:
            raise ValueError(f"einsum path step {number} {tuple(step)} names no live operands")
        chosen = [live[p] for p in positions]
        live = [t for i, t in enumerate(live) if i not in positions]
        later = set(output).union(*(letters for _, letters in live))
        joint = dict.fromkeys("".join(letters for _, letters in chosen))
        keep = "".join(x for x in joint if x in later) if live else output
        steps.append(Step(tuple(k for k, _ in chosen), tuple(t for _, t in chosen), keep))
        live.append((n + number, keep))
    if len(live) != 1:
        raise ValueError(f"einsum path leaves {len(live)} operands, not one")
    if not steps and live[0][1] != output:  # one operand, its own sums still to do
        steps.append(Step((0,), (live[0][1],), output))
    return steps


def distinct_axes(x: np.ndarray[Any, Any], letters: str, sizes: Mapping[str, int]) -> Term:
    """``x`` with its repeated indices taken as diagonals: one axis per distinct letter."""
    distinct = "".join(dict.fromkeys(letters))
    if distinct == letters:
        return x, letters
    (term,) = input_terms([letters], [x.strides])
    view = np.lib.stride_tricks.as_strided(
        x, shape=[sizes[d] for d in distinct], strides=term.strides, writeable=False
    )
    return view, distinct


def contract(
    ring: Semiring, terms: Sequence[Term], out: str, sizes: Mapping[str, int]
) -> np.ndarray[Any, Any]:
    """The zero (+) the sum over the indices not in ``out`` of the terms' product (left to
    right), one axis per letter of ``out``, broadcast over all the terms' indices in blocks."""
    joint = joint_indices((s for _, s in terms), out)
    dtype = terms[0][0].dtype
    zero = ring.zero(dtype)
    add = reduction(ring)
    result = np.full([sizes[c] for c in out], zero, dtype=dtype)
    shape = [sizes[c] for c in joint]
    if 0 in shape:  # nothing to sum: every cell (if any) is the empty sum
        return result
    aligned = [align(x, letters, joint) for x, letters in terms]
    summed = tuple(range(len(out), len(joint)))
    for block in blocks(shape):
        parts = [in_block(x, block) for x in aligned]
        product = parts[0]
        for part in parts[1:]:
            product = combine(ring, product, part)
        if summed:
            product = add.reduce(product, axis=summed)
        where = block[: len(out)]
        result[where] = add(result[where], product)  # (+) into the cells, from the zero
    return result


def joint_indices(inputs: Iterable[str], out: str) -> str:
    """The indices a step broadcasts over: ``out``'s, then the others of ``inputs`` once each,
    as they first appear."""
    return out + "".join(dict.fromkeys(c for letters in inputs for c in letters if c not in out))


def reduction(ring: Semiring) -> np.ufunc:
    """The semiring's (+) as a ufunc. fmax and fmin skip NaN: a NaN input counts as the zero,
    as a NaN product does."""
    return np.logical_or if ring.name == "andor" else np.fmax if ring.maximise else np.fmin


def in_block(x: np.ndarray[Any, Any], block: tuple[slice, ...]) -> Any:
    """The part of ``x`` (aligned to a step's indices) in ``block``: an axis of size 1, where
    ``x`` lacks the index and is broadcast, is taken whole."""
    return x[tuple(b if n > 1 else slice(None) for b, n in zip(block, x.shape, strict=True))]


def align(x: np.ndarray[Any, Any], letters: str, joint: str) -> np.ndarray[Any, Any]:
    """A view of ``x`` with one axis per letter of ``joint``, of size 1 where ``x`` lacks it."""
    x = x.transpose(sorted(range(len(letters)), key=lambda a: joint.index(letters[a])))
    return x[tuple(slice(None) if c in letters else np.newaxis for c in joint)]


def blocks(shape: Sequence[int], weight: int = 1) -> Iterator[tuple[slice, ...]]:
    """Slices cutting ``shape`` (no size 0 in it) into blocks of at most ``CHUNK_ELEMENTS``
    elements, each weighing ``weight`` (a block of them is that many times the memory): single
    indices of the leading axes, a run of one axis, the trailing axes whole."""
    if not shape:
        yield ()
        return
    chunk = max(1, CHUNK_ELEMENTS // weight)
    axis = next(a for a in range(len(shape)) if math.prod(shape[a + 1 :]) <= chunk)
    step = max(1, chunk // math.prod(shape[axis + 1 :]))
    rest = (slice(None),) * (len(shape) - axis - 1)
    for head in itertools.product(*(range(n) for n in shape[:axis])):
        for start in range(0, shape[axis], step):
            yield (*(slice(i, i + 1) for i in head), slice(start, start + step), *rest)
