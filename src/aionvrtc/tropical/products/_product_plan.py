"""What a tropical product launches: operands checked, outputs made, the kernel chosen."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ..._spec import KernelSpec
from ._semirings import Semiring, semiring
from ._semirings import semiring as lookup
from ._shape_classes import (
    ARGMAX_MAX_TILES,
    ROWS_KMAX,
    TILES,
    Tile,
    classify,
    tile_variant,
    tuned_tiles,
)
from ._shapes import Shapes, check_operands
from ._specs import Layout, backward_spec, gemm_spec, rows_spec, tiled_spec, tiled_supported

__all__ = [
    "BackwardPlan",
    "Plan",
    "backward_plan",
    "batch_specs",
    "check_out_devices",
    "choose",
    "cupy_module",
    "kernel_spec",
    "output_strides",
    "plan",
    "require_cupy",
    "standins",
    "strides",
]

Strides = tuple[int, int, int]


@functools.cache
def cupy_module() -> Any:
    """CuPy, imported on first use (importing aionvrtc.tropical needs no GPU stack)."""
    import cupy

    return cupy


def require_cupy(x: Any, what: str) -> Any:
    cupy = cupy_module()
    if not isinstance(x, cupy.ndarray):
        hint = ": move it with cupy.asarray(...)" if isinstance(x, np.ndarray) else ""
        raise TypeError(
            f"{what} must be a cupy.ndarray, not {type(x).__module__}.{type(x).__name__}{hint}"
        )
    return x


def strides(x: Any) -> Strides:
    """Element strides (batch, rows, columns) of a 2-D or 3-D array; batch 0 for 2-D."""
    item = x.itemsize
    each = [s // item for s in x.strides]
    if x.ndim == 2:
        return 0, each[0], each[1]
    return (0 if x.shape[0] == 1 else each[0]), each[1], each[2]


@dataclass(frozen=True, slots=True)
class Plan:
    """One product to launch: its operands and outputs, their element strides, the kernel.

    Made by ``plan``, launched by ``launch``.

    Attributes:
        ring: The semiring, one of ``SEMIRINGS``.
        spec: The kernel to launch.
        a: The left operand, as given.
        b: The right operand, as given.
        c: The array that receives C: ``out``, or a new one.
        index: The int32 array that receives the argmax, or None without argmax.
        a_strides: ``a``'s element strides (batch, rows, columns); the batch stride is 0 for a
            2-D operand or a batch of 1 (it broadcasts).
        b_strides: ``b``'s element strides, as ``a_strides``.
        batch: The result's batch size (1 without a batch dimension).
        m: Rows of A and C.
        n: Columns of B and C.
        k: Columns of A, rows of B: the length of each reduction.
        device: The CUDA device of the operands and outputs.
        batched: Whether C has a batch dimension (an operand is 3-D).
        tile: The tuned kernel's tile (BM, BN, BK, TM, TN, blocks per SM) where it serves,
            else None.
        rows: The skinny kernel's bound on K (its KMAX) where it serves, else 0.
        transposed: Whether the skinny kernel runs the product transposed, C^T = B^T A^T (wide
            products).
        dtype: The operands' and C's dtype.
        c_strides: C's element strides (batch, rows, columns); the batch stride is 0 without
            a batch dimension.
        index_strides: The argmax's element strides as ``c_strides``, or None without argmax.
        accumulate: Whether the product computes C = C (+) A (x) B.
    """

    ring: Semiring
    spec: KernelSpec
    a: Any
    b: Any
    c: Any
    index: Any  # int32 argmax output, or None
    a_strides: Strides
    b_strides: Strides
    batch: int
    m: int
    n: int
    k: int
    device: int
    batched: bool
    tile: Tile | None  # the tuned kernel's tile, if it serves
    rows: int  # KMAX of the skinny kernel, if it serves (else 0)
    transposed: bool  # the skinny kernel runs C' = B' A' (wide products)
    # The layout alone, which a launch is made from (a plan without its arrays makes the
    # launches of other kernels: standins).
    dtype: np.dtype[Any]
    c_strides: Strides
    index_strides: Strides | None
    accumulate: bool

    def unbound(self) -> Plan:
        """This plan without its arrays: the layout, kept to make launches from later.

        Returns:
            A copy whose ``a``, ``b``, ``c`` and ``index`` are None (``Launch.of`` reads the
            rest).
        """
        return dataclasses.replace(self, a=None, b=None, c=None, index=None)


def plan(
    a: Any,
    b: Any,
    semiring_name: str,
    *,
    argmax: bool,
    out: Any,
    accumulate: bool,
    tile: Tile | Literal["auto"] | None = "auto",
    table: dict[str, dict[str, Tile]] | None = None,
) -> Plan:
    """What to launch for C = A (x) B, with checks and outputs as ``matmul``'s.

    Not cached: each call checks everything and allocates its outputs (where ``out`` is None).

    Args:
        a: The left operand: a CuPy array of shape (M, K), or (batch, M, K).
        b: The right operand: a CuPy array of shape (K, N), or (batch, K, N), of ``a``'s dtype
            and on ``a``'s device.
        semiring_name: ``"maxplus"``, ``"minplus"``, ``"maxmul"`` or ``"andor"``.
        argmax: Also compute the int32 index of the winning k.
        out: The array that receives C (with ``argmax``, a (C, argmax) pair), or None for new
            arrays.
        accumulate: Compute C = C (+) A (x) B into ``out``.
        tile: ``"auto"`` picks the kernel by shape class from ``table``, as ``matmul`` does; a
            tile (BM, BN, BK, TM, TN, blocks per SM) names one of the tuned kernel, as the
            autotuner and benchmarks do (``tile_fits`` says which compile); None, the generic
            kernel. An argmax over more than ``ARGMAX_MAX_TILES`` k-tiles takes the generic
            kernel whatever the tile.
        table: The tiles by shape class then variant, for ``tile="auto"``. Default: the
            device's ``tuned_tiles`` as they are now.

    Returns:
        The plan, its outputs made (``c`` and ``index``).

    Raises:
        TypeError: An operand or ``out`` is not a CuPy array, or the dtypes do not fit (as
            for ``matmul``).
        ValueError: The semiring, shapes, devices or ``out`` do not fit (as for ``matmul``);
            a tile is named for operands that are not row-major (unit stride along k for A and
            along n for B), or for a semiring and type the tuned kernel does not serve
            (``tiled_supported``).
        cupy.cuda.memory.OutOfMemoryError: The outputs do not fit in GPU memory.
    """
    ring = semiring(semiring_name)
    a = require_cupy(a, "a")
    b = require_cupy(b, "b")
    shapes = check_operands(ring, a, b)
    if a.device.id != b.device.id:
        raise ValueError(f"a is on device {a.device.id} and b on device {b.device.id}")
    batch, m, k, n, batched = shapes.batch, shapes.m, shapes.k, shapes.n, shapes.batched
    shape = (batch, m, n) if batched else (m, n)
    c, index = _outputs(a, shape, argmax=argmax, out=out, accumulate=accumulate)
    a_strides, b_strides = strides(a), strides(b)
    rowmajor = a_strides[2] == 1 and b_strides[2] == 1
    if tile not in ("auto", None) and not rowmajor:
        raise ValueError("the tuned kernel needs row-major operands")
    if tile != "auto":
        table = None
    elif table is None:
        table = tuned_tiles(a.device.id)
    spec, tile, rows, transposed = choose(
        ring, a.dtype, m, n, k, batch=batch, argmax=argmax, accumulate=accumulate,
        rowmajor=rowmajor, tile=tile, table=table,
    )  # fmt: skip
    return Plan(
        ring, spec, a, b, c, index, a_strides, b_strides,
        batch, m, n, k, a.device.id, batched, tile, rows, transposed,
        a.dtype, output_strides(c, batched),
        None if index is None else output_strides(index, batched),
        bool(accumulate),
    )  # fmt: skip


def output_strides(x: Any, batched: bool) -> Strides:
    """Element strides (batch, rows, columns) of an output; the batch stride 0 without a
    batch dimension."""
    each = tuple(s // x.itemsize for s in x.strides)
    return (each[0], each[1], each[2]) if batched else (0, each[0], each[1])


def standins(plan: Plan, table: dict[str, dict[str, Tile]] | None = None) -> list[Plan]:
    """``plan``'s product on the other kernels that compute it, fastest first as a rule: the
    skinny kernel's larger bounds on K, the tuned kernel's other tiles (``table``'s, default
    TILES), then the generic kernel. What a call runs while its own kernel loads
    (``Batcher``, ``matmul``): a batch whose size moves it to another shape class runs on the
    tile of the class it had, say. Each plan is ``plan`` with another kernel, arrays and all.
    """
    ring, dtype, accumulate = plan.ring, plan.dtype, plan.accumulate
    argmax = plan.index_strides is not None
    rowmajor = plan.a_strides[2] == 1 and plan.b_strides[2] == 1
    found: list[Plan] = []
    if tiled_supported(ring.name, dtype):
        for kmax in ROWS_KMAX if plan.rows else ():
            if kmax > plan.rows:
                spec = rows_spec(ring, dtype, accumulate=accumulate, kmax=kmax)
                found.append(dataclasses.replace(plan, spec=spec, rows=kmax))
        variant = tile_variant(dtype, argmax=argmax)
        for tile in dict.fromkeys(t[variant] for t in (table or TILES).values()):
            if not rowmajor or tile == plan.tile:
                continue
            if argmax and -(-plan.k // tile[2]) > ARGMAX_MAX_TILES:
                continue
            spec = tiled_spec(ring, dtype, argmax=argmax, accumulate=accumulate, tile=tile)
            found.append(dataclasses.replace(plan, spec=spec, tile=tile, rows=0, transposed=False))
    layouts: tuple[Layout, ...] = ("rowmajor", "strided") if rowmajor else ("strided",)
    for layout in layouts:
        spec = gemm_spec(ring, dtype, argmax=argmax, accumulate=accumulate, layout=layout)
        if spec != plan.spec:
            found.append(dataclasses.replace(plan, spec=spec, tile=None, rows=0, transposed=False))
    return found


def choose(
    ring: Semiring,
    dtype: Any,
    m: int,
    n: int,
    k: int,
    *,
    batch: int,
    argmax: bool,
    accumulate: bool,
    rowmajor: bool,
    tile: Tile | Literal["auto"] | None,
    table: dict[str, dict[str, Tile]] | None,
) -> tuple[KernelSpec, Tile | None, int, bool]:
    """The kernel of a product (spec, tile, skinny KMAX or 0, transposed): by shape class from
    ``table`` (default TILES) when ``tile`` is "auto", else the named tile, or the generic
    kernel for None."""
    rows, transposed = 0, False
    if tile == "auto":
        tile = None
        if tiled_supported(ring.name, dtype):
            kind = classify(m, n, k, argmax=argmax, batch=batch)
            # The skinny kernel takes any strides (the tiles want row-major operands): a
            # tensor network's tall steps read A with its row stride 1 and its k stride the
            # rest of the tensor, which the warp's rows coalesce. The generic kernel's 64 x 64
            # tiles work 64 columns where N is 2, and ran such steps (2 x 2^30 x 2 x 2, 900 of
            # a 32 x 32 lattice's) more than ten times below bandwidth.
            if kind.kmax:
                rows, transposed = kind.kmax, kind.transposed
            elif rowmajor:
                tile = (table or TILES)[kind.name][tile_variant(dtype, argmax=argmax)]
    if argmax and tile is not None and -(-k // tile[2]) > ARGMAX_MAX_TILES:
        tile = None
    if rows:
        spec = rows_spec(ring, dtype, accumulate=accumulate, kmax=rows)
    elif tile is not None:
        spec = tiled_spec(ring, dtype, argmax=argmax, accumulate=accumulate, tile=tile)
    else:
        layout: Layout = "rowmajor" if rowmajor else "strided"
        spec = gemm_spec(ring, dtype, argmax=argmax, accumulate=accumulate, layout=layout)
    return spec, tile, rows, transposed


def kernel_spec(
    m: int,
    n: int,
    k: int,
    semiring: str = "maxplus",
    dtype: Any = "float32",
    *,
    argmax: bool = False,
    accumulate: bool = False,
    batch: int = 1,
) -> KernelSpec:
    """The kernel that ``matmul`` would launch for a ``batch`` x M x N x K product of
    contiguous operands, with the default tiles (TILES): for compiling it ahead of use, or on a
    machine without a GPU (``await compiler.compile(tropical.kernel_spec(...))``).

    Args:
        m: Rows of A and C.
        n: Columns of B and C.
        k: Columns of A, rows of B.
        semiring: ``"maxplus"``, ``"minplus"``, ``"maxmul"`` or ``"andor"``.
        dtype: The element type: a NumPy dtype, type or name such as ``"float32"``.
        argmax: The product also computes the argmax.
        accumulate: The product computes C = C (+) A (x) B.
        batch: The batch size (1: no batch).

    Returns:
        The kernel's spec, for ``Compiler.compile`` or ``Compiler.get``.

    Raises:
        ValueError: ``semiring`` is not one of the four; ``dtype`` is not a dtype, or not one
            the semiring takes; a size is below 1.
    """
    ring, dtype = _checked(semiring, dtype, m, n, k, batch=batch)
    spec, *_ = choose(
        ring, dtype, m, n, k, batch=batch, argmax=argmax, accumulate=accumulate,
        rowmajor=True, tile="auto", table=None,
    )  # fmt: skip
    return spec


def _checked(
    semiring: str, dtype: Any, m: int, n: int, k: int, *, batch: int
) -> tuple[Semiring, np.dtype[Any]]:
    """The semiring and dtype of ``kernel_spec``'s and ``batch_specs``' products, checked with
    their sizes."""
    ring = lookup(semiring)
    checked = ring.check_dtype(dtype)
    if min(m, n, k, batch) < 1:
        raise ValueError(f"sizes must be positive, got M={m}, N={n}, K={k}, batch={batch}")
    return ring, checked


def batch_specs(
    m: int,
    n: int,
    k: int,
    semiring: str = "maxplus",
    dtype: Any = "float32",
    *,
    argmax: bool = False,
    max_batch: int = 64,
    table: dict[str, dict[str, Tile]] | None = None,
) -> list[KernelSpec]:
    """The kernels that products of contiguous M x K and K x N operands take at every batch
    size from 1 to ``max_batch``: what a ``Batcher`` launches for them. A batch's size counts
    towards filling the GPU, so a larger batch may take another shape class, and its kernel.

    Args:
        m: Rows of A and C.
        n: Columns of B and C.
        k: Columns of A, rows of B.
        semiring: ``"maxplus"``, ``"minplus"``, ``"maxmul"`` or ``"andor"``.
        dtype: The element type: a NumPy dtype, type or name such as ``"float32"``.
        argmax: The products also compute the argmax.
        max_batch: The largest batch (a Batcher's ``max_batch``).
        table: The tiles by shape class then variant. Default: TILES (a device's
            ``tuned_tiles`` after ``autotune``).

    Returns:
        The kernels' specs, each once, by batch size.

    Raises:
        ValueError: As ``kernel_spec`` raises it; ``max_batch`` is not a positive int.
    """
    ring, dtype = _checked(semiring, dtype, m, n, k, batch=1)
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"max_batch must be a positive int, got {max_batch!r}")
    specs: dict[KernelSpec, None] = {}
    for batch in range(1, max_batch + 1):
        spec, *_ = choose(
            ring, dtype, m, n, k, batch=batch, argmax=argmax, accumulate=False,
            rowmajor=True, tile="auto", table=table,
        )  # fmt: skip
        specs[spec] = None
    return list(specs)


def _outputs(
    a: Any, shape: tuple[int, ...], *, argmax: bool, out: Any, accumulate: bool
) -> tuple[Any, Any]:
    cupy = cupy_module()
    if out is None:
        if accumulate:
            raise ValueError("accumulate=True needs out: C = C (+) A (x) B updates out in place")
        with cupy.cuda.Device(a.device.id):
            c = cupy.empty(shape, dtype=a.dtype)
            index = cupy.empty(shape, dtype=cupy.int32) if argmax else None
        return c, index
    if argmax:
        if not (isinstance(out, tuple) and len(out) == 2):
            raise TypeError("with argmax=True, out must be a (values, argmax) pair of arrays")
        c, index = out
        require_cupy(index, "out[1] (argmax)")
        if index.dtype != np.int32 or index.shape != shape:
            raise ValueError(
                f"out[1] (argmax) must be int32 of shape {shape}, "
                f"got {index.dtype} of shape {index.shape}"
            )
    else:
        c, index = out, None
    require_cupy(c, "out")
    if c.dtype != a.dtype or c.shape != shape:
        raise ValueError(
            f"out must be {a.dtype} of shape {shape}, got {c.dtype} of shape {c.shape}"
        )
    check_out_devices(((c, "out"), (index, "out[1] (argmax)")), a.device.id)
    return c, index


def check_out_devices(outputs: Sequence[tuple[Any, str]], device: int) -> None:
    """Each of ``outputs`` (an array, or None, and its name) on ``device``, the operands'."""
    for x, what in outputs:
        if x is not None and x.device.id != device:
            raise ValueError(
                f"{what} is on device {x.device.id}, a and b on device {device}: make it "
                f"there (with cupy.cuda.Device({device}): ...)"
            )


# -- backward --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BackwardPlan:
    """The gradients of one product to compute: checked inputs and the kernel."""

    spec: KernelSpec
    grad_c: Any
    argmax: Any
    a: Any
    b: Any
    shapes: Shapes
    device: int


def backward_plan(grad_c: Any, a: Any, b: Any, argmax: Any, semiring_name: str) -> BackwardPlan:
    ring = semiring(semiring_name)
    for x, what in ((grad_c, "grad_c"), (a, "a"), (b, "b"), (argmax, "argmax")):
        require_cupy(x, what)
    spec = backward_spec(ring, a.dtype)
    dims = check_operands(ring, a, b)
    shape = (dims.batch, dims.m, dims.n) if dims.batched else (dims.m, dims.n)
    if grad_c.shape != shape or grad_c.dtype != a.dtype:
        raise ValueError(
            f"grad_c must be {a.dtype} of shape {shape}, got {grad_c.dtype} of {grad_c.shape}"
        )
    if argmax.shape != shape or argmax.dtype != np.int32:
        raise ValueError(
            f"argmax must be int32 of shape {shape}, got {argmax.dtype} of {argmax.shape}"
        )
    devices = {x.device.id for x in (grad_c, argmax, b)} - {a.device.id}
    if devices:
        raise ValueError(
            f"grad_c, argmax, a and b must be on one device: a is on device {a.device.id}, "
            f"others on {sorted(devices)}"
        )
    return BackwardPlan(spec, grad_c, argmax, a, b, dims, a.device.id)
