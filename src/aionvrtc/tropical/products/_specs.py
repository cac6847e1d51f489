"""KernelSpecs of the tropical kernels: one per (semiring, type, variant, layout class)."""

from __future__ import annotations

import functools
import hashlib
import itertools
from collections.abc import Iterable
from importlib import resources
from types import MappingProxyType
from typing import Any, Literal

import numpy as np

from ..._spec import KernelSpec
from ._semirings import DTYPES, SEMIRINGS, Semiring, as_dtype, semiring
from ._shape_classes import ROWS_KMAX, TILES, Tile, tile_variant

__all__ = [
    "COUNTED_FORMS",
    "COUNTINGS",
    "LAYOUTS",
    "TOP_BOUNDS",
    "TOP_LANES",
    "all_specs",
    "backward_spec",
    "counted_spec",
    "family_digest",
    "family_source",
    "family_spec",
    "gemm_spec",
    "pairs",
    "rows_spec",
    "tiled_spec",
    "tiled_supported",
    "top_spec",
]

Layout = Literal["rowmajor", "strided"]
# rowmajor: A has unit stride along k and B along n, known at compile time; strided: any.
LAYOUTS: tuple[Layout, ...] = ("rowmajor", "strided")
OPTIONS = ("-std=c++17",)


Family = Literal["gemm", "tiled", "rows", "backward", "einsum", "probe", "counted", "top"]
# The headers each family's source includes (kernels/): a kernel's key covers its family's
# source and these, and nothing of the other families.
_INCLUDES: dict[Family, tuple[str, ...]] = {
    "gemm": ("tropical_common.cuh",),
    "tiled": ("tropical_common.cuh", "tropical_fast.cuh"),
    "rows": ("tropical_common.cuh", "tropical_fast.cuh"),
    "backward": (),
    "einsum": ("tropical_common.cuh",),
    "probe": (),
    "counted": ("tropical_common.cuh", "tropical_counts.cuh", "tropical_fast.cuh"),
    "top": ("tropical_common.cuh", "tropical_counts.cuh"),
}


@functools.cache
def _text(file: str) -> str:
    return resources.files("aionvrtc.tropical").joinpath(f"kernels/{file}").read_text()


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


def family_spec(family: Family, expression: str) -> KernelSpec:
    """The spec of kernel ``expression`` (a name expression) of a family's source."""
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


def gemm_spec(
    semiring_name: str | Semiring,
    dtype: Any,
    *,
    argmax: bool,
    accumulate: bool,
    layout: Layout,
) -> KernelSpec:
    """The spec of one forward kernel of the generic family: the shared source, one
    instantiation.

    ``kernel_spec`` names the kernel that ``matmul`` launches for a product, of whichever
    family; this builds the generic kernel's, which serves every product of its semiring and
    type (the tuned kernels are faster where they serve).

    Args:
        semiring_name: ``"maxplus"``, ``"minplus"``, ``"maxmul"`` or ``"andor"``, or one of
            ``SEMIRINGS``.
        dtype: The element type: a NumPy dtype, type or name such as ``"float32"``.
        argmax: The variant that also computes the argmax.
        accumulate: The variant that computes C = C (+) A (x) B.
        layout: ``"rowmajor"`` (A has unit stride along k and B along n, known at compile
            time) or ``"strided"`` (any strides).

    Returns:
        The kernel's spec, for ``Compiler.compile`` or ``Compiler.get``.

    Raises:
        ValueError: ``semiring_name`` is not one of the four (or is a Semiring made
            elsewhere); ``dtype`` is not a dtype, or not one the semiring takes; ``layout``
            is not one of ``LAYOUTS``.
        TypeError: ``dtype`` is not hashable.
    """
    return _gemm_spec(
        semiring(semiring_name), dtype, argmax=argmax, accumulate=accumulate, layout=layout
    )


@functools.cache
def _gemm_spec(
    ring: Semiring,
    dtype: np.dtype[np.generic],
    *,
    argmax: bool,
    accumulate: bool,
    layout: Layout,
) -> KernelSpec:
    ring.check_dtype(dtype)
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    expression = (
        f"tropical_gemm<{DTYPES[np.dtype(dtype)]}, {ring.cpp}, {_bool(argmax)}, "
        f"{_bool(accumulate)}, {_bool(layout == 'rowmajor')}>"
    )
    return family_spec("gemm", expression)


@functools.cache
def rows_spec(
    ring: Semiring, dtype: np.dtype[np.generic], *, accumulate: bool, kmax: int
) -> KernelSpec:
    """The spec of one skinny-product kernel (no argmax, K <= kmax, N <= ROWS_NMAX)."""
    ring.check_dtype(dtype)
    if not tiled_supported(ring.name, dtype) or kmax not in ROWS_KMAX:
        raise ValueError(f"no skinny kernel for {ring.name} on {np.dtype(dtype)} with K <= {kmax}")
    expression = (
        f"tropical_gemm_rows<{DTYPES[np.dtype(dtype)]}, {_FAST[ring.name]}, "
        f"{_bool(accumulate)}, {kmax}>"
    )
    return family_spec("rows", expression)


