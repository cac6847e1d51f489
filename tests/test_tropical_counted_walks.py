"""Every optimum on the GPU, followed on the CPU: the walk of ``tropical.configurations``
(``_counted_walks.walk``: the counted run's kept values, then every row extended at each step
in array work) driven with NumPy over the GPU's plans, against ``reference.configurations`` on
drawn scalar networks, in drawn layouts and orders, with the planner's split and relocated sums;
and the GPU call's checks, made before anything touches a device."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aionvrtc import tropical
from aionvrtc.tropical import SEMIRINGS, reference
from aionvrtc.tropical.networks import _counted_walks
from aionvrtc.tropical.networks._counted_walks import (
    check_walk,
    check_walked_plan,
    in_order,
    walk,
    walked_indices,
)

from .support.counted import follow, pairwise_path
from .support.einsum import (
    CASES,
    IDS,
    exact_operands,
    expressions,
    layouts,
    network_values,
    random_network,
    relayout,
    shuffled,
    sliced_plan,
)


def walked(plan: Any, ring: str, arrays: Any, *, first: bool = False, gather: int = 1 << 22) -> Any:
    """The rows ``configurations`` finds along ``plan`` over NumPy ``arrays``, in order."""
    kept: dict[int, Any] = {}
    follow(plan, ring, arrays, kept=kept)
    rows = walk(plan, SEMIRINGS[ring], arrays, kept, xp=np, first=first, gather=gather)
    assert not kept  # (each step's values taken out as the walk passed them)
    return in_order(np, rows)


def tied_values(rng: np.random.Generator, ring: str, dtype: Any, shapes: Any) -> list[Any]:
    """Values from few (0 to 2, or 1 and 2 for max-times: exact products, many ties), a
    tenth of them the semiring's zero."""
    zero = SEMIRINGS[ring].zero(np.dtype(dtype))
    low = 1 if ring == "maxmul" else 0
    return [
        np.where(rng.random(shape) < 0.1, zero, rng.integers(low, 3, size=shape)).astype(dtype)
        for shape in shapes
    ]


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
@settings(derandomize=True, max_examples=120, deadline=None)
@given(data=st.data())
def test_the_walk_lists_the_references_assignments(
    ring: str, dtype: Any, data: st.DataObject
) -> None:
    dtype = np.dtype(dtype)
    subscripts, drawn = data.draw(expressions(ring, dtype))
    subscripts = subscripts.partition("->")[0] + "->"  # (a scalar contraction)
    operands = exact_operands(data, ring, dtype, drawn)
    viewed = [relayout(x, *data.draw(layouts(x.ndim))) for x in operands]
    _, letters, want = reference.configurations(subscripts, *operands, semiring=ring,
                                                limit=1 << 20)  # fmt: skip
    for optimize in ("greedy", pairwise_path(data, len(operands))):
        plan = tropical.einsum_plan(subscripts, *viewed, optimize=optimize)
        assert walked_indices(plan) == letters
        rows = walked(plan, ring, viewed)
        assert rows.dtype == np.int64
        np.testing.assert_array_equal(rows, want)
        # In gathers of a pair or two at a time, the same rows.
        np.testing.assert_array_equal(walked(plan, ring, viewed, gather=2), want)
        # The first alone: one of them.
        firsts = walked(plan, ring, viewed, first=True)
        assert len(firsts) == min(len(want), 1)
        assert all(any((one == row).all() for row in want) for one in firsts)


@pytest.mark.parametrize(("ring", "dtype"), [("maxplus", "int32"), ("minplus", "float64"),
                                             ("maxmul", "float32")])  # fmt: skip
def test_larger_networks_in_shuffled_layouts_walk_as_the_reference(ring: str, dtype: str) -> None:
    """Networks of 6 to 10 tensors of up to three indices of size 2 or 3, a diagonal, each
    operand transposed, reversed or gapped, the values drawn from few so that many tie."""
    seed = 61
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    listed = 0
    for _ in range(10):
        subscripts, shapes = random_network(rng, int(rng.integers(6, 11)), int(rng.integers(5, 9)))
        operands = tied_values(rng, ring, dtype, shapes)
        viewed = [shuffled(rng, x) for x in operands]
        _, _, want = reference.configurations(subscripts, *operands, semiring=ring,
                                              limit=1 << 20)  # fmt: skip
        plan = tropical.einsum_plan(subscripts, *viewed, optimize="greedy")
        np.testing.assert_array_equal(walked(plan, ring, viewed), want)
        listed += len(want)
    assert listed >= 20  # (networks with many optima were walked)


def test_a_split_sum_is_walked_as_the_one_step_it_stands_for() -> None:
    """A scalar's last product over a long K is cut in parts (a split index, then the sum of
    the partials): its rows are those of the sum over the whole K."""
    seed = 62
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 4, size=(2, 1024)).astype(np.int32)
    b = rng.integers(0, 4, size=(1024, 2)).astype(np.int32)
    plan = tropical.einsum_plan("ij,jk->", a, b, optimize=[(0, 1)])
    assert any(step.split is not None for step in plan.steps)
    _, _, want = reference.configurations("ij,jk->", a, b, limit=1 << 20)
    assert len(want) > 1
    np.testing.assert_array_equal(walked(plan, "maxplus", [a, b]), want)


