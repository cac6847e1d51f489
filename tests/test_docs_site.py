"""The documentation site, built as a documentation host builds it and seen in a real browser.

The build is strict (``-W -n``: a broken link, a reference that resolves nowhere or a public
name without a page fails it), and sees only what ``pip install '.[docs]'`` installs: every
other package of this environment (CuPy, NVRTC, networkx, Ray, Redis, ...) is hidden from it, as
it is from a documentation host, which has no GPU either. The built site is served on a
loopback port: every page's every internal link answers 200, and headless Chromium (Debian's
``chromium``, driven by Playwright) opens the home page, an API page, a guide with a plot and
the search for ``memory_limit``, with no error on the console, every image drawn, every code
block within its column, and a screenshot of each kept where a person can look
(``$AIONVRTC_TEST_ARTIFACTS``, else ``build/test-artifacts/docs``).
"""

from __future__ import annotations

import dataclasses
import functools
import http.server
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .support import ROOT

sys.path.insert(0, str(ROOT / "docs" / "_ext"))
import performance
import public_api

IN_SDIST = (ROOT / "PKG-INFO").exists()
pytestmark = pytest.mark.skipif(
    IN_SDIST, reason="an sdist ships no logs or plots, which the site links"
)
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# What Chromium needs to start headless as root in a container, and to stay off the network.
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def docs_extra() -> set[str]:
    """The distributions ``pip install '.[docs]'`` installs: aionvrtc, its dependencies and
    the docs extra's, and theirs, by canonical name (as this environment's metadata says)."""
    found: set[str] = set()
    todo = [("aionvrtc", frozenset({"docs"}))]
    while todo:
        name, extras = todo.pop()
        if canonicalize_name(name) in found:
            continue
        found.add(canonicalize_name(name))
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:  # a dependency of another platform
            continue
        for line in requires:
            requirement = Requirement(line)
            marker = requirement.marker
            if marker is None or any(marker.evaluate({"extra": e}) for e in {"", *extras}):
                todo.append((requirement.name, frozenset(requirement.extras)))
    return found


def hidden_from_docs() -> set[str]:
    """The top-level modules of every installed distribution the docs extra does not bring."""
    brought = docs_extra()
    return {
        module
        for module, distributions in importlib.metadata.packages_distributions().items()
        if not any(canonicalize_name(d) in brought for d in distributions)
    }


