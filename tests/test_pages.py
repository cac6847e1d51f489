"""What the documentation's pages show a reader, checked from their sources (no build): code
blocks that fit the column the site shows them in, the README's map of the guides, and the
performance pages' titles and headline figures (``docs/_ext/performance.py``).

The built site is checked in a browser by ``tests/test_docs_site.py``."""

from __future__ import annotations

import json
import re
import sys

import pytest

from .support import ROOT

sys.path.insert(0, str(ROOT / "docs" / "_ext"))
import aionvrtc_docs
import performance

README = ROOT / "README.md"
DOCS = ROOT / "docs"
RESULTS = ROOT / "benchmarks" / "results"
# The pages written by hand (what the build generates, and the results it copies in, aside).
PAGES = sorted(p for p in DOCS.rglob("*.md") if p.relative_to(DOCS).parts[0]
               not in ("_generated", "results"))  # fmt: skip

# A fenced block: its indentation, its fence, its info string (a language, or a {directive}).
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^\n]*)$")
# An include of the README's section between two markers, as the pages write it.
INCLUDE = re.compile(
    r"```\{include\} [./]*README\.md\n:start-after: \"(?P<start>[^\"]+)\"\n"
    r":end-before: \"(?P<end>[^\"]+)\"\n```"
)


def code_lines(text: str) -> list[tuple[int, str]]:
    """The lines of ``text``'s fenced code blocks (not its directives: ``{eval-rst}``,
    ``{include}``, ``{toctree}``), each with its line number and without its block's
    indentation, as the page shows them."""
    found: list[tuple[int, str]] = []
    fence: re.Match[str] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        opened = FENCE.match(line)
        if fence is None:
            fence = opened
        elif opened and opened["fence"].startswith(fence["fence"]) and not opened["info"]:
            fence = None
        elif not fence["info"].strip().startswith("{"):
            found.append((number, line.removeprefix(fence["indent"])))
    return found


def too_wide(text: str) -> list[str]:
    return [
        f"line {number}: {len(line)} characters: {line.strip()[:60]}..."
        for number, line in code_lines(text)
        if len(line) > aionvrtc_docs.CODE_WIDTH
    ]


def included_readme() -> dict[str, str]:
    """The README's sections the pages include, by their start marker."""
    readme = README.read_text(encoding="utf-8")
    found = {}
    for page in PAGES:
        for include in INCLUDE.finditer(page.read_text(encoding="utf-8")):
            start, end = include["start"], include["end"]
            assert start in readme, f"{page}: {start!r}"
            assert end in readme, f"{page}: {end!r}"
            found[start] = readme.split(start, 1)[1].split(end, 1)[0]
    return found


def test_every_code_block_fits_the_column() -> None:
    # Wider than the column, a line scrolls and hides its end (the key argument of a call).
    texts = {page.relative_to(ROOT).as_posix(): page.read_text(encoding="utf-8")
             for page in PAGES}  # fmt: skip
    texts |= {f"README.md after {start!r}": text for start, text in included_readme().items()}
    texts["the command line's reference (generated)"] = aionvrtc_docs.cli_reference()
    problems = [f"{where} {problem}" for where, text in texts.items()
                for problem in too_wide(text)]  # fmt: skip
    assert not problems, "\n".join(problems)
    # The pages include the README's installation, first example and the two commands, and
    # the landing page its introduction.
    assert {"## Installation", "## A first example", "## The two commands",
            "<!-- intro:start -->"} <= set(included_readme())  # fmt: skip
    assert len([1 for text in texts.values() for _ in code_lines(text)]) > 500


def test_a_code_line_too_wide_is_found() -> None:
    wide = "x = 1  # " + "a" * (aionvrtc_docs.CODE_WIDTH - 8)
    text = f"Text {'b' * 200}\n\n```python\nx = 1\n{wide}\n```\n\n  ~~~bash\n  {wide}\n  ~~~\n"
    assert too_wide(text) == [
        f"line 5: {aionvrtc_docs.CODE_WIDTH + 1} characters: {wide[:60]}...",
        f"line 9: {aionvrtc_docs.CODE_WIDTH + 1} characters: {wide[:60]}...",
    ]
    # A directive's content is prose, not code; a line at the width fits.
    assert too_wide(f"```{{eval-rst}}\n{wide}\n```\n") == []
    assert too_wide(f"```\n{wide[:-1]}\n````\n") == []


