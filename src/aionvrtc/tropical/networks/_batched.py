"""A network over a batch of queries, as JAX's ``vmap`` makes one: the operands that vary take
a leading index of their own (the batch's), which every step that reads them keeps and the
result leads with; the operands that every query shares keep their shapes, and the steps
among them alone run once for the whole batch. The order is the query's own (its plan's
path), so a batched program does per query what the program of one does."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import opt_einsum

from ._plan import EinsumPlan

__all__ = ["batched_network", "check_batch"]


def check_batch(batch: Any, batched: Any, count: int) -> tuple[int, tuple[int, ...]]:
    """``batch`` and ``batched`` (the positions of the operands that vary, None: all of the
    ``count``) checked: the batch's size and the positions, sorted."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive int (the queries in one replay), got {batch!r}")
    if batched is None:
        return batch, tuple(range(count))
    try:
        positions = list(batched)
    except TypeError:
        raise TypeError(
            f"batched must be the positions of the operands that vary (such as [0, 2]), not "
            f"{type(batched).__name__}"
        ) from None
    for position in positions:
        if isinstance(position, bool | np.bool_) or not isinstance(position, int | np.integer):
            raise TypeError(f"batched holds operand positions (ints), not {position!r}")
        if not 0 <= position < count:
            raise ValueError(
                f"batched names operand {position}, and there are {count} (0 to {count - 1})"
            )
    if not positions or len(set(positions)) != len(positions):
        raise ValueError(
            f"batched must name each varying operand once, and at least one; got {positions}"
        )
    return batch, tuple(sorted(int(p) for p in positions))


def batched_network(
    plan: EinsumPlan, shapes: Sequence[tuple[int, ...]], size: int, batched: Sequence[int]
) -> tuple[str, list[tuple[int, ...]], str]:
    """The subscripts and shapes of ``plan``'s network over ``size`` queries, the operands at
    ``batched`` with a leading axis of ``size``; and the batch's index (the first symbol that
    no input uses)."""
    used = set("".join(plan.inputs))
    symbol = next(s for s in map(opt_einsum.get_symbol, range(len(used) + 1)) if s not in used)
    terms = [symbol + t if i in batched else t for i, t in enumerate(plan.inputs)]
    subscripts = ",".join(terms) + "->" + symbol + plan.output
    made = [(size, *shape) if i in batched else tuple(shape) for i, shape in enumerate(shapes)]
    return subscripts, made, symbol
