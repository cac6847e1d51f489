"""The roofline as data (no GPU): a device's figures and the bound of a step, each step's pairs
and elements, a plan's roofline and report, the modelled time of a contraction order, and
cotengra's HyperOptimizer scoring orders by it."""

from __future__ import annotations

import dataclasses
import json
import math
import pickle
import re

import cotengra
import numpy as np
import pytest

from aionvrtc import tropical
from aionvrtc.tropical import DeviceFigures, einsum_plan, roofline_objective
from aionvrtc.tropical.networks._orders import FILLED_OUTPUTS, modelled_seconds
from aionvrtc.tropical.products import MODEL_FIGURES
from aionvrtc.tropical.products._figures import _parse
from aionvrtc.tropical.products._tune import _parse as parse_tiles

# Round figures, so that each bound below is worked out by hand.
FIGURES = DeviceFigures(
    "a GPU", {"float32": 1e12, "float64": 5e11, "int32": 2e12, "int64": 4e11}, 1e12, 10
)


def test_a_bound_is_the_longer_of_the_pairs_at_the_probe_and_the_bytes_at_the_copy() -> None:
    assert FIGURES.bound(10**12, 10**9, "float32") == 1.0  # the pairs: 1 s, the bytes 1 ms
    assert FIGURES.bound(10**6, 3 * 10**12, np.float64) == 3.0  # the bytes
    assert FIGURES.bound(2 * 10**12, 0, "bool") == 1.0  # and/or counted at int32's rate
    with pytest.raises(KeyError):
        FIGURES.bound(1, 1, "complex64")


def test_figures_keep_as_json_and_a_record_of_another_shape_is_measured_again() -> None:
    data = json.dumps(FIGURES.to_json()).encode()
    assert _parse(data) == FIGURES
    assert _parse(b"not json") is None
    assert _parse(json.dumps({"gpu": "x", "pairs_per_s": [1]}).encode()) is None
    assert _parse(json.dumps({**FIGURES.to_json(), "multiprocessors": "many"}).encode()) is None
    assert MODEL_FIGURES.multiprocessors == 132


RATES = dict(FIGURES.pairs_per_s)


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"copy_bytes_per_s": 0.0}, ValueError, "DeviceFigures.copy_bytes_per_s is 0.0: a "
         "ceiling is a finite number above 0, per second"),
        ({"copy_bytes_per_s": -1e12}, ValueError,
         "DeviceFigures.copy_bytes_per_s is -1000000000000.0: a"),
        ({"copy_bytes_per_s": math.inf}, ValueError, "DeviceFigures.copy_bytes_per_s is inf: a"),
        ({"copy_bytes_per_s": 10**400}, ValueError, "DeviceFigures.copy_bytes_per_s is 1000000000"),
        ({"pairs_per_s": {**RATES, "int32": math.nan}}, ValueError,
         "DeviceFigures.pairs_per_s['int32'] is nan: a ceiling is a finite number above 0"),
        ({"pairs_per_s": {**RATES, "float64": 0}}, ValueError,
         "DeviceFigures.pairs_per_s['float64'] is 0: a"),
        ({"pairs_per_s": {"float32": 1e12}}, ValueError, "DeviceFigures.pairs_per_s has no "
         "rate for float64, int32, int64: give one for each of float32, float64, int32, int64"),
        ({"pairs_per_s": [1e12]}, TypeError, "DeviceFigures.pairs_per_s must map each element "
         "type to its rate, got list"),
        ({"copy_bytes_per_s": "fast"}, TypeError, "DeviceFigures.copy_bytes_per_s must be a "
         "number, got str"),
        ({"multiprocessors": 0}, ValueError, "DeviceFigures.multiprocessors is 0: a GPU has at "
         "least 1"),
        ({"multiprocessors": True}, TypeError, "DeviceFigures.multiprocessors must be an int, "
         "got bool"),
        ({"gpu": None}, TypeError, "DeviceFigures.gpu must be a str, got NoneType"),
    ],
)  # fmt: skip
def test_figures_no_gpu_has_are_refused_where_they_are_made(
    change: dict[str, object], error: type[Exception], message: str
) -> None:
    # Each gave bound() a division by zero, or a negative, NaN or 0 s time.
    with pytest.raises(error, match="^" + re.escape(message)):
        dataclasses.replace(FIGURES, **change)  # type: ignore[arg-type]  # the point


