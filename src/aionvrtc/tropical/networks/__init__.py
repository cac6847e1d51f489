"""Tropical tensor networks: a contraction's subscripts, its plan (the order, each step as a
batched product, its slicing), the steps prepared for a device, the kernel of many small
products and which steps it takes, the backtrace of the argmaxes; and its runs: eager
(``einsum``, with counts or the k best too; every assignment attaining the value,
``configurations``), compiled into a CUDA graph (``einsum_program``, over a batch of queries
too, and concurrent calls joined by ``ProgramBatcher``), in slices over the host's GPUs, and
on a Ray cluster (``tropical.cluster``).

The face of the tensor networks: ``aionvrtc.tropical`` re-exports the public names.
"""

from ._calls import einsum, einsum_sync
from ._counted_programs import (
    MAX_COUNTED_PROGRAMS,
    CountedProgram,
    clear_counted_programs,
    counted_program,
    counted_program_sync,
)
from ._counted_walks import configurations, configurations_sync
from ._counting import MAX_TOP
from ._orders import roofline_objective
from ._plan import EinsumPlan, StepCost
from ._planner import einsum_plan
from ._program_batcher import ProgramBatcher, ProgramBatcherStats
from ._programs import EinsumProgram, clear_programs, einsum_program, einsum_program_sync
from ._reference import top_values
from ._subscripts import MAX_INDICES, NetworkSubscripts
from ._walks import check_limit

__all__ = [
    "MAX_COUNTED_PROGRAMS",
    "MAX_INDICES",
    "MAX_TOP",
    "CountedProgram",
    "EinsumPlan",
    "EinsumProgram",
    "NetworkSubscripts",
    "ProgramBatcher",
    "ProgramBatcherStats",
    "StepCost",
    "check_limit",
    "clear_counted_programs",
    "clear_programs",
    "configurations",
    "configurations_sync",
    "counted_program",
    "counted_program_sync",
    "einsum",
    "einsum_plan",
    "einsum_program",
    "einsum_program_sync",
    "einsum_sync",
    "roofline_objective",
    "top_values",
]
