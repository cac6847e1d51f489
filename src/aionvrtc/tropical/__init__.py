"""Tropical matrix multiplication on the GPU, each kernel compiled lazily through aionvrtc.

Semirings (``semiring=``): ``maxplus`` (max over k of a + b), ``minplus`` (min over k of a + b),
``maxmul`` (max over k of a * b, defined for non-negative inputs) on float32, float64, int32 and
int64, and ``andor`` on bool. Integer infinities are the type's extremes and arithmetic
saturates. ``reference`` holds a NumPy implementation with the same semantics.
"""

from . import reference, tuning
from ._api import backward, backward_sync, matmul, matmul_sync, warm
from ._batching import Batcher, BatcherStats
from ._einsum import einsum, einsum_sync
from ._einsum_plan import EinsumPlan, einsum_plan
from ._einsum_program import EinsumProgram, clear_programs, einsum_program, einsum_program_sync
from ._product_plan import kernel_spec
from ._semirings import SEMIRINGS, Semiring
from ._shape_classes import TILES, VARIANTS, shape_class, tuned_tiles
from ._specs import LAYOUTS, all_specs, backward_spec, gemm_spec
from ._tune import autotune

__all__ = [
    "LAYOUTS",
    "SEMIRINGS",
    "TILES",
    "VARIANTS",
    "Batcher",
    "BatcherStats",
    "EinsumPlan",
    "EinsumProgram",
    "Semiring",
    "all_specs",
    "autotune",
    "backward",
    "backward_spec",
    "backward_sync",
    "clear_programs",
    "einsum",
    "einsum_plan",
    "einsum_program",
    "einsum_program_sync",
    "einsum_sync",
    "gemm_spec",
    "kernel_spec",
    "matmul",
    "matmul_sync",
    "reference",
    "shape_class",
    "tuned_tiles",
    "tuning",
    "warm",
]
