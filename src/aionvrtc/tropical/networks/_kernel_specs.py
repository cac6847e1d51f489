"""The specs of the kernels around a contraction's products (kernels/tropical_einsum.cu): the
kernel of many small products in one launch, the backtrace of the argmaxes, the strided copy and
the gather of elements."""

from __future__ import annotations

import functools
from typing import Literal

import numpy as np

from ..._spec import KernelSpec
from ..products import DTYPES, Semiring, family_spec

__all__ = ["backtrace_spec", "einsum_spec", "many_spec"]


@functools.cache
def many_spec(ring: Semiring, dtype: np.dtype[np.generic], *, argmax: bool) -> KernelSpec:
    """The spec of the kernel that runs many small products in one launch (a compiled
    contraction's tiny steps)."""
    ring.check_dtype(dtype)
    flag = "true" if argmax else "false"
    return family_spec("einsum", f"tropical_many<{DTYPES[np.dtype(dtype)]}, {ring.cpp}, {flag}>")


# The einsum family's element types, by size: its kernels move elements, never compute.
_MOVED = {1: "unsigned char", 4: "unsigned int", 8: "unsigned long long"}


@functools.cache
def backtrace_spec(ring: Semiring, dtype: np.dtype[np.generic]) -> KernelSpec:
    """The spec of the kernel that walks an einsum's argmaxes back to an assignment (it scans
    again the products whose argmax was not kept: the element type and semiring's)."""
    ring.check_dtype(dtype)
    return family_spec("einsum", f"einsum_backtrace<{DTYPES[np.dtype(dtype)]}, {ring.cpp}>")


@functools.cache
def einsum_spec(kernel: Literal["copy", "gather"], itemsize: int) -> KernelSpec:
    """The spec of one of the small kernels around an einsum's products (kernels/
    tropical_einsum.cu): the strided copy or the gather of elements of ``itemsize`` bytes."""
    if itemsize not in _MOVED:
        raise ValueError(f"no einsum {kernel} kernel for {itemsize}-byte elements")
    return family_spec("einsum", f"einsum_{kernel}<{_MOVED[itemsize]}>")
