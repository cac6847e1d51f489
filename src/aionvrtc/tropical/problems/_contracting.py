"""The contractions behind each property, on a network's subscripts and operands alone (a
problem's meaning is read above, in _problem): its tensors in the semiring a property asks
(forbidden entries hold the semiring's zero, so the other end of the objective is the same
tensors with the other zero), the order found once, then the NumPy reference's value, counts,
k best and configurations, or the GPU's value and assignment."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..networks import einsum, einsum_plan, einsum_sync
from ..products import SEMIRINGS, cupy_module
from ..reference import configurations
from ..reference import einsum as numpy_einsum
from ._reading import Array

__all__ = ["Network"]


@dataclass(frozen=True, slots=True)
class Network:
    """A scalar network in one semiring: what einsum takes, and its order (a path), found once
    for every semiring it is asked in."""

    subscripts: str
    operands: tuple[Array, ...]
    semiring: str
    path: tuple[tuple[int, ...], ...]

    @classmethod
    def planned(
        cls, subscripts: str, operands: Sequence[Array], semiring: str, optimize: Any
    ) -> Network:
        path = einsum_plan(subscripts, *operands, optimize=optimize).path
        return cls(subscripts, tuple(operands), semiring, tuple(map(tuple, path)))

    def towards(self, sense: str) -> Network:
        """The same tensors in the semiring of ``sense`` (``"max"``: max-plus, ``"min"``:
        min-plus): each forbidden entry (the own semiring's zero) the other's zero; or for
        ``"all"`` every allowed entry 0 in the own semiring, so that every valid configuration
        attains the optimum, 0 (counting those counts them all)."""
        own = SEMIRINGS[self.semiring]
        dtype = self.operands[0].dtype
        if sense == "all":
            zero = own.zero(dtype)
            made = tuple(np.where(x == zero, zero, x.dtype.type(0)) for x in self.operands)
            return Network(str(self.subscripts), made, self.semiring, self.path)
        wanted = "maxplus" if sense == "max" else "minplus"
        if wanted == self.semiring:
            return self
        zero, other = own.zero(dtype), SEMIRINGS[wanted].zero(dtype)
        made = tuple(np.where(x == zero, other, x) for x in self.operands)
        return Network(str(self.subscripts), made, wanted, self.path)

    def best(self, k: int, max_bytes: int) -> list[tuple[Any, int]]:
        """The ``k`` best distinct values, best first, each with its count (a Python int): for
        ``k=1`` exact at any size, else within int64; fewer where fewer exist."""
        if k == 1:
            value, count = numpy_einsum(
                *self._arguments(),
                semiring=self.semiring,
                path=self.path,
                max_bytes=max_bytes,
                count=True,
            )
            return [(_scalar(value), int(count))] if int(count) else []
        values, counts = numpy_einsum(
            *self._arguments(), semiring=self.semiring, path=self.path, max_bytes=max_bytes, top=k
        )
        return [(_scalar(v), int(c)) for v, c in zip(values, counts, strict=True) if c]

    def rows(self, limit: int | None, max_bytes: int) -> tuple[str, Array]:
        """Every assignment attaining the value (None: the first the walk finds alone): the
        indices, and one row of values each; no row where nothing attains a value."""
        _, letters, rows = configurations(
            *self._arguments(),
            semiring=self.semiring,
            path=self.path,
            max_bytes=max_bytes,
            limit=limit or 1,
            first=limit is None,
        )
        return letters, rows

    def on_device(self, device: int) -> tuple[Any, ...]:
        """The operands on GPU ``device``, each copied once."""
        cupy = cupy_module()
        with cupy.cuda.Device(device):
            return tuple(cupy.asarray(x) for x in self.operands)

    def gpu_sync(self, device: int, *, argmax: bool) -> tuple[Any, Mapping[str, int] | None]:
        """The value (and an assignment) on GPU ``device``, from a thread that may block."""
        found = einsum_sync(
            self.subscripts,
            *self.on_device(device),
            semiring=self.semiring,
            argmax=argmax,
            optimize=self.path,
        )
        return _read(found, argmax, self.semiring)

    async def gpu(self, device: int, *, argmax: bool) -> tuple[Any, Mapping[str, int] | None]:
        """``gpu_sync`` for an event loop: it is not blocked."""
        found = await einsum(
            self.subscripts,
            *self.on_device(device),
            semiring=self.semiring,
            argmax=argmax,
            optimize=self.path,
        )
        return _read(found, argmax, self.semiring)

    def _arguments(self) -> tuple[Any, ...]:
        return (self.subscripts, *self.operands)


def _read(found: Any, argmax: bool, ring: str) -> tuple[Any, Mapping[str, int] | None]:
    """The value as Python's scalar, and the assignment; (None, None) where the value is the
    semiring's zero: nothing attains it."""
    value, assignment = found if argmax else (found, None)
    host = value.get()
    if host == SEMIRINGS[ring].zero(host.dtype):
        return None, None
    return _scalar(host), assignment


def _scalar(x: Any) -> Any:
    """A 0-d result as Python's float (or int, for an integer dtype)."""
    return np.asarray(x).item()
