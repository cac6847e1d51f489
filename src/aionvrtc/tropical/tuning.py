"""What the autotuner and the benchmarks work with, for tuning and measuring the kernels
(``aionvrtc.tropical.matmul`` is the API for computing): the shape classes' representative
shapes and candidate tiles, the checks a tile must pass, planning a product and launching it
with a tile of one's choosing, and timing GPU work."""

from ._launching import launch
from ._product_plan import Plan, plan
from ._semirings import DTYPES
from ._shape_classes import ARGMAX_MAX_TILES, CANDIDATES, ROWS_KMAX, SHAPES, tile_fits, tile_variant
from ._specs import tiled_supported
from ._tune import random_operands, timed

__all__ = [
    "ARGMAX_MAX_TILES",
    "CANDIDATES",
    "DTYPES",
    "ROWS_KMAX",
    "SHAPES",
    "Plan",
    "launch",
    "plan",
    "random_operands",
    "tile_fits",
    "tile_variant",
    "tiled_supported",
    "timed",
]