def test_a_record_of_figures_no_gpu_has_is_a_miss_not_an_error() -> None:
    # Read back from the cache, such a record is measured again (None), as a bad entry is.
    good = FIGURES.to_json()
    for bad in (
        {**good, "copy_bytes_per_s": 0},
        {**good, "copy_bytes_per_s": -4.2e12},
        {**good, "pairs_per_s": {**RATES, "int64": math.nan}},
        {**good, "pairs_per_s": {**RATES, "float32": math.inf}},
        {**good, "pairs_per_s": {"float32": 1e12}},
        {**good, "multiprocessors": 0},
        {**good, "multiprocessors": math.inf},  # int() of it: OverflowError
    ):
        assert _parse(json.dumps(bad).encode()) is None, bad
    # Nested past the parser's recursion limit: RecursionError, read as a miss.
    deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(RecursionError):
        json.loads(deep)
    assert _parse(deep) is None
    rates = b'{"float32": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    nested = json.dumps({**good, "pairs_per_s": {}}).encode().replace(b"{}", rates)
    assert _parse(nested) is None
    # The tuned tiles' record, kept beside it, reads the same way.
    assert parse_tiles(deep) is None
    assert parse_tiles(b'{"small": ' + deep + b"}") is None


def test_each_step_counts_its_pairs_and_the_elements_it_moves() -> None:
    plan = einsum_plan("ij,jk->ik", (64, 32), (32, 16))
    (cost,) = plan.step_costs()
    assert cost == tropical.StepCost(pairs=64 * 16 * 32, elements=64 * 16 + 64 * 32 + 32 * 16)
    # 32,768 pairs at 1e12/s: 32.8 ns; 3,584 elements of 4 bytes at 1e12 B/s: 14.3 ns.
    assert plan.roofline(FIGURES) == pytest.approx(64 * 16 * 32 / 1e12)
    assert plan.roofline(FIGURES, "float64") == pytest.approx(64 * 16 * 32 / 5e11)
    # A chain: each step counted alone, the roofline their sum.
    chain = einsum_plan("ij,jk,kl->il", (8, 256), (256, 8), (8, 8), optimize=[(0, 1), (0, 1)])
    first, second = chain.step_costs()
    assert first == tropical.StepCost(8 * 8 * 256, 8 * 8 + 2 * 8 * 256)
    assert second == tropical.StepCost(8 * 8 * 8, 3 * 64)
    assert chain.roofline(FIGURES) == pytest.approx(
        max(first.pairs / 1e12, first.elements * 4 / 1e12)
        + max(second.pairs / 1e12, second.elements * 4 / 1e12)
    )


def test_a_broadcast_operand_counts_its_elements_once_and_slices_multiply_the_roofline() -> None:
    # B is read with stride 0 along the batch: 16 distinct elements, not 1024 * 16.
    b = np.lib.stride_tricks.as_strided(np.zeros(16, np.float32), (1024, 4, 4), (0, 16, 4))
    plan = einsum_plan("bij,bjk->bik", (1024, 4, 4), b)
    (cost,) = plan.step_costs()
    assert cost == tropical.StepCost(1024 * 64, 1024 * 16 + 1024 * 16 + 16)
    # In 64 slices over k each step is counted with k fixed: the first 4 x 64 over 64 (its
    # result of 4 x 64 outputs over j, no k), the second 4 x 4 over 1.
    sliced = einsum_plan(
        "ij,jk,kl->il", (4, 64), (64, 64), (64, 4), optimize=[(0, 1), (0, 1)], memory_limit=512
    )
    assert sliced.slicing is not None
    assert sliced.slicing.indices == ("k",)
    assert sliced.step_costs() == [
        tropical.StepCost(4 * 64, 4 + 4 * 64 + 64),
        tropical.StepCost(4 * 4, 4 * 4 + 4 + 4),
    ]
    assert sliced.roofline(FIGURES) == pytest.approx(
        64 * sum(c.bound(FIGURES, "float32") for c in sliced.step_costs())
    )
    assert "64 slices of the steps below" in sliced.report(FIGURES)


