"""A compiled contraction's groups of steps (no GPU): chains within tropical_many's row, and,
contracted as the kernel contracts them (each group's tensors folded in its leaves' order, the
sum over its summed indices in C order, the first best winning), the same values as the steps
apart, exactly (floats with infinities included), and a backtrace over the groups that attains
the value."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from aionvrtc.tropical import SEMIRINGS, einsum_plan, reference
from aionvrtc.tropical.networks._backtrace import assignment_of, backtrace_code, follow
from aionvrtc.tropical.networks._fusion import FUSE_K, FUSE_WORK, grouped_plan, groups
from aionvrtc.tropical.networks._plan import EinsumPlan
from aionvrtc.tropical.networks._rows import LEAVES, MANY_OUT, MANY_SUMMED, Group
from aionvrtc.tropical.products import combine as _combine

from .support.einsum import (
    ARGMAX_CASES,
    CASES,
    IDS,
    check_assignment,
    kings_graph,
    network_values,
    random_network,
)

Array = np.ndarray[Any, Any]


def values(rng: np.random.Generator, ring: str, dtype: Any, shapes: Sequence[Any]) -> list[Array]:
    """Small integers with the semiring's zero among them; floats: any values, a tenth of them
    infinite of either sign (max-times, defined for non-negative values: zeros and +inf)."""
    if np.dtype(dtype).kind != "f":
        drawn = network_values(rng, ring, dtype, shapes)
        return [np.abs(x) for x in drawn] if ring == "maxmul" else drawn
    out = []
    for shape in shapes:
        x = rng.standard_normal(shape) * 10
        if ring == "maxmul":
            x = np.abs(x)
        pick = rng.random(shape)
        x = np.where(pick < 0.05, np.inf, x)
        x = np.where(pick > 0.95, SEMIRINGS[ring].zero(np.dtype(dtype)), x)
        out.append(x.astype(dtype))
    return out


def run_groups(
    plan: EinsumPlan, made: Sequence[Group], ring: str, arrays: Sequence[Array]
) -> tuple[Array, list[Array]]:
    """``made`` contracted as tropical_many does; the result in the output's order, and each
    group's argmax (its winner over the summed values in C order, -1 for the zero)."""
    semiring = SEMIRINGS[ring]
    sizes, inputs = plan.sizes, len(plan.terms)
    results: dict[int, Array] = {}
    argmaxes = []
    for group in made:
        root = plan.steps[group.root]
        full = [i for i in root.result if sizes[i] != 1] + list(group.summed)
        folded: Array | None = None
        for o in group.leaves:
            if o < inputs:
                term, x = plan.terms[o], arrays[o]
                leaf = np.lib.stride_tricks.as_strided(
                    x,
                    [sizes[i] for i in term.indices],
                    [s * x.itemsize for s in term.strides],
                )
                indices = term.indices
            else:
                leaf, indices = results[o - inputs], plan.steps[o - inputs].result
            leaf = _spread(leaf, indices, full, sizes)
            folded = leaf if folded is None else _combine(semiring, folded, leaf)
        assert folded is not None
        outputs = math.prod(sizes[i] for i in root.result)
        block = np.broadcast_to(folded, [sizes[i] for i in full]).reshape(outputs, group.k)
        zero = semiring.zero(block.dtype)
        if ring == "andor":
            best = block.any(axis=1)
        elif semiring.maximise:
            best = np.maximum(block.max(axis=1), zero)
        else:
            best = np.minimum(block.min(axis=1), zero)
        first = np.argmax(block == np.asarray(best)[:, None], axis=1)
        argmaxes.append(np.where(best == zero, -1, first))
        results[group.root] = best.reshape([sizes[i] for i in root.result])
    last = plan.steps[-1].result
    out = results[len(plan.steps) - 1].transpose([last.index(i) for i in plan.output])
    return out, argmaxes


def _spread(x: Array, indices: Sequence[str], full: Sequence[str], sizes: Any) -> Array:
    """``x`` (one axis per index) with an axis per index of ``full``, broadcast where it has
    none; its axes of size 1 dropped (``full`` has none)."""
    keep = [n for n, i in enumerate(indices) if sizes[i] != 1]
    x = x.reshape([sizes[indices[n]] for n in keep])
    held = [indices[n] for n in keep]
    assert set(held) <= set(full), (held, full)
    order = sorted(range(len(held)), key=lambda n: full.index(held[n]))
    x = x.transpose(order)
    return x.reshape([sizes[i] if i in held else 1 for i in full])


def networks(rng: np.random.Generator) -> list[tuple[str, list[tuple[int, ...]], Any]]:
    found: list[tuple[str, list[tuple[int, ...]], Any]] = []
    for count, indices in ((6, 5), (10, 8), (14, 10)):
        subscripts, shapes = random_network(rng, count, indices)
        found.append((subscripts, shapes, "auto"))
    subscripts, shapes, path = kings_graph(4)
    found.append((subscripts, shapes, path))
    # Outputs of their own and a final reordering.
    found.append(("ij,jk,kl,lm->mi", [(3, 4), (4, 2), (2, 3), (3, 5)], [(0, 1), (0, 2), (0, 1)]))
    return found


