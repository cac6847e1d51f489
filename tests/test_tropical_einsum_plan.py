"""tropical.einsum_plan on the CPU: the views and copies of each step worked out by hand, paths
(explicit, reused, refused), the bounds on dimensions, sizes and searches (einsum's too),
networks past 52 indices, reference.einsum along a path, every plan run step by step in NumPy
over its own strided views, and the kernels a plan names compiled for sm_90 with real NVRTC."""

from __future__ import annotations

import itertools
import re
import string
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import opt_einsum
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from aionvrtc import tropical
from aionvrtc.tropical import SEMIRINGS, EinsumPlan, einsum_plan, reference
from aionvrtc.tropical.networks import _planner, _runs
from aionvrtc.tropical.networks._backtrace import (
    Scan,
    assignment_of,
    backtrace_code,
    backtrace_program,
    follow,
    output_digits,
    output_values,
)
from aionvrtc.tropical.networks._kernel_specs import backtrace_spec, einsum_spec, many_spec
from aionvrtc.tropical.networks._terms import View, contiguous
from aionvrtc.tropical.products._semirings import semiring as lookup

from .support.einsum import (
    ARGMAX_CASES,
    CASES,
    CYCLE5,
    IDS,
    PETERSEN,
    Array,
    Trace,
    check_assignment,
    expressions,
    independent_sets,
    layouts,
    network_values,
    random_network,
    relayout,
    run_plan,
    with_output,
)
from .support.tropical_data import compile_each_for_sm_90

# -- helpers shared with test_tropical_einsum_gpu.py ------------------------------------------


@st.composite
def pair_paths(draw: st.DrawFn, count: int) -> list[tuple[int, ...]]:
    """A random contraction order of ``count`` operands in opt_einsum's format: two live
    operands at a time (in either order), the result joining the end of the list."""
    if count == 1:
        return [(0,)]
    path: list[tuple[int, ...]] = []
    for live in range(count, 1, -1):
        i = draw(st.integers(0, live - 1))
        j = draw(st.integers(0, live - 2))
        path.append((i, j + (j >= i)))
    return path


def small_values(ring: str, x: Array) -> Array:
    """``x`` with every value but the semiring's zero mapped into [-100, 100] (non-negative
    for max-times): no sum of a few of them saturates, so the order of the (x)'s cannot
    change a result. Max-times saturates associatively and and-or has nothing to map."""
    if ring in ("maxmul", "andor") or x.dtype.kind != "i":
        return x
    zero = SEMIRINGS[ring].zero(x.dtype)
    mapped = (x.astype(np.int64) % 201 - 100).astype(x.dtype)
    return np.where(x == zero, zero, mapped)


