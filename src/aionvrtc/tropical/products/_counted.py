"""Counted products on the GPU (``matmul(..., counts=...)``): C = A (x) B with, for each element,
the count of the ways it is attained (tropical_counted.cu). The plan checks the operands, their
counts and the outputs once per layout, as a product's does; the launch packs the kernel's
arguments once, and a call writes its six pointers.

A product in tiles is two passes: the value product (the tuned kernels) writes C, then the count
kernel counts, for each output, the pairs that attain its value; a compare for most pairs, where
one pass must ask of each "better, or equal?" and keep int64 counts through every change of the
best. Products that accumulate, and those too long for the count kernel's 32-bit tallies, take
the one-pass kernel."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..._cuda import Module
from ._counts import barrett, check_count_arrays
from ._launching import THREADS, Packed, fill, thread_blocks, tile_grid
from ._product_plan import (
    Strides,
    check_out_devices,
    cupy_module,
    output_strides,
    require_cupy,
    strides,
)
from ._semirings import semiring
from ._shapes import check_operands
from ._specs import CountedForm, Counting, counted_spec

__all__ = [
    "ROWS_BELOW",
    "WARPS_FROM_K",
    "WARPS_UP_TO",
    "CountedLaunch",
    "CountedProduct",
    "counted_args",
    "counted_form",
    "counted_grid",
    "plan_counted",
    "warp_per_output",
]

# Products with fewer rows or columns than this take a skinny counted kernel (a thread or a warp
# per output): the tiled kernel's 64 x 64 tiles would leave three quarters of its threads idle.
ROWS_BELOW = 16
_TILE = 64  # tropical_counted's CBM and CBN, and tropical_count's KBM and KBN
# A warp per output where a thread per output would leave most of the GPU idle (2^16 threads:
# an eighth of an H100's) and each walks a long sum.
WARPS_FROM_K = 64
WARPS_UP_TO = 1 << 16
# The count kernel tallies each entry's 1 in 32 bits: a sum over 2^31 k or more takes one pass.
_COUNT_K_BELOW = 1 << 31


def counted_form(
    m: int, n: int, k: int = 1, batch: int = 1, *, accumulate: bool = False
) -> CountedForm:
    """The counted kernel for a batch of M x N results, each a sum over K: where either side
    is short, ``"warps"`` for a long sum into few outputs, else ``"rows"``; else ``"count"``
    (after the value product), or ``"tiles"`` (one pass) where it accumulates or K is 2^31 or
    more."""
    if min(m, n) < ROWS_BELOW:
        return "warps" if warp_per_output(batch * m * n, k) else "rows"
    return "tiles" if accumulate or k >= _COUNT_K_BELOW else "count"


def warp_per_output(outputs: int, k: int) -> bool:
    """Whether a skinny product (counted, or the k best) of ``outputs`` outputs, each a sum
    over ``k``, takes a warp per output: a long sum into few outputs."""
    return k >= WARPS_FROM_K and outputs <= WARPS_UP_TO


def counted_grid(form: CountedForm, m: int, n: int, batch: int) -> tuple[int, int, int]:
    """The grid of a counted product: a block per 64 x 64 tile of C (column tiles and batches
    past 65535 looped over), or for the skinny kernels a thread (a warp) per output."""
    if form in ("tiles", "count"):
        return tile_grid(m, n, batch, _TILE, _TILE)
    return thread_blocks(batch * m * n * (32 if form == "warps" else 1)), 1, 1


def counted_args(
    sizes: tuple[int, int, int, int],
    each: Sequence[Strides],
    *,
    modulus: int | None,
    accumulate: bool,
) -> list[int]:
    """The kernel's arguments past its six pointers: M, N, K, the batch, each array's element
    strides (A, A's counts, B, B's counts, C, C's counts), p, mu and the accumulate flag."""
    assert len(each) == 6
    return [*sizes, *(s for three in each for s in three), *barrett(modulus), int(accumulate)]


class CountedLaunch(Packed):
    """A counted product's launch; the pointers (a, counts of a or 0, b, counts of b or 0, c,
    counts of c) are each call's."""

    __slots__ = ()

    def run(self, module: Module, arrays: Sequence[Any], stream: Any) -> None:
        """Enqueue the product on ``stream``: ``arrays`` (a, counts of a or None, b, counts
        of b or None, c, counts of c)."""
        self.run_pointers(module, [0 if x is None else x.data.ptr for x in arrays], stream)


@dataclass(frozen=True, slots=True, eq=False)  # compared by identity: one per layout
class CountedProduct:
    """A counted product's launch, and the other form's kernel that computes it too in one
    pass (run while its own loads); or, with no kernel to run (an empty result, or K = 0),
    None. ``after_value``: the launch counts the values that the value product of the same
    operands into the same C writes first."""

    launch: CountedLaunch | None
    standin: CountedLaunch | None
    after_value: bool
    fill: Any  # K = 0 without accumulate: the zero C is filled with (counts 0), else None
    shape: tuple[int, ...]  # C's
    dtype: Any
    device: int

    def outputs(self, out: Any) -> tuple[Any, Any]:
        """(C, counts): ``out``'s (checked when planned), else new arrays."""
        if out is not None:
            return out  # type: ignore[no-any-return]
        cupy = cupy_module()
        with cupy.cuda.Device(self.device):
            return cupy.empty(self.shape, self.dtype), cupy.empty(self.shape, np.int64)

    def fill_outputs(self, c: Any, counts: Any, stream: Any) -> None:
        """What a product with no kernel to run leaves in C and its counts."""
        if self.fill is not None:
            fill(self.device, stream, ((c, self.fill), (counts, 0)))


def plan_counted(
    a: Any,
    b: Any,
    semiring_name: str,
    counts: Any,
    modulus: int | None,
    *,
    out: Any,
    accumulate: bool,
) -> tuple[CountedProduct, tuple[Any, Any]]:
    """The counted product of ``a`` and ``b`` (``counts`` True, or a pair of count arrays,
    checked by ``check_counted`` already) and its outputs (C, counts): checked as ``matmul``
    checks, made where ``out`` is None."""
    ring = semiring(semiring_name)
    a, b = require_cupy(a, "a"), require_cupy(b, "b")
    shapes = check_operands(ring, a, b)
    device = a.device.id
    given: tuple[Any, Any] = (None, None)
    if counts is not True:
        given = (require_cupy(counts[0], "counts[0]"), require_cupy(counts[1], "counts[1]"))
        check_count_arrays(given, a, b)
    for x, what in ((b, "b"), (given[0], "counts[0]"), (given[1], "counts[1]")):
        if x is not None and x.device.id != device:
            raise ValueError(f"{what} is on device {x.device.id}, a on device {device}")
    batch, m, k, n = shapes.batch, shapes.m, shapes.k, shapes.n
    shape = (batch, m, n) if shapes.batched else (m, n)
    c, made = _outputs(a, shape, out=out, accumulate=accumulate)
    launch = standin = fill = None
    after_value = False
    if m and n and batch and k:
        counting: Counting = "ones" if counts is True else "exact" if modulus is None else "modular"
        each = [
            strides(a),
            strides(given[0]) if given[0] is not None else (0, 0, 0),
            strides(b),
            strides(given[1]) if given[1] is not None else (0, 0, 0),
            output_strides(c, shapes.batched),
            output_strides(made, shapes.batched),
        ]
        args = [0] * 6 + counted_args(
            (m, n, k, batch), each, modulus=modulus, accumulate=accumulate
        )
        own = counted_form(m, n, k, batch, accumulate=accumulate)
        after_value = own == "count"
        launch, standin = (
            CountedLaunch(
                counted_spec(ring, a.dtype, counting=counting, form=form),
                device,
                counted_grid(form, m, n, batch),
                (THREADS, 1, 1),
                args,
            )
            for form in (own, "tiles" if own == "rows" else "rows")
        )
    elif m and n and batch and not accumulate:
        fill = ring.zero(a.dtype)  # the sum over no k, attained by no assignment
    product = CountedProduct(launch, standin, after_value, fill, shape, a.dtype, device)
    return product, (c, made)


def _outputs(a: Any, shape: tuple[int, ...], *, out: Any, accumulate: bool) -> tuple[Any, Any]:
    cupy = cupy_module()
    if out is None:
        if accumulate:
            raise ValueError(
                "accumulate=True needs out: (C, counts) = (C, counts) (+) A (x) B updates the "
                "pair given as out in place"
            )
        with cupy.cuda.Device(a.device.id):
            return cupy.empty(shape, dtype=a.dtype), cupy.empty(shape, dtype=np.int64)
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError("with counts, out must be a (values, counts) pair of arrays")
    c, made = require_cupy(out[0], "out[0]"), require_cupy(out[1], "out[1] (counts)")
    if c.dtype != a.dtype or c.shape != shape:
        raise ValueError(
            f"out[0] must be {a.dtype} of shape {shape}, got {c.dtype} of shape {c.shape}"
        )
    if made.dtype != np.int64 or made.shape != shape:
        raise ValueError(
            f"out[1] (counts) must be int64 of shape {shape}, got {made.dtype} of shape "
            f"{made.shape}"
        )
    check_out_devices(((c, "out[0]"), (made, "out[1] (counts)")), a.device.id)
    return c, made
