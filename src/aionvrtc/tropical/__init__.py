"""Tropical matrix multiplication on the GPU, each kernel compiled lazily through aionvrtc.

Semirings (``semiring=``): ``maxplus`` (max over k of a + b), ``minplus`` (min over k of a + b),
``maxmul`` (max over k of a * b, defined for non-negative inputs) on float32, float64, int32 and
int64, and ``andor`` on bool. Integer infinities are the type's extremes and arithmetic
saturates. ``reference`` holds a NumPy implementation with the same semantics.
"""

from . import reference
from ._api import backward, backward_sync, matmul, matmul_sync, warm
from ._classes import (
    ARGMAX_MAX_TILES,
    CANDIDATES,
    ROWS_KMAX,
    SHAPES,
    TILES,
    VARIANTS,
    shape_class,
    tile_fits,
    tile_variant,
    tuned_tiles,
)
from ._planning import Plan, kernel_spec, plan
from ._semirings import DTYPES, SEMIRINGS, Semiring
from ._specs import LAYOUTS, all_specs, backward_spec, gemm_spec, tiled_supported
from ._tune import autotune, random_operands, timed

__all__ = [
    "ARGMAX_MAX_TILES",
    "CANDIDATES",
    "DTYPES",
    "LAYOUTS",
    "ROWS_KMAX",
    "SEMIRINGS",
    "SHAPES",
    "TILES",
    "VARIANTS",
    "Plan",
    "Semiring",
    "all_specs",
    "autotune",
    "backward",
    "backward_spec",
    "backward_sync",
    "gemm_spec",
    "kernel_spec",
    "matmul",
    "matmul_sync",
    "plan",
    "random_operands",
    "reference",
    "shape_class",
    "tile_fits",
    "tile_variant",
    "tiled_supported",
    "timed",
    "tuned_tiles",
    "warm",
]