def test_the_readme_and_the_home_page_map_every_guide() -> None:
    guides = sorted(
        path.relative_to(DOCS).as_posix()
        for folder in ("guides", "operating")
        for path in (DOCS / folder).glob("*.md")
    )
    readme = README.read_text(encoding="utf-8").split("## Where things are", 1)[1]
    readme = readme.split("\n## ", 1)[0]
    home = (DOCS / "index.md").read_text(encoding="utf-8").split("## Where to go", 1)[1]
    home = home.split("\n## ", 1)[0].split("```", 1)[0]
    assert len(guides) > 20
    assert [g for g in guides if f"](docs/{g})" not in readme] == []
    assert [g for g in guides if f"]({g})" not in home] == []


def test_the_home_page_shows_install_and_code_first() -> None:
    home = (DOCS / "index.md").read_text(encoding="utf-8")
    first_section = home.split("\n## ", 1)[0]
    assert "pip install '.[cu13]'" in first_section
    snippet = first_section.split("```python\n", 1)[1].split("```", 1)[0]
    assert "await compiler.compile(spec)" in snippet
    assert len(snippet.splitlines()) <= 15  # a few lines, above the fold


def test_every_current_result_has_one_title_of_its_own() -> None:
    found = performance.placed(RESULTS)
    titles = [title for group in performance.GROUPS for _, title in group.results]
    assert len(titles) == len(set(titles)) == len(found) > 20
    for stem, title in (r for group in performance.GROUPS for r in group.results):
        # Words a reader reads, not a file's slug.
        assert title[0].isupper(), title
        assert " " in title, title
        assert stem not in title, title
        assert not re.search(r"\w[-_]\w+[-_]\w", title), title


def test_a_result_left_out_twice_or_titled_twice_is_refused() -> None:
    groups = performance.GROUPS
    first, *rest = groups
    missing = performance.Group(first.page, first.results[1:])
    with pytest.raises(
        ValueError,
        match=r"the current result compile_service-2-vcpus-asyncio "
        r"is on no performance page: add it, with a title, to a group of GROUPS",
    ):
        performance.placed(RESULTS, (missing, *rest))
    twice = performance.Group(first.page, (*first.results, first.results[0]))
    with pytest.raises(ValueError, match="places compile_service-2-vcpus-asyncio twice"):
        performance.placed(RESULTS, (twice, *rest))
    stale = performance.Group(first.page, (*first.results, ("server_load-nvidia-h200", "Old")))
    with pytest.raises(
        ValueError, match="places server_load-nvidia-h200 but the results index lists it as not"
    ):
        performance.placed(RESULTS, (stale, *rest))
    (stem, _), *others = first.results
    same = performance.Group(first.page, ((stem, others[0][1]), *others))
    with pytest.raises(ValueError, match=f"titles two results {others[0][1]!r}"):
        performance.placed(RESULTS, (same, *rest))


# Figures the README quotes (tests/test_figures.py holds them to the committed files) that the
# headline table reads from the same results' JSON: the two agree, so the table reads the right
# keys.
QUOTED_BY_BOTH = {
    "compile_service-2-vcpus-asyncio": ["168 ns", "1.73x"],
    "gpu_start-nvidia-h200": ["2.2 ms", "28.5 ms"],
    "tropical_gemm-nvidia-h200": ["24.8 T ops/s", "80%"],
    "tropical_einsum-nvidia-h200": ["0.34 to 0.92", "149 to 1036"],
    "tensor_network_kings_subgraph-nvidia-h100-80gb-hbm3": ["86.1 ms"],
}


def test_the_headline_figures_are_the_results() -> None:
    table = performance.headlines(RESULTS).splitlines()
    assert table[:2] == ["| measured | figure | on |", "| --- | --- | --- |"]
    rows = {row.stem: line for row, line in zip(performance.HEADLINES, table[2:], strict=True)}
    readme = " ".join(README.read_text(encoding="utf-8").split())
    for stem, figures in QUOTED_BY_BOTH.items():
        for figure in figures:
            assert figure in readme, figure
            assert figure in rows[stem], (figure, rows[stem])
    for row in performance.HEADLINES:
        # Each row links its result's section, and names the GPU or machine of its run.
        line = rows[row.stem]
        assert f"](#{performance.label(row.stem)}) |" in line
        facts = json.loads((RESULTS / f"{row.stem}.json").read_text(encoding="utf-8"))["facts"]
        assert line.endswith((" | H100 |", " | H200 |")) == ("gpu" in facts), line
