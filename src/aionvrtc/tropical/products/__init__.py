"""Tropical matrix products on CuPy arrays: the semirings and the shape classes that pick each
product's kernel and tile, the kernels' specs, a product's plan (checked once per layout) and
its packed launch, ``matmul`` and ``backward`` with their blocking twins, the ``Batcher`` that
runs concurrent tasks' products as one launch (and the ``Joiner`` that groups their requests),
and autotuning.

The face of the products: ``aionvrtc.tropical`` re-exports the public names, and the rest of the
package (tensor networks, the reference, tuning, torch) takes what it builds on from here: how
a call is run and its kernels fetched (``run_async``, ``Fetch``...), launches (``Packed``,
``OnDevice``) and the kernel sources (``family_spec``).
"""

from ._batching import Batcher, BatcherStats
from ._calls import backward, backward_sync, matmul, matmul_sync, matmul_work, warm, warm_specs
from ._counts import MAX_MODULUS, entry_counts
from ._figures import MODEL_FIGURES, DeviceFigures, device_figures, known_figures, probe_spec
from ._joining import Group, Joiner, Member
from ._launching import Launch, OnDevice, Packed, launch, load_soon, loaded
from ._product_plan import Plan, batch_specs, choose, cupy_module, kernel_spec, plan, standins
from ._reference import CHUNK_ELEMENTS, MAX_BYTES, check_max_bytes, combine, max_bytes_bound
from ._semirings import DTYPES, SEMIRINGS, Semiring, numpy_dtype, semiring
from ._shape_classes import (
    ARGMAX_MAX_TILES,
    CANDIDATES,
    ROWS_KMAX,
    SHAPES,
    TILES,
    VARIANTS,
    shape_class,
    tables_version,
    tile_fits,
    tile_variant,
    tuned_tiles,
)
from ._shapes import check_operands, check_size
from ._specs import LAYOUTS, all_specs, backward_spec, family_spec, gemm_spec, tiled_supported
from ._top import MAX_TOP_GPU, top_product
from ._tune import autotune, random_operands, timed
from ._twins import Fetch, Offload, Wait, Work, run_async, run_sync

__all__ = [
    "ARGMAX_MAX_TILES",
    "CANDIDATES",
    "CHUNK_ELEMENTS",
    "DTYPES",
    "LAYOUTS",
    "MAX_BYTES",
    "MAX_MODULUS",
    "MAX_TOP_GPU",
    "MODEL_FIGURES",
    "ROWS_KMAX",
    "SEMIRINGS",
    "SHAPES",
    "TILES",
    "VARIANTS",
    "Batcher",
    "BatcherStats",
    "DeviceFigures",
    "Fetch",
    "Group",
    "Joiner",
    "Launch",
    "Member",
    "Offload",
    "OnDevice",
    "Packed",
    "Plan",
    "Semiring",
    "Wait",
    "Work",
    "all_specs",
    "autotune",
    "backward",
    "backward_spec",
    "backward_sync",
    "batch_specs",
    "check_max_bytes",
    "check_operands",
    "check_size",
    "choose",
    "combine",
    "cupy_module",
    "device_figures",
    "entry_counts",
    "family_spec",
    "gemm_spec",
    "kernel_spec",
    "known_figures",
    "launch",
    "load_soon",
    "loaded",
    "matmul",
    "matmul_sync",
    "matmul_work",
    "max_bytes_bound",
    "numpy_dtype",
    "plan",
    "probe_spec",
    "random_operands",
    "run_async",
    "run_sync",
    "semiring",
    "shape_class",
    "standins",
    "tables_version",
    "tile_fits",
    "tile_variant",
    "tiled_supported",
    "timed",
    "top_product",
    "tuned_tiles",
    "warm",
    "warm_specs",
]