_FAST = {"maxplus": "FastMaxPlus", "minplus": "FastMinPlus", "maxmul": "FastMaxMul"}


def tiled_supported(semiring_name: str, dtype: np.dtype[np.generic]) -> bool:
    """Whether the tuned kernels (tiles, the skinny kernel) serve this semiring and type:
    max-plus, min-plus and max-times on 4- and 8-byte elements.

    Args:
        semiring_name: The semiring's name, such as ``"maxplus"`` (a Semiring object is not
            recognised: False).
        dtype: The element type: a NumPy dtype, type or name such as ``"float32"``. Only its
            size is looked at.

    Returns:
        True where the tuned kernels serve, else False (the generic kernel serves).

    Raises:
        TypeError: ``dtype`` is not one NumPy understands (checked only for a semiring the
            tuned kernels serve), or ``semiring_name`` is not hashable.
    """
    return semiring_name in _FAST and np.dtype(dtype).itemsize in (4, 8)


@functools.cache
def tiled_spec(
    ring: Semiring,
    dtype: np.dtype[np.generic],
    *,
    argmax: bool,
    accumulate: bool,
    tile: Tile | None = None,
) -> KernelSpec:
    """The spec of one tuned row-major kernel with one tile configuration (default: the
    "large" class's)."""
    ring.check_dtype(dtype)
    if not tiled_supported(ring.name, dtype):
        raise ValueError(f"no tuned kernel for {ring.name} on {np.dtype(dtype)}")
    bm, bn, bk, tm, tn, blocks = tile or TILES["large"][tile_variant(dtype, argmax=argmax)]
    expression = (
        f"tropical_gemm_tiled<{DTYPES[np.dtype(dtype)]}, {_FAST[ring.name]}, {_bool(argmax)}, "
        f"{_bool(accumulate)}, {bm}, {bn}, {bk}, {tm}, {tn}, {blocks}>"
    )
    return family_spec("tiled", expression)


Counting = Literal["ones", "exact", "modular"]
# ones: each operand entry counts for 1 (no count arrays read); exact: int64 counts, -1 past
# 2^63 - 1; modular: residues modulo a prime below 2^31. (tropical_counted.cu's Ones, Exact and
# Modular.)
COUNTINGS: tuple[Counting, ...] = ("ones", "exact", "modular")
CountedForm = Literal["tiles", "rows", "warps", "count"]
# tiles: 64 x 64 tiles of C per block; rows: a thread per output, for products with few rows or
# few columns; warps: a warp per output, for long sums into few outputs; count: the counts alone,
# in 64 x 64 tiles, of values a value product wrote first.
COUNTED_FORMS: tuple[CountedForm, ...] = ("tiles", "rows", "warps", "count")
# Each form's template, and its arguments past (type, semiring, counting).
_COUNTED_KERNELS: dict[CountedForm, tuple[str, str]] = {
    "tiles": ("tropical_counted", ""),
    "rows": ("tropical_counted_rows", ", 1"),
    "warps": ("tropical_counted_rows", ", 32"),
    "count": ("tropical_count", ""),
}


@functools.cache
def counted_spec(
    ring: Semiring, dtype: np.dtype[np.generic], *, counting: Counting, form: CountedForm
) -> KernelSpec:
    """The spec of one counted-product kernel (tropical_counted.cu): values and the counts of
    the ways each is attained (the count form: the counts of values written already), any
    strides, batches, accumulating or not (arguments; the count form never accumulates)."""
    ring.check_dtype(dtype)
    if counting not in COUNTINGS or form not in COUNTED_FORMS:
        raise ValueError(f"no counted kernel {form!r} counting {counting!r}")
    template, more = _COUNTED_KERNELS[form]
    expression = f"{template}<{DTYPES[np.dtype(dtype)]}, {ring.cpp}, {counting.capitalize()}{more}>"
    return family_spec("counted", expression)


# The k-best kernel's bounds on k (its lists in registers): a list of k takes the least that
# holds it. (The reference's einsum takes top up to 64, the CPU's.)
TOP_BOUNDS = (4, 8, 16)


# Threads per output list: one, or a warp for a long sum into few outputs.
TOP_LANES = (1, 32)


@functools.cache
def top_spec(
    ring: Semiring, dtype: np.dtype[np.generic], *, kmax: int, lanes: int = 1
) -> KernelSpec:
    """The spec of one k-best kernel (tropical_top.cu): lists of up to ``kmax`` (value,
    count) pairs, ``lanes`` threads per output."""
    ring.check_dtype(dtype)
    if kmax not in TOP_BOUNDS:
        raise ValueError(f"no k-best kernel for lists of {kmax}: the bounds are {TOP_BOUNDS}")
    if lanes not in TOP_LANES:
        raise ValueError(f"no k-best kernel with {lanes} threads per output: {TOP_LANES}")
    expression = f"tropical_top<{DTYPES[np.dtype(dtype)]}, {ring.cpp}, {kmax}, {lanes}>"
    return family_spec("top", expression)


