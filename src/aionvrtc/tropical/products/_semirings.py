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
    """A tropical semiring: ``add`` reduces over k, ``mul`` combines A[m, k] with B[k, n].

    The four that the kernels define are in ``SEMIRINGS``, by name; functions that take a
    semiring take its name or one of these objects, and refuse a Semiring made elsewhere.

    Attributes:
        name: The name functions take: ``"maxplus"``, ``"minplus"``, ``"maxmul"`` or
            ``"andor"``.
        cpp: The C++ struct of the kernels that implements it (kernels/tropical_common.cuh).
        add: The reduction over k: ``"max"``, ``"min"`` or ``"or"``.
        mul: The combination of A[m, k] and B[k, n]: ``"+"``, ``"*"`` or ``"and"``.
        dtypes: The element types it is defined on, as NumPy dtypes.
        maximise: Whether the reduction keeps the largest product (else the smallest; for
            and-or, any true).
        description: What it computes, and its zero, in words.
    """

    name: str
    cpp: str  # the struct in kernels/tropical_common.cuh
    add: str
    mul: str
    dtypes: tuple[np.dtype[np.generic], ...]
    maximise: bool  # the reduction keeps the largest product (else the smallest, or any true)
    description: str

    def zero(self, dtype: np.dtype[np.generic]) -> np.generic:
        """The identity of ``add``, absorbing for ``mul``: the result of an empty sum (K = 0).

        -inf for max-plus and +inf for min-plus on floats (the type's minimum and maximum on
        integers), 0 for max-times, False for and-or. ``dtype`` is not checked against
        ``dtypes``.

        Args:
            dtype: The element type: a NumPy dtype, type or name such as ``"float32"``.

        Returns:
            The zero as a NumPy scalar of ``dtype`` (``numpy.False_`` for and-or, whatever
            ``dtype``).

        Raises:
            TypeError: ``dtype`` is not one NumPy understands.
            ValueError: For max-plus or min-plus, ``dtype`` is neither a float nor an integer
                type (NumPy's ``iinfo`` refuses it).
        """
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
        a product with a vector of ones).

        0 for max-plus and min-plus, 1 for max-times, True for and-or. ``dtype`` is not checked
        against ``dtypes``.

        Args:
            dtype: The element type: a NumPy dtype, type or name such as ``"float32"``.

        Returns:
            The one as a NumPy scalar of ``dtype``.

        Raises:
            TypeError: ``dtype`` is not one NumPy understands.
        """
        dtype = np.dtype(dtype)
        return dtype.type(True if self.name == "andor" else 1 if self.mul == "*" else 0)

    def check_dtype(self, dtype: object, array: str | None = None) -> np.dtype[np.generic]:
        """``dtype`` as a NumPy dtype, if this semiring takes it.

        Args:
            dtype: A NumPy dtype, type or name such as ``"float32"``.
            array: The name of the operand whose dtype this is (``"a"``), for the message; None
                where a dtype argument gave it.

        Returns:
            ``dtype`` as a NumPy dtype, one of ``dtypes``.

        Raises:
            TypeError: With ``array``: this semiring does not take ``dtype``.
            ValueError: Without ``array``: this semiring does not take ``dtype``. With or
                without: ``dtype`` is None or not a dtype NumPy understands.
        """
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
