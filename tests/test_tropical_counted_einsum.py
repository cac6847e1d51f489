"""Counted contractions followed on the CPU: the GPU's run (``einsum(..., count=True)``: each
plan step a counted product over the step's views, copies where the plan copies) driven with
NumPy and the reference's counted product, against ``reference.einsum(..., count=True)``, on
drawn networks in drawn memory layouts and along drawn orders; and the GPU call's checks."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aionvrtc import tropical
from aionvrtc.tropical import SEMIRINGS, reference
from aionvrtc.tropical.networks._counted import count_bound, join_counted, joined, merged
from aionvrtc.tropical.networks._residues import moduli

from .support.counted import driven, follow, numpy_product, pairwise_path
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
    with_output,
)


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
        viewed = [shuffled(rng, x) for x in operands]
        want_value, want = reference.einsum(subscripts, *operands, semiring=ring, count=True)
        plan = tropical.einsum_plan(subscripts, *viewed, optimize="greedy")
        copies += sum(v is not None and v.copy is not None
                      for step in plan.steps for v in (step.first, step.second))  # fmt: skip
        value, count = follow(plan, ring, viewed)
        np.testing.assert_array_equal(value, want_value)
        np.testing.assert_array_equal(count, want)
    assert copies >= 5  # (the plans copied: the copies' order is followed too)


def test_sliced_networks_join_their_slices_counts() -> None:
    seed = 57
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    sliced = 0
    for _ in range(10):
        subscripts, shapes = random_network(rng, int(rng.integers(6, 11)), int(rng.integers(6, 9)))
        if rng.random() < 0.5:
            subscripts = with_output(rng, subscripts, most=1)
        operands = network_values(rng, "maxplus", "int64", shapes)
        want_value, want = reference.einsum(subscripts, *operands, count=True)
        plan = sliced_plan(subscripts, operands)
        sliced += plan.slicing is not None
        for modulus in (None, 7):
            value, count = follow(plan, "maxplus", operands, modulus=modulus)
            np.testing.assert_array_equal(value, want_value)
            np.testing.assert_array_equal(count, want if modulus is None else want % modulus)
    assert sliced >= 5


def test_devices_shares_of_the_slices_join_into_the_whole() -> None:
    """Slice n on device n modulo their count (``counted_slices(..., numbers=)``), each
    device's part joined on the operands' (counts added, lists merged) as ``_over_lanes``
    joins them: the whole network's counts and lists."""
    seed = 58
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    spread = 0
    for lanes, top in ((2, None), (3, None), (2, 3), (3, 5), (4, None), (2, 2)):
        subscripts, shapes = random_network(rng, int(rng.integers(6, 11)), int(rng.integers(6, 9)))
        if rng.random() < 0.5:
            subscripts = with_output(rng, subscripts, most=1)
        operands = network_values(rng, "maxplus", "int64", shapes)
        plan = sliced_plan(subscripts, operands)
        if plan.slicing is None or plan.slicing.count < lanes:
            continue
        spread += 1
        parts = [
            follow(plan, "maxplus", operands, top=top,
                   numbers=range(n, plan.slicing.count, lanes))
            for n in range(lanes)
        ]  # fmt: skip
        total = parts[0]
        for part in parts[1:]:
            if top is None:
                total = join_counted(SEMIRINGS["maxplus"], np, total, part, None)
            else:
                merge = numpy_product("maxplus", top=top)
                total = driven(merged(SEMIRINGS["maxplus"], np, (total, part), product=merge,
                                      on=contextlib.nullcontext))  # fmt: skip
        want = reference.einsum(subscripts, *operands, count=top is None, top=top)
        np.testing.assert_array_equal(total[0], want[0])
        np.testing.assert_array_equal(total[1], want[1])
    assert spread >= 4


def test_sliced_networks_merge_their_slices_k_best_lists() -> None:
    seed = 59
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    sliced = 0
    for top in (2, 3, 5, 2, 3, 5):
        subscripts, shapes = random_network(rng, int(rng.integers(6, 11)), int(rng.integers(6, 9)))
        if rng.random() < 0.5:
            subscripts = with_output(rng, subscripts, most=1)
        operands = network_values(rng, "minplus", "float64", shapes)
        want = reference.einsum(subscripts, *operands, semiring="minplus", top=top)
        plan = sliced_plan(subscripts, operands)
        sliced += plan.slicing is not None
        values, counts = follow(plan, "minplus", operands, top=top)
        np.testing.assert_array_equal(values, want[0])
        np.testing.assert_array_equal(counts, want[1])
    assert sliced >= 3