# sphinx-build with the modules named in argv[1] not importable: found by no path finder, as if
# they were not installed (importlib.util.find_spec says None, an import raises
# ModuleNotFoundError).
HIDING_BUILD = """
import importlib.machinery, sys
hidden = set(sys.argv[1].split(","))
class Hidden(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in hidden:
            return None
        return super().find_spec(name, path, target)
sys.meta_path[sys.meta_path.index(importlib.machinery.PathFinder)] = Hidden
from sphinx.cmd.build import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    hidden = ",".join(sorted(hidden_from_docs()))
    build = subprocess.run(
        [sys.executable, "-c", HIDING_BUILD, hidden, "-W", "--keep-going", "-n", "-q",
         "-b", "html", str(ROOT / "docs"), str(out)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert (build.returncode, build.stderr) == (0, ""), build.stderr[-6000:]
    return out


def test_the_site_builds_from_the_docs_extra_alone(site: Path) -> None:
    # What the build above could not import: the other extras' packages, CuPy and NVRTC
    # included (the test extra installs them all here).
    assert {"cupy", "nvidia", "networkx", "cotengra", "ray", "redis", "prometheus_client",
            "aiohttp", "pytest"} <= hidden_from_docs()  # fmt: skip
    assert {"sphinx", "myst_parser", "furo", "matplotlib", "numpy", "anyio",
            "opt_einsum"}.isdisjoint(hidden_from_docs())  # fmt: skip
    # The modules that import CuPy or PyTorch when loaded are documented all the same.
    torch_page = (site / "api/torch.html").read_text(encoding="utf-8")
    assert 'id="aionvrtc.tropical.torch.matmul"' in torch_page
    problems_page = (site / "api/problems.html").read_text(encoding="utf-8")
    assert 'id="aionvrtc.tropical.problems.independent_set"' in problems_page


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    handler = functools.partial(_Quiet, directory=str(site))
    server = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()
    thread.join()


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A browser that closes a connection it no longer needs (a prefetch, a page left) is
        # not an error of the site's; anything else is printed, as the base class does.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return None


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value and (tag, name) in {("a", "href"), ("img", "src"), ("link", "href"),
                                          ("script", "src")}:  # fmt: skip
                self.links.append(value)


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def test_the_site_has_a_page_for_each_topic(site: Path) -> None:
    pages = {p.relative_to(site).as_posix() for p in site.rglob("*.html")}
    for needed in ["index.html", "get-started/install.html", "guides/compile-service.html",
                   "guides/tensor-networks.html", "operating/settings.html", "operating/cli.html",
                   "operating/upgrading.html", "reliability.html", "performance.html",
                   "api/index.html", "api/compiler.html", "api/einsum.html", "changelog.html",
                   "search.html", "genindex.html"]:  # fmt: skip
        assert needed in pages
    # Generated from the code and the results: the settings from _config.SETTINGS, the
    # command line from its parsers, a plot per current benchmark with a JSON.
    settings = (site / "operating/settings.html").read_text(encoding="utf-8")
    assert "AIONVRTC_DISK_LIMIT" in settings
    assert "AIONVRTC_REMOTE_ALLOW_UNSIGNED" in settings
    cli = (site / "operating/cli.html").read_text(encoding="utf-8")
    assert "aionvrtc warm manifest" in cli
    assert "--older-than" in cli
    assert len(list((site / "_images").glob("*.png"))) >= 10


def test_every_internal_link_answers(site: Path, served: str) -> None:
    checked: set[str] = set()
    failures = []
    for page in sorted(site.rglob("*.html")):
        base = served + page.relative_to(site).as_posix()
        parser = _Links()
        parser.feed(page.read_text(encoding="utf-8"))
        for link in parser.links:
            url = urllib.parse.urljoin(base, link).split("#", 1)[0]
            if not url.startswith(served) or url in checked:
                continue
            checked.add(url)
            if (status := _status(url)) != 200:
                failures.append(f"{page.relative_to(site)} -> {link}: {status}")
    assert len(checked) > 100
    assert not failures, "\n".join(failures)


def _text(html: str) -> str:
    """An HTML fragment's text, as a reader sees it (tags dropped, entities decoded), its
    apostrophes as typed (the site curls them)."""
    import html as entities

    text = entities.unescape(re.sub(r"<[^>]+>", "", html)).replace("\u2019", "'")
    return " ".join(text.split())


def test_the_performance_pages_title_each_result_once(site: Path) -> None:
    groups = {group.page: group for group in performance.GROUPS}
    titles: list[str] = []
    for page, group in groups.items():
        html = (site / "performance" / f"{page}.html").read_text(encoding="utf-8")
        sections = re.findall(r"<h2>(.*?)<a class=\"headerlink\"[^>]*>.*?</h2>\s*<p>(.*?)</p>",
                              html, re.S)  # fmt: skip
        assert [_text(title) for title, _ in sections] == [t for _, t in group.results]
        titles += [_text(title) for title, _ in sections]
        for title, intro in sections:
            # Each says what it measured in a sentence, not a file's slug.
            assert _text(intro)[:1].isupper() or _text(intro).startswith("examples/"), intro
            assert not re.search(r"\w[-_]\w+[-_]\w", _text(title)), title
    assert (
        len(titles) == len(set(titles)) == len(performance.placed(ROOT / "benchmarks" / "results"))
    )
    # A flag is shown as typed, not with its two hyphens made a dash.
    serving = _text((site / "performance" / "serving.html").read_text(encoding="utf-8"))
    assert "--no-batch" in serving
    assert "\u2013no-batch" not in serving
    # The overview: the headline table, a row per figure, each linking its result's section.
    overview = (site / "performance.html").read_text(encoding="utf-8")
    table = overview.split("<table", 1)[1].split("</table>", 1)[0]
    links = re.findall(r'<a class="reference internal" href="performance/([\w-]+)\.html#([\w-]+)"',
                       table)  # fmt: skip
    assert len(links) == len(performance.HEADLINES)
    for page, anchor in links:
        assert f'id="{anchor}"' in (site / "performance" / f"{page}.html").read_text("utf-8")


def _field_list(entry: str, name: str) -> list[str]:
    """The names an API entry's field list ``name`` (Variables, Parameters) lists."""
    found = re.search(rf'<dt class="field-\w+">{name}<span class="colon">:</span></dt>\s*'
                      r'<dd class="field-\w+">(.*?)</dd>', entry, re.S)  # fmt: skip
    return re.findall(r"<strong>(\w+)</strong>", found[1]) if found else []


