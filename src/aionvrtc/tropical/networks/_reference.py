"""The NumPy contraction of tensor networks in the tropical semirings
(``tropical.reference.einsum``): the oracle of ``tropical.einsum``, and a CPU fallback, along a
given order or left to right."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..products import (
    CHUNK_ELEMENTS,
    MAX_BYTES,
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
    index_sizes,
    parse_subscripts,
)
from ._terms import input_terms

__all__ = ["einsum"]

# One operand with its subscripts: an array and one letter per axis.
_Term = tuple[np.ndarray[Any, Any], str]


@dataclass(frozen=True, slots=True)
class _Step:
    """One contraction of ``einsum``: the operands it takes, by number (the inputs 0 to n-1,
    then step i's result n + i), their indices, and the indices its result keeps."""

    operands: tuple[int, ...]
    inputs: tuple[str, ...]
    keep: str

    @property
    def subscripts(self) -> str:
        return ",".join(self.inputs) + "->" + self.keep


def einsum(
    subscripts: str,
    *operands: Any,
    semiring: str = "maxplus",
    path: Sequence[Sequence[int]] | None = None,
    max_bytes: int = MAX_BYTES,
) -> np.ndarray[Any, Any]:
    """The tropical einsum of NumPy arrays: the oracle of ``tropical.einsum``, and a CPU fallback.

    ``out[o] = zero (+) ... (+) (x_1[...] (x) x_2[...] (x) ... x_n[...])``, the (+)-sum running
    over every value of the indices that are not in the output.

    (+) and (x) are the semiring's, with ``matmul``'s rules: integers saturate, their extremes
    are the infinities, and a NaN product (-inf + inf, 0 * inf) counts as the zero; the products
    are formed in operand order, left to right (float (x) is not associative). Every output
    cell starts from the zero, so an empty sum gives the zero and a NaN input counts as the zero.

    Small contractions (the joint space of all indices fits in ``CHUNK_ELEMENTS``) are evaluated
    in one broadcast; larger ones operand by operand, left to right, in blocks of at most
    ``CHUNK_ELEMENTS`` products. No result (the output, an intermediate) may hold more than
    ``max_bytes``, nor one broadcast join more indices than a NumPy array has dimensions: the
    order is worked out first, and a contraction past either is refused with a ValueError
    before any work.

    Args:
        subscripts: NumPy's grammar over the letters a-z, A-Z and any non-ASCII character
            (``opt_einsum.get_symbol(i)`` names the i-th, for networks of many indices):
            ``"ij,jk->ik"`` (matmul), ``"ii->i"`` (a diagonal), ``"ii->"`` (the trace),
            ``"ij->i"`` (a sum within one operand), ``"i,j->ij"`` (an outer product), ``",->"``
            (0-d operands). Without ``->`` the output is the indices that appear exactly once,
            sorted by character (upper case first), as in ``numpy.einsum``. No ellipsis, and no
            broadcasting: an index has one size everywhere.
        *operands: The tensors, one per operand of ``subscripts``: NumPy arrays (or what
            ``numpy.asarray`` takes) that share one dtype that the semiring takes.
        semiring: ``"maxplus"``, ``"minplus"``, ``"maxmul"`` or ``"andor"``.
        path: Contract the operands two at a time in this order instead (opt_einsum's format,
            as ``tropical.einsum_plan(...).path`` gives it: the two leave the list of operands
            and their product joins its end), for networks too large to contract left to
            right; exact where (x) is (integers, booleans, floats holding integers).
        max_bytes: The most bytes that one result (the output, an intermediate) may hold
            (default ``MAX_BYTES``, 1 GiB).

    Returns:
        The result, of the operands' dtype, with one axis per output index (0-d for
        ``"->"``-style outputs).

    Raises:
        TypeError: ``subscripts`` is not a str; ``max_bytes`` is not an int; the operands'
            dtypes differ, or the semiring does not take theirs.
        ValueError: ``semiring`` is not one of ``SEMIRINGS``; the subscripts are malformed (an
            ellipsis, more than one ``->``, a character that is not an index, an output index
            repeated or in no operand, another count of operands than given) or name more than
            64 indices for an operand or the output; an operand's dimensions are not the ones
            its subscripts name; an index has two sizes.
        ValueError: A step of ``path`` names no operand, or a position outside the operands
            left, or the path leaves more than one; the output or an intermediate would hold
            more than ``max_bytes``; a step would join more indices in one broadcast than a
            NumPy array has dimensions (64).
    """
    ring = lookup(semiring)
    inputs, output = parse_subscripts(subscripts, len(operands))
    check_max_bytes(max_bytes)
    arrays = [np.asarray(x) for x in operands]
    check_dtypes(ring, arrays)
    sizes = index_sizes(inputs, arrays)
    itemsize = arrays[0].dtype.itemsize
    bound = max_bytes_bound(max_bytes)
    check_output(output, sizes, itemsize=itemsize, limit=max_bytes, bound=bound)
    distinct = ["".join(dict.fromkeys(letters)) for letters in inputs]
    if path is not None:
        steps = _along(distinct, output, path)
        fix = (
            "pass a path with smaller intermediates (tropical.einsum_plan(subscripts, *shapes, "
            "optimize='auto-hq').path), or contract the network in slices"
        )
    else:
        steps = _left_to_right(distinct, output, sizes)
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
            _distinct_axes(x, letters, sizes) for x, letters in zip(arrays, inputs, strict=True)
        )
    )
    for number, step in enumerate(steps):
        chosen = [made.pop(i) for i in step.operands]
        made[len(inputs) + number] = _contract(ring, chosen, step.keep, sizes), step.keep
    ((x, letters),) = made.values()
    return np.ascontiguousarray(_align(x, letters, output)) if letters != output else x


