"""The documentation site, built as a user builds it and seen in a real browser.

The build is strict (``-W -n``: a broken link, a reference that resolves nowhere or a public
name without a page fails it). The built site is served on a loopback port: every page's every
internal link answers 200, and headless Chromium (Debian's ``chromium``, driven by Playwright)
opens the home page, an API page, a guide with a plot and the search for ``memory_limit``,
with no error on the console, every image drawn, and a screenshot of each kept where a person
can look (``$AIONVRTC_TEST_ARTIFACTS``, else ``build/test-artifacts/docs``).
"""

from __future__ import annotations

import functools
import http.server
import os
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

from .support import ROOT

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


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html",
         str(ROOT / "docs"), str(out)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert (build.returncode, build.stderr) == (0, ""), build.stderr[-6000:]
    return out


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
                ("performance", "performance.html", "Tropical GEMM on NVIDIA H200"),
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
            assert seen["performance"] >= 10
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
