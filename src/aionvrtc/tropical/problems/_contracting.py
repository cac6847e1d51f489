"""The contractions behind each property, on a network's subscripts and operands alone (a
problem's meaning is read above, in _problem): its tensors in the semiring a property asks
(forbidden entries hold the semiring's zero, so the other end of the objective is the same
tensors with the other zero), the plan found once, then the NumPy reference's value, counts,
k best, configurations and sums, or the GPU's value and assignment."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..networks import EinsumPlan, configurations_sync, einsum_plan, einsum_sync, top_values
from ..products import SEMIRINGS, cupy_module
from ..reference import (
    configurations,
    partition_function,
    polynomial,
    samples,
    top_configurations,
)
from ..reference import einsum as numpy_einsum
from ._reading import Array

__all__ = ["SENSES", "Network"]

SENSES = ("max", "min", "all", "every")


@dataclass(frozen=True, slots=True)
class Network:
    """A scalar network in one semiring: what einsum takes, and its plan, found once for every
    semiring it is asked in (the plan holds the order, and any slicing the optimizer chose)."""

    subscripts: str
    operands: tuple[Array, ...]
    semiring: str
    plan: EinsumPlan

    @classmethod
    def planned(
        cls, subscripts: str, operands: Sequence[Array], semiring: str, optimize: Any
    ) -> Network:
        plan = einsum_plan(subscripts, *operands, optimize=optimize)
        return cls(subscripts, tuple(operands), semiring, plan)

    @property
    def path(self) -> list[tuple[int, ...]]:
        return [tuple(step) for step in self.plan.path]

    def towards(self, sense: str) -> Network:
        """The same tensors in the semiring of ``sense`` (``"max"``: max-plus, ``"min"``:
        min-plus): each forbidden entry (the own semiring's zero) the other's zero; for
        ``"all"`` every allowed entry 0 in the own semiring, so that every valid configuration
        attains the optimum, 0 (counting those counts them all); for ``"every"`` as they are."""
        if sense not in SENSES:
            raise ValueError(f"sense must be one of {', '.join(map(repr, SENSES))}, got {sense!r}")
        own = SEMIRINGS[self.semiring]
        dtype = self.operands[0].dtype
        if sense == "every":  # the sizes as they are: the zero alone marks what is invalid
            return self
        if sense == "all":
            zero = own.zero(dtype)
            made = tuple(np.where(x == zero, zero, x.dtype.type(0)) for x in self.operands)
            return dataclasses.replace(self, subscripts=str(self.subscripts), operands=made)
        wanted = "maxplus" if sense == "max" else "minplus"
        if wanted == self.semiring:
            return self
        zero, other = own.zero(dtype), SEMIRINGS[wanted].zero(dtype)
        made = tuple(np.where(x == zero, other, x) for x in self.operands)
        return Network(str(self.subscripts), made, wanted, self.plan)

    def values(self, k: int, max_bytes: int) -> list[Any]:
        """The ``k`` best distinct values, best first; fewer where fewer exist. Not counted:
        no count past 2^63 - 1 stands in their way."""
        zero = SEMIRINGS[self.semiring].zero(self.operands[0].dtype)
        if k == 1:
            value = numpy_einsum(
                *self._arguments(), semiring=self.semiring, path=self.path, max_bytes=max_bytes
            )
            found = [value]
        else:
            found = list(
                top_values(
                    *self._arguments(),
                    top=k,
                    semiring=self.semiring,
                    path=self.path,
                    max_bytes=max_bytes,
                )
            )
        return [_scalar(v) for v in found if v != zero and v == v]  # noqa: PLR0124  # (NaN)

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

    def top_rows(self, k: int, limit: int | None, max_bytes: int) -> tuple[str, list[Array]]:
        """Every assignment attaining one of the ``k`` best values (None: one of each alone):
        the indices, and for each value (best first) a row of values each."""
        _, letters, rows = top_configurations(
            *self._arguments(), top=k, semiring=self.semiring, path=self.path,
            max_bytes=max_bytes, limit=limit or 1, first=limit is None,
        )  # fmt: skip
        return letters, rows

    def drawn(self, count: int, seed: Any, max_bytes: int) -> tuple[str, Array]:
        """``count`` assignments attaining the value, drawn uniformly: the indices, and a row
        of values each; no row where nothing attains a value."""
        _, letters, rows = samples(
            *self._arguments(),
            count=count,
            seed=seed,
            semiring=self.semiring,
            path=self.path,
            max_bytes=max_bytes,
        )
        return letters, rows

    def polynomial(self, max_bytes: int) -> dict[int, int]:
        """How many valid assignments have each size (exact)."""
        return polynomial(
            *self._arguments(), semiring=self.semiring, path=self.path, max_bytes=max_bytes
        )

    def log_partition(self, beta: float, max_bytes: int) -> float:
        """ln of the sum over the valid assignments of exp(beta * size)."""
        return partition_function(
            *self._arguments(),
            beta=beta,
            semiring=self.semiring,
            path=self.path,
            max_bytes=max_bytes,
        )

    def on_gpu(self, device: int, *, argmax: bool) -> tuple[Any, Mapping[str, int] | None]:
        """The value as Python's scalar, and with ``argmax`` an assignment attaining it, on GPU
        ``device`` along the plan (its slicing too), from a thread that may block; (None,
        None) where the value is the semiring's zero: nothing attains it."""
        found = einsum_sync(
            self.subscripts, *self._uploaded(device), semiring=self.semiring, argmax=argmax,
            optimize=self.plan,
        )  # fmt: skip
        value, assignment = found if argmax else (found, None)
        host = value.get()
        if host == SEMIRINGS[self.semiring].zero(host.dtype):
            return None, None
        return _scalar(host), assignment

    def counted_on_gpu(self, device: int) -> list[tuple[Any, int]]:
        """``best(1)`` on GPU ``device`` along the plan (its slicing too), from a thread that
        may block: the value with its count (a Python int, exact at any size), or nothing
        where no configuration is valid."""
        value, count = einsum_sync(
            self.subscripts, *self._uploaded(device), semiring=self.semiring, count=True,
            optimize=self.plan,
        )  # fmt: skip
        many = int(count)  # (a CuPy int64, or past it Python's int in a NumPy array)
        return [(_scalar(value.get()), many)] if many else []

    def top_on_gpu(self, device: int, k: int) -> list[tuple[Any, int]]:
        """The ``k`` best distinct values, best first, each with its count (-1 past
        2^63 - 1), on GPU ``device`` along the plan, from a thread that may block; fewer
        where fewer exist."""
        values, counts = einsum_sync(
            self.subscripts, *self._uploaded(device), semiring=self.semiring, top=k,
            optimize=self.plan,
        )  # fmt: skip
        pairs = zip(values.get().tolist(), counts.get().tolist(), strict=True)
        return [(value, count) for value, count in pairs if count != 0]

    def rows_on_gpu(self, device: int, limit: int) -> tuple[str, Array]:
        """Every assignment attaining the value, on GPU ``device`` along the plan's order
        (whole: the walk keeps every step's values, so a sliced plan's path is planned again
        without its slicing), from a thread that may block: the indices, and one row of
        values each (on the host); no row where nothing attains a value."""
        plan = self.plan.path if self.plan.slicing is not None else self.plan
        _, letters, rows = configurations_sync(
            self.subscripts, *self._uploaded(device), semiring=self.semiring, limit=limit,
            optimize=plan,
        )  # fmt: skip
        return letters, rows.get()

    def _uploaded(self, device: int) -> list[Any]:
        cupy = cupy_module()
        with cupy.cuda.Device(device):
            return [cupy.asarray(x) for x in self.operands]

    def _arguments(self) -> tuple[Any, ...]:
        return (self.subscripts, *self.operands)


def _scalar(x: Any) -> Any:
    """A 0-d result as Python's float (or int, for an integer dtype)."""
    return np.asarray(x).item()
