"""KernelSpecs of the tropical kernels: one per (semiring, type, variant, layout class)."""

from __future__ import annotations

import functools
import hashlib
import itertools
from collections.abc import Iterable
from importlib import resources
from types import MappingProxyType
from typing import Literal

import numpy as np

from .._spec import KernelSpec
from ._semirings import DTYPES, SEMIRINGS, as_dtype, semiring

__all__ = [
    "ARGMAX_MAX_TILES",
    "LAYOUTS",
    "TILES",
    "VARIANTS",
    "Tile",
    "all_specs",
    "backward_spec",
    "gemm_expression",
    "gemm_spec",
    "shape_class",
    "tile_fits",
    "tile_variant",
    "tiled_spec",
    "tiled_supported",
]

Layout = Literal["rowmajor", "strided"]
# rowmajor: A has unit stride along k and B along n, known at compile time; strided: any.
LAYOUTS: tuple[Layout, ...] = ("rowmajor", "strided")
OPTIONS = ("-std=c++17",)


Family = Literal["gemm", "tiled", "rows", "backward"]
# The headers each family's source includes (kernels/): a kernel's key covers its family's
# source and these, and nothing of the other families.
_INCLUDES: dict[Family, tuple[str, ...]] = {
    "gemm": ("tropical_common.cuh",),
    "tiled": ("tropical_common.cuh", "tropical_fast.cuh"),
    "rows": ("tropical_common.cuh", "tropical_fast.cuh"),
    "backward": (),
}


@functools.cache
def _text(file: str) -> str:
    return resources.files(__package__).joinpath(f"kernels/{file}").read_text()


@functools.cache
def family_source(family: Family) -> tuple[str, MappingProxyType[str, str]]:
    """A kernel family's source (kernels/tropical_<family>.cu) and the headers it includes."""
    return _text(f"tropical_{family}.cu"), MappingProxyType(
        {header: _text(header) for header in _INCLUDES[family]}
    )


def family_digest(family: Family) -> str:
    """SHA-256 of a family's source and headers: what its kernels are built from (the tuning
    records of the tiled family are kept under it)."""
    source, headers = family_source(family)
    digest = hashlib.sha256(source.encode())
    for name, text in sorted(headers.items()):
        digest.update(b"\0" + name.encode() + b"\0" + text.encode())
    return digest.hexdigest()


def _spec(family: Family, expression: str) -> KernelSpec:
    source, headers = family_source(family)
    return KernelSpec(
        source,
        name_expressions=(expression,),
        options=OPTIONS,
        headers=headers,
        name=f"tropical_{family}.cu",
    )


def _bool(flag: bool) -> str:
    return "true" if flag else "false"


def gemm_expression(
    semiring_name: str,
    dtype: np.dtype[np.generic],
    *,
    argmax: bool,
    accumulate: bool,
    layout: Layout,
) -> str:
    ring = semiring(semiring_name)
    ring.check_dtype(dtype)
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return (
        f"tropical_gemm<{DTYPES[np.dtype(dtype)]}, {ring.cpp}, {_bool(argmax)}, "
        f"{_bool(accumulate)}, {_bool(layout == 'rowmajor')}>"
    )


@functools.cache
def gemm_spec(
    semiring_name: str,
    dtype: np.dtype[np.generic],
    *,
    argmax: bool,
    accumulate: bool,
    layout: Layout,
) -> KernelSpec:
    """The spec of one forward kernel: the shared source, one instantiation."""
    expression = gemm_expression(
        semiring_name, dtype, argmax=argmax, accumulate=accumulate, layout=layout
    )
    return _spec("gemm", expression)


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
    """The key of TILES[kind] for ``dtype``: kind and bytes ("f4", "i8"), "-argmax" added."""
    dtype = np.dtype(dtype)
    return f"{dtype.kind}{dtype.itemsize}{'-argmax' if argmax else ''}"


def tile_fits(tile: Tile, itemsize: int, *, argmax: bool = False) -> bool:
    """Whether the tuned kernel compiles with ``tile`` (its static_asserts) and fits the 48 KiB
    of static shared memory (the argmax variant also keeps 2 bytes per output there)."""
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