def backward_spec(semiring_name: str | Semiring, dtype: Any) -> KernelSpec:
    """The spec of the backward kernel of a product under ``semiring_name``: the kernel that
    ``backward`` launches. Max-plus and min-plus share one.

    Args:
        semiring_name: ``"maxplus"``, ``"minplus"`` or ``"maxmul"``, or one of ``SEMIRINGS``.
        dtype: The element type: float32 or float64, as a NumPy dtype, type or name.

    Returns:
        The kernel's spec, for ``Compiler.compile`` or ``Compiler.get``.

    Raises:
        TypeError: ``semiring_name`` is ``"andor"``, or ``dtype`` is one of the kernels' other
            types (int32, int64, bool): they have no gradients. Also where ``dtype`` is not
            hashable.
        ValueError: ``semiring_name`` is not one of the four (or is a Semiring made
            elsewhere); ``dtype`` is not one of the kernels' types.
    """
    return _backward_spec(semiring(semiring_name), dtype)


@functools.cache
def _backward_spec(ring: Semiring, dtype: np.dtype[np.generic]) -> KernelSpec:
    if ring.name == "andor" or as_dtype(dtype).kind != "f":
        raise TypeError(
            f"gradients need float32 or float64 operands of maxplus, minplus or maxmul, "
            f"not {np.dtype(dtype)} under {ring.name}"
        )
    product = _bool(ring.name == "maxmul")
    expression = f"tropical_backward<{DTYPES[np.dtype(dtype)]}, {product}>"
    return family_spec("backward", expression)


def all_specs(
    semirings: Iterable[str] | None = None, dtypes: Iterable[object] | None = None
) -> list[KernelSpec]:
    """Every forward variant and layout (and backward kernel) of the named semirings and
    dtypes: what ``warm`` compiles.

    The generic kernels of each variant (argmax, accumulate) and layout, the tuned ones with
    each tile of ``TILES`` and the skinny ones where they serve, the backward kernels of the
    float types, the counted kernels (``matmul(..., counts=...)``) of each counting and form,
    and the k-best kernels (``einsum(..., top=k)``) of each bound on k. Combinations a semiring
    does not define are skipped.

    Args:
        semirings: The semirings' names, such as ``["maxplus"]``. Default: all four.
        dtypes: The element types, such as ``["float32"]``. Default: all that each semiring
            takes.

    Returns:
        The specs, each once, by semiring then dtype.

    Raises:
        TypeError: ``semirings`` or ``dtypes`` is a str, not a list of them.
        ValueError: A name is not a semiring or a dtype; a named semiring takes none of the
            named dtypes, or a named dtype none of the semirings: nothing would be compiled
            for what was asked.
    """
    specs: list[KernelSpec] = []
    for ring, dtype in pairs(semirings, dtypes):
        name = ring.name
        for argmax, accumulate, layout in itertools.product((False, True), (False, True), LAYOUTS):
            specs.append(
                _gemm_spec(ring, dtype, argmax=argmax, accumulate=accumulate, layout=layout)
            )
        if tiled_supported(name, dtype):
            for argmax, acc in itertools.product((False, True), (False, True)):
                variant = tile_variant(dtype, argmax=argmax)
                specs += [
                    tiled_spec(ring, dtype, argmax=argmax, accumulate=acc, tile=tile)
                    for tile in dict.fromkeys(t[variant] for t in TILES.values())
                ]
            for acc in (False, True):
                specs += [rows_spec(ring, dtype, accumulate=acc, kmax=kmax) for kmax in ROWS_KMAX]
        if name != "andor" and dtype.kind == "f":
            specs.append(_backward_spec(ring, dtype))
        specs += [
            counted_spec(ring, dtype, counting=counting, form=form)
            for counting, form in itertools.product(COUNTINGS, COUNTED_FORMS)
        ]
        specs += [
            top_spec(ring, dtype, kmax=kmax, lanes=lanes)
            for kmax, lanes in itertools.product(TOP_BOUNDS, TOP_LANES)
        ]
    return list(dict.fromkeys(specs))  # max-plus and min-plus share backward kernels


def pairs(
    semirings: Iterable[str] | None = None, dtypes: Iterable[object] | None = None
) -> list[tuple[Semiring, np.dtype[np.generic]]]:
    """Each (semiring, dtype) that the named semirings and dtypes make, in order: what
    ``all_specs`` and ``warm`` serve, checked as ``all_specs`` says."""
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
    return [
        (SEMIRINGS[name], dtype)
        for name in names
        for dtype in SEMIRINGS[name].dtypes
        if wanted is None or dtype in wanted
    ]
