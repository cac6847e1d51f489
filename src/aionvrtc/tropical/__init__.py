"""Tropical matrix multiplication on the GPU, each kernel compiled lazily through aionvrtc.

Semirings (``semiring=``): ``maxplus`` (max over k of a + b), ``minplus`` (min over k of a + b),
``maxmul`` (max over k of a * b, defined for non-negative inputs) on float32, float64, int32 and
int64, and ``andor`` on bool. Integer infinities are the type's extremes and arithmetic
saturates. ``reference`` holds a NumPy implementation with the same semantics.
"""

from . import reference, tuning
from .networks import (
    EinsumPlan,
    EinsumProgram,
    clear_programs,
    einsum,
    einsum_plan,
    einsum_program,
    einsum_program_sync,
    einsum_sync,
)
from .products import (
    LAYOUTS,
    SEMIRINGS,
    TILES,
    VARIANTS,
    Batcher,
    BatcherStats,
    Semiring,
    all_specs,
    autotune,
    backward,
    backward_spec,
    backward_sync,
    gemm_spec,
    kernel_spec,
    matmul,
    matmul_sync,
    shape_class,
    tuned_tiles,
    warm,
)

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