def check_groups(plan: EinsumPlan, made: Sequence[Group]) -> None:
    inputs, sizes = len(plan.terms), plan.sizes
    assert sorted(n for group in made for n in group.members) == list(range(len(plan.steps)))
    assert [group.root for group in made] == sorted(group.root for group in made)
    roots = {group.root for group in made}
    for group in made:
        assert group.root == group.members[-1]
        steps = [plan.steps[n] for n in group.members]
        # A chain: each step reads the one before it; the leaves are the first's operands,
        # then each later step's other operand, in order.
        leaves = list(steps[0].operands)
        for before, step in zip(group.members, steps[1:], strict=False):
            assert inputs + before in step.operands
            leaves += [o for o in step.operands if o != inputs + before]
        assert list(group.leaves) == leaves
        assert all(o < inputs or o - inputs in roots for o in group.leaves)
        assert all(o < inputs or o - inputs < group.root for o in group.leaves)
        summed = [i for step in steps for i in step.k if sizes[i] != 1]
        assert sorted(group.summed) == sorted(summed)
        if len(group.members) > 1:
            assert all(step.split is None for step in steps)
            assert group.k == math.prod(sizes[i] for i in group.summed)
            assert len(group.leaves) <= LEAVES
            assert len(group.summed) <= MANY_SUMMED
            assert sum(sizes[i] != 1 for i in steps[-1].result) <= MANY_OUT
            assert group.k <= FUSE_K
            assert steps[-1].size * group.k <= FUSE_WORK


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
def test_groups_contract_as_the_steps_apart(ring: str, dtype: Any) -> None:
    rng = np.random.default_rng(list(SEMIRINGS).index(ring) * 10 + np.dtype(dtype).itemsize)
    fused = 0
    for subscripts, shapes, optimize in networks(rng):
        operands = values(rng, ring, dtype, shapes)
        plan = einsum_plan(subscripts, *operands, optimize=optimize)
        made = groups(plan)
        check_groups(plan, made)
        fused += len(plan.steps) - len(made)
        got, _ = run_groups(plan, made, ring, operands)
        want = reference.einsum(subscripts, *operands, semiring=ring, path=plan.path)
        assert (got.shape, got.dtype) == (want.shape, want.dtype)
        np.testing.assert_array_equal(got, want, err_msg=f"{ring} {dtype} {subscripts}")
    assert fused >= 20  # steps that ran inside another's group


def test_a_chain_of_steps_is_shortened() -> None:
    """The king's graph row by row: one step after another on the critical path; in groups
    the path is at least twice as short, and every step of it is in a group of several."""
    subscripts, shapes, path = kings_graph(6)
    plan = einsum_plan(subscripts, *shapes, optimize=path)
    made = groups(plan)
    check_groups(plan, made)
    inputs = len(plan.terms)

    def depth(operands_of: dict[int, Sequence[int]]) -> int:
        level: dict[int, int] = {}
        for n in sorted(operands_of):
            made_by = [level[o - inputs] for o in operands_of[n] if o >= inputs]
            level[n] = 1 + max(made_by, default=0)
        return max(level.values())

    steps = depth({n: step.operands for n, step in enumerate(plan.steps)})
    grouped = depth({group.root: group.leaves for group in made})
    assert grouped * 2 <= steps, (grouped, steps)
    assert len(made) < len(plan.steps)


def test_a_step_whose_k_is_cut_in_parts_stays_alone() -> None:
    # ka,kb: K = 4096 over 6 outputs is cut in parts (a batch of 64), then the parts are
    # summed, and bc reads that sum.
    plan = einsum_plan("ka,kb,bc->ca", (4096, 2), (4096, 3), (3, 2))
    made = groups(plan)
    check_groups(plan, made)
    split = [n for n, step in enumerate(plan.steps) if step.split is not None]
    assert split
    assert all(group.members == (n,) for group in made for n in split if n in group.members)


@pytest.mark.parametrize(("ring", "dtype"), ARGMAX_CASES)
def test_the_backtrace_of_groups_attains_the_value(ring: str, dtype: str) -> None:
    rng = np.random.default_rng(list(SEMIRINGS).index(ring) * 10 + len(dtype) + 1)
    attained = 0
    cases: list[tuple[str, list[tuple[int, ...]], Any]] = [
        (*random_network(rng, int(rng.integers(6, 15)), int(rng.integers(5, 11))), "auto")
        for _ in range(20)
    ]
    cases.append(kings_graph(4))
    for subscripts, shapes, optimize in cases:
        operands = network_values(rng, ring, dtype, shapes)
        plan = einsum_plan(subscripts, *operands, optimize=optimize)
        made = groups(plan)
        value, argmaxes = run_groups(plan, made, ring, operands)
        code = backtrace_code(grouped_plan(plan, made), range(len(made)))

        def read(where: int, at: int, argmaxes: list[Array] = argmaxes) -> int:
            return int(argmaxes[where].flat[at])

        found = follow(code, len(made), len(plan.sizes), read)
        check_assignment(subscripts, operands, ring, value, assignment_of(plan, found))
        attained += int(value != SEMIRINGS[ring].zero(np.dtype(dtype)))
    assert attained >= 10
