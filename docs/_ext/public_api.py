"""The public API as users import it: every public module and the names it exports, with
the object each name is. The documentation's completeness check (every name has a page) and
the docstring test (every name says what, its parameters and what it raises) both read it,
so that the two agree on what "public" is.

Needs neither CuPy nor PyTorch: the packages a public module imports when loaded that the
``docs`` extra does not bring (``OPTIONAL_IMPORTS``) are mocked where they are not installed,
with Sphinx's own mock, as autodoc mocks them (``docs/conf.py`` passes it the same list)."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
from collections.abc import Iterator
from types import ModuleType
from typing import Any

# The modules whose names users import. A module is public when its name has no underscored
# part; each is listed here so that a new one is a decision, not an accident.
PUBLIC_MODULES = (
    "aionvrtc",
    "aionvrtc.metrics",
    "aionvrtc.tropical",
    "aionvrtc.tropical.cluster",
    "aionvrtc.tropical.problems",
    "aionvrtc.tropical.reference",
    "aionvrtc.tropical.torch",
    "aionvrtc.tropical.tuning",
)


# The packages a public module imports when it is loaded, rather than when called, that a
# documentation host (``pip install '.[docs]'``, no GPU) does not have: ``tropical.torch``
# imports CuPy and PyTorch at its top, as its every call needs both. The other optional packages
# (networkx, cotengra, Ray, Redis, prometheus_client) are imported where they are used, which
# the build with the ``docs`` extra alone keeps true (CI's .venv-docs, tests/test_docs_site.py).
OPTIONAL_IMPORTS = ("cupy", "torch")


def missing_imports() -> list[str]:
    """The packages of ``OPTIONAL_IMPORTS`` not installed here: what the API reference mocks.
    One that is installed is imported for real, so that a page documents the real thing."""
    return [name for name in OPTIONAL_IMPORTS if importlib.util.find_spec(name) is None]


@contextlib.contextmanager
def _mocked() -> Iterator[None]:
    missing = missing_imports()
    if not missing:
        yield
        return
    from sphinx.ext.autodoc.mock import mock  # type: ignore[attr-defined]  # not in __all__

    with mock(missing):
        yield


def module(name: str) -> ModuleType:
    """The public module ``name``, imported (``missing_imports()`` mocked)."""
    with _mocked():
        return importlib.import_module(name)


def names() -> dict[str, Any]:
    """Every public name by its full dotted path (``aionvrtc.tropical.einsum``), to its object;
    a module's submodules that are public modules themselves are left to their own entry."""
    found: dict[str, Any] = {}
    for module_name in PUBLIC_MODULES:
        mod = module(module_name)
        for name in mod.__all__:
            if f"{module_name}.{name}" in PUBLIC_MODULES:
                continue
            found[f"{module_name}.{name}"] = getattr(mod, name)
    return found


def is_ours(obj: Any) -> bool:
    return (getattr(obj, "__module__", None) or "").split(".")[0] == "aionvrtc"


def members(cls: type) -> dict[str, Any]:
    """The public methods and properties of ``cls`` that aionvrtc defines (on it or on a base
    of aionvrtc's), by name: what its page documents beside it. Dataclass fields are the
    class's attributes, documented with the class."""
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    out: dict[str, Any] = {}
    for base in reversed(cls.__mro__):
        if not is_ours(base):
            continue
        for name, attribute in vars(base).items():
            if name.startswith("_") or name in fields:
                continue
            value = (
                attribute.__func__
                if isinstance(attribute, (staticmethod, classmethod))
                else attribute
            )
            if inspect.isfunction(value) or isinstance(value, property):
                out[name] = value
    return out
