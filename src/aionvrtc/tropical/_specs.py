"""KernelSpecs of the tropical kernels: one per (semiring, type, variant, layout class)."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable
from importlib import resources
from typing import Literal

import numpy as np

from .._spec import KernelSpec
from ._semirings import DTYPES, SEMIRINGS, semiring

__all__ = [
    "LAYOUTS",
    "TILES",
    "Tile",
    "all_specs",
    "backward_spec",
    "gemm_expression",
    "gemm_spec",
    "shape_class",
    "tiled_spec",
    "tiled_supported",
]

Layout = Literal["rowmajor", "strided"]
# rowmajor: A has unit stride along k and B along n, known at compile time; strided: any.
LAYOUTS: tuple[Layout, ...] = ("rowmajor", "strided")
OPTIONS = ("-std=c++17",)


@functools.cache
def source() -> str:
    return resources.files(__package__).joinpath("kernels/tropical.cu").read_text()


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
    ring.check_dtype(dtype, "the operands")
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
    return KernelSpec(source(), name_expressions=(expression,), options=OPTIONS, name="tropical.cu")


Tile = tuple[int, int, int, int, int]  # BM, BN, BK, TM, TN
# Tile configurations of the tuned kernel, by shape class and element size. Chosen from a sweep
# of candidate tiles on the lent H200 (f32 max-plus; .probe sweeps are not committed): "large"
# products fill the GPU with big tiles; "small" ones (M or N at most 64, such as batches of small
# matrices) want more, smaller blocks; tall products (M >= 4096) want a tile as wide as N.
TILES: dict[str, dict[int, Tile]] = {
    "large": {4: (128, 128, 8, 8, 8), 8: (128, 64, 8, 8, 4)},
    "small": {4: (64, 64, 8, 8, 4), 8: (64, 64, 8, 4, 4)},
    "tall16": {4: (128, 32, 8, 8, 4), 8: (128, 32, 8, 8, 4)},
    "tall32": {4: (64, 32, 8, 4, 4), 8: (64, 32, 8, 4, 4)},
    "tall64": {4: (128, 64, 8, 8, 4), 8: (128, 64, 8, 8, 4)},
}

# The skinny kernel (a thread per row, B in shared memory) serves tall products with K and N
# up to these; above, tiles measured faster (one shared-memory load per pair in the skinny one).
ROWS_KMAX = (8,)
TALL_M = 4096


def shape_class(m: int, n: int, k: int = 1 << 30) -> str:
    """The kernel class for an M x N x K product: "rows8", "tall16/32/64", "small", "large"."""
    if m >= TALL_M:
        if max(n, k) <= ROWS_KMAX[-1]:
            return f"rows{ROWS_KMAX[-1]}"
        for width in (16, 32, 64):
            if n <= width:
                return f"tall{width}"
    return "small" if min(m, n) <= 64 else "large"


@functools.cache
def rows_spec(
    semiring_name: str, dtype: np.dtype[np.generic], *, accumulate: bool, kmax: int
) -> KernelSpec:
    """The spec of one skinny-product kernel (row-major, no argmax, K and N <= kmax)."""
    ring = semiring(semiring_name)
    ring.check_dtype(dtype, "the operands")
    if not tiled_supported(ring.name, dtype, argmax=False) or kmax not in ROWS_KMAX:
        raise ValueError(f"no skinny kernel for {ring.name} on {np.dtype(dtype)}, K <= {kmax}")
    expression = (
        f"tropical_gemm_rows<{DTYPES[np.dtype(dtype)]}, {_FAST[ring.name]}, "
        f"{_bool(accumulate)}, {kmax}>"
    )
    return KernelSpec(source(), name_expressions=(expression,), options=OPTIONS, name="tropical.cu")


_FAST = {"maxplus": "FastMaxPlus", "minplus": "FastMinPlus", "maxmul": "FastMaxMul"}


def tiled_supported(semiring_name: str, dtype: np.dtype[np.generic], *, argmax: bool) -> bool:
    """Whether the tuned kernel serves this product (row-major operands assumed)."""
    return not argmax and semiring_name in _FAST and np.dtype(dtype).itemsize in TILES["large"]


@functools.cache
def tiled_spec(
    semiring_name: str,
    dtype: np.dtype[np.generic],
    *,
    accumulate: bool,
    tile: Tile | None = None,
) -> KernelSpec:
    """The spec of one tuned row-major kernel (no argmax) with one tile configuration."""
    ring = semiring(semiring_name)
    ring.check_dtype(dtype, "the operands")
    if not tiled_supported(ring.name, dtype, argmax=False):
        raise ValueError(f"no tuned kernel for {ring.name} on {np.dtype(dtype)}")
    bm, bn, bk, tm, tn = tile or TILES["large"][np.dtype(dtype).itemsize]
    expression = (
        f"tropical_gemm_tiled<{DTYPES[np.dtype(dtype)]}, {_FAST[ring.name]}, "
        f"{_bool(accumulate)}, {bm}, {bn}, {bk}, {tm}, {tn}>"
    )
    return KernelSpec(source(), name_expressions=(expression,), options=OPTIONS, name="tropical.cu")


@functools.cache
def backward_spec(semiring_name: str, dtype: np.dtype[np.generic]) -> KernelSpec:
    ring = semiring(semiring_name)
    if ring.name == "andor" or np.dtype(dtype).kind != "f":
        raise TypeError(
            f"gradients need float32 or float64 operands of maxplus, minplus or maxmul, "
            f"not {np.dtype(dtype)} under {ring.name}"
        )
    product = _bool(ring.name == "maxmul")
    expression = f"tropical_backward<{DTYPES[np.dtype(dtype)]}, {product}>"
    return KernelSpec(source(), name_expressions=(expression,), options=OPTIONS, name="tropical.cu")


def all_specs(
    semirings: Iterable[str] | None = None, dtypes: Iterable[object] | None = None
) -> list[KernelSpec]:
    """Every forward variant and layout (and backward kernel) of the named semirings and
    dtypes (default: all); combinations a semiring does not define are skipped."""
    names = list(SEMIRINGS) if semirings is None else [semiring(n).name for n in semirings]
    wanted = None if dtypes is None else {np.dtype(d) for d in dtypes}  # type: ignore[call-overload]
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
            if tiled_supported(name, dtype, argmax=False):
                for acc in (False, True):
                    specs += [
                        tiled_spec(name, dtype, accumulate=acc, tile=tile)
                        for tile in dict.fromkeys(t[dtype.itemsize] for t in TILES.values())
                    ]
                    specs += [
                        rows_spec(name, dtype, accumulate=acc, kmax=kmax) for kmax in ROWS_KMAX
                    ]
            if name != "andor" and dtype.kind == "f":
                specs.append(backward_spec(name, dtype))
    return list(dict.fromkeys(specs))  # max-plus and min-plus share backward kernels
