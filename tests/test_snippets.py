"""Every ```python block of README.md and of the documentation's pages (docs/, the pages the
site is built from) runs as written, each in a fresh interpreter: a reader who copies one meets
no undefined name, no top-level ``await`` and no missing import.

A block says what it needs on its first line: ``# needs a GPU`` runs only where there is one
(marked ``gpu``, so the conftest skips it elsewhere); ``# needs a Redis server`` runs against a
redis-server these tests start (skipped, saying so, where none is installed). Every block, GPU or
not, must compile and define every name it uses, so a GPU snippet broken for its readers fails
here too, on any machine."""

from __future__ import annotations

import builtins
import os
import re
import subprocess
import symtable
import sys
import textwrap
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .support import ROOT
from .support.redis import RedisServer, free_port

README = ROOT / "README.md"
DOCS = ROOT / "docs"
# The pages written by hand: the README and the site's sources (what the build generates, and
# the results it copies in, hold no snippets).
PAGES = [README, *sorted(p for p in DOCS.rglob("*.md") if p.relative_to(DOCS).parts[0]
                         not in ("_generated", "results"))]  # fmt: skip

# The blocks the pages hold, by what they need: removing a snippet, or marking one as needing
# a GPU so that CI stops running it, must show up here as a decision.
EXPECTED = Counter({"nothing": 20, "a GPU": 9, "a Redis server": 1})

FENCE = re.compile(r"^(?P<indent> *)```python\n(?P<code>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
NEEDS = re.compile(r"# needs (?P<what>[^:]+)")


@dataclass(frozen=True)
class Snippet:
    page: str  # README.md, docs/guides/compile-service.md, ...
    line: int  # of the opening fence
    code: str
    needs: str  # "nothing", "a GPU" or "a Redis server"

    @property
    def where(self) -> str:
        return f"{self.page} line {self.line}"


def page_snippets(path: Path) -> list[Snippet]:
    text = path.read_text(encoding="utf-8")
    snippets = []
    for match in FENCE.finditer(text):
        code = textwrap.dedent(match["code"])
        needs = NEEDS.match(code.split("\n", 1)[0])
        snippets.append(
            Snippet(
                page=path.relative_to(ROOT).as_posix(),
                line=text.count("\n", 0, match.start()) + 1,
                code=code,
                needs=needs["what"].strip() if needs else "nothing",
            )
        )
    return snippets


SNIPPETS = [snippet for page in PAGES for snippet in page_snippets(page)]


def params(snippets: list[Snippet], *, gpu_marks: bool) -> list[object]:
    return [
        pytest.param(
            snippet,
            id=f"{snippet.page.removeprefix('docs/').removesuffix('.md')}:{snippet.line}",
            marks=[pytest.mark.gpu] if gpu_marks and snippet.needs == "a GPU" else [],
        )
        for snippet in snippets
    ]


def undefined_names(code: str) -> set[str]:
    """Names ``code`` reads as globals (at module level or from any function or class in it)
    that it neither assigns nor imports at module level, and that are not builtins."""
    top = symtable.symtable(code, "<snippet>", "exec")
    defined = {
        symbol.get_name()
        for symbol in top.get_symbols()
        if symbol.is_assigned() or symbol.is_imported() or symbol.is_namespace()
    }
    used: set[str] = set()
    tables = [top]
    while tables:
        table = tables.pop()
        tables.extend(table.get_children())
        used.update(
            symbol.get_name()
            for symbol in table.get_symbols()
            if symbol.is_referenced() and symbol.is_global()
        )
    return used - defined - set(dir(builtins))


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer(free_port())
    server.start()  # skips, naming the fix, where redis-server is not installed
    yield server
    server.stop()


def test_the_pages_keep_their_snippets() -> None:
    # Every fence that opens a Python block was parsed (none left unclosed or mis-indented).
    for page in PAGES:
        fences = re.findall(r"^ *```py", page.read_text(encoding="utf-8"), re.M)
        assert len(fences) == len(page_snippets(page)), page
    assert Counter(snippet.needs for snippet in SNIPPETS) == EXPECTED


@pytest.mark.parametrize("snippet", params(SNIPPETS, gpu_marks=False))
def test_snippet_is_complete(snippet: Snippet) -> None:
    """Without running it: valid Python outside an event loop (no top-level ``await`` or
    ``async with``), and every name it reads is imported or defined in the snippet."""
    try:
        compile(snippet.code, snippet.where, "exec")
    except SyntaxError as exc:
        pytest.fail(f"{snippet.where}: {exc}")
    assert not undefined_names(snippet.code), f"{snippet.where} uses names it never defines"


def test_undefined_names_are_found() -> None:
    """The check above can fail: the README's old compile-service snippet would have."""
    code = "import anyio\nasync def main():\n    module.get_function('k')(grid, block, args)\n"
    assert undefined_names(code) == {"module", "grid", "block", "args"}
    assert not undefined_names("x = 1\ndef f():\n    return [x + i for i in range(3)]\n")
    with pytest.raises(SyntaxError):
        compile("await main()\n", "<snippet>", "exec")


@pytest.mark.parametrize("snippet", params(SNIPPETS, gpu_marks=True))
def test_snippet_runs(snippet: Snippet, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # A clean aionvrtc environment: a cache dir of this test's own, the pages' target, and
    # nothing of the developer's (a remote tier, a shared cache) leaking in.
    env = {key: value for key, value in os.environ.items() if not key.startswith("AIONVRTC_")}
    python_path = [str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])]
    env |= {
        "AIONVRTC_CACHE_DIR": str(tmp_path / "cache"),
        "AIONVRTC_ARCH": "sm_90",
        "PYTHONPATH": os.pathsep.join(python_path),
        "METRICS_PORT": "0",  # the metrics snippet's HTTP server: any free port
    }
    if snippet.needs == "a Redis server":
        server: RedisServer = request.getfixturevalue("redis_server")
        env |= {"REDIS_URL": server.url, "AIONVRTC_REMOTE_SECRET": "snippet test secret"}
    path = tmp_path / f"snippet_line{snippet.line}.py"
    path.write_text(snippet.code, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, (
        f"{snippet.where} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    )
