"""Every public name says what it is, what it takes and what it raises: the API reference is
built from these docstrings (Google style: ``Args:``, ``Returns:``, ``Raises:``), so a gap here
is a gap on the site.

The rules, for every public function, class and public method or property (``public_api``):
- a docstring whose first line says what it is or does;
- a function's or method's ``Args:`` names each of its parameters (``self`` and ``cls`` aside),
  and a class's ``Args:`` (or ``Attributes:``, a dataclass's fields) each of its constructor's;
- ``Returns:`` (or ``Yields:``) where it returns something (an annotation other than None), a
  class and a property aside;
- ``Raises:`` where it takes arguments (bad input is refused with an error that says so) or
  raises in its own body.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

from .support import ROOT

sys.path.insert(0, str(ROOT / "docs" / "_ext"))
import public_api

SECTION = re.compile(r"^(?P<name>[A-Z][A-Za-z ]*):\s*$")
ITEM = re.compile(r"^(?P<name>\*{0,2}[A-Za-z_][A-Za-z0-9_]*)(?:\s*\([^)]*\))?\s*:")


def sections(doc: str) -> dict[str, list[str]]:
    """A Google-style docstring's sections, by name, to the names of their items (the lines
    one level in that start ``name:`` or ``name (type):``)."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    indent = None
    for line in inspect.cleandoc(doc).splitlines():
        head = SECTION.match(line)
        if head is not None:
            current = found.setdefault(head["name"], [])
            indent = None
            continue
        if current is None or not line.strip():
            continue
        if not line.startswith(" "):
            current, indent = None, None  # prose again: the section ended
            continue
        depth = len(line) - len(line.lstrip())
        if indent is None:
            indent = depth
        if depth == indent:
            item = ITEM.match(line.strip())
            if item is not None:
                current.append(item["name"].lstrip("*"))
    return found


def _parameters(func: Callable[..., Any]) -> list[str]:
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return []
    return [name for name in signature.parameters if name not in ("self", "cls")]


def _raises_itself(func: Callable[..., Any]) -> bool:
    try:
        source = textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError):
        return False
    return any(isinstance(node, ast.Raise) for node in ast.walk(ast.parse(source)))


def _returns_something(func: Callable[..., Any]) -> bool:
    returns = inspect.signature(func).return_annotation
    return returns not in (None, "None", inspect.Signature.empty, "NoReturn", "Never")


def problems_of_callable(func: Callable[..., Any]) -> list[str]:
    doc = inspect.getdoc(func) or ""
    if not doc.strip():
        return ["no docstring"]
    found = sections(doc)
    out = []
    params = _parameters(func)
    documented = set(found.get("Args", []))
    missing = [p for p in params if p not in documented]
    if missing:
        out.append(f"Args: does not name {', '.join(missing)}")
    returns = func.__name__ != "__init__" and _returns_something(func)
    if returns and "Returns" not in found and "Yields" not in found:
        out.append("no Returns:")
    if (params or _raises_itself(func)) and "Raises" not in found:
        out.append("no Raises:")
    return out


def problems_of_class(cls: type) -> list[str]:
    doc = cls.__doc__ or ""
    if not doc.strip():
        return ["no docstring"]
    if issubclass(cls, BaseException):
        return []  # raised, not built: what it means is the whole story
    found = sections(doc)
    documented = set(found.get("Args", [])) | set(found.get("Attributes", []))
    if dataclasses.is_dataclass(cls):
        params = [f.name for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")]
        own = "__post_init__" in vars(cls) and _raises_itself(vars(cls)["__post_init__"])
    else:
        init = cls.__dict__.get("__init__") or cls.__dict__.get("__new__")
        params = [p for p in _parameters(init) if not p.startswith("_")] if init else []
        own = bool(params)
    out = []
    missing = [p for p in params if p not in documented]
    if missing:
        out.append(f"Args:/Attributes: does not name {', '.join(missing)}")
    if own and "Raises" not in found:
        out.append("no Raises:")
    return out


def problems() -> dict[str, list[str]]:
    """Each public name (and public member) with what its docstring lacks."""
    out: dict[str, list[str]] = {}
    for name, obj in public_api.names().items():
        if inspect.isclass(obj):
            out[name] = problems_of_class(obj)
            for member, value in public_api.members(obj).items():
                if isinstance(value, property):
                    lacking = [] if (value.__doc__ or "").strip() else ["no docstring"]
                else:
                    lacking = problems_of_callable(value)
                out[f"{name}.{member}"] = lacking
        elif callable(obj) and public_api.is_ours(obj):
            out[name] = problems_of_callable(obj)
    return {name: lacking for name, lacking in out.items() if lacking}


def test_the_rules_can_fail() -> None:
    def bare(x: int) -> int:
        return x

    def full(x: int, *rest: int, flag: bool = False) -> int:
        """Add.

        Args:
            x: the first.
            *rest: the others.
            flag (bool): a switch.

        Returns:
            The sum.

        Raises:
            ValueError: never, here.
        """
        return x

    def partial(x: int, y: int) -> None:
        """Do.

        Args:
            x: the first.

        Not a section: y is named here only in prose.
        """

    assert problems_of_callable(bare) == ["no docstring"]
    assert problems_of_callable(full) == []
    assert problems_of_callable(partial) == ["Args: does not name y", "no Raises:"]


def test_every_public_name_documents_what_it_takes_returns_and_raises() -> None:
    found = problems()
    listed = "\n".join(f"{name}: {'; '.join(lacking)}" for name, lacking in sorted(found.items()))
    assert not found, f"{len(found)} public names lack documentation:\n{listed}"


@pytest.mark.parametrize("module", public_api.PUBLIC_MODULES)
def test_every_public_module_says_what_it_holds(module: str) -> None:
    assert (public_api.module(module).__doc__ or "").strip()