def test_a_relocated_sum_is_walked_through_its_partials() -> None:
    """A batched product of few outputs over a long K keeps K's outermost index as a batch
    index, summed by a reduction after: the walk fixes it there, the rest at the product."""
    seed = 63
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 3, size=(2, 4, 256)).astype(np.int64)
    y = rng.integers(0, 3, size=(2, 4, 256)).astype(np.int64)
    z = rng.integers(0, 3, size=2).astype(np.int64)
    plan = tropical.einsum_plan("bxy,bxy,b->", x, y, z, optimize=[(0, 1), (0, 1)])
    assert any(len(step.operands) == 1 for step in plan.steps)  # (the partials' reduction)
    assert not any(step.split for step in plan.steps)
    _, _, want = reference.configurations("bxy,bxy,b->", x, y, z, limit=1 << 20)
    assert len(want) >= 1
    np.testing.assert_array_equal(walked(plan, "maxplus", [x, y, z]), want)


def test_no_rows_where_the_value_is_the_zero_and_one_of_a_lone_scalar() -> None:
    zero = SEMIRINGS["maxplus"].zero(np.dtype(np.float32))
    x = np.full((2, 3), zero, np.float32)
    plan = tropical.einsum_plan("ij->", x)
    assert walked(plan, "maxplus", [x]).shape == (0, 2)
    scalar = np.asarray(np.float32(2.5))
    plan = tropical.einsum_plan("->", scalar)
    assert walked(plan, "maxplus", [scalar]).shape == (1, 0)
    empty = np.zeros((2, 0), np.float32)
    plan = tropical.einsum_plan("ij->", empty)
    assert walked(plan, "maxplus", [empty]).shape == (0, 2)


def test_every_maximum_independent_set_of_a_cycle() -> None:
    """The 5-cycle's maximum independent sets: its 5 pairs of vertices two apart."""
    names = "abcde"
    edges = [(i, (i + 1) % 5) for i in range(5)]
    vertex = np.array([0, 1], np.int64)
    zero = SEMIRINGS["maxplus"].zero(np.dtype(np.int64))
    edge = np.array([[0, 0], [0, zero]], np.int64)
    subscripts = ",".join([*names, *(names[u] + names[v] for u, v in edges)]) + "->"
    operands = [vertex] * 5 + [edge] * 5
    plan = tropical.einsum_plan(subscripts, *operands, optimize="greedy")
    rows = walked(plan, "maxplus", operands)
    assert walked_indices(plan) == "abcde"
    assert sorted(tuple(np.flatnonzero(r).tolist()) for r in rows) == [
        (0, 2), (0, 3), (1, 3), (1, 4), (2, 4)
    ]  # fmt: skip


def test_the_calls_arguments_are_checked_before_any_device() -> None:
    with pytest.raises(TypeError, match="limit must be an int, got float"):
        check_walk(2.0, False)
    with pytest.raises(TypeError, match="limit must be an int, got bool"):
        check_walk(True, False)
    with pytest.raises(ValueError, match="limit must be at least 1, got 0"):
        check_walk(0, False)
    with pytest.raises(TypeError, match="first must be True or False, got int"):
        check_walk(3, 1)
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match=r"^configurations takes a scalar contraction .* 'i'"):
        check_walked_plan(tropical.einsum_plan("ij->i", x), np.float32, 0)
    with pytest.raises(ValueError, match="limit must be at least 1, got -3"):
        tropical.configurations_sync("ij->", x, limit=-3)
    with pytest.raises(TypeError, match=r"cupy\.asarray"):  # (a NumPy array: named, with the fix)
        tropical.configurations_sync("ij->", x)


def test_a_sliced_plan_and_kept_values_past_the_device_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seed = 64
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    subscripts, shapes = random_network(rng, 8, 7)
    operands = network_values(rng, "maxplus", "int64", shapes)
    sliced = sliced_plan(subscripts, operands)
    assert sliced.slicing is not None
    with pytest.raises(ValueError, match="runs in slices: pass a plan without a slicing"):
        check_walked_plan(sliced, np.int64, 0)
    plan = tropical.einsum_plan(subscripts, *operands)
    kept = sum(step.size for step in plan.steps) * 8
    largest = max(step.size for step in plan.steps) * 16  # (a step with its counts)
    assert kept > largest
    monkeypatch.setattr(_counted_walks, "device_bytes", lambda device: largest)
    monkeypatch.setattr(tropical.networks._runs, "device_bytes", lambda device: largest)
    with pytest.raises(ValueError, match=rf"kept values \(every step's\) would hold .* \({kept:,} "
                       r"bytes at 8 each\), more than the"):  # fmt: skip
        check_walked_plan(plan, np.int64, 0)