def test_joined_pairs_keep_the_better_value_and_add_equal_ones() -> None:
    ring = SEMIRINGS["maxplus"]
    total = (np.array([1, 5, 5, 5]), np.array([3, 4, 1 << 62, 2]))
    part = (np.array([2, 5, 5, 4]), np.array([7, 6, 1 << 62, 9]))
    value, count = join_counted(ring, np, total, part, None)
    assert value.tolist() == [2, 5, 5, 5]
    assert count.tolist() == [7, 10, -1, 2]  # 2^63 passes int64: -1, never a wrapped count
    # Modulo a prime, of residues: equal values' counts add and wrap.
    total, part = (total[0], np.array([3, 4, 6, 2])), (part[0], np.array([6, 6, 5, 5]))
    assert join_counted(ring, np, total, part, 7)[1].tolist() == [6, 3, 4, 2]


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
@settings(derandomize=True, max_examples=100, deadline=None)
@given(data=st.data())
def test_the_gpus_k_best_run_follows_every_plan(ring: str, dtype: Any, data: st.DataObject) -> None:
    dtype = np.dtype(dtype)
    subscripts, drawn = data.draw(expressions(ring, dtype))
    operands = exact_operands(data, ring, dtype, drawn)
    viewed = [relayout(x, *data.draw(layouts(x.ndim))) for x in operands]
    top = data.draw(st.sampled_from([1, 2, 3, 5]), label="top")
    want = reference.einsum(subscripts, *operands, semiring=ring, top=top)
    plan = tropical.einsum_plan(subscripts, *viewed, optimize=pairwise_path(data, len(operands)))
    values, counts = follow(plan, ring, viewed, top=top)
    np.testing.assert_array_equal(values, want[0])
    np.testing.assert_array_equal(counts, want[1])


def test_the_k_best_of_larger_networks_in_shuffled_layouts() -> None:
    seed = 58
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    for top in (2, 4, 8):
        subscripts, shapes = random_network(rng, int(rng.integers(6, 11)), int(rng.integers(5, 9)))
        subscripts = with_output(rng, subscripts, most=1)
        operands = network_values(rng, "maxplus", "int32", shapes)
        viewed = [shuffled(rng, x) for x in operands]
        want = reference.einsum(subscripts, *operands, top=top)
        plan = tropical.einsum_plan(subscripts, *viewed, optimize="greedy")
        values, counts = follow(plan, "maxplus", viewed, top=top)
        np.testing.assert_array_equal(values, want[0])
        np.testing.assert_array_equal(counts, want[1])
        assert (counts[..., 1] > 0).any()  # (second best values exist: the lists are used)


def test_the_bound_on_a_count_takes_the_inputs_indices_not_the_planners() -> None:
    # A long sum into one output is cut in parts (a hidden index of the parts): the bound on
    # the count is the inputs' 4,096 assignments still.
    x = np.zeros(4096, np.float32)
    plan = tropical.einsum_plan("j,j->", x, x)
    assert set(plan.sizes) > {"j"}  # (the split's own index)
    assert count_bound(plan) == 4096
    value, count = follow(plan, "maxplus", [x, x])
    assert (float(value), int(count)) == (0.0, 4096)


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
        ({"count": True, "out": np.zeros((2, 2))}, ValueError, "return new arrays .*: pass no out"),
        ({"top": 17}, ValueError, "top must be at most 16 on the GPU .* got 17"),
        ({"top": 0}, ValueError, "top must be from 1 to 64, got 0"),
        ({"top": 2.0}, TypeError, "top must be an int"),
        ({"top": 2, "count": True}, ValueError, "pass count=True or top=k, not both"),
        ({"top": 2, "argmax": True}, ValueError, "pass top=k or argmax=True, not both"),
        ({"top": 2, "out": np.zeros((2, 2))}, ValueError, r"^count=True and top=k return new"),
    ],
)
def test_a_counted_einsums_arguments_are_checked_first(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    a = np.zeros((2, 3), np.float32)
    with pytest.raises(error, match=message):
        tropical.einsum_sync("ij,jk->ik", a, a.T, **options)


@pytest.mark.parametrize(
    ("operands", "options", "error", "message"),
    [
        (
            [(2, 3), (3, 2)],
            {"top": 17},
            ValueError,
            r"top must be at most 16 on the GPU \(each output's list is kept in registers\), "
            "got 17",
        ),
        ([(2, 3), (3, 2)], {"top": 0}, ValueError, "top must be from 1 to 64, got 0"),
        ([(2, 0), (0, 2)], {}, ValueError, "index 'j' has size 0, so the result is the"),
        ([(2, 3), (3, 2)], {"semiring": "andor"}, ValueError, "andor takes bool"),
        ([(2, 3), (3,)], {}, ValueError, r"operand 1 has 1 dimension\(s\)"),
        ([], {}, ValueError, "counted_program needs at least one operand"),
    ],
)
def test_a_counted_programs_arguments_are_checked_before_the_gpu(
    operands: list[Any], options: dict[str, Any], error: type[Exception], message: str
) -> None:
    subscripts = "ij,jk->ik" if len(operands) == 2 else ""
    with pytest.raises(error, match=message):
        tropical.counted_program_sync(subscripts, *operands, dtype="float32", device=0,
                                      **options)  # fmt: skip


def test_a_counted_program_refuses_a_sliced_plan_naming_einsum() -> None:
    subscripts, shapes = random_network(np.random.default_rng(7), 10, 8)
    operands = [np.zeros(s, np.float32) for s in shapes]
    plan = sliced_plan(subscripts, operands)
    assert plan.slicing is not None
    with pytest.raises(ValueError, match=r"the plan is sliced \(.* pass the plan to einsum"):
        tropical.counted_program_sync(subscripts, *operands, optimize=plan, device=0)
