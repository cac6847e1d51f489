"""Products and backwards planned once per operand layout.

A call whose operands have the shapes, strides, dtypes and devices of an earlier call's, with the
same semiring, flags and outputs' layout, finds that call's launch by one dict lookup: the checks,
the kernel's choice, its grid and its packed arguments are not made again; only the outputs are
allocated and the pointers written. Anything new is planned (and checked) from scratch, and the
tuned tiles' version is part of the key, so that autotune's winners apply to the next call.

A product whose kernel is not loaded yet on its device runs at once on one that is and computes
it as well (``ready``: another tile, the generic kernel), while its own compiles and loads in
the Compiler's background lane for the calls after it: so a server's new batch size, which may
move a batch to another shape class and kernel, never waits for NVRTC. (vLLM pads a batch up to
a size it captured ahead; these kernels take any batch size, and only a shape class needs a
kernel of its own.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..._compiler import Compiler
from ..._cuda import Module
from ..._spec import KernelSpec
from .._bounded import keep
from ._counted import CountedProduct, plan_counted
from ._launching import BackwardLaunch, Launch, OnDevice, fill, load_soon, loaded
from ._product_plan import Plan, backward_plan, cupy_module, plan, standins
from ._shape_classes import tables_version, tuned_tiles

__all__ = [
    "MAX_PLANS",
    "Product",
    "clear",
    "find",
    "planned_backward",
    "planned_counted",
    "planned_product",
    "ready",
]

# Launches kept, for products and for backwards each; past it, the oldest goes first. A launch
# holds no operand, only its layout (a few hundred bytes) and its kernel's module.
MAX_PLANS = 4096

_products: dict[Any, Product] = {}
_backwards: dict[Any, BackwardLaunch] = {}
_counted: dict[Any, CountedProduct] = {}
# Each product's stand-in launches, made at its first call that found its kernel missing.
_standins: dict[Product, tuple[Launch, ...]] = {}


@dataclass(frozen=True, slots=True, eq=False)  # compared by identity: one per layout
class Product:
    """A product's launch, or what it needs instead: nothing for an empty result, and for a sum
    over no k (K = 0) the semiring's zero in C (and -1 in the argmax) unless it accumulates."""

    launch: Launch | None
    fill: Any  # the value C is filled with where no kernel runs, or None
    shape: tuple[int, ...]  # C's
    dtype: Any
    argmax: bool
    device: int
    layout: Plan | None  # the plan without its arrays (Plan.unbound), where a kernel runs

    @property
    def spec(self) -> KernelSpec | None:
        return self.launch.spec if self.launch is not None else None

    def outputs(self, out: Any) -> tuple[Any, Any]:
        """(C, argmax or None): ``out``'s (checked when planned), else new arrays."""
        if out is not None:
            return out if self.argmax else (out, None)
        cupy = cupy_module()
        with OnDevice(self.device):
            c = cupy.ndarray(self.shape, self.dtype)
            return c, (cupy.ndarray(self.shape, "int32") if self.argmax else None)

    def fill_outputs(self, c: Any, index: Any, stream: Any) -> None:
        """Write what a product with no kernel to run leaves in C (and the argmax)."""
        if self.fill is not None:
            fill(self.device, stream, ((c, self.fill), (index, -1)))


def _layout(x: Any) -> tuple[Any, ...]:
    # Raises AttributeError for anything but a CuPy array: the caller then plans, which says
    # what was wrong.
    if type(x) is not cupy_module().ndarray:
        raise AttributeError
    return x.shape, x.strides, x.dtype, x.data.device_id


def _key(a: Any, b: Any, semiring: str, *, argmax: bool, out: Any, accumulate: bool) -> Any:
    if out is None:
        made: Any = None
    elif argmax:
        if type(out) is not tuple:
            raise AttributeError  # plan() says what out must be
        c, index = out
        made = (_layout(c), _layout(index))
    else:
        made = _layout(out)
    # (A semiring that is not hashable raises TypeError where the key is looked up.)
    return (
        semiring,
        bool(argmax),
        bool(accumulate),
        _layout(a),
        _layout(b),
        made,
        tables_version(),
    )


def planned_product(
    a: Any, b: Any, semiring: str, *, argmax: bool, out: Any, accumulate: bool
) -> tuple[Product, Any, Any]:
    """The product's launch and its outputs (C, argmax or None), planned once per layout."""
    found, made = find(a, b, semiring, argmax=argmax, out=out, accumulate=accumulate)
    c, index = made if made is not None else found.outputs(out)
    return found, c, index