def _left_to_right(inputs: Sequence[str], output: str, sizes: Mapping[str, int]) -> list[_Step]:
    """``einsum``'s order without a path: all operands in one broadcast when that is small;
    else, by distributivity, each index summed as soon as no later operand (nor the output)
    needs it: first each operand's own, then operand by operand. Exact, floats included,
    because x -> x (x) c is monotone (for max-times: on non-negative inputs, where it is
    defined)."""
    n = len(inputs)
    if n == 1 or (math.prod(sizes.values()) <= CHUNK_ELEMENTS and len(sizes) <= MAX_NDIM):
        return [_Step(tuple(range(n)), tuple(inputs), output)]
    steps: list[_Step] = []
    owners = Counter(i for letters in inputs for i in letters)  # operands holding each index
    terms: list[tuple[int, str]] = []  # each operand's number and indices after its own sums
    for k, letters in enumerate(inputs):
        keep = "".join(i for i in letters if owners[i] > 1 or i in output)
        if keep == letters:
            terms.append((k, letters))
        else:
            steps.append(_Step((k,), (letters,), keep))
            terms.append((n + len(steps) - 1, keep))
    later = Counter(i for _, letters in terms[1:] for i in letters)  # in operands not yet taken
    acc = terms[0]
    for k, term in enumerate(terms[1:], start=1):
        later.subtract(term[1])
        joint = dict.fromkeys(acc[1] + term[1])
        last = k == n - 1
        keep = output if last else "".join(i for i in joint if later[i] > 0 or i in output)
        steps.append(_Step((acc[0], term[0]), (acc[1], term[1]), keep))
        acc = (n + len(steps) - 1, keep)
    return steps


