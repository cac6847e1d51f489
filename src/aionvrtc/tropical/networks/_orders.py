"""Contraction orders ranked by what they cost on a GPU, not by their products alone.

A step of a tropical contraction takes at least the longer of its add+max pairs at the probe's
rate and its bytes at the copy bandwidth (``DeviceFigures.bound``), and longer where its output
is too small to spread over the GPU: the kernels put a tile of outputs on a block, and only a
long K is split over more blocks (``SPLIT_MIN_K``). An order with a step of a few outputs over a
short K, or one whose steps stream far more bytes than pairs, loses here to one of more pairs
that the GPU runs at its rate, where a count of products alone would pick the other way.

``roofline_objective`` gives cotengra's HyperOptimizer this model as its objective;
``ranked_path`` is what ``optimize="auto"`` runs on a large network: several seeded
random-greedy searches, the order of least modelled time kept. Pure Python, no GPU.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..products import MODEL_FIGURES, DeviceFigures

__all__ = [
    "FILLED_OUTPUTS",
    "RANKED_SEARCHES",
    "modelled_seconds",
    "ranked_path",
    "roofline_objective",
]

# Outputs per multiprocessor below which a step of short K leaves the GPU partly idle: two blocks
# of the tiled kernels' 32 x 32 tiles an SM. A step of fewer runs at that fraction of the probe.
FILLED_OUTPUTS = 2 * 32 * 32
# K at and past which the kernels split it over more blocks (the planner's SPLIT_MIN_K), so that
# a step of few outputs still fills the GPU.
_SPLIT_K = 1 << 9
# optimize="auto" on a large network: this many random-greedy searches, seeded 0, 1, ..., of
# LARGE_NETWORK_TRIALS / RANKED_SEARCHES trials each (the same trials as one search of them all),
# each search's best order by products, the order of least modelled time of those kept.
RANKED_SEARCHES = 8


def modelled_seconds(tree: Any, figures: DeviceFigures, dtype: Any = "float32") -> float:
    """The modelled time of a cotengra ContractionTree's contraction on a device of ``figures``.

    Args:
        tree: A ``cotengra.ContractionTree`` (an optimizer's ``search`` returns one), sliced or
            not.
        figures: The device's ceilings (``tropical.device_figures``, or ``MODEL_FIGURES``).
        dtype: The element type the steps are counted for.

    Returns:
        Seconds: each step at the longer of its pairs at the probe's rate (that rate times the
        fraction of the GPU its outputs fill, where K is too short to split) and its bytes at
        the copy bandwidth, summed, times the slices.

    Raises:
        KeyError: ``dtype`` is not one of the kernels' element types.
    """
    name = np.dtype(dtype).name
    rate = figures.pairs_per_s["int32" if name == "bool" else name]
    per_byte = np.dtype(dtype).itemsize / figures.copy_bytes_per_s
    filled = figures.multiprocessors * FILLED_OUTPUTS
    total = 0.0
    for node, left, right in tree.traverse():
        pairs = float(tree.get_flops(node))
        outputs = float(tree.get_size(node))
        fill = 1.0 if pairs >= outputs * _SPLIT_K else min(1.0, outputs / filled)
        moved = outputs + float(tree.get_size(left)) + float(tree.get_size(right))
        total += max(pairs / (rate * fill), moved * per_byte)
    return total * float(getattr(tree, "multiplicity", 1))


def ranked_path(
    inputs: Sequence[str], output: str, sizes: Mapping[str, int], trials: int
) -> tuple[tuple[int, ...], ...]:
    """``optimize="auto"``'s order of a large network: RANKED_SEARCHES seeded random-greedy
    searches of ``trials`` together, the one of least ``modelled_seconds`` on MODEL_FIGURES.
    The same in every process, whatever GPU it has: seeded, ranked on fixed figures (an order's
    rank hangs on their ratios, alike across recent GPUs), ties to the lower seed. To rank on a
    GPU's own figures: a HyperOptimizer with ``roofline_objective(await device_figures())``."""
    import cotengra

    each = max(1, trials // RANKED_SEARCHES)
    best: tuple[float, tuple[tuple[int, ...], ...]] | None = None
    for seed in range(RANKED_SEARCHES):
        search = cotengra.RandomGreedyOptimizer(max_repeats=each, seed=seed, parallel=False)
        tree = search.search([tuple(t) for t in inputs], tuple(output), dict(sizes))
        seconds = modelled_seconds(tree, MODEL_FIGURES)
        if best is None or seconds < best[0]:
            best = seconds, tuple(tuple(int(i) for i in p) for p in tree.get_path())
    assert best is not None
    return best[1]


def roofline_objective(figures: DeviceFigures | None = None, dtype: Any = "float32") -> Any:
    """An objective for cotengra's HyperOptimizer that scores an order by its modelled time on a
    GPU (``modelled_seconds``) instead of its products: pass it as ``minimize=``.

    Args:
        figures: The device's ceilings (``await tropical.device_figures()``); None: those of
            ``MODEL_FIGURES``, an H200's.
        dtype: The element type the steps are counted for.

    Returns:
        A ``cotengra.scoring.Objective``; a trial's score is log2(1 + its modelled time in
        picoseconds).

    Raises:
        ImportError: cotengra is not installed (``pip install 'aionvrtc[cotengra]'``).
        KeyError: ``dtype`` is not one of the kernels' element types.
    """
    figures = MODEL_FIGURES if figures is None else figures
    np.dtype(dtype)  # a bad dtype fails here, not in the optimizer's worker
    if np.dtype(dtype).name not in (*figures.pairs_per_s, "bool"):
        raise KeyError(
            f"dtype {np.dtype(dtype).name!r} is not one of the kernels' element types "
            f"({', '.join(figures.pairs_per_s)}, bool)"
        )
    return _objective_class()(figures, dtype)


@functools.cache
def _objective_class() -> type:
    from cotengra.scoring import ExactObjective

    class RooflineObjective(ExactObjective):  # type: ignore[misc]
        """cotengra's objective of aionvrtc's roofline model (``roofline_objective``). The
        parts of cotengra that see a step's products and sizes only (its optimal subtrees,
        annealing, slicing) weigh them as products + ``factor`` x elements written, ``factor``
        the pairs the GPU does in the time it writes an element."""

        __slots__ = ("dtype", "factor", "figures")

        def __init__(self, figures: DeviceFigures, dtype: Any) -> None:
            self.figures = figures
            self.dtype = np.dtype(dtype).name
            rate = figures.pairs_per_s["int32" if self.dtype == "bool" else self.dtype]
            self.factor = rate * np.dtype(dtype).itemsize / figures.copy_bytes_per_s
            super().__init__()

        def __reduce__(self) -> tuple[Any, ...]:
            # A class made on first use pickles as the call that makes it (cotengra's parallel
            # trials send the objective to worker processes).
            return roofline_objective, (self.figures, self.dtype)

        def __call__(self, trial: Mapping[str, Any]) -> float:
            # Positive, as cotengra raises scores to a power: log2 of 1 + the picoseconds.
            seconds = modelled_seconds(trial["tree"], self.figures, self.dtype)
            return math.log2(1.0 + 1e12 * seconds)

        def cost_local_tree_node(self, tree: Any, node: Any) -> float:
            return float(tree.get_flops(node) + self.factor * tree.get_size(node))

        def score_local(self, **kwargs: Any) -> float:
            flops, size = kwargs["flops"], kwargs["size"]
            flops = sum(flops) if isinstance(flops, Iterable) else flops
            size = sum(size) if isinstance(size, Iterable) else size
            return math.log2(flops + self.factor * size)

        def score_slice_index(self, costs: Any, ix: Any) -> float:
            saved = costs._flop_reductions[ix] + costs._write_reductions[ix] * self.factor
            return math.log(float(saved) + 1.0)

        def get_dynamic_programming_minimize(self) -> str:
            return f"combo-{self.factor:.6g}"

    return RooflineObjective
