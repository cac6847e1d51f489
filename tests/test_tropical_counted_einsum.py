"""Counted contractions followed on the CPU: the GPU's run (``einsum(..., count=True)``: each
plan step a counted product over the step's views, copies where the plan copies) driven with
NumPy and the reference's counted product, against ``reference.einsum(..., count=True)``, on
drawn networks in drawn memory layouts and along drawn orders; and the GPU call's checks."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aionvrtc import tropical
from aionvrtc.tropical import SEMIRINGS, reference
from aionvrtc.tropical.networks._counted import count_bound, counted_run, joined
from aionvrtc.tropical.networks._residues import moduli

from .support.einsum import (
    CASES,
    IDS,
    expressions,
    layouts,
    network_values,
    random_network,
    relayout,
    with_output,
)
from .test_tropical_counting import exact_operands


def follow(plan: Any, ring: str, arrays: Any, modulus: int | None = None) -> Any:
    """``counted_run`` on NumPy arrays, each step by the reference's counted product."""

    def product(a: Any, b: Any, na: Any, nb: Any) -> Generator[Any, Any, tuple[Any, Any]]:
        made = reference.matmul(a, b, ring, counts=(na, nb), modulus=modulus)
        return made  # type: ignore[no-any-return]
        yield  # (a body that needs nothing done)

    run = counted_run(plan, SEMIRINGS[ring], arrays, xp=np, product=product)
    try:
        next(run)
    except StopIteration as done:
        return done.value
    raise AssertionError("the run asked for something")


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


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
@settings(derandomize=True, max_examples=150, deadline=None)
@given(data=st.data())
def test_the_gpus_counted_run_follows_every_plan(
    ring: str, dtype: Any, data: st.DataObject
) -> None:
    dtype = np.dtype(dtype)
    subscripts, drawn = data.draw(expressions(ring, dtype))
    operands = exact_operands(data, ring, dtype, drawn)
    # Each operand in a drawn memory layout (transposed, reversed, with gaps): the plan reads
    # it in place or copies it, and its counts lie alike.
    viewed = [relayout(x, *data.draw(layouts(x.ndim))) for x in operands]
    want_value, want = reference.einsum(subscripts, *operands, semiring=ring, count=True)
    path = pairwise_path(data, len(operands))
    for optimize in ("greedy", path):
        plan = tropical.einsum_plan(subscripts, *viewed, optimize=optimize)
        value, count = follow(plan, ring, viewed)
        np.testing.assert_array_equal(value, want_value)
        np.testing.assert_array_equal(count, want)
        assert count.dtype == np.int64
        # Modulo a prime, the same counts' residues.
        _, residues = follow(plan, ring, viewed, modulus=7)
        np.testing.assert_array_equal(residues, want % 7)


@pytest.mark.parametrize(("ring", "dtype"), [("maxplus", "int32"), ("minplus", "float64")])
def test_larger_networks_in_shuffled_layouts_count_as_the_reference(ring: str, dtype: str) -> None:
    """Networks of 6 to 10 tensors of up to three indices of size 2 or 3, a diagonal, some
    with output indices, each operand transposed, reversed or gapped: plans that copy."""
    seed = 55
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    copies = 0
    for _ in range(12):
        subscripts, shapes = random_network(rng, int(rng.integers(6, 11)), int(rng.integers(5, 9)))
        if rng.random() < 0.5:
            subscripts = with_output(rng, subscripts)
        operands = network_values(rng, ring, dtype, shapes)
        viewed = []
        for x in operands:
            perm = [int(i) for i in rng.permutation(x.ndim)]
            viewed.append(
                relayout(x, perm, list(rng.random(x.ndim) < 0.5), bool(rng.random() < 0.5))
            )
        want_value, want = reference.einsum(subscripts, *operands, semiring=ring, count=True)
        plan = tropical.einsum_plan(subscripts, *viewed, optimize="greedy")
        copies += sum(v is not None and v.copy is not None
                      for step in plan.steps for v in (step.first, step.second))  # fmt: skip
        value, count = follow(plan, ring, viewed)
        np.testing.assert_array_equal(value, want_value)
        np.testing.assert_array_equal(count, want)
    assert copies >= 5  # (the plans copied: the copies' order is followed too)


def test_counts_past_int64_are_joined_from_their_residues() -> None:
    # 52 variables of 4 values, no constraint: 4^52 = 2^104 assignments attain the maximum, 0.
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [
        chr(c) for c in range(ord("A"), ord("Z") + 1)
    ]
    names = letters[:52]
    subscripts = ",".join(names) + "->"
    operands = [np.zeros(4, np.int64) for _ in names]
    plan = tropical.einsum_plan(subscripts, *operands)
    assert count_bound(plan) == 4**52
    value, count = follow(plan, "maxplus", operands)
    assert int(value) == 0
    assert int(count) == -1  # past int64: the exact run marks it
    primes = moduli(count_bound(plan))
    residues = [np.asarray(follow(plan, "maxplus", operands, modulus=p)[1]) for p in primes]
    assert joined(residues, primes) == 4**52
    want = reference.einsum(subscripts, *operands, count=True)[1]
    assert want == 4**52


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"count": True, "argmax": True}, ValueError, "pass count=True or argmax=True, not both"),
        ({"count": "yes"}, TypeError, "count must be True or False, got str"),
        ({"count": True, "memory_limit": 1 << 20}, ValueError, "count=True runs whole"),
    ],
)
def test_a_counted_einsums_arguments_are_checked_first(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    a = np.zeros((2, 3), np.float32)
    with pytest.raises(error, match=message):
        tropical.einsum_sync("ij,jk->ik", a, a.T, **options)
