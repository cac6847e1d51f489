"""Every module the package imports is a dependency it declares: a module that only the test
extra brings (as sniffio came with trio) would fail on a user's install."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib

from .conftest import ROOT

PACKAGE = ROOT / "src" / "aionvrtc"
# Extras that are not the package's: what tests and development need.
NOT_RUN_TIME = {"test", "dev"}
# Imported only where the caller already has it: trio, when the Compiler runs under trio.
BROUGHT_BY_THE_CALLER = {"trio"}


def _name(requirement: str) -> str:
    """The normalised distribution name of a requirement such as 'redis>=5' (PEP 503)."""
    found = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert found is not None, requirement
    return re.sub(r"[-_.]+", "-", found[0]).lower()


def _declared() -> dict[str, set[str]]:
    """Distribution names by where they are declared: "" for the dependencies, else the extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {"": {_name(r) for r in project["dependencies"]}}
    for extra, requirements in project["optional-dependencies"].items():
        if extra not in NOT_RUN_TIME:
            declared[extra] = {_name(r) for r in requirements if not r.startswith("aionvrtc")}
    return declared


def _imported() -> dict[str, list[str]]:
    """Top-level modules outside the standard library imported by the package, with where."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top != "aionvrtc" and top not in sys.stdlib_module_names:
                    found.setdefault(top, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_every_module_the_package_imports_is_declared() -> None:
    declared = _declared()
    everything = set().union(*declared.values())
    providers = importlib.metadata.packages_distributions()
    imported = _imported()
    assert {"anyio", "cupy", "numpy", "opt_einsum", "redis", "torch"} <= set(imported)
    undeclared = {}
    for module, where in imported.items():
        if module in BROUGHT_BY_THE_CALLER:
            continue
        # A module not installed here (torch) is named as its distribution.
        names = {_name(d) for d in providers.get(module, [module])}
        if not names & everything:
            undeclared[module] = where
    assert undeclared == {}, f"imported but declared by no dependency or extra: {undeclared}"


def test_the_extras_name_what_they_add() -> None:
    declared = _declared()
    assert {"redis"} <= declared["redis"]
    assert {"prometheus-client"} <= declared["metrics"]
    assert {"torch"} <= declared["torch"]
    for extra in ("cu12", "cu13"):  # NVRTC and CUDA's headers of one release, and CuPy
        assert {"cuda-toolkit", f"cupy-cuda{extra[2:]}x"} <= declared[extra]
    assert {"cuda-pathfinder", "numpy", "anyio"} <= declared[""]
