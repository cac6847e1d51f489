"""Every module the package imports is a dependency it declares: a module that only the test
extra brings (as sniffio came with trio) would fail on a user's install."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

from .support import ROOT

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


def _imports(path: Path, *, eager: bool) -> list[tuple[str, int]]:
    """(top-level module, line) of each import in ``path`` outside the standard library and
    aionvrtc; with ``eager``, only those run when the module is imported (not inside a
    function, not under ``if TYPE_CHECKING:``)."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        if eager and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            return
        if eager and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for branch in node.orelse:
                visit(branch)
            return
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            top = name.split(".")[0]
            if top != "aionvrtc" and top not in sys.stdlib_module_names:
                assert isinstance(node, ast.Import | ast.ImportFrom)
                found.append((top, node.lineno))
        for inner in ast.iter_child_nodes(node):
            visit(inner)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def _imported(*, eager: bool = False) -> dict[str, list[str]]:
    """Top-level modules the package imports (``eager``: see ``_imports``), with where."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for top, line in _imports(path, eager=eager):
            found.setdefault(top, []).append(f"{path.relative_to(ROOT)}:{line}")
    return found


def _distributions(module: str) -> set[str]:
    # A module not installed here (torch) is named as its distribution.
    providers = importlib.metadata.packages_distributions()
    return {_name(d) for d in providers.get(module, [module])}


def test_every_module_the_package_imports_is_declared() -> None:
    declared = _declared()
    everything = set().union(*declared.values())
    imported = _imported()
    assert {"anyio", "cupy", "numpy", "opt_einsum", "redis", "torch"} <= set(imported)
    undeclared = {
        module: where
        for module, where in imported.items()
        if module not in BROUGHT_BY_THE_CALLER and not _distributions(module) & everything
    }
    assert undeclared == {}, f"imported but declared by no dependency or extra: {undeclared}"


# The modules of an extra: what they import when imported is that extra's.
EXTRA_MODULES = {"metrics.py": "metrics", "tropical/torch.py": "torch"}


def test_what_a_module_imports_when_imported_comes_with_what_installs_it() -> None:
    # The core needs the dependencies and one CUDA extra (cu12 and cu13 bring the same
    # modules); an extra's module may need that extra too. Everything else is imported where
    # it is used, so that `import aionvrtc` works without it.
    declared = _declared()
    core = declared[""] | declared["cu13"]
    wrong = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        extra = EXTRA_MODULES.get(str(path.relative_to(PACKAGE)))
        allowed = core | (declared[extra] if extra else set())
        for module, line in _imports(path, eager=True):
            if not _distributions(module) & allowed:
                wrong[f"{path.relative_to(ROOT)}:{line}"] = module
    assert wrong == {}, f"imported on import, but not by what installs the module: {wrong}"
    assert set(EXTRA_MODULES.values()) <= set(declared)
    assert all((PACKAGE / name).is_file() for name in EXTRA_MODULES)


def test_the_extras_name_what_they_add() -> None:
    declared = _declared()
    assert {"redis"} <= declared["redis"]
    assert {"prometheus-client"} <= declared["metrics"]
    assert {"torch"} <= declared["torch"]
    for extra in ("cu12", "cu13"):  # NVRTC and CUDA's headers of one release, and CuPy
        assert {"cuda-toolkit", f"cupy-cuda{extra[2:]}x"} <= declared[extra]
    assert {"cuda-pathfinder", "numpy", "anyio"} <= declared[""]


def _imported_modules(path: Path) -> list[str]:
    """Every module ``path`` imports, relative imports made absolute (from its package), and
    those named in the code its child processes run (``from tests.x import y`` in a string)."""
    text = path.read_text(encoding="utf-8")
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            found.append(".".join(filter(None, [base, node.module or ""])))
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
    found += re.findall(r"from (tests\.[\w.]+) import", text)
    return found


def test_no_test_module_imports_another_and_benchmarks_use_only_tests_support() -> None:
    # Shared helpers live in tests/support: a test module imported by another runs its module
    # code twice over and ties the two together; a benchmark that imports a test module
    # breaks when a test is renamed.
    offenders = []
    for path in [
        *sorted((ROOT / "tests").rglob("*.py")),
        *sorted((ROOT / "benchmarks").glob("*.py")),
    ]:
        for module in _imported_modules(path):
            parts = module.split(".")
            if parts[0] == "tests" and (
                any(part.startswith("test_") or part == "conftest" for part in parts[1:])
                or (path.parent.name == "benchmarks" and parts[1:2] != ["support"])
            ):
                offenders.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not offenders, offenders
    assert _imported_modules(ROOT / "tests" / "test_snippets.py").count("tests.support.redis") == 1
