"""The tropical semirings: names, element types and the identities of their operations."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["DTYPES", "SEMIRINGS", "Semiring", "semiring"]

# NumPy dtype -> the CUDA C++ type of the kernels.
DTYPES: dict[np.dtype[np.generic], str] = {
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
    np.dtype(np.int32): "int",
    np.dtype(np.int64): "long long",
    np.dtype(np.bool_): "bool",
}
_NUMERIC = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32), np.dtype(np.int64))


@dataclass(frozen=True, slots=True)
class Semiring:
    """``add`` reduces over k, ``mul`` combines A[m, k] with B[k, n]."""

    name: str
    cpp: str  # the struct in kernels/tropical.cu
    add: str
    mul: str
    dtypes: tuple[np.dtype[np.generic], ...]
    maximise: bool  # the reduction keeps the largest product (else the smallest, or any true)
    description: str

    def zero(self, dtype: np.dtype[np.generic]) -> np.generic:
        """The identity of ``add``, absorbing for ``mul``: the result of an empty sum (K = 0)."""
        dtype = np.dtype(dtype)
        if self.name == "andor":
            return np.bool_(False)
        if self.name == "maxmul":
            return dtype.type(0)
        if dtype.kind == "f":
            return dtype.type(-np.inf if self.maximise else np.inf)
        info = np.iinfo(dtype)  # type: ignore[type-var]
        return dtype.type(info.min if self.maximise else info.max)

    def check_dtype(self, dtype: np.dtype[np.generic], what: str) -> None:
        if np.dtype(dtype) not in self.dtypes:
            allowed = ", ".join(str(d) for d in self.dtypes)
            raise TypeError(f"{what} has dtype {np.dtype(dtype)}; {self.name} takes {allowed}")


SEMIRINGS: dict[str, Semiring] = {
    s.name: s
    for s in (
        Semiring(
            "maxplus",
            "MaxPlus",
            "max",
            "+",
            _NUMERIC,
            True,
            "max over k of a + b; zero -inf (the type's minimum for integers)",
        ),
        Semiring(
            "minplus",
            "MinPlus",
            "min",
            "+",
            _NUMERIC,
            False,
            "min over k of a + b; zero +inf (the type's maximum for integers)",
        ),
        Semiring(
            "maxmul",
            "MaxMul",
            "max",
            "*",
            _NUMERIC,
            True,
            "max over k of a * b, defined for non-negative inputs; zero 0",
        ),
        Semiring(
            "andor",
            "AndOr",
            "or",
            "and",
            (np.dtype(np.bool_),),
            True,
            "or over k of a and b, on booleans; zero False",
        ),
    )
}


def semiring(name: str) -> Semiring:
    try:
        return SEMIRINGS[name]
    except (KeyError, TypeError):
        raise ValueError(f"semiring must be one of {', '.join(SEMIRINGS)}, got {name!r}") from None
