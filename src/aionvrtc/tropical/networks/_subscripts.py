"""The einsum grammar, shared by the NumPy reference and the GPU einsum (same rules, same
messages): subscripts parsed, index sizes gathered, operand dtypes checked, and the bounds on
dimensions and on the size of what a contraction makes."""

from __future__ import annotations

import math
import string
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from ..products import Semiring, check_size

__all__ = [
    "MAX_INDICES",
    "MAX_NDIM",
    "NetworkSubscripts",
    "check_dtypes",
    "check_output",
    "check_semiring",
    "index_sizes",
    "parse_subscripts",
]

# The most dimensions an array has (NumPy's NPY_MAXDIMS, CuPy's MAX_NDIM): no operand and no
# output can have more, so subscripts that name more are refused while parsing, in one pass
# over the string, before shapes are read or strides built (for 1,000,000 letters those were
# integers of up to a million bits each: 15 s, then MemoryError).
MAX_NDIM = 64
# The most indices a contraction can have: one character each, as opt_einsum.get_symbol(i) names
# the i-th (the planner renames every index so, tropical.problems names each vertex so), and it
# has 1,112,064 of them: chr(i + 2048) for the last, U+10FFFF, past the 2,048 surrogates skipped.
MAX_INDICES = 1_112_064
_SUM_SOME = "sum some of them away (name an output without them after '->')"


class NetworkSubscripts(str):
    """The subscripts of a network whose tensors hold one semiring's zero where an assignment is
    forbidden (a problem's network, ``tropical.problems``): a str, that also names the semiring
    and what the network is, so that a contraction in another semiring is refused. Read under
    another semiring the same tensors give a number that answers no question (a spin glass's
    highest energy as its ground state, a forbidden set as the best), silently."""

    __slots__ = ("semiring", "what")
    semiring: str
    what: str

    def __new__(cls, text: str, semiring: str, what: str) -> NetworkSubscripts:
        made = super().__new__(cls, text)
        made.semiring, made.what = semiring, what
        return made

    def __reduce__(self) -> tuple[Any, ...]:  # (pickled to Ray's workers with its semiring)
        return NetworkSubscripts, (str(self), self.semiring, self.what)


def check_semiring(subscripts: object, semiring: object) -> None:
    """Refuse a network's subscripts (``NetworkSubscripts``) in another semiring than its own."""
    own = getattr(subscripts, "semiring", None)
    asked = getattr(semiring, "name", semiring)  # (a Semiring, or its name)
    if isinstance(subscripts, NetworkSubscripts) and asked != own:
        raise ValueError(
            f"these subscripts are {subscripts.what}'s network, whose tensors are contracted in "
            f"{own!r}, not {asked!r}: pass semiring={own!r} (problem.semiring), or ask "
            "problem.solve(...) for the property, which picks the semiring"
        )


def _is_index(ch: str) -> bool:
    # NumPy's letters, and beyond them what opt_einsum.get_symbol hands out for networks of more
    # than 52 indices: every non-ASCII character (the ASCII rest is grammar or a typo).
    return ch in string.ascii_letters or (ord(ch) > 127 and not ch.isspace())