def test_a_report_lists_each_steps_pairs_elements_and_bound_under_the_roofline() -> None:
    plan = einsum_plan("ij,jk,kl->il", (8, 256), (256, 8), (8, 8), optimize=[(0, 1), (0, 1)])
    plain = plan.report()
    assert plain.splitlines()[0] == str(plan).splitlines()[0]
    assert "16,384 pairs, 4,160 elements" in plain
    assert "bound" not in plain
    assert "roofline" not in plain
    text = plan.report(FIGURES)
    roof = plan.roofline(FIGURES) * 1e3
    assert f"roofline on a GPU, float32: {roof:.4g} ms" in text
    assert text.count(" us") == len(plan.steps)
    # The first step: 16,384 pairs (16.4 ns) against 4,160 * 4 bytes (16.64 ns).
    assert "16,384 pairs, 4,160 elements, bound 0.0166 us" in text
    with pytest.raises(KeyError):
        plan.report(FIGURES, "complex64")


def tree(inputs: list[str], output: str, sizes: dict[str, int]) -> cotengra.ContractionTree:
    return cotengra.ContractionTree.from_path(
        [tuple(t) for t in inputs], tuple(output), sizes, path=[(0, 1)] * (len(inputs) - 1)
    )


def test_an_orders_modelled_time_counts_bytes_pairs_and_the_gpus_fill() -> None:
    # Enough outputs to fill 10 SMs (10 * FILLED_OUTPUTS) and K = 64: the pairs bound.
    big = tree(["ij", "jk"], "ik", {"i": 256, "j": 64, "k": 256})
    assert modelled_seconds(big, FIGURES) == pytest.approx(256 * 256 * 64 / 1e12)
    # K = 2: the bytes (A, B and C, 4 bytes each) bound.
    flat = tree(["ij", "jk"], "ik", {"i": 512, "j": 2, "k": 512})
    assert modelled_seconds(flat, FIGURES) == pytest.approx((512 * 512 + 2 * 1024) * 4 / 1e12)
    # 64 outputs over K = 256: the GPU a fraction 64 / (10 * FILLED_OUTPUTS) full.
    few = tree(["ij", "jk"], "ik", {"i": 8, "j": 256, "k": 8})
    fill = 64 / (10 * FILLED_OUTPUTS)
    assert modelled_seconds(few, FIGURES) == pytest.approx(64 * 256 / (1e12 * fill))
    # Over K = 2^16 the kernels split K: full again.
    split = tree(["ij", "jk"], "ik", {"i": 8, "j": 1 << 16, "k": 8})
    assert modelled_seconds(split, FIGURES) == pytest.approx(
        max(64 * (1 << 16) / 1e12, (64 + 16 * (1 << 16)) * 4 / 1e12)
    )
    # Steps add, at f64's probe: 256 x 256 over 64, then 256 x 2 outputs over 256 (a fill of
    # 512 outputs; its 66,560 elements of 8 bytes would take 0.53 us).
    chain = tree(["ij", "jk", "kl"], "il", {"i": 256, "j": 64, "k": 256, "l": 2})
    assert modelled_seconds(chain, FIGURES, "float64") == pytest.approx(
        256 * 256 * 64 / 5e11 + 512 * 256 / (5e11 * 512 / (10 * FILLED_OUTPUTS))
    )
    assert modelled_seconds(chain, FIGURES, "float64") > modelled_seconds(chain, FIGURES)


def test_a_hyper_optimizer_scores_orders_by_their_modelled_time() -> None:
    from tests.support.einsum import kings_graph

    subscripts, shapes, _ = kings_graph(4)
    objective = roofline_objective(FIGURES)
    optimizer = cotengra.HyperOptimizer(
        methods=["greedy"], max_repeats=6, parallel=False, minimize=objective, progbar=False
    )
    plan = einsum_plan(subscripts, *shapes, optimize=optimizer)
    inputs = [tuple(t) for t in subscripts.split("->")[0].split(",")]
    found = cotengra.ContractionTree.from_path(
        inputs, (), {i: 2 for t in inputs for i in t}, path=plan.path
    )
    modelled = modelled_seconds(found, FIGURES)
    assert optimizer.best["score"] == pytest.approx(math.log2(1 + modelled * 1e12))
    assert len(optimizer.scores) == 6
    assert min(optimizer.scores) == optimizer.best["score"]
    with pytest.raises(KeyError, match="'complex64' is not one of the kernels' element types"):
        roofline_objective(FIGURES, "complex64")
    assert roofline_objective(None).figures is MODEL_FIGURES
    # Pickled for cotengra's worker processes, as the call that makes it.
    again = pickle.loads(pickle.dumps(objective))
    assert (type(again), again.figures, again.dtype) == (type(objective), FIGURES, "float32")
