"""The einsum grammar, shared by the NumPy reference and the GPU einsum (same rules, same
messages): subscripts parsed, index sizes gathered, operand dtypes checked."""

from __future__ import annotations

import string
from collections import Counter
from collections.abc import Sequence
from typing import Any

from ._semirings import Semiring

__all__ = ["check_dtypes", "index_sizes", "parse_subscripts"]


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
    counts = Counter(lhs.replace(",", ""))
    if not arrow:
        return inputs, "".join(sorted(x for x, n in counts.items() if n == 1))
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
