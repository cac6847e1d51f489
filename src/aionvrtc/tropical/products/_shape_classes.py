"""Shape classes of tropical products: which kernel and tile a product of a given shape takes.

The classes' names, their representative products (SHAPES) and candidate tiles (CANDIDATES) for
the autotuner, the default tiles (TILES) and the tuned ones installed in this process, and the
limits that send a product to the skinny kernel or away from the tuned kernel's argmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "ARGMAX_MAX_TILES",
    "CANDIDATES",
    "ROWS_KMAX",
    "SHAPES",
    "TILES",
    "VARIANTS",
    "ShapeClass",
    "Tile",
    "classify",
    "install",
    "shape_class",
    "tables_version",
    "tile_fits",
    "tile_variant",
    "tuned_tiles",
]

Tile = tuple[int, int, int, int, int, int]  # BM, BN, BK, TM, TN, blocks per SM

# Tile configurations of the tuned kernel, by shape class, then variant (tile_variant): the
# defaults where the autotuner (tropical.autotune) has not run on this GPU, its winners on the
# H200 (benchmarks/tile_sweep.py; results/tile_sweep-nvidia-h200*.md: "large" and "small"
# from the latest sweep, their argmax variants from the sweep of the argmax kernel with its tile
# numbers in shared memory (-argmax-shared-index), the tall and wide classes from the sweep of all
# classes). "large" products fill the GPU with big tiles; "small" ones (M or N at most 64, such
# as batches of small matrices) want more, smaller blocks; tall (wide) products want a tile as
# wide (tall) as N (M).
TILES: dict[str, dict[str, Tile]] = {
    "large": {
        "f4": (128, 128, 16, 8, 8, 1), "i4": (128, 128, 8, 8, 8, 2),
        "f8": (64, 64, 8, 4, 4, 1), "i8": (128, 128, 8, 8, 4, 1),
        "f4-argmax": (64, 128, 16, 4, 8, 2), "i4-argmax": (64, 128, 16, 4, 8, 2),
        "f8-argmax": (64, 64, 16, 4, 4, 2), "i8-argmax": (64, 64, 8, 4, 4, 1),
    },
    "small": {
        "f4": (64, 64, 16, 8, 4, 1), "i4": (32, 64, 16, 4, 4, 1),
        "f8": (64, 64, 8, 4, 4, 1), "i8": (64, 64, 8, 4, 4, 1),
        "f4-argmax": (64, 64, 8, 4, 4, 1), "i4-argmax": (64, 64, 8, 4, 4, 1),
        "f8-argmax": (64, 64, 8, 4, 4, 1), "i8-argmax": (64, 64, 8, 4, 4, 1),
    },
    "tall16": {
        "f4": (128, 16, 8, 8, 2, 1), "i4": (64, 16, 16, 4, 2, 1),
        "f8": (64, 16, 16, 4, 2, 1), "i8": (128, 16, 8, 8, 2, 1),
        "f4-argmax": (64, 16, 16, 4, 2, 1), "i4-argmax": (64, 16, 16, 4, 2, 1),
        "f8-argmax": (64, 16, 16, 4, 2, 1), "i8-argmax": (64, 16, 16, 4, 2, 1),
    },
    "tall32": {
        "f4": (64, 32, 16, 4, 4, 1), "i4": (128, 32, 16, 8, 4, 1),
        "f8": (64, 32, 8, 4, 4, 1), "i8": (64, 32, 8, 4, 4, 1),
        "f4-argmax": (64, 32, 8, 4, 4, 1), "i4-argmax": (64, 32, 16, 4, 4, 1),
        "f8-argmax": (64, 32, 8, 4, 4, 1), "i8-argmax": (64, 32, 8, 4, 4, 1),
    },
    "tall64": {
        "f4": (128, 64, 16, 8, 4, 1), "i4": (128, 64, 8, 8, 4, 1),
        "f8": (64, 64, 16, 4, 4, 1), "i8": (64, 64, 16, 4, 4, 1),
        "f4-argmax": (64, 64, 16, 4, 4, 1), "i4-argmax": (64, 64, 8, 4, 4, 1),
        "f8-argmax": (64, 64, 8, 4, 4, 1), "i8-argmax": (64, 64, 8, 4, 4, 1),
    },
    "wide16": {
        "f4": (16, 64, 16, 2, 4, 1), "i4": (16, 64, 16, 2, 4, 1),
        "f8": (16, 64, 16, 2, 4, 1), "i8": (16, 64, 16, 2, 4, 1),
        "f4-argmax": (16, 64, 16, 2, 4, 1), "i4-argmax": (16, 64, 16, 2, 4, 1),
        "f8-argmax": (16, 64, 16, 2, 4, 1), "i8-argmax": (16, 64, 16, 2, 4, 1),
    },
    "wide32": {
        "f4": (32, 64, 16, 4, 4, 1), "i4": (32, 64, 16, 4, 4, 1),
        "f8": (32, 128, 8, 4, 8, 1), "i8": (32, 64, 16, 4, 4, 1),
        "f4-argmax": (32, 64, 16, 4, 4, 1), "i4-argmax": (32, 64, 16, 4, 4, 1),
        "f8-argmax": (32, 64, 16, 4, 4, 1), "i8-argmax": (32, 64, 16, 4, 4, 1),
    },
    "wide64": {
        "f4": (64, 128, 8, 8, 8, 1), "i4": (64, 128, 8, 8, 8, 1),
        "f8": (64, 64, 16, 4, 4, 1), "i8": (64, 64, 16, 4, 4, 1),
        "f4-argmax": (64, 64, 16, 4, 4, 1), "i4-argmax": (64, 128, 8, 8, 8, 1),
        "f8-argmax": (64, 64, 8, 4, 4, 1), "i8-argmax": (64, 64, 8, 4, 4, 1),
    },
}  # fmt: skip
VARIANTS = tuple(TILES["large"])


def tile_variant(dtype: np.dtype[np.generic], *, argmax: bool) -> str:
    """The key of TILES[kind] for ``dtype``: kind and bytes ("f4", "i8"), "-argmax" added.

    Args:
        dtype: The element type: a NumPy dtype, type or name such as ``"float32"``.
        argmax: The variant that also computes the argmax.

    Returns:
        The variant's key, one of ``VARIANTS`` for the tuned kernels' types (another type gets
        a key that no table has, such as ``"b1"`` for bool).

    Raises:
        TypeError: ``dtype`` is not one NumPy understands.
    """
    dtype = np.dtype(dtype)
    return f"{dtype.kind}{dtype.itemsize}{'-argmax' if argmax else ''}"


def tile_fits(tile: Tile, itemsize: int, *, argmax: bool = False) -> bool:
    """Whether the tuned kernel compiles with ``tile`` (its static_asserts) and fits the 48 KiB
    of static shared memory (the argmax variant also keeps 2 bytes per output there).

    Args:
        tile: (BM, BN, BK, TM, TN, blocks per SM): a block's BM x BN tile of C, its step of
            BK along k, each thread's TM x TN tile of C, and how many blocks the compiler must
            fit on one SM (``__launch_bounds__``).
        itemsize: Bytes per element (4 or 8).
        argmax: The variant that also computes the argmax.

    Returns:
        True if the kernel compiles with ``tile`` and its shared memory fits, else False (a
        size below 1 included).

    Raises:
        ValueError: ``tile`` does not have six entries.
        TypeError: ``tile`` is not a sequence, or an entry of it or ``itemsize`` is not a
            number.
    """
    bm, bn, bk, tm, tn, blocks = tile
    if min(tile) < 1 or bm % tm or bn % tn or tm % 2 or tn % 2:
        return False
    threads = (bm // tm) * (bn // tn)
    return (
        threads <= 1024
        and (bm * bk) % threads == 0
        and (bk * bn) % threads == 0
        and 2 * bk * (bm + bn) * itemsize + (2 * bm * bn if argmax else 0) <= 48 << 10
        and blocks * threads <= 2048
    )


# The tuned kernel's argmax keeps the last improving k-tile of each output in 16 bits (0xffff:
# none), so products with an argmax and more k-tiles take the generic kernel (K past 0xffff * BK:
# at least half a million).
ARGMAX_MAX_TILES = 0xFFFF


# The skinny kernel (a thread per row of C, B in shared memory) serves products with K at most
# 16 and N (tall) or M (wide, run transposed) at most 64, by K's class; tiles serve the rest. On
# the H200 (results/tropical_gemm-nvidia-h200.md) it moved 59-79% of copy bandwidth at N = K =
# 4..16 against 12-37% for tiles, and lost to tiles at K = 32 and 64 (which it also compiles for).
ROWS_KMAX = (4, 8, 16)
ROWS_NMAX = 64
TALL_M = 4096


# Fewer tiles of 128 x 128 than this (about two per SM of a 132-SM H100 or H200) and a product
# takes the small tiles: at 1024^3 the large tiles left half of the H200 idle (12 T ops/s, where
# the 64 x 64 tiles of the argmax variant ran 14 T with the argmax's extra work).
LARGE_MIN_TILES = 256


@dataclass(frozen=True, slots=True)
class ShapeClass:
    """A product's class: ``name`` is a key of TILES, or for the skinny kernel "rows4/8/16"
    (tall products) and "cols4/8/16" (wide ones, run on the transpose)."""

    name: str
    kmax: int = 0  # the skinny kernel's bound on K; 0 where tiles serve
    transposed: bool = False  # the skinny kernel computes C^T = B^T A^T (wide products)


# Every class, made once: classify() runs on each matmul.
_TILED = {name: ShapeClass(name) for name in TILES}
_SKINNY = {
    (kmax, transposed): ShapeClass(f"{'cols' if transposed else 'rows'}{kmax}", kmax, transposed)
    for kmax in ROWS_KMAX
    for transposed in (False, True)
}


def classify(m: int, n: int, k: int, *, argmax: bool, batch: int) -> ShapeClass:
    """The class of a ``batch`` x M x N x K product (see shape_class)."""
    skinny = k <= ROWS_KMAX[-1] and not argmax
    if m >= TALL_M and n <= ROWS_NMAX:
        return _SKINNY[_kmax(k), False] if skinny else _TILED[f"tall{_width(n)}"]
    if n >= TALL_M and m <= ROWS_NMAX:
        return _SKINNY[_kmax(k), True] if skinny else _TILED[f"wide{_width(m)}"]
    tiles = batch * -(-m // 128) * -(-n // 128)
    return _TILED["small" if min(m, n) <= 64 or tiles < LARGE_MIN_TILES else "large"]


def shape_class(m: int, n: int, k: int = 1 << 30, *, argmax: bool = False, batch: int = 1) -> str:
    """The kernel class of a ``batch`` x M x N x K product: "rows4/8/16" (the skinny kernel: M
    at least TALL_M, N at most 64, K at most 16, no argmax), "cols4/8/16" (the same kernel on
    the transpose: N at least TALL_M, M at most 64), "tall16/32/64" and "wide16/32/64" (tiles
    as wide as N, or as tall as M), "large" (enough 128 x 128 tiles to fill the GPU) or
    "small".

    TALL_M is 4096. The class decides the kernel where the tuned kernels serve the semiring
    and type (``tiled_supported``); the generic kernel serves the others whatever the class.

    Args:
        m: Rows of A and C.
        n: Columns of B and C.
        k: Columns of A, rows of B. Default: large enough to rule out the skinny kernel.
        argmax: The product also computes the argmax (which the skinny kernel does not).
        batch: The batch size (1: no batch); a batch counts towards filling the GPU.

    Returns:
        The class's name, a key of ``TILES`` or one of the skinny kernel's ``"rows4"``...
        ``"cols16"``.

    Raises:
        TypeError: A size is not a number. Sizes are not otherwise checked (``kernel_spec``
            refuses those below 1).
    """
    return classify(m, n, k, argmax=argmax, batch=batch).name


def _kmax(k: int) -> int:
    return next(x for x in ROWS_KMAX if k <= x)


def _width(size: int) -> int:
    return next(w for w in (16, 32, 64) if size <= w)


# Candidate tiles by shape class (those a variant cannot use are skipped, see tile_fits).
CANDIDATES: dict[str, tuple[Tile, ...]] = {
    "large": (
        (128, 128, 8, 8, 8, 1), (128, 128, 8, 8, 8, 2), (128, 128, 16, 8, 8, 1),
        (128, 128, 16, 8, 8, 2), (128, 128, 8, 8, 4, 1), (128, 64, 8, 8, 4, 1),
        (128, 64, 16, 8, 4, 1), (128, 64, 16, 8, 4, 2), (128, 64, 32, 8, 4, 1),
        (128, 64, 8, 8, 4, 2), (64, 64, 8, 4, 4, 1), (64, 64, 16, 4, 4, 1), (64, 64, 16, 4, 4, 2),
        (64, 64, 32, 4, 4, 1), (64, 128, 8, 4, 8, 1), (64, 128, 16, 4, 8, 2),
    ),
    "small": (
        (64, 64, 8, 8, 4, 1), (64, 64, 8, 4, 4, 1), (64, 64, 16, 4, 4, 1), (64, 64, 32, 4, 4, 1),
        (64, 64, 16, 8, 4, 1), (64, 64, 32, 8, 8, 1), (32, 64, 16, 4, 4, 1),
        (64, 64, 16, 4, 4, 2), (32, 64, 32, 4, 4, 1),
    ),
    "tall16": (
        (128, 16, 8, 8, 2, 1), (128, 16, 16, 8, 2, 1), (64, 16, 16, 4, 2, 1),
        (128, 16, 16, 4, 4, 1), (256, 16, 16, 8, 4, 1), (128, 32, 8, 8, 4, 1),
    ),
    "tall32": (
        (64, 32, 8, 4, 4, 1), (128, 32, 8, 8, 4, 1), (128, 32, 16, 8, 4, 1),
        (128, 32, 16, 4, 4, 1), (256, 32, 16, 8, 4, 1), (64, 32, 16, 4, 4, 1),
    ),
    "tall64": (
        (128, 64, 8, 8, 4, 1), (128, 64, 16, 8, 4, 1), (64, 64, 16, 4, 4, 1),
        (128, 64, 16, 4, 4, 1), (256, 64, 8, 8, 8, 1), (64, 64, 8, 4, 4, 1),
    ),
    "wide16": ((16, 128, 16, 2, 8, 1), (16, 128, 8, 2, 8, 1), (16, 64, 16, 2, 4, 1)),
    "wide32": (
        (32, 128, 8, 4, 8, 1), (32, 128, 16, 4, 8, 1), (32, 64, 16, 4, 4, 1),
        (32, 256, 8, 4, 8, 1),
    ),
    "wide64": (
        (64, 64, 8, 4, 4, 1), (64, 128, 8, 4, 8, 1), (64, 128, 8, 8, 8, 1),
        (64, 256, 8, 8, 8, 1), (64, 64, 16, 4, 4, 1),
    ),
}  # fmt: skip

# The representative product of each class: (batch, M, N, K).
SHAPES: dict[str, tuple[int, int, int, int]] = {
    "large": (1, 4096, 4096, 4096),
    "small": (1024, 64, 64, 64),
    "tall16": (1, 1 << 20, 16, 16),
    "tall32": (1, 1 << 20, 32, 32),
    "tall64": (1, 1 << 20, 64, 64),
    "wide16": (1, 16, 1 << 20, 16),
    "wide32": (1, 32, 1 << 20, 32),
    "wide64": (1, 64, 1 << 20, 64),
}

# Winners installed in this process, by device: device -> class -> variant -> tile.
_installed: dict[int, dict[str, dict[str, Tile]]] = {}


# Bumped by every install: launches planned with other tiles are not reused (_plan_cache).
_version = [0]


def tables_version() -> int:
    """How many tables have been installed in this process."""
    return _version[0]


def tuned_tiles(device: int) -> dict[str, dict[str, Tile]]:
    """The tiles matmul uses on ``device``: the autotuner's winners, else the built-in TILES.

    Args:
        device: The CUDA device's index. Not checked: a device with no table installed by
            ``autotune`` in this process, or none at all, gets TILES.

    Returns:
        The table in use, by shape class then variant (``tile_variant``) to a tile (BM, BN,
        BK, TM, TN, blocks per SM). It is the table itself, not a copy: read it, do not change
        it.

    Raises:
        TypeError: ``device`` is not hashable (an int is expected).
    """
    return _installed.get(device, TILES)


def install(device: int, table: dict[str, dict[str, Tile]]) -> None:
    """Use ``table`` (class -> variant -> tile) for matmul on ``device`` from now on."""
    _installed[device] = table
    _version[0] += 1