def _along(inputs: Sequence[str], output: str, path: Sequence[Sequence[int]]) -> list[_Step]:
    """The steps of ``path`` (opt_einsum's format), each keeping what later steps need."""
    n = len(inputs)
    live = [(k, letters) for k, letters in enumerate(inputs)]
    steps: list[_Step] = []
    for number, step in enumerate(path):
        positions = sorted({int(p) for p in step})
        if not positions or positions[-1] >= len(live) or positions[0] < 0:
            raise ValueError(f"einsum path step {number} {tuple(step)} names no live operands")
        chosen = [live[p] for p in positions]
        live = [t for i, t in enumerate(live) if i not in positions]
        later = set(output).union(*(letters for _, letters in live))
        joint = dict.fromkeys("".join(letters for _, letters in chosen))
        keep = "".join(x for x in joint if x in later) if live else output
        steps.append(_Step(tuple(k for k, _ in chosen), tuple(t for _, t in chosen), keep))
        live.append((n + number, keep))
    if len(live) != 1:
        raise ValueError(f"einsum path leaves {len(live)} operands, not one")
    return steps


def _distinct_axes(x: np.ndarray[Any, Any], letters: str, sizes: Mapping[str, int]) -> _Term:
    """``x`` with its repeated indices taken as diagonals: one axis per distinct letter."""
    distinct = "".join(dict.fromkeys(letters))
    if distinct == letters:
        return x, letters
    (term,) = input_terms([letters], [x.strides])
    view = np.lib.stride_tricks.as_strided(
        x, shape=[sizes[d] for d in distinct], strides=term.strides, writeable=False
    )
    return view, distinct


def _contract(
    ring: Semiring, terms: Sequence[_Term], out: str, sizes: Mapping[str, int]
) -> np.ndarray[Any, Any]:
    """The zero (+) the sum over the indices not in ``out`` of the terms' product (left to
    right), one axis per letter of ``out``, broadcast over all the terms' indices in blocks."""
    joint = out + "".join(dict.fromkeys(c for _, s in terms for c in s if c not in out))
    dtype = terms[0][0].dtype
    zero = ring.zero(dtype)
    # fmax / fmin skip NaN: a NaN input counts as the zero, as a NaN product does.
    add: np.ufunc = np.logical_or if ring.name == "andor" else np.fmax if ring.maximise else np.fmin
    result = np.full([sizes[c] for c in out], zero, dtype=dtype)
    shape = [sizes[c] for c in joint]
    if 0 in shape:  # nothing to sum: every cell (if any) is the empty sum
        return result
    aligned = [_align(x, letters, joint) for x, letters in terms]
    summed = tuple(range(len(out), len(joint)))
    for block in _blocks(shape):
        # An operand lacking an index has a broadcast axis of size 1 there: take all of it.
        parts = [
            x[tuple(b if n > 1 else slice(None) for b, n in zip(block, x.shape, strict=True))]
            for x in aligned
        ]
        product = parts[0]
        for part in parts[1:]:
            product = combine(ring, product, part)
        if summed:
            product = add.reduce(product, axis=summed)
        where = block[: len(out)]
        result[where] = add(result[where], product)  # (+) into the cells, from the zero
    return result


def _align(x: np.ndarray[Any, Any], letters: str, joint: str) -> np.ndarray[Any, Any]:
    """A view of ``x`` with one axis per letter of ``joint``, of size 1 where ``x`` lacks it."""
    x = x.transpose(sorted(range(len(letters)), key=lambda a: joint.index(letters[a])))
    return x[tuple(slice(None) if c in letters else np.newaxis for c in joint)]


def _blocks(shape: Sequence[int]) -> Iterator[tuple[slice, ...]]:
    """Slices cutting ``shape`` (no size 0 in it) into blocks of at most ``CHUNK_ELEMENTS``
    elements: single indices of the leading axes, a run of one axis, the trailing axes whole."""
    if not shape:
        yield ()
        return
    axis = next(a for a in range(len(shape)) if math.prod(shape[a + 1 :]) <= CHUNK_ELEMENTS)
    step = max(1, CHUNK_ELEMENTS // math.prod(shape[axis + 1 :]))
    rest = (slice(None),) * (len(shape) - axis - 1)
    for head in itertools.product(*(range(n) for n in shape[:axis])):
        for start in range(0, shape[axis], step):
            yield (*(slice(i, i + 1) for i in head), slice(start, start + step), *rest)