def random_operands(
    rng: np.random.Generator, ring: str, dtype: Any, shapes: Sequence[tuple[int, ...]]
) -> list[Array]:
    """Small integer values (non-negative for max-times, booleans for and-or)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return [np.asarray(rng.random(s) < 0.6) for s in shapes]
    low = 0 if ring == "maxmul" else -50
    return [np.asarray(rng.integers(low, 50, size=s)).astype(dtype) for s in shapes]


# -- argmax: networks and the check of an assignment -------------------------------------------


# -- copies, views and statistics worked out by hand --------------------------------------------


def _dims(view: View | None) -> tuple[Any, ...] | None:
    """A view's copy, shape, and strides where a dimension has more than one element (a
    single element is read whatever the stride)."""
    if view is None:
        return None
    strides = tuple(s if n > 1 else None for n, s in zip(view.shape, view.strides, strict=True))
    return view.copy, view.shape, strides


def _transposed(v: Array) -> Array:
    return np.ascontiguousarray(v.T).T  # a transposed view: F order


def _sliced(v: Array) -> Array:
    big = np.zeros((2 * v.shape[0], 2 * v.shape[1]), v.dtype)
    big[::2, 1::2] = v
    return big[::2, 1::2]


def _reversed(v: Array) -> Array:
    return np.ascontiguousarray(v[:, ::-1])[:, ::-1]


def _broadcast(v: Array) -> Array:
    return np.broadcast_to(v[0], v.shape)  # rows of stride 0


Operand = tuple[int, ...] | tuple[tuple[int, ...], Callable[[Array], Array]]

ZERO_COPIES: list[tuple[str, list[Operand]]] = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),  # the implicit output
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ij,jk->ik", [((3, 5), _transposed), ((5, 6), _transposed)]),
    ("ij,jk->ik", [((3, 5), _transposed), (5, 6)]),
    ("ij,kj->ik", [(3, 4), (5, 4)]),
    ("ij,jk->ki", [(3, 4), (4, 5)]),  # the product swapped: C^T = B^T A^T
    ("i,j->ij", [(3,), (4,)]),
    ("ij,ij->ij", [(3, 4), (3, 4)]),
    (",->", [(), ()]),
    ("i,->i", [(3,), ()]),
    ("ij->i", [(3, 4)]),
    ("ii->", [(3, 3)]),
    ("iij,jk->ik", [(3, 3, 4), (4, 5)]),
    ("ij,jk->ik", [((4, 3), _sliced), ((3, 5), _reversed)]),
    ("ij,jk->ik", [((3, 4), _broadcast), (4, 5)]),
]


@pytest.mark.parametrize(("subscripts", "operands"), ZERO_COPIES)
def test_products_of_views_copy_nothing(subscripts: str, operands: list[Operand]) -> None:
    rng = np.random.default_rng(1)
    arrays = []
    for operand in operands:
        shape, make = operand if len(operand) == 2 and callable(operand[1]) else (operand, None)
        (values,) = random_operands(rng, "maxplus", np.int64, [shape])
        arrays.append(make(values) if make is not None else values)
    plan = einsum_plan(subscripts, *arrays)
    assert (plan.copies, plan.copied_elements, plan.final_copy) == (0, 0, False), str(plan)
    assert all(v is None or v.copy is None for s in plan.steps for v in (s.first, s.second))
    # The shapes alone plan the same way when the operands are C ordered.
    if all(x.flags.c_contiguous for x in arrays):
        assert einsum_plan(subscripts, *(x.shape for x in arrays)) == plan
    # And the views read the right elements.
    want = reference.einsum(subscripts, *arrays)
    np.testing.assert_array_equal(run_plan(plan, "maxplus", arrays), want)


def test_the_views_of_a_matmul_and_a_batched_matmul() -> None:
    (step,) = einsum_plan("ij,jk->ik", (3, 4), (4, 5)).steps
    assert (step.operands, step.subscripts, step.swapped) == ((0, 1), "ij,jk->ik", False)
    assert (step.batch, step.m, step.k, step.n, step.result) == (
        (),
        ("i",),
        ("j",),
        ("k",),
        ("i", "k"),
    )
    assert _dims(step.first) == (None, (1, 3, 4), (None, 4, 1))
    assert _dims(step.second) == (None, (1, 4, 5), (None, 5, 1))

    plan = einsum_plan("bij,bjk->bik", (2, 3, 4), (2, 4, 5))
    (step,) = plan.steps
    assert (step.batch, step.m, step.k, step.n) == (("b",), ("i",), ("j",), ("k",))
    assert step.first == View(None, (2, 3, 4), (12, 4, 1))
    assert step.second == View(None, (2, 4, 5), (20, 5, 1))
    assert (plan.largest_intermediate, plan.products) == (2 * 3 * 5, 2 * 3 * 5 * 4)


def test_the_views_of_transposed_operands_are_their_strides() -> None:
    # F-ordered (3, 5) and (5, 6): i steps by 1 and j by 3; j by 1 and k by 5.
    (step,) = einsum_plan("ij,jk->ik", np.ones((5, 3)).T, np.ones((6, 5)).T).steps
    assert not step.swapped
    assert _dims(step.first) == (None, (1, 3, 5), (None, 1, 3))
    assert _dims(step.second) == (None, (1, 5, 6), (None, 1, 5))
    # C = A B written as C^T = B^T A^T: both operands row-major, the result in the output's order.
    (step,) = einsum_plan("ij,jk->ki", (3, 4), (4, 5)).steps
    assert step.swapped
    assert (step.m, step.k, step.n, step.result) == (("k",), ("j",), ("i",), ("k", "i"))
    assert _dims(step.first) == (None, (1, 5, 4), (None, 1, 5))  # jk read as (k, j)
    assert _dims(step.second) == (None, (1, 4, 3), (None, 1, 4))  # ij read as (j, i)


def test_the_views_of_a_hadamard_product_a_diagonal_and_a_private_sum() -> None:
    (step,) = einsum_plan("ij,ij->ij", (3, 4), (3, 4)).steps
    assert step.batch == ("i", "j")  # both indices merge into one batch of 12
    assert _dims(step.first) == _dims(step.second) == (None, (12, 1, 1), (1, None, None))
    (step,) = einsum_plan("ij->i", (3, 4)).steps
    assert (step.operands, step.second, step.m, step.k) == ((0,), None, ("i",), ("j",))
    assert _dims(step.first) == (None, (1, 3, 4), (None, 4, 1))
    # The trace: the diagonal steps by 3 + 1 elements.
    (step,) = einsum_plan("ii->", (3, 3)).steps
    assert (step.k, _dims(step.first)) == (("i",), (None, (1, 1, 3), (None, None, 4)))
    (step,) = einsum_plan("iij,jk->ik", (3, 3, 4), (4, 5)).steps
    assert _dims(step.first) == (None, (1, 3, 4), (None, 16, 1))


def test_a_plans_statistics_look_at_each_step_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # copies and copied_elements skip the steps read in place: that set is found once, not
    # once a step (which made them quadratic: minutes for a network of 4,703 steps).
    from aionvrtc.tropical.networks import _plan

    calls = []
    read_in_place = _plan.read_in_place  # what the plan asks of each step

    def counted(plan: Any, number: int) -> bool:
        calls.append(number)
        return read_in_place(plan, number)

    ring = ",".join(f"{a}{b}" for a, b in itertools.pairwise("abcdefghijklmnopqrstuvwxyza"))
    plan = einsum_plan(f"{ring}->", *[(4, 4)] * 26)
    monkeypatch.setattr(_plan, "read_in_place", counted)
    for statistic in ("copies", "copied_elements"):
        calls.clear()
        getattr(plan, statistic)
        assert sorted(calls) == list(range(len(plan.steps))), statistic


def test_operands_no_view_reads_are_copied() -> None:
    # abc (4, 3, 8) and cba (8, 3, 4) contract a and c, keeping b: in cba, b sits between c and
    # a, in abc between a and c, so neither reads (a, c) as one dimension.
    plan = einsum_plan("abc,cba->b", (4, 3, 8), (8, 3, 4))
    assert plan.copies == 2
    assert plan.copied_elements == 96 + 96
    assert not plan.final_copy
    (step,) = plan.steps
    assert (step.batch, step.m, step.k, step.n) == (("b",), (), ("a", "c"), ())
    assert _dims(step.first) == (("b", "a", "c"), (3, 1, 32), (32, None, 1))
    assert _dims(step.second) == (("b", "a", "c"), (3, 32, 1), (32, 1, None))
    assert str(plan) == (
        "einsum abc,cba->b: 1 step(s), largest intermediate 3 elements, 96 products, "
        "2 copies (192 elements); space complexity 1.58, time complexity 6.58 (log2)\n"
        "  (0, 1) abc,cba->b: batch 3 x 1 x 1 over 32, 2 copied"
    )
    # A short sum (K = 8) over few outputs reads them as they lie instead: one row of the
    # kernel of small products, each operand through its own strides.
    plan = einsum_plan("abc,cba->b", (2, 3, 4), (4, 3, 2))
    assert (plan.copies, plan.copied_elements, plan.in_place) == (0, 0, frozenset({0}))
    (step,) = plan.steps
    assert _dims(step.first) == (("b", "a", "c"), (3, 1, 8), (8, None, 1))  # (as a product)
    assert str(plan) == (
        "einsum abc,cba->b: 1 step(s), largest intermediate 3 elements, 24 products, "
        "0 copies (0 elements); space complexity 1.58, time complexity 4.58 (log2)\n"
        "  (0, 1) abc,cba->b: batch 3 x 1 x 1 over 8, read in place"
    )
    specs = [s.name_expressions[0] for s in plan.kernel_specs()]
    assert specs == ["tropical_many<float, MaxPlus, false>"]
    # Nothing to contract: the result is a new array, one copy in the output's order.
    for subscripts, shape, elements in (("ij->ji", (3, 4), 12), ("ii->i", (3, 3), 3),
                                        ("ij->ij", (3, 4), 12), ("ji", (3, 4), 12)):  # fmt: skip
        plan = einsum_plan(subscripts, shape)
        assert (plan.steps, plan.final_copy) == ((), True), subscripts
        assert (plan.copies, plan.copied_elements) == (1, elements), subscripts
    # Both stored with b outermost (as bac): each reads (a, c) as one dimension, in place.
    stored = np.ones((3, 2, 4))  # b, a, c
    plan = einsum_plan("abc,cba->b", stored.transpose(1, 0, 2), stored.transpose(2, 0, 1))
    assert plan.copies == 0
    assert _dims(plan.steps[0].first) == (None, (3, 1, 8), (8, None, 1))


@pytest.mark.parametrize("seed", range(3))
def test_plans_with_copies_compute_the_contraction(seed: int) -> None:
    rng = np.random.default_rng(seed)
    # (Sums over more than 16 values: a shorter one reads its operands in place.)
    cases: list[tuple[str, list[tuple[int, ...]], int | None]] = [
        ("abc,cba->b", [(4, 3, 8), (8, 3, 4)], 2),
        ("ab,bc,cd,de,ea->", [(6, 6), (6, 6), (6, 6), (6, 6), (6, 6)], 1),
        ("ij->ji", [(3, 4)], 1),
        ("abcd,dcba->ad", [(2, 5, 4, 3), (3, 4, 5, 2)], None),
    ]
    for subscripts, shapes, copies in cases:
        operands = random_operands(rng, "maxplus", np.int32, shapes)
        plan = einsum_plan(subscripts, *operands)
        if copies is not None:
            assert plan.copies == copies, str(plan)
        assert plan.copies > 0
        want = reference.einsum(subscripts, *operands)
        np.testing.assert_array_equal(run_plan(plan, "maxplus", operands), want)


def test_statistics_of_a_chain_along_two_paths() -> None:
    shapes = [(3, 4), (4, 5), (5, 6)]
    right = einsum_plan("ij,jk,kl->il", *shapes, optimize=[(1, 2), (0, 1)])
    assert right.path == ((1, 2), (0, 1))
    assert [s.subscripts for s in right.steps] == ["jk,kl->jl", "ij,jl->il"]
    assert [s.operands for s in right.steps] == [(1, 2), (0, 3)]  # 3: the first step's result
    # jk,kl: 4 x 6 results over 5; ij,jl: 3 x 6 over 4.
    assert (right.largest_intermediate, right.products) == (24, 24 * 5 + 18 * 4)
    assert right.shapes() == shapes
    assert str(right) == (
        "einsum ij,jk,kl->il: 2 step(s), largest intermediate 24 elements, 192 products, "
        "0 copies (0 elements); space complexity 4.58, time complexity 7.58 (log2)\n"
        "  (1, 2) jk,kl->jl: batch 1 x 4 x 6 over 5\n"
        "  (0, 3) ij,jl->il: batch 1 x 3 x 6 over 4"
    )
    left = einsum_plan("ij,jk,kl->il", *shapes, optimize=[(0, 1), (0, 1)])
    assert (left.largest_intermediate, left.products) == (18, 15 * 4 + 18 * 5)
    assert einsum_plan("ij,jk,kl->il", *shapes).products == 150  # the cheaper one
    empty = einsum_plan("ij,jk->ik", (3, 0), (0, 4))
    assert (empty.products, empty.largest_intermediate, empty.copies) == (0, 12, 0)


def test_the_live_set_counts_each_result_until_its_last_reader() -> None:
    # A chain of five along ((0, 1), (1, 2), (0, 1), (0, 1)): ij,jk -> ik (10 x 30), then
    # lm,mn -> ln (40 x 60), then kl,ik -> il (10 x 40); ln lives until the last step.
    shapes = [(10, 20), (20, 30), (30, 40), (40, 50), (50, 60)]
    chain = einsum_plan("ij,jk,kl,lm,mn->in", *shapes, optimize=[(0, 1), (1, 2), (0, 1), (0, 1)])
    assert [s.size for s in chain.steps] == [300, 2400, 400, 600]
    assert [s.operands for s in chain.steps] == [(0, 1), (3, 4), (2, 5), (6, 7)]
    # The last step, ln,il -> in, with both it reads alive: 2400 + 400 + 600 (step 2 held
    # ik and ln with its own result: 300 + 2400 + 400, less).
    assert chain.live_elements == 2400 + 400 + 600
    assert chain.live_elements <= sum(s.size for s in chain.steps)
    # The copies a step reads count while it runs (see the test of copies above: b sits
    # between a and c in both, so both are copied), beside its result of 3.
    copied = einsum_plan("abc,cba->b", (4, 3, 8), (8, 3, 4))
    assert (copied.copied_elements, copied.live_elements) == (96 + 96, 96 + 96 + 3)


SIZE_0 = [
    ("ab,->ab", [(2, 0), ()]),
    ("abc,c->ab", [(2, 0, 3), (3,)]),
    ("abc,c->ba", [(2, 0, 3), (3,)]),
    ("ab,bc->ac", [(2, 0), (0, 3)]),
    ("ab,bc->", [(0, 2), (2, 3)]),
    ("ab->a", [(2, 0)]),
    ("ab->", [(0, 0)]),
]


@pytest.mark.parametrize(("subscripts", "shapes"), SIZE_0)
def test_size_0_indices_are_planned(subscripts: str, shapes: list[tuple[int, ...]]) -> None:
    # An empty sum is the zero and an empty result has no cells; the plan exists all the same
    # (einsum fills its result without launching it). A size-0 index merged with another
    # into one dimension of a view must not make the view impossible.
    plan = einsum_plan(subscripts, *shapes)
    operands = [np.zeros(s, np.int32) for s in shapes]
    want = reference.einsum(subscripts, *operands)
    np.testing.assert_array_equal(run_plan(plan, "maxplus", operands), want)
    along = reference.einsum(subscripts, *operands, path=plan.path)
    assert along.shape == want.shape
    np.testing.assert_array_equal(along, want)


# -- paths ------------------------------------------------------------------------------------

CHAIN = "ij,jk,kl->il"
CHAIN_SHAPES = [(3, 4), (4, 5), (5, 6)]


@pytest.mark.parametrize(
    "optimize",
    ["auto", "greedy", "optimal", "dp", "branch-all", "random-greedy",
     opt_einsum.DynamicProgramming(), [(1, 2), (0, 1)], [[0, 2], [0, 1]], ((2, 0), (1, 0))],
)  # fmt: skip
def test_strategies_optimizers_and_paths_give_plans_that_compute_the_chain(optimize: Any) -> None:
    operands = random_operands(np.random.default_rng(2), "minplus", np.int64, CHAIN_SHAPES)
    plan = einsum_plan(CHAIN, *operands, optimize=optimize)
    assert len(plan.steps) == 2
    if isinstance(optimize, list | tuple):
        assert plan.path == tuple(tuple(p) for p in optimize)
    want = reference.einsum(CHAIN, *operands, semiring="minplus")
    np.testing.assert_array_equal(run_plan(plan, "minplus", operands), want)
    along = reference.einsum(CHAIN, *operands, semiring="minplus", path=plan.path)
    np.testing.assert_array_equal(along, want)


def _exactly(message: str) -> str:
    return "^" + re.escape(message) + "$"


def _strategy(optimize: str) -> str:
    return "^" + re.escape(
        f"optimize={optimize} is not an opt_einsum strategy, optimizer or path for 3 operands: "
    )


@pytest.mark.parametrize(
    ("optimize", "pattern"),
    [
        ("nonsense", _strategy("'nonsense'") + ".*nonsense"),
        (42, _strategy("42")),
        ([(0, 0), (0, 1)], _exactly(
            "optimize: path step 0 (0, 0) does not name one or two of the 3 operands left "
            "(positions 0 to 2)")),
        ([(0, 1, 2)], _exactly(
            "optimize: path step 0 (0, 1, 2) does not name one or two of the 3 operands left "
            "(positions 0 to 2)")),
        # A position past the live operands: a ValueError naming the step (not opt_einsum's
        # IndexError "pop index out of range").
        ([(0, 5)], r"^optimize.*\(0, 5\)"),
        ([(0, 1), (0, 1), (0, 1)], r"^optimize.*\(0, 1\)"),
        # Paths that stop early: how many operands they leave.
        ([(0, 1)], _exactly(
            "optimize: the path leaves 2 operands, not one; a path contracts until one is left")),
        ([], _exactly(
            "optimize: the path leaves 3 operands, not one; a path contracts until one is left")),
    ],
)  # fmt: skip
def test_a_bad_optimize_is_refused_with_what_is_wrong(optimize: Any, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        einsum_plan(CHAIN, *CHAIN_SHAPES, optimize=optimize)


def test_a_single_operand_step_moves_its_operand_to_the_end() -> None:
    # opt_einsum's convention, which reference.einsum(path=) follows: a step's operands leave
    # the list and its result joins the end, also for one operand with nothing to sum. So
    # after (0,) the list is jk, kl, ij, and (0, 1) contracts jk with kl.
    plan = einsum_plan(CHAIN, *CHAIN_SHAPES, optimize=[(0,), (0, 1), (0, 1)])
    assert plan.path == ((0,), (0, 1), (0, 1))
    assert [s.subscripts.partition("->")[0] for s in plan.steps] in (
        ["jk,kl", "ij,jl"],
        ["jk,kl", "ij,lj"],
    ), str(plan)


def test_a_plan_is_reused_for_operands_of_its_shapes() -> None:
    plan = einsum_plan(CHAIN, *CHAIN_SHAPES, optimize=[(1, 2), (0, 1)])
    assert einsum_plan(CHAIN, *CHAIN_SHAPES, optimize=plan) is plan
    assert einsum_plan(CHAIN, *(np.zeros(s) for s in CHAIN_SHAPES), optimize=plan) is plan
    assert einsum_plan("ij,jk,kl", *CHAIN_SHAPES, optimize=plan) is plan  # the same output
    # Other strides: planned again along the same path.
    operands = random_operands(np.random.default_rng(3), "maxplus", np.int32, CHAIN_SHAPES)
    transposed = [relayout(x, [1, 0], [False, False], False) for x in operands]
    again = einsum_plan(CHAIN, *transposed, optimize=plan)
    assert again is not plan
    assert again.path == plan.path
    assert [t.strides for t in again.terms] == [(1, 3), (1, 4), (1, 5)]
    np.testing.assert_array_equal(
        run_plan(again, "maxplus", transposed), reference.einsum(CHAIN, *operands)
    )


def test_plans_are_values_equal_plans_hash_equal() -> None:
    # A plan was unhashable (its sizes are a dict): now a dict key and a set member, an equal
    # plan (a pickled copy: another object) finding it, other paths or slicings kept apart.
    import pickle

    plan = einsum_plan(CHAIN, *CHAIN_SHAPES, optimize=[(1, 2), (0, 1)])
    twin = pickle.loads(pickle.dumps(plan))
    other = einsum_plan(CHAIN, *CHAIN_SHAPES, optimize=[(0, 1), (0, 1)])
    sliced = einsum_plan(CHAIN, *CHAIN_SHAPES, optimize=[(1, 2), (0, 1)], memory_limit=144)
    assert twin is not plan
    assert (twin == plan, hash(twin) == hash(plan)) == (True, True)
    assert sliced.slicing is not None
    assert (sliced == plan, other == plan) == (False, False)
    found = {plan: "plan", other: "other", sliced: "sliced"}
    assert [found[twin], found[other], found[sliced]] == ["plan", "other", "sliced"]
    assert len({plan, twin, other, sliced}) == 3


@pytest.mark.parametrize(
    ("subscripts", "shapes", "message"),
    [
        ("ij,jk,kl->li", CHAIN_SHAPES, f"optimize is a plan for {CHAIN!r}, not 'ij,jk,kl->li'; "
         "make one with einsum_plan for these subscripts"),
        ("ij,jk,km->im", CHAIN_SHAPES, f"optimize is a plan for {CHAIN!r}, not 'ij,jk,km->im'"),
        (CHAIN, [(3, 4), (4, 5), (5, 7)], "optimize is a plan for shapes [(3, 4), (4, 5), (5, 6)], "
         "not [(3, 4), (4, 5), (5, 7)]; make one with einsum_plan for these operands"),
    ],
)  # fmt: skip
def test_a_plan_for_other_subscripts_or_shapes_is_refused(
    subscripts: str, shapes: list[tuple[int, ...]], message: str
) -> None:
    plan = einsum_plan(CHAIN, *CHAIN_SHAPES)
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        einsum_plan(subscripts, *shapes, optimize=plan)


@pytest.mark.parametrize(
    ("operands", "error", "message"),
    [
        (["ab", (2, 3)], TypeError, "einsum operand 0 must be an array (cupy, numpy) or a shape "
         "tuple, not str"),
        ([(2, -1), (3, 2)], ValueError,
         "einsum operand 0: a shape has no negative sizes, got (2, -1)"),
        ([(2, 3), (4, 2)], ValueError,
         "einsum index 'j' has size 3 in operand 0 and 4 in operand 1"),
        ([(2, 3)], ValueError, "einsum subscripts 'ij,jk->ik' name 2 operand(s) but 1 were given"),
    ],
)  # fmt: skip
def test_operands_that_cannot_be_planned(
    operands: list[Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match="^" + re.escape(message)):
        einsum_plan("ij,jk->ik", *operands)


# -- bounds: dimensions, sizes, exhaustive searches -------------------------------------------

ADDRESSABLE = (
    "more than the 9,223,372,036,854,775,807 bytes a 64-bit offset addresses (a plan counts 8 "
    "bytes an element, the widest dtype); "
)
OUTPUT_FIX = (
    "every order of contraction ends with it: compute it in slices (fix some output indices by "
    "indexing the operands) or contract a smaller network"
)
ORDER_FIX = (
    "pick an order with smaller intermediates (optimize='auto-hq', 'random-greedy' or a cotengra "
    "HyperOptimizer; einsum_plan(...).largest_intermediate compares them), or contract the "
    "network in slices (fix an index by indexing the operands)"
)


def _never(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("reached what the bound should have stopped first")


def test_subscripts_of_more_dimensions_than_an_array_are_refused_before_shapes_are_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 1,000,000 letters of one operand built strides of up to a million bits each: 15 s, then
    # MemoryError. The grammar refuses them in one pass over the string, before any shape.
    monkeypatch.setattr(_planner._Shaped, "of", _never)
    started = time.perf_counter()
    with pytest.raises(ValueError, match=_exactly(
        "einsum operand 0's subscripts name 1,000,000 indices, more than the 64 dimensions an "
        "array can have (NumPy's and CuPy's bound); give one letter per dimension"
    )):  # fmt: skip
        einsum_plan("a" * 1_000_000 + "->", (2,) * 1_000_000)
    assert time.perf_counter() - started < 2  # (milliseconds; the bound is for a loaded machine)
    letters = "".join(opt_einsum.get_symbol(i) for i in range(65))
    with pytest.raises(ValueError, match=_exactly(
        "einsum output names 65 indices, more than the 64 dimensions an array can have (NumPy's "
        "and CuPy's bound); sum some of them away (name an output without them after '->')"
    )):  # fmt: skip
        einsum_plan(",".join(letters) + "->" + letters, *[(1,)] * 65)


def test_64_dimensions_are_planned() -> None:
    letters = "".join(opt_einsum.get_symbol(i) for i in range(64))
    plan = einsum_plan(f"{letters},{letters}->{letters}", (1,) * 64, (1,) * 64)
    assert plan.output == letters
    assert plan.largest_intermediate == 1


def test_an_output_past_what_64_bit_offsets_address_is_refused_in_exact_integers() -> None:
    # 2**80 elements: NumPy's int64 would wrap the product to 0.
    with pytest.raises(ValueError, match=_exactly(
        "einsum output 'ab' would hold 1,208,925,819,614,629,174,706,176 elements "
        "(9,671,406,556,917,033,397,649,408 bytes at 8 each), " + ADDRESSABLE + OUTPUT_FIX
    )):  # fmt: skip
        einsum_plan("ab", (2**40, 2**40))


def test_an_intermediate_past_what_64_bit_offsets_address_names_its_step() -> None:
    shapes = [(2**31,), (2**31,), (2**31, 2**31)]  # shapes only: nothing is allocated
    with pytest.raises(ValueError, match=_exactly(
        "einsum intermediate 'ij' of step 0 (i,j->ij) would hold 4,611,686,018,427,387,904 "
        "elements (36,893,488,147,419,103,232 bytes at 8 each), " + ADDRESSABLE + ORDER_FIX
    )):  # fmt: skip
        einsum_plan("i,j,ij->", *shapes, optimize=[(0, 1), (0, 1)])
    # Another order keeps every intermediate a vector.
    plan = einsum_plan("i,j,ij->", *shapes, optimize=[(0, 2), (0, 1)])
    assert plan.largest_intermediate == 2**31


def _chain(count: int) -> tuple[str, list[tuple[int, int]]]:
    symbols = [opt_einsum.get_symbol(i) for i in range(count + 1)]
    subscripts = ",".join(symbols[i] + symbols[i + 1] for i in range(count))
    return subscripts + "->" + symbols[0] + symbols[count], [(2, 2)] * count


@pytest.mark.parametrize(("optimize", "limit"), list(_planner.SEARCH_LIMITS.items()))
def test_exhaustive_searches_past_their_operand_count_are_refused_before_searching(
    optimize: str, limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(opt_einsum, "contract_path", _never)
    subscripts, shapes = _chain(limit + 1)
    with pytest.raises(ValueError, match=_exactly(
        f"optimize={optimize.upper()!r} is a search whose time grows exponentially with the "
        f"operands, run here for at most {limit}, and this contraction has {limit + 1}; pass "
        "'auto' or 'auto-hq' (opt_einsum picks a search the count allows), 'greedy' or "
        "'random-greedy', or an optimizer object to run it regardless "
        "(opt_einsum.DynamicProgramming(), a cotengra HyperOptimizer)"
    )):  # fmt: skip
        einsum_plan(subscripts, *shapes, optimize=optimize.upper())  # (names are any case)


def test_optimal_on_60_operands_is_refused_and_an_optimizer_object_runs_as_given() -> None:
    subscripts, shapes = _chain(60)
    with pytest.raises(
        ValueError, match=r"^optimize='optimal' is a search .* this contraction has 60;"
    ):
        einsum_plan(subscripts, *shapes, optimize="optimal")
    assert len(einsum_plan(subscripts, *shapes, optimize="auto-hq").steps) == 59
    # An object is the caller's to judge: dynamic programming over a chain is quick.
    subscripts, shapes = _chain(_planner.SEARCH_LIMITS["dp"] + 1)
    plan = einsum_plan(subscripts, *shapes, optimize=opt_einsum.DynamicProgramming())
    assert len(plan.steps) == _planner.SEARCH_LIMITS["dp"]


# What einsum checks on the GPU once it has planned, before anything is allocated: here with
# the device's memory stood in for (the GPU test asks a real device).
F4 = np.dtype(np.float32)


def test_einsum_refuses_an_output_or_intermediate_larger_than_the_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_runs, "device_bytes", lambda device: 1500)
    memory = "more than the 1,500 bytes of device 3's memory"
    matmul = einsum_plan("ij,jk->ik", (20, 10), (10, 20))
    with pytest.raises(ValueError, match=_exactly(
        f"einsum output 'ik' would hold 400 elements (1,600 bytes at 4 each), {memory}; "
        + OUTPUT_FIX
    )):  # fmt: skip
        _runs.check_plan(matmul, F4, argmax=False, device=3)
    outer = einsum_plan("i,j,ij->", (16,), (16,), (16, 16), optimize=[(0, 1), (0, 1)])
    _runs.check_plan(outer, F4, argmax=False, device=3)  # 1,024 bytes fit
    # With argmax=True an int32 argmax is allocated beside each element.
    with pytest.raises(ValueError, match=_exactly(
        "einsum intermediate 'ij' of step 0 (i,j->ij) would hold 256 elements (2,048 bytes at "
        f"8 each), {memory} (an int32 argmax, 4 bytes, beside each element); " + ORDER_FIX
    )):  # fmt: skip
        _runs.check_plan(outer, F4, argmax=True, device=3)


def test_einsum_with_argmax_refuses_a_plan_whose_argmaxes_together_pass_the_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A ring of five 8 x 8 matrices: three results of 64 elements and a scalar, each step's
    # 512 bytes (with its argmax) within 600, the argmaxes kept for the walk back 772 bytes.
    monkeypatch.setattr(_runs, "device_bytes", lambda device: 600)
    ring = einsum_plan("ab,bc,cd,de,ea->", *[(8, 8)] * 5, optimize=[(0, 1)] * 4)
    assert [step.size for step in ring.steps] == [64, 64, 64, 1]
    _runs.check_plan(ring, F4, argmax=False, device=2)
    with pytest.raises(ValueError, match=_exactly(
        "einsum with argmax=True keeps an int32 argmax of every step's result for the walk back: "
        "772 bytes for this plan, more than the 600 bytes of device 2's memory (an int32 "
        "argmax, 4 bytes, beside each element); contract it in (smaller) slices (memory_limit=: "
        "only the winning slice's argmaxes are kept), pick an order with smaller intermediates "
        "(optimize=), or run without argmax"
    )):  # fmt: skip
        _runs.check_plan(ring, F4, argmax=True, device=2)


def test_einsum_with_argmax_refuses_a_product_over_more_k_than_an_int32_numbers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_runs, "device_bytes", lambda device: 1 << 40)
    k = _runs.ARGMAX_MAX_K + 1  # odd: not cut in parts (see _split)
    plan = einsum_plan("i,i->", (k,), (k,))
    assert [s.first.shape[2] for s in plan.steps] == [k]
    _runs.check_plan(plan, F4, argmax=False, device=0)
    with pytest.raises(ValueError, match=_exactly(
        "einsum step 0 (i,i->) sums over 2,147,483,649 values of its indices 'i' in one product, "
        "more than the 2,147,483,648 an int32 argmax (argmax=True) can number; pick an order "
        "that sums fewer at once (another optimize=), contract the network in slices, or run "
        "without argmax"
    )):  # fmt: skip
        _runs.check_plan(plan, F4, argmax=True, device=0)


# -- networks past 52 indices -----------------------------------------------------------------


def test_a_chain_of_60_matrices_past_the_ascii_letters() -> None:
    symbols = [opt_einsum.get_symbol(i) for i in range(61)]
    assert not all(s.isascii() for s in symbols)  # past 52: À, Á, ...
    subscripts = (
        ",".join(symbols[i] + symbols[i + 1] for i in range(60)) + "->" + symbols[0] + symbols[60]
    )
    rng = np.random.default_rng(60)
    sizes = rng.integers(1, 4, size=61)
    shapes = [(int(sizes[i]), int(sizes[i + 1])) for i in range(60)]
    for ring, dtype in (("maxplus", np.int64), ("minplus", np.float64), ("maxmul", np.int32)):
        matrices = random_operands(rng, ring, dtype, shapes)
        if ring == "maxmul":
            # Products of up to 2**60 saturate, which for non-negative factors is associative.
            matrices = [np.minimum(m, 2).astype(dtype) for m in matrices]
        plan = einsum_plan(subscripts, *matrices)
        assert len(plan.steps) == 59
        assert plan.sizes == {s: int(n) for s, n in zip(symbols, sizes, strict=True)}
        chain = matrices[0]
        for m in matrices[1:]:
            chain = reference.matmul(chain, m, ring)
        along = reference.einsum(subscripts, *matrices, semiring=ring, path=plan.path)
        np.testing.assert_array_equal(along, chain, err_msg=ring)
        np.testing.assert_array_equal(run_plan(plan, ring, matrices), chain, err_msg=ring)
        np.testing.assert_array_equal(reference.einsum(subscripts, *matrices, semiring=ring), chain)
        # The implicit output: the two ends, sorted by character (a < À).
        implicit = reference.einsum(subscripts.partition("->")[0], *matrices, semiring=ring)
        np.testing.assert_array_equal(implicit, chain)


# -- reference.einsum along a path ------------------------------------------------------------

INTEGER_CASES = [(s, d) for s, d in CASES if np.dtype(d).kind in "ib"]


@pytest.mark.parametrize(
    ("ring", "dtype"), INTEGER_CASES, ids=[f"{s}-{d}" for s, d in INTEGER_CASES]
)
@settings(derandomize=True, max_examples=150, deadline=None)
@given(data=st.data())
def test_reference_along_a_path_equals_reference(
    ring: str, dtype: Any, data: st.DataObject
) -> None:
    subscripts, operands = data.draw(expressions(ring, np.dtype(dtype)))
    assume(all(x.size for x in operands))  # size 0: test_size_0_indices_are_planned
    operands = [small_values(ring, x) for x in operands]
    if data.draw(st.booleans(), label="planned"):
        path = list(einsum_plan(subscripts, *operands).path)
    else:
        path = data.draw(pair_paths(len(operands)), label="path")
    want = reference.einsum(subscripts, *operands, semiring=ring)
    got = reference.einsum(subscripts, *operands, semiring=ring, path=path)
    assert (got.shape, got.dtype) == (want.shape, want.dtype)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ([(0, 5)], "einsum path step 0 (0, 5) names no live operands"),
        ([(0, 1), (0, 2)], "einsum path step 1 (0, 2) names no live operands"),
        ([(-1, 0)], "einsum path step 0 (-1, 0) names no live operands"),
        ([()], "einsum path step 0 () names no live operands"),
        ([(0, 1)], "einsum path leaves 2 operands, not one"),
        ([], "einsum path leaves 3 operands, not one"),
    ],
)
def test_reference_refuses_a_bad_path(path: list[tuple[int, ...]], message: str) -> None:
    operands = [np.ones(s) for s in CHAIN_SHAPES]
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        reference.einsum(CHAIN, *operands, path=path)


# -- every plan, run in NumPy -----------------------------------------------------------------


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
@settings(derandomize=True, max_examples=150, deadline=None)
@given(data=st.data())
def test_every_plan_reads_what_its_steps_say(ring: str, dtype: Any, data: st.DataObject) -> None:
    # Operands in any memory order (transposed, reversed, with gaps), along any path: the plan
    # run in NumPy equals the reference contracted along the same path, exactly (the same
    # products in the same order, and summing an index early is exact: x -> x (x) c is monotone).
    subscripts, operands = data.draw(expressions(ring, np.dtype(dtype)))
    assume(all(x.size for x in operands))  # size 0: test_size_0_indices_are_planned
    arrays = [relayout(x, *data.draw(layouts(x.ndim), label="layout")) for x in operands]
    for x, y in zip(operands, arrays, strict=True):
        np.testing.assert_array_equal(x, y)
    optimize = data.draw(
        st.one_of(st.sampled_from(["auto", "greedy", "optimal"]), pair_paths(len(arrays))),
        label="optimize",
    )
    plan = einsum_plan(subscripts, *arrays, optimize=optimize)
    if isinstance(optimize, list):
        assert plan.path == tuple(optimize)
    want = reference.einsum(subscripts, *operands, semiring=ring, path=plan.path)
    got = run_plan(plan, ring, arrays)
    assert (got.shape, got.dtype) == (want.shape, want.dtype)
    np.testing.assert_array_equal(got, want)
    # The same plan for C-ordered operands of these shapes: the same path.
    again = einsum_plan(subscripts, *(x.shape for x in operands), optimize=plan)
    assert again.path == plan.path
    np.testing.assert_array_equal(run_plan(again, ring, operands), want)


# -- the argmax's backtrace, on the host ------------------------------------------------------


def _follow(plan: EinsumPlan, trace: Trace, ring: str) -> dict[str, int]:
    """tropical's backtrace program (the one its kernel follows), followed on the host over a
    trace of NumPy argmaxes (run_plan's), each step's located by its place in the trace."""
    code = backtrace_code(plan, range(len(trace)))
    values = follow(
        code, len(trace), len(plan.sizes), lambda where, at: int(trace[where][1].reshape(-1)[at])
    )
    return assignment_of(plan, values)


def _follow_by_depth(plan: EinsumPlan, trace: Trace, ring: str) -> dict[str, int]:
    """``_follow``, the steps taken in the kernel's schedule: depth by depth in the tree."""
    code, schedule = backtrace_program(plan, range(len(trace)))
    steps = len(plan.steps)
    depths = (len(schedule) - steps - 1) // 2
    starts, scans, offsets = (
        schedule[: depths + 1], schedule[depths + 1 : 2 * depths + 1], schedule[2 * depths + 1 :]
    )  # fmt: skip
    assert starts[0] == 0
    assert starts[-1] == steps
    assert scans == [0] * depths  # (every argmax kept)
    assert sorted(offsets) == sorted(set(offsets))  # each step once
    ends = dict(itertools.pairwise([*sorted(offsets), len(code)]))
    ordered = [x for offset in offsets for x in code[offset : ends[offset]]]
    values = follow(
        ordered, steps, len(plan.sizes), lambda where, at: int(trace[where][1].reshape(-1)[at])
    )
    return assignment_of(plan, values)


def _follow_scanning(plan: EinsumPlan, trace: Trace, ring: str) -> dict[str, int]:
    """``_follow`` with every product's argmax found again at the position reached, as a
    compiled program's backtrace finds a large product's (a ``Scan``): each product's operands
    laid in one flat buffer (the arena) at the Scan's byte offsets, read through its strides as
    the kernel reads them, its K scanned for the first best k (by reference.matmul)."""
    pieces: list[Array] = []
    where: list[int | Scan] = []
    size = 0

    def place(x: Array) -> tuple[int, tuple[int, int, int]]:
        nonlocal size
        pieces.append(np.ascontiguousarray(x).reshape(-1))
        at, size = size, size + x.size
        b, m, k = contiguous(x.shape)
        return at * x.itemsize, (b if x.shape[0] > 1 else 0, m, k)

    for n, (step, _, first, second) in enumerate(trace):
        if step.second is None:
            where.append(n)
            continue
        (a, a_strides), (b, b_strides) = place(first), place(second)
        where.append(Scan(a, b, first.shape[1], second.shape[2], first.shape[2], a_strides,
                          b_strides))  # fmt: skip
    arena = np.concatenate(pieces) if pieces else np.zeros(0)

    def scan(product: Scan, at: int) -> int:
        item = arena.itemsize
        b, rest = divmod(at, product.m * product.n)
        m, n = divmod(rest, product.n)
        (ab, am, ak), (bb, bk, bn) = product.a_strides, product.b_strides
        k = np.arange(product.k)
        row = arena[product.a // item + b * ab + m * am + k * ak]
        column = arena[product.b // item + b * bb + n * bn + k * bk]
        _, index = reference.matmul(row.reshape(1, 1, -1), column.reshape(1, -1, 1), ring,
                                    argmax=True)  # fmt: skip
        return int(index.reshape(-1)[0])

    code = backtrace_code(plan, where)
    values = follow(
        code, len(trace), len(plan.sizes),
        lambda where, at: int(trace[where][1].reshape(-1)[at]), scan,
    )  # fmt: skip
    return assignment_of(plan, values)


@pytest.fixture(params=["in order", "by depth", "scanning"])
def host_backtrace(request: pytest.FixtureRequest) -> Callable[..., dict[str, int]]:
    return {"in order": _follow, "by depth": _follow_by_depth, "scanning": _follow_scanning}[
        request.param
    ]


def _value_and_assignment(
    subscripts: str,
    operands: Sequence[Array],
    ring: str,
    backtrace: Callable[..., dict[str, int]],
    optimize: Any = "auto",
) -> tuple[Array, dict[str, int]]:
    plan = einsum_plan(subscripts, *operands, optimize=optimize)
    trace: Trace = []
    value = run_plan(plan, ring, operands, trace)
    assert [step for step, *_ in trace] == list(plan.steps)
    np.testing.assert_array_equal(value, reference.einsum(subscripts, *operands, semiring=ring))
    assignment = backtrace(plan, trace, ring)
    check_assignment(subscripts, operands, ring, value, assignment)
    return value, assignment


@pytest.mark.parametrize(("ring", "dtype"), ARGMAX_CASES)
def test_the_backtrace_of_random_networks_attains_their_value(
    ring: str, dtype: str, host_backtrace: Callable[..., dict[str, int]]
) -> None:
    rng = np.random.default_rng(list(SEMIRINGS).index(ring) * 10 + len(dtype))
    attained = 0
    for _ in range(30):
        subscripts, shapes = random_network(rng, int(rng.integers(8, 13)), int(rng.integers(7, 11)))
        operands = network_values(rng, ring, dtype, shapes)
        value, _ = _value_and_assignment(subscripts, operands, ring, host_backtrace)
        attained += int(value != SEMIRINGS[ring].zero(np.dtype(dtype)))
    assert attained >= 20


@pytest.mark.parametrize(("ring", "dtype"), ARGMAX_CASES)
@pytest.mark.parametrize(("n", "edges", "size"), [(5, CYCLE5, 2), (10, PETERSEN, 4)])
def test_the_backtrace_finds_a_maximum_independent_set(
    ring: str,
    dtype: str,
    n: int,
    edges: list[tuple[int, int]],
    size: int,
    host_backtrace: Callable[..., dict[str, int]],
) -> None:
    subscripts, operands = independent_sets(n, edges, ring, dtype)
    value, assignment = _value_and_assignment(subscripts, operands, ring, host_backtrace)
    assert value.item() == (size if ring == "maxplus" else -size)
    chosen = {v for v in range(n) if assignment[string.ascii_lowercase[v]] == 1}
    assert len(chosen) == size
    assert not any(u in chosen and v in chosen for u, v in edges)


def element_assignments(
    subscripts: str, operands: Sequence[Array], ring: str, rng: np.random.Generator
) -> tuple[Array, list[dict[str, int]]]:
    """The result of a contraction with output indices, and each element's assignment as the
    kernel's blocks find them: the walk from the element's position (``output_digits``)."""
    plan = einsum_plan(subscripts, *operands, optimize=str(rng.choice(["auto", "greedy"])))
    trace: Trace = []
    value = run_plan(plan, ring, operands, trace)
    np.testing.assert_array_equal(value, reference.einsum(subscripts, *operands, semiring=ring))
    code, digits = backtrace_code(plan, range(len(trace))), output_digits(plan)
    found = []
    for element in range(value.size):
        start = output_values(digits, element)
        values = follow(
            code, len(trace), len(plan.sizes),
            lambda where, at: int(trace[where][1].reshape(-1)[at]), start=start,
        )  # fmt: skip
        found.append(assignment_of(plan, values))
    return value, found


@pytest.mark.parametrize(("ring", "dtype"), ARGMAX_CASES)
def test_each_element_of_a_result_with_indices_has_an_assignment_that_attains_it(
    ring: str, dtype: str
) -> None:
    # argmax=True on an output with indices: the kernel's block for element e starts its walk
    # from e's position, so each element gets an assignment attaining it (its output indices
    # at its position) — a batch of queries, the batch index in the output, each answered.
    rng = np.random.default_rng(list(SEMIRINGS).index(ring) * 10 + len(dtype) + 500)
    elements = attained = 0
    for _ in range(12):
        subscripts, shapes = random_network(rng, int(rng.integers(6, 10)), int(rng.integers(6, 9)))
        subscripts = with_output(rng, subscripts)
        inputs, kept = subscripts.split("->")
        operands = network_values(rng, ring, dtype, shapes)
        value, found = element_assignments(subscripts, operands, ring, rng)
        assert value.shape == tuple(
            dict(zip("".join(inputs.split(",")), [n for s in shapes for n in s], strict=True))[c]
            for c in kept
        )
        for element, assignment in enumerate(found):
            position = np.unravel_index(element, value.shape)
            assert [assignment[c] for c in kept] == [int(p) for p in position]
            check_assignment(subscripts, operands, ring, value[position], assignment)
            elements += 1
            attained += int(value[position] != SEMIRINGS[ring].zero(np.dtype(dtype)))
    assert elements >= 24
    assert attained >= elements // 2


def test_output_digits_read_an_element_s_position_in_c_order() -> None:
    plan = einsum_plan("abc,cd->db", (2, 3, 4), (4, 5))
    number = {index: n for n, index in enumerate(plan.sizes)}
    digits = output_digits(plan)
    assert digits == [number["b"], 3, number["d"], 5]
    for element in range(15):
        d, b = divmod(element, 3)
        assert output_values(digits, element) == {number["b"]: b, number["d"]: d}
    assert output_digits(einsum_plan("ab,ab->", (2, 3), (2, 3))) == []


def test_long_sums_over_few_outputs_are_cut_in_parts() -> None:
    """A product of few outputs over a long K would run on a few blocks (a scalar: one), so K
    is cut: partial products as a batch over a split index, then their sum."""
    plan = einsum_plan("ab,ab->", (128, 128), (128, 128))
    partials, total = plan.steps
    assert partials.split is not None
    assert partials.batch == (partials.split,)
    assert (partials.first.shape, partials.first.strides) == ((256, 1, 64), (64, 1, 1))
    assert partials.second is not None
    assert (partials.second.shape, partials.second.strides) == ((256, 64, 1), (64, 1, 1))
    assert (total.operands, total.k, total.second) == ((partials.number,), (partials.split,), None)
    assert plan.sizes[partials.split] == 256
    assert partials.split not in "".join(plan.inputs)
    # Outputs of their own: cut too, the sum of the parts keeping them.
    plan = einsum_plan("ka,kb->ab", (1 << 14, 2), (1 << 14, 2))
    partials, total = plan.steps
    assert partials.first.shape == (256, 2, 64)
    assert total.result == ("a", "b")
    # A batch index of size 1 stays among the batch indices, after the split one.
    (partials, _) = einsum_plan("bij,bjk->bik", (1, 1, 1 << 14), (1, 1 << 14, 1)).steps
    assert partials.batch == (partials.split, "b")
    assert partials.result == partials.batch + partials.m + partials.n
    # Too short, or enough outputs to fill the GPU: one product.
    assert len(einsum_plan("ab,ab->", (16, 16), (16, 16)).steps) == 1
    assert len(einsum_plan("ka,kb->ab", (1 << 14, 1024), (1 << 14, 1024)).steps) == 1
    rng = np.random.default_rng(11)
    for ring, dtype in (("maxplus", "int32"), ("minplus", "float64"), ("andor", "bool")):
        for subscripts, shapes in (
            ("ab,ab->", [(128, 128), (128, 128)]),
            ("ka,kb->ba", [(1 << 14, 2), (1 << 14, 3)]),
            ("ijk->j", [(32, 2, 256)]),
        ):
            operands = network_values(rng, ring, dtype, shapes)
            plan = einsum_plan(subscripts, *operands)
            assert any(step.split for step in plan.steps), subscripts
            np.testing.assert_array_equal(
                run_plan(plan, ring, operands),
                reference.einsum(subscripts, *operands, semiring=ring),
            )


# A batch of few outputs over a long K (the 2 x 16 x 2^20 x 4 product of a 200-vertex MIS order,
# in small): 12 summed indices of size 2, a batch of 2, 4 x 2 outputs each.
LONG_K = "cdefghjkmnop"
BATCHED = (f"bi{LONG_K},b{LONG_K}l->bil", [(2, 4) + (2,) * 12, (2,) + (2,) * 12 + (2,)])


def test_a_batch_of_few_outputs_over_a_long_k_sums_part_of_k_as_a_batch_first() -> None:
    # No split index serves a batched product (a view has one batch dimension): the outermost
    # summed indices join the batch instead, and a reduction sums them after.
    subscripts, shapes = BATCHED
    plan = einsum_plan(subscripts, *shapes, optimize=[(0, 1)])
    partial, total = plan.steps
    assert partial.split is None
    assert set(partial.batch) == {"b", *LONG_K[:4]}  # K = 4096 in parts of 256
    assert (partial.first.shape[0], partial.first.shape[2]) == (32, 256)
    assert (total.operands, set(total.k), total.second) == (
        (partial.number,),
        set(LONG_K[:4]),
        None,
    )
    assert total.result == ("b", "i", "l")
    # Enough outputs to fill the GPU, or too short a K: one product.
    many = f"bi{LONG_K},b{LONG_K}l->bil", [(2, 4096) + (2,) * 12, (2,) + (2,) * 12 + (64,)]
    assert len(einsum_plan(*many[:1], *many[1], optimize=[(0, 1)]).steps) == 1
    short = "bik,bkl->bil", [(2, 4, 64), (2, 64, 2)]
    assert len(einsum_plan(short[0], *short[1]).steps) == 1
    rng = np.random.default_rng(12)
    for ring, dtype in (("maxplus", "float32"), ("minplus", "int64"), ("maxmul", "float64"),
                        ("andor", "bool")):  # fmt: skip
        operands = network_values(rng, ring, dtype, shapes)
        plan = einsum_plan(subscripts, *operands, optimize=[(0, 1)])
        np.testing.assert_array_equal(
            run_plan(plan, ring, operands), reference.einsum(subscripts, *operands, semiring=ring)
        )


@pytest.mark.parametrize(("ring", "dtype"), ARGMAX_CASES)
def test_the_backtrace_of_small_networks(
    ring: str, dtype: str, host_backtrace: Callable[..., dict[str, int]]
) -> None:
    rng = np.random.default_rng(7)
    cases: list[tuple[str, list[tuple[int, ...]]]] = [
        ("ij,jk,ki->", [(4, 5), (5, 3), (3, 4)]),
        ("bij,bjk->", [(3, 7, 9), (3, 9, 5)]),
        ("ii->", [(9, 9)]),
        ("iij,jk->", [(5, 5, 7), (7, 6)]),
        ("abc,cba->", [(2, 3, 4), (4, 3, 2)]),  # with copies
        ("ab,bc,cd,de,ea->", [(3, 4), (4, 5), (5, 3), (3, 4), (4, 3)]),
        ("ii", [(6, 6)]),
        # Long sums, cut in parts (see the test below): the winner's part, then its offset.
        ("ab,ab->", [(128, 128), (128, 128)]),
        ("ijk->", [(32, 64, 8)]),
    ]
    for subscripts, shapes in cases:
        _value_and_assignment(
            subscripts, network_values(rng, ring, dtype, shapes), ring, host_backtrace
        )
    _, assignment = _value_and_assignment(
        ",->", network_values(rng, ring, dtype, [(), ()]), ring, host_backtrace
    )
    assert assignment == {}
    # The value is the zero: any assignment, within the sizes.
    zero = SEMIRINGS[ring].zero(np.dtype(dtype))
    x, y = np.array([zero, 3, 4], dtype), np.array([1, zero, zero], dtype)
    value, assignment = _value_and_assignment("i,i->", [x, y], ring, host_backtrace)
    assert value == zero
    assert 0 <= assignment["i"] < 3


@pytest.mark.parametrize(("ring", "dtype"), ARGMAX_CASES)
@settings(derandomize=True, max_examples=60, deadline=None)
@given(data=st.data())
def test_the_backtrace_of_generated_contractions(
    ring: str, dtype: str, data: st.DataObject
) -> None:
    # Generated subscripts summed to a scalar, operands in any memory order, along any path.
    subscripts, drawn = data.draw(expressions(ring, np.dtype(dtype)))
    assume(all(x.size for x in drawn))  # argmax=True refuses a size-0 index
    subscripts = subscripts.partition("->")[0] + "->"
    seed = data.draw(st.integers(0, 1 << 32), label="seed")
    values = network_values(np.random.default_rng(seed), ring, dtype, [x.shape for x in drawn])
    arrays = [relayout(x, *data.draw(layouts(x.ndim), label="layout")) for x in values]
    optimize = data.draw(st.one_of(st.just("auto"), pair_paths(len(arrays))), label="optimize")
    _value_and_assignment(subscripts, arrays, ring, _follow, optimize)


def test_einsum_refuses_what_it_can_tell_without_a_gpu() -> None:
    a = np.ones((2, 3), np.float32)
    numpy_operand = (
        "einsum operand 0 must be a cupy.ndarray, not numpy.ndarray: move it with cupy.asarray(...)"
    )
    with pytest.raises(TypeError, match=_exactly(numpy_operand)):
        tropical.einsum_sync("ij,jk->ik", a, a.T)
    with pytest.raises(TypeError, match=_exactly(numpy_operand)):
        anyio.run(lambda: tropical.einsum("ij->i", a))
    with pytest.raises(ValueError, match=_exactly("einsum needs at least one operand")):
        tropical.einsum_sync("")
    with pytest.raises(ValueError, match=_exactly(
        "semiring must be one of maxplus, minplus, maxmul, andor, got 'plusmax'"
    )):  # fmt: skip
        tropical.einsum_sync("ij->i", a, semiring="plusmax")


# -- kernels ----------------------------------------------------------------------------------


def test_kernel_specs_name_the_kernels_of_the_steps() -> None:
    # jk,lk->jl reads lk with unit stride along k, not along l: the strided kernel. Then
    # ij,jl->il is a tall row-major product with K = 8: the skinny kernel, or with an argmax,
    # a tuned tile.
    plan = einsum_plan("ij,jk,lk->il", (4096, 8), (8, 8), (5, 8))
    assert [s.subscripts for s in plan.steps] == ["jk,lk->jl", "ij,jl->il"]
    f4 = np.dtype("float32")
    strided = tropical.gemm_spec("maxplus", f4, argmax=False, accumulate=False, layout="strided")
    assert plan.kernel_specs() == [strided, tropical.kernel_spec(4096, 5, 8)]
    names = [s.name_expressions[0] for s in plan.kernel_specs()]
    assert names == ["tropical_gemm<float, MaxPlus, false, false, false>",
                     "tropical_gemm_rows<float, FastMaxPlus, false, 8>"]  # fmt: skip
    argmax = plan.kernel_specs("maxplus", "float32", argmax=True)
    assert argmax == [
        tropical.gemm_spec("maxplus", f4, argmax=True, accumulate=False, layout="strided"),
        tropical.kernel_spec(4096, 5, 8, argmax=True),
        backtrace_spec(lookup("maxplus"), f4),  # the walk back to the assignment, on the GPU
    ]
    assert argmax[1].name_expressions[0].startswith("tropical_gemm_tiled<float, FastMaxPlus, true,")
    i8 = plan.kernel_specs("minplus", np.int64)
    assert [s.name_expressions[0].partition("<")[2].split(", ")[:2] for s in i8] == [
        ["long long", "MinPlus"], ["long long", "FastMinPlus"]
    ]  # fmt: skip
    # Two steps of one kernel name it once.
    square = einsum_plan("ij,jk,kl->il", (64, 64), (64, 64), (64, 64), optimize=[(0, 1), (0, 1)])
    assert square.kernel_specs() == [tropical.kernel_spec(64, 64, 64)]
    # A copy launches no product, only the strided copy (of 4-byte elements here).
    assert einsum_plan("ij->ji", (3, 4)).kernel_specs() == [einsum_spec("copy", 4)]
    # A compiled program adds its gather and its launch of many small steps.
    assert square.kernel_specs(program=True)[1:] == [
        einsum_spec("gather", 4),
        many_spec(tropical.SEMIRINGS["maxplus"], f4, argmax=False),
    ]
    with pytest.raises(ValueError, match=r"^dtype is float32; andor takes bool$"):
        plan.kernel_specs("andor", "float32")
    with pytest.raises(
        ValueError, match=r"^semiring must be one of maxplus, minplus, maxmul, andor"
    ):
        plan.kernel_specs("plusmax")


def test_kernel_specs_compile_for_sm_90_through_the_service(cache_dir: Path) -> None:
    plan = einsum_plan("ij,jk,lk->il", (4096, 8), (8, 8), (5, 8))
    specs = [
        *plan.kernel_specs(),
        *plan.kernel_specs(argmax=True, program=True),
        *plan.kernel_specs("andor", "bool"),
    ]
    templates = [s.name_expressions[0].partition("<")[0] for s in specs]
    assert templates == ["tropical_gemm", "tropical_gemm_rows", "tropical_gemm",
                         "tropical_gemm_tiled", "einsum_backtrace", "einsum_gather",
                         "tropical_many", "tropical_gemm", "tropical_gemm"]  # fmt: skip
    assert len(set(specs)) == 9

    compile_each_for_sm_90(specs, cache_dir)


def test_a_reused_plan_is_checked_against_the_item_size_too() -> None:
    """Equal byte strides of another dtype are other element strides: re-planned, not reused."""
    a32 = np.zeros((3, 8), np.float32)[:, ::2]  # byte strides (32, 8): elements (8, 2)
    b32 = np.zeros((4, 10), np.float32)[:, ::2]  # (40, 8): elements (10, 2)
    a64, b64 = np.zeros((3, 4)), np.zeros((4, 5))  # the same byte strides: elements (4, 1), (5, 1)
    assert (a32.strides, b32.strides) == (a64.strides, b64.strides)
    plan = einsum_plan("ij,jk->ik", a32, b32)
    assert plan.planned_for("ij,jk->ik", [a32, b32])
    assert not plan.planned_for("ij,jk->ik", [a64, b64])
    again = einsum_plan("ij,jk->ik", a64, b64, optimize=plan)
    assert [t.strides for t in again.terms] == [(4, 1), (5, 1)]
    assert [t.strides for t in plan.terms] == [(8, 2), (10, 2)]


def test_the_program_cache_bounds_each_devices_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    # (Stand-ins for programs: the cache reads their device and bytes alone; the GPU tests
    # keep real ones.) Two devices' programs past MAX_PROGRAM_BYTES together are both kept; a
    # newer one on device 0 drops device 0's oldest until that device's fit; past
    # MAX_PROGRAMS the oldest of any device goes; one larger than the bound is not kept.
    from collections import OrderedDict
    from types import SimpleNamespace

    from aionvrtc.tropical.networks import _programs

    monkeypatch.setattr(_programs, "_programs", OrderedDict())
    monkeypatch.setattr(_programs, "MAX_PROGRAM_BYTES", 100)
    monkeypatch.setattr(_programs, "MAX_PROGRAMS", 4)

    def kept(key: str, device: int, nbytes: int) -> Any:
        program = SimpleNamespace(device=device, nbytes=nbytes)
        _programs._keep(key, program)  # type: ignore[arg-type]
        return list(_programs._programs)

    assert kept("a0", 0, 60) == ["a0"]
    assert kept("b1", 1, 60) == ["a0", "b1"]
    assert kept("c0", 0, 30) == ["a0", "b1", "c0"]
    assert kept("d0", 0, 50) == ["b1", "c0", "d0"]  # device 0: 60 + 30 + 50 > 100
    assert kept("e1", 1, 40) == ["b1", "c0", "d0", "e1"]
    assert kept("f1", 1, 10) == ["c0", "d0", "e1", "f1"]  # five: the oldest goes
    assert kept("g0", 0, 101) == ["c0", "d0", "e1", "f1"]


def test_einsum_program_names_a_bad_dtype_or_shape_before_the_gpu() -> None:
    # NumPy's own TypeError ("data type 'foo' not understood") named no argument.
    with pytest.raises(ValueError, match=r"dtype must be one of float32, .*, got 'foo'"):
        tropical.einsum_program_sync("ij,jk->ik", (2, 2), (2, 2), dtype="foo")
    with pytest.raises(TypeError, match=re.escape("operand 0 must be an array or a shape tuple "
                                                  "of ints, not (2.0, 2)")):  # fmt: skip
        tropical.einsum_program_sync("ij,jk->ik", (2.0, 2), (2, 2), dtype="float32")
    with pytest.raises(TypeError, match=re.escape("operand 1 must be an array or a shape tuple")):
        tropical.einsum_program_sync("ij,jk->ik", (2, 2), (True, 2), dtype="float32")
