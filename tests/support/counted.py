"""The GPU's counted run followed on the CPU: ``counted_run`` (or ``counted_slices``) driven
with NumPy arrays and the reference's counted product, as the counted contractions' and the
walks' tests follow every plan."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np
from hypothesis import strategies as st

from aionvrtc import tropical
from aionvrtc.tropical import SEMIRINGS, reference
from aionvrtc.tropical.networks._counted import counted_run, counted_slices
from aionvrtc.tropical.networks._counting import _contract_best  # the CPU's k-best step

__all__ = ["driven", "follow", "numpy_product", "pairwise_path"]


def follow(
    plan: Any,
    ring: str,
    arrays: Any,
    modulus: int | None = None,
    *,
    top: int | None = None,
    kept: dict[int, Any] | None = None,
    numbers: Any = None,
) -> Any:
    """``counted_run`` on NumPy arrays, each step by the reference's counted product, or with
    ``top`` by the CPU's k-best step (the reference's ``einsum(..., top=k)``'s); in slices
    (``counted_slices``: counts joined, lists merged) where ``plan`` has a slicing, the slices
    ``numbers`` alone where given. ``kept`` as ``counted_run`` takes it (each step's values
    into it)."""
    semiring = SEMIRINGS[ring]
    product = numpy_product(ring, modulus=modulus, top=top)
    slicing = plan.slicing
    if slicing is None:
        run = counted_run(plan, semiring, arrays, xp=np, product=product, top=top, kept=kept)
    else:
        views = slicing.views(plan.inputs, arrays, 0)
        each = tropical.einsum_plan(slicing.subscripts, *views, optimize=plan.path)
        run = counted_slices(plan, each, semiring, arrays, xp=np, product=product,
                             modulus=modulus, top=top, numbers=numbers)  # fmt: skip
    return driven(run)


def driven(run: Generator[Any, Any, Any]) -> Any:
    """What a body that needs nothing done returns."""
    try:
        next(run)
    except StopIteration as done:
        return done.value
    raise AssertionError("the run asked for something")


def numpy_product(ring: str, *, modulus: int | None = None, top: int | None = None) -> Any:
    """A counted run's step on NumPy arrays: the reference's counted product (modulo
    ``modulus``), or with ``top`` the CPU's k-best step."""
    semiring = SEMIRINGS[ring]

    def product(a: Any, b: Any, na: Any, nb: Any) -> Generator[Any, Any, tuple[Any, Any]]:
        if top is None:
            made = reference.matmul(a, b, ring, counts=(na, nb), modulus=modulus)
        else:
            batch = max(a.shape[0], b.shape[0])
            a, na = (np.broadcast_to(x, (batch, *x.shape[1:])) for x in (a, na))
            b, nb = (np.broadcast_to(x, (batch, *x.shape[1:])) for x in (b, nb))
            sizes = {"b": batch, "m": a.shape[1], "k": a.shape[2], "n": b.shape[2]}
            terms = [(a, na, "bmk"), (b, nb, "bkn")]
            made = _contract_best(semiring, terms, "bmn", sizes, top, number=0, counting=True)
        return made  # type: ignore[no-any-return]
        yield  # (a body that needs nothing done)

    return product


def pairwise_path(data: st.DataObject, n: int) -> list[tuple[int, ...]]:
    """A random order of pairs, as the GPU's plans take them; for one operand, its own sums
    as a step."""
    if n == 1:
        return [(0,)]
    path: list[tuple[int, ...]] = []
    while n > 1:
        picked = data.draw(st.permutations(range(n)), label="order")[:2]
        path.append(tuple(sorted(picked)))
        n -= 1
    return path