def shape_class(m: int, n: int, k: int = 1 << 30, *, argmax: bool = False, batch: int = 1) -> str:
    """The kernel class of a ``batch`` x M x N x K product: "rows4/8/16" (the skinny kernel: M
    at least TALL_M, N at most 64, K at most 16, no argmax), "cols4/8/16" (the same kernel on
    the transpose: N at least TALL_M, M at most 64), "tall16/32/64" and "wide16/32/64" (tiles
    as wide as N, or as tall as M), "large" (enough 128 x 128 tiles to fill the GPU) or
    "small"."""
    skinny = k <= ROWS_KMAX[-1] and not argmax
    kmax = next((x for x in ROWS_KMAX if k <= x), 0)
    if m >= TALL_M and n <= ROWS_NMAX:
        return f"rows{kmax}" if skinny else f"tall{_width(n)}"
    if n >= TALL_M and m <= ROWS_NMAX:
        return f"cols{kmax}" if skinny else f"wide{_width(m)}"
    tiles = batch * -(-m // 128) * -(-n // 128)
    return "small" if min(m, n) <= 64 or tiles < LARGE_MIN_TILES else "large"


def _width(size: int) -> int:
    return next(w for w in (16, 32, 64) if size <= w)


@functools.cache
def rows_spec(
    semiring_name: str, dtype: np.dtype[np.generic], *, accumulate: bool, kmax: int
) -> KernelSpec:
    """The spec of one skinny-product kernel (no argmax, K <= kmax, N <= ROWS_NMAX)."""
    ring = semiring(semiring_name)
    ring.check_dtype(dtype)
    if not tiled_supported(ring.name, dtype) or kmax not in ROWS_KMAX:
        raise ValueError(f"no skinny kernel for {ring.name} on {np.dtype(dtype)} with K <= {kmax}")
    expression = (
        f"tropical_gemm_rows<{DTYPES[np.dtype(dtype)]}, {_FAST[ring.name]}, "
        f"{_bool(accumulate)}, {kmax}>"
    )
    return _spec("rows", expression)


_FAST = {"maxplus": "FastMaxPlus", "minplus": "FastMinPlus", "maxmul": "FastMaxMul"}


def tiled_supported(semiring_name: str, dtype: np.dtype[np.generic]) -> bool:
    """Whether the tuned kernels serve this product (row-major operands assumed)."""
    return semiring_name in _FAST and np.dtype(dtype).itemsize in (4, 8)


@functools.cache
def tiled_spec(
    semiring_name: str,
    dtype: np.dtype[np.generic],
    *,
    argmax: bool,
    accumulate: bool,
    tile: Tile | None = None,
) -> KernelSpec:
    """The spec of one tuned row-major kernel with one tile configuration (default: the
    "large" class's)."""
    ring = semiring(semiring_name)
    ring.check_dtype(dtype)
    if not tiled_supported(ring.name, dtype):
        raise ValueError(f"no tuned kernel for {ring.name} on {np.dtype(dtype)}")
    bm, bn, bk, tm, tn, blocks = tile or TILES["large"][tile_variant(dtype, argmax=argmax)]
    expression = (
        f"tropical_gemm_tiled<{DTYPES[np.dtype(dtype)]}, {_FAST[ring.name]}, {_bool(argmax)}, "
        f"{_bool(accumulate)}, {bm}, {bn}, {bk}, {tm}, {tn}, {blocks}>"
    )
    return _spec("tiled", expression)


@functools.cache
def backward_spec(semiring_name: str, dtype: np.dtype[np.generic]) -> KernelSpec:
    ring = semiring(semiring_name)
    if ring.name == "andor" or as_dtype(dtype).kind != "f":
        raise TypeError(
            f"gradients need float32 or float64 operands of maxplus, minplus or maxmul, "
            f"not {np.dtype(dtype)} under {ring.name}"
        )
    product = _bool(ring.name == "maxmul")
    expression = f"tropical_backward<{DTYPES[np.dtype(dtype)]}, {product}>"
    return _spec("backward", expression)


def all_specs(
    semirings: Iterable[str] | None = None, dtypes: Iterable[object] | None = None
) -> list[KernelSpec]:
    """Every forward variant and layout (and backward kernel) of the named semirings and
    dtypes (default: all); combinations a semiring does not define are skipped. ValueError
    for a named semiring that takes none of the named dtypes, or a named dtype that none of
    the semirings takes: nothing would be compiled for what was asked."""
    for given, what in ((semirings, "semirings"), (dtypes, "dtypes")):
        if isinstance(given, str):  # iterating it would name one letter at a time
            raise TypeError(f"{what} must be a list such as [{given!r}], not a str")
    names = list(SEMIRINGS) if semirings is None else [semiring(n).name for n in semirings]
    wanted = None if dtypes is None else {as_dtype(d, "each of dtypes"): None for d in dtypes}
    if wanted is not None:
        asked = f"dtype{'s' * (len(wanted) > 1)} {', '.join(map(str, wanted))}"
        for name in names if semirings is not None else ():
            ring = SEMIRINGS[name]
            if not any(d in wanted for d in ring.dtypes):
                takes = ", ".join(map(str, ring.dtypes))
                raise ValueError(
                    f"no tropical kernels for semiring {name} with {asked}: {name} takes {takes}"
                )
        for dtype in wanted:
            if not any(dtype in SEMIRINGS[name].dtypes for name in names):
                under = f"semiring{'s' * (len(names) > 1)} {', '.join(names)}"
                takers = ", ".join(n for n, r in SEMIRINGS.items() if dtype in r.dtypes)
                raise ValueError(
                    f"no tropical kernels for dtype {dtype} under {under}: {takers} takes {dtype}"
                )
    specs: list[KernelSpec] = []
    for name in names:
        ring = SEMIRINGS[name]
        for dtype in ring.dtypes:
            if wanted is not None and dtype not in wanted:
                continue
            for argmax, accumulate, layout in itertools.product(
                (False, True), (False, True), LAYOUTS
            ):
                specs.append(
                    gemm_spec(name, dtype, argmax=argmax, accumulate=accumulate, layout=layout)
                )
            if tiled_supported(name, dtype):
                for argmax, acc in itertools.product((False, True), (False, True)):
                    variant = tile_variant(dtype, argmax=argmax)
                    specs += [
                        tiled_spec(name, dtype, argmax=argmax, accumulate=acc, tile=tile)
                        for tile in dict.fromkeys(t[variant] for t in TILES.values())
                    ]
                for acc in (False, True):
                    specs += [
                        rows_spec(name, dtype, accumulate=acc, kmax=kmax) for kmax in ROWS_KMAX
                    ]
            if name != "andor" and dtype.kind == "f":
                specs.append(backward_spec(name, dtype))
    return list(dict.fromkeys(specs))  # max-plus and min-plus share backward kernels