def parse_subscripts(subscripts: object, count: int) -> tuple[list[str], str]:
    """The operands' subscripts and the output's (the implicit one worked out)."""
    if not isinstance(subscripts, str):
        raise TypeError(
            f"einsum subscripts must be a str such as 'ij,jk->ik', got {type(subscripts).__name__}"
        )
    text = subscripts.replace(" ", "")  # NumPy ignores spaces too
    if "." in text:
        raise ValueError(
            f"einsum subscripts {subscripts!r} use an ellipsis '...', which is not supported; "
            "name every dimension with a letter"
        )
    if text.count("->") > 1:
        raise ValueError(f"einsum subscripts {subscripts!r} have more than one '->'")
    lhs, arrow, rhs = text.partition("->")
    for ch in lhs.replace(",", "") + rhs:
        if not _is_index(ch):
            raise ValueError(
                f"einsum subscripts {subscripts!r} contain {ch!r}; indices are the letters a-z "
                "and A-Z and any non-ASCII character (opt_einsum.get_symbol(i) names the i-th), "
                "operands are separated by ',' and the output follows '->'"
            )
    inputs = lhs.split(",")
    if len(inputs) != count:
        raise ValueError(
            f"einsum subscripts {subscripts!r} name {len(inputs)} operand(s) but {count} were given"
        )
    for i, letters in enumerate(inputs):
        _check_ndim(f"operand {i}'s subscripts name", letters, "give one letter per dimension")
    _check_ndim("output names", rhs, _SUM_SOME)
    counts = Counter(lhs.replace(",", ""))
    if len(counts) > MAX_INDICES:
        raise ValueError(
            f"einsum subscripts name {len(counts):,} distinct indices, more than the "
            f"{MAX_INDICES:,} opt_einsum.get_symbol names (one character per index, which the "
            "planner renames them to): contract the network in parts"
        )
    if not arrow:
        implicit = "".join(sorted(x for x, n in counts.items() if n == 1))
        _check_ndim("implicit output (each index that appears once) has", implicit, _SUM_SOME)
        return inputs, implicit
    for x, n in Counter(rhs).items():
        if n > 1:
            raise ValueError(
                f"einsum output index {x!r} appears more than once in {subscripts!r}; "
                "take a diagonal on the input side instead ('ii->i')"
            )
        if x not in counts:
            raise ValueError(
                f"einsum output index {x!r} appears in no operand in {subscripts!r}; "
                "every output index must be an index of some operand"
            )
    return inputs, rhs


def _check_ndim(what: str, letters: str, fix: str) -> None:
    if len(letters) > MAX_NDIM:
        raise ValueError(
            f"einsum {what} {len(letters):,} indices, more than the {MAX_NDIM} dimensions an "
            f"array can have (NumPy's and CuPy's bound); {fix}"
        )


def check_output(
    output: str, sizes: Mapping[str, int], *, itemsize: int, limit: int, bound: str
) -> None:
    """``check_size`` for the output, checked first: no order of contraction helps there."""
    check_size(
        f"einsum output {output!r}",
        math.prod(sizes[i] for i in output),
        itemsize=itemsize,
        limit=limit,
        bound=bound,
        fix="every order of contraction ends with it: compute it in slices (fix some output "
        "indices by indexing the operands) or contract a smaller network",
    )


def check_dtypes(ring: Semiring, arrays: Sequence[Any]) -> None:
    # No promotion, as in matmul: the kernels take one element type.
    for i, x in enumerate(arrays):
        if x.dtype != arrays[0].dtype:
            raise TypeError(
                f"einsum operands must have one dtype, got {arrays[0].dtype} (operand 0) and "
                f"{x.dtype} (operand {i}); convert them with .astype()"
            )
    ring.check_dtype(arrays[0].dtype, "einsum operand 0")


def index_sizes(inputs: Sequence[str], arrays: Sequence[Any]) -> dict[str, int]:
    seen: dict[str, tuple[int, int]] = {}  # letter -> (size, the operand it was first seen in)
    for i, (letters, x) in enumerate(zip(inputs, arrays, strict=True)):
        if x.ndim != len(letters):
            raise ValueError(
                f"einsum operand {i} has {x.ndim} dimension(s) (shape {x.shape}) but its "
                f"subscripts {letters!r} name {len(letters)}; give one letter per dimension"
            )
        for letter, n in zip(letters, x.shape, strict=True):
            size, first = seen.setdefault(letter, (n, i))
            if size != n:
                raise ValueError(
                    f"einsum index {letter!r} has size {size} in operand {first} and {n} in "
                    f"operand {i}; an index must have one size everywhere"
                )
    return {letter: size for letter, (size, _) in seen.items()}
