"""The source distribution, built as a release would build it: what it ships (what a user needs
to build, test and check the README's figures, not the logs and plots of measured runs) and
what its metadata tells an index (where the project lives, which Pythons and systems it runs
on)."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
from email.message import Message
from email.parser import HeaderParser
from pathlib import Path

import pytest

from .support import ROOT

# The test extra installs the build backend; an environment without it cannot build.
pytest.importorskip("hatchling.build", reason="needs hatchling: pip install -e '.[test]'")


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sdist")
    # In a process of its own: the backend builds the project of its working directory.
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from hatchling.build import build_sdist; "
         "print(build_sdist(sys.argv[1]))", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return out / done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def shipped(sdist: Path) -> list[str]:
    """The sdist's files, relative to its top folder."""
    with tarfile.open(sdist) as tar:
        return [m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile()]


@pytest.fixture(scope="module")
def metadata(sdist: Path) -> Message:
    with tarfile.open(sdist) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/PKG-INFO"))
        extracted = tar.extractfile(member)
        assert extracted is not None
        return HeaderParser().parsestr(extracted.read().decode())


def test_the_sdist_ships_no_logs_plots_or_ci(shipped: list[str]) -> None:
    unwanted = [
        name
        for name in shipped
        if name.endswith((".log", ".png", ".pyc"))
        or name.startswith((".ci/", ".whl/", ".venv"))
        or "/__pycache__/" in name
        or "/test-logs/" in name
    ]
    assert not unwanted


def test_the_sdist_ships_what_a_user_needs(shipped: list[str]) -> None:
    for needed in ["pyproject.toml", "README.md", "CONTRIBUTING.md", "LICENSE",
                   "src/aionvrtc/__init__.py", "src/aionvrtc/py.typed", "tests/conftest.py",
                   "tests/support/__init__.py",
                   "examples/quickstart.py", "benchmarks/_results.py"]:  # fmt: skip
        assert needed in shipped
    assert any(name.startswith("src/aionvrtc/tropical/kernels/") for name in shipped)
    # The pages, and the tables and JSON they quote, so that their figures can be checked
    # against them (tests/test_figures.py runs in the sdist too); not what a build generates.
    assert "docs/conf.py" in shipped
    assert "docs/guides/compile-service.md" in shipped
    assert not [name for name in shipped if name.startswith(("docs/_generated/", "docs/results/"))]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = re.findall(r"\]\((benchmarks/results/[^)\s#]+\.(?:md|json))\)", readme)
    assert linked
    assert not [name for name in linked if name not in shipped]


def test_the_metadata_says_where_and_on_what_it_runs(metadata: Message) -> None:
    urls = dict(url.split(", ", 1) for url in metadata.get_all("Project-URL", []))
    assert set(urls) == {"Homepage", "Documentation", "Source", "Issues"}
    assert all(url.startswith("https://") for url in urls.values())
    classifiers = metadata.get_all("Classifier", [])
    assert "Operating System :: POSIX :: Linux" in classifiers
    assert "Typing :: Typed" in classifiers
    assert any(c.startswith("Development Status :: ") for c in classifiers)
    assert any(c.startswith("Intended Audience :: ") for c in classifiers)
    assert any(c.startswith("Topic :: ") for c in classifiers)
    # Every Python version named is one that Requires-Python admits, starting at its floor.
    versions = sorted(
        tuple(map(int, found[1].split(".")))
        for c in classifiers
        if (found := re.fullmatch(r"Programming Language :: Python :: (3\.\d+)", c))
    )
    assert versions == [(3, 11), (3, 12), (3, 13)]
    assert metadata["Requires-Python"] == ">=3.11"
    # The license as an SPDX expression (PEP 639), which replaces the license classifiers.
    assert metadata["License-Expression"] == "MIT"
    assert not [c for c in classifiers if c.startswith("License ::")]