def find(
    a: Any, b: Any, semiring: str, *, argmax: bool, out: Any, accumulate: bool
) -> tuple[Product, tuple[Any, Any] | None]:
    """The product's launch and, where it was planned just now, the plan's outputs."""
    try:
        key = _key(a, b, semiring, argmax=argmax, out=out, accumulate=accumulate)
        return _products[key], None
    except KeyError:
        pass
    except (AttributeError, TypeError, ValueError):
        key = None  # not CuPy arrays, a subclass of one, or not hashable: planned every time
    # Plans and checks everything, raising where a check fails.
    planned = plan(a, b, semiring, argmax=argmax, out=out, accumulate=accumulate)
    fill = None
    if not (planned.m and planned.n and planned.batch):
        launch = None  # an empty result
    elif planned.k == 0:
        # The sum over no k is the semiring's zero (and C (+) zero = C).
        launch, fill = None, None if accumulate else planned.ring.zero(planned.c.dtype)
    else:
        launch = Launch.of(planned)
    found = Product(
        launch, fill, planned.c.shape, planned.c.dtype, bool(argmax), planned.device,
        planned.unbound() if launch is not None else None,
    )  # fmt: skip
    if key is not None:
        keep(_products, key, found, MAX_PLANS)
    return found, (planned.c, planned.index)


def ready(product: Product, compiler: Compiler | None) -> tuple[Launch, Module] | None:
    """A launch of ``product`` with its kernel loaded on the product's device, served from
    ``compiler`` (None: the process-wide one) without a task switch: its own; else the first
    of its stand-ins (``standins``) that is loaded, with its own queued to compile and load in
    the background (``Compiler.prefetch`` with a device, never a hot compile); else None, and
    the caller fetches its own. ``product`` must have a launch."""
    launch = product.launch
    assert launch is not None
    assert product.layout is not None
    own = loaded(launch.spec, launch.device, compiler)
    if own is not None:
        return launch, own
    others = _standins.get(product)
    if others is None:
        table = tuned_tiles(product.device)
        others = tuple(Launch.of(other) for other in standins(product.layout, table))
        keep(_standins, product, others, MAX_PLANS)
    for other in others:
        module = loaded(other.spec, other.device, compiler)
        if module is not None:
            load_soon([launch.spec], launch.device, compiler)
            return other, module
    return None


def planned_counted(
    a: Any, b: Any, semiring: str, counts: Any, modulus: int | None, *, out: Any, accumulate: bool
) -> tuple[CountedProduct, tuple[Any, Any]]:
    """A counted product (``plan_counted``) and its outputs (C, counts), planned once per
    layout of the operands, their counts and ``out``."""
    try:
        given = None if counts is True else _pair(counts)
        made = None if out is None else _pair(out)
        key = (semiring, modulus, bool(accumulate), _layout(a), _layout(b), given, made)
        found = _counted[key]
        return found, found.outputs(out)
    except KeyError:
        pass
    except (AttributeError, TypeError, ValueError):
        key = None  # not CuPy arrays (or not a pair): planned, which says what was wrong
    planned, outputs = plan_counted(a, b, semiring, counts, modulus, out=out,
                                    accumulate=accumulate)  # fmt: skip
    if key is not None:
        keep(_counted, key, planned, MAX_PLANS)
    return planned, outputs


def _pair(given: Any) -> tuple[Any, Any]:
    if type(given) is not tuple or len(given) != 2:
        raise AttributeError  # planning says what it must be
    return _layout(given[0]), _layout(given[1])


def planned_backward(grad_c: Any, a: Any, b: Any, argmax: Any, semiring: str) -> BackwardLaunch:
    """The backward's launch, planned once per layout (its gradients: ``gradients``)."""
    try:
        key = (semiring, _layout(grad_c), _layout(argmax), _layout(a), _layout(b))
        return _backwards[key]
    except KeyError:
        pass
    except (AttributeError, TypeError):
        key = None
    launch = BackwardLaunch(backward_plan(grad_c, a, b, argmax, semiring))
    if key is not None:  # None: unhashable, or a subclass of cupy.ndarray: not kept
        keep(_backwards, key, launch, MAX_PLANS)
    return launch


def clear() -> None:
    """Forget every planned launch (the next calls plan again)."""
    _products.clear()
    _backwards.clear()
    _standins.clear()
    _counted.clear()
