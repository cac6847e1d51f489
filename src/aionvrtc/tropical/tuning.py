"""What the autotuner and the benchmarks work with, for tuning and measuring the kernels
(``aionvrtc.tropical.matmul`` is the API for computing): the shape classes' representative
shapes and candidate tiles, the checks a tile must pass, planning a product and launching it
with a tile of one's choosing, and timing GPU work."""

from .products import (
    ARGMAX_MAX_TILES,
    CANDIDATES,
    DTYPES,
    ROWS_KMAX,
    SHAPES,
    Plan,
    launch,
    plan,
    random_operands,
    tile_fits,
    tile_variant,
    tiled_supported,
    timed,
)

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
