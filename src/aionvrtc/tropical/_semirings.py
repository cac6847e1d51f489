"""The tropical semirings: names, element types and the identities of their operations."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["DTYPES", "SEMIRINGS", "Semiring", "as_dtype", "numpy_dtype", "semiring"]

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
    cpp: str  # the struct in kernels/tropical_common.cuh
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

    def one(self, dtype: np.dtype[np.generic]) -> np.generic:
        """The identity of ``mul``: x (x) one = x (einsum reduces an operand's own indices as
        a product with a vector of ones)."""
        dtype = np.dtype(dtype)
        return dtype.type(True if self.name == "andor" else 1 if self.mul == "*" else 0)

    def check_dtype(self, dtype: object, array: str | None = None) -> np.dtype[np.generic]:
        """``dtype`` as a NumPy dtype if this semiring takes it. Else TypeError when it is the
        dtype of ``array`` (an operand's name), ValueError when a dtype argument gave it."""
        found = numpy_dtype(dtype, "dtype")
        if found not in self.dtypes:
            allowed = ", ".join(str(d) for d in self.dtypes)
            if array is not None:
                raise TypeError(f"{array} has dtype {found}; {self.name} takes {allowed}")
            raise ValueError(f"dtype is {found}; {self.name} takes {allowed}")
        return found


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


def as_dtype(value: object, what: str = "dtype") -> np.dtype[np.generic]:
    """``value`` (a name such as "float32", a NumPy type or dtype) as one of the kernels'
    dtypes, else ValueError naming ``what`` and the accepted ones (not NumPy's TypeError
    about a "data type not understood")."""
    dtype = numpy_dtype(value, what)
    if dtype not in DTYPES:
        raise _not_a_dtype(dtype, what)
    return dtype


def numpy_dtype(value: object, what: str) -> np.dtype[np.generic]:
    # None is NumPy's float64, which nobody passing None meant.
    if value is None:
        raise _not_a_dtype(value, what)
    try:
        return np.dtype(value)  # type: ignore[call-overload,no-any-return]
    except (TypeError, ValueError):
        raise _not_a_dtype(value, what) from None


def _not_a_dtype(value: object, what: str) -> ValueError:
    shown = str(value) if isinstance(value, np.dtype) else repr(value)
    return ValueError(f"{what} must be one of {', '.join(map(str, DTYPES))}, got {shown}")


def semiring(name: str | Semiring) -> Semiring:
    """The semiring called ``name``; one of SEMIRINGS is its own (callers resolve a name once).
    Another Semiring is refused: the kernels know these four by name."""
    if isinstance(name, Semiring):
        if SEMIRINGS.get(name.name) is name:
            return name
        raise ValueError(
            f"semiring must be one of {', '.join(SEMIRINGS)} (aionvrtc.tropical.SEMIRINGS), not "
            f"a Semiring made elsewhere: {name.name!r}"
        )
    try:
        return SEMIRINGS[name]
    except (KeyError, TypeError):
        raise ValueError(f"semiring must be one of {', '.join(SEMIRINGS)}, got {name!r}") from None