def test_a_dataclass_lists_its_fields_once(site: Path) -> None:
    pages = {path: path.read_text(encoding="utf-8") for path in (site / "api").glob("*.html")}
    checked = 0
    for name, obj in public_api.names().items():
        if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
            continue
        [page] = [html for html in pages.values() if f'id="{name}"' in html]
        # The class's own entry, up to its first member's.
        entry = page.split(f'id="{name}"', 1)[1].split('<dl class="py ', 1)[0]
        fields = [f.name for f in dataclasses.fields(obj) if not f.name.startswith("_")]
        documented = _field_list(entry, "Variables")
        assert sorted(documented) == sorted(fields), name
        assert _field_list(entry, "Parameters") == [], name
        checked += 1
    assert checked > 15


def _artifacts() -> Path:
    folder = Path(os.environ.get("AIONVRTC_TEST_ARTIFACTS", ROOT / "build" / "test-artifacts"))
    (folder / "docs").mkdir(parents=True, exist_ok=True)
    return folder / "docs"


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium: apt-get install chromium")
def test_a_reader_sees_the_pages_in_chromium(served: str) -> None:
    playwright = pytest.importorskip("playwright.sync_api")
    shots = _artifacts()
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            seen = {}
            for name, path, expect in [
                ("home", "", "What it does"),
                ("api-compiler", "api/compiler.html", "aionvrtc.Compiler"),
                ("guide-tropical-products", "guides/tropical-products.html", "Speed"),
                (
                    "performance",
                    "performance/contractions.html",
                    "Compiled contractions against JAX and PyTorch, H200",
                ),
            ]:
                answer = page.goto(served + path)
                assert answer is not None
                assert answer.status == 200
                page.wait_for_load_state("networkidle")
                assert expect in page.inner_text("body"), name
                # Every image drawn: loaded, and with a size.
                images = page.eval_on_selector_all(
                    "article img", "els => els.map(e => [e.src, e.complete, e.naturalWidth])"
                )
                assert all(done and width > 0 for _, done, width in images), images
                seen[name] = len(images)
                page.screenshot(path=str(shots / f"{name}.png"), full_page=False)
            assert seen["guide-tropical-products"] >= 1
            assert seen["performance"] >= 5
            # Above the fold of the home page: how to install, and a few lines of code.
            page.goto(served)
            blocks = page.eval_on_selector_all(
                "article pre",
                "els => els.map(e => [e.textContent, e.getBoundingClientRect().bottom])",
            )
            assert "pip install" in blocks[0][0], blocks[:2]
            assert "import" in blocks[1][0], blocks[:2]
            assert blocks[1][1] <= 900, blocks[:2]
            # The search box, as a reader uses it.
            page.goto(served)
            page.fill("input[name=q]", "memory_limit")
            page.keyboard.press("Enter")
            page.wait_for_selector("#search-results li", timeout=30_000)
            page.wait_for_function(
                "document.querySelector('#search-results p')?.textContent.includes('found')"
            )
            results = page.inner_text("#search-results")
            assert "memory_limit" in results
            titles = page.eval_on_selector_all(
                "#search-results li > a", "els => els.map(e => e.textContent)"
            )
            assert "Caches, tiers and manifests" in titles, titles
            page.screenshot(path=str(shots / "search-memory_limit.png"), full_page=False)
            assert errors == []
        finally:
            browser.close()


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium: apt-get install chromium")
def test_every_code_block_shows_its_lines_whole_in_chromium(site: Path, served: str) -> None:
    # In a desktop window, no code block scrolls: a line wider than the column would hide its
    # end (tests/test_pages.py holds the sources to the width this shows).
    playwright = pytest.importorskip("playwright.sync_api")
    pages = sorted(
        path.relative_to(site).as_posix()
        for path in site.rglob("*.html")
        if path.relative_to(site).parts[0] not in ("results", "_static")
        and path.name not in ("genindex.html", "search.html", "py-modindex.html")
    )
    wide = []
    blocks = 0
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            for path in pages:
                page.goto(served + path, wait_until="load")
                found = page.eval_on_selector_all(
                    "article pre",
                    "els => els.map(e => [e.scrollWidth, e.clientWidth, e.textContent])",
                )
                blocks += len(found)
                wide += [f"{path}: {text.splitlines()[0][:60]!r}... {scroll} > {client} px"
                         for scroll, client, text in found if scroll > client]  # fmt: skip
        finally:
            browser.close()
    assert len(pages) > 40
    assert blocks > 40
    assert not wide, "\n".join(wide)
