"""The performance page, drawn from the committed results alone: for every benchmark that
``benchmarks/results/README.md`` lists as current, its facts (GPU or machine, driver, versions,
date), its table and a plot drawn from its JSON by the plotter registered for it in ``plots``.

Nothing here holds a figure: a re-run that replaces a result file changes the page and its plot.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import plots

# A row of the results index: | [name](file) (.json, .png) | what it measured | commit | status |
_ROW = re.compile(
    r"^\| \[(?P<name>[^\]]+)\]\((?P<file>[^)]+)\)(?P<also>[^|]*)\| (?P<what>[^|]*) \| "
    r"(?P<commit>[^|]*) \| (?P<status>[^|]*) \|$"
)


_HEADING = re.compile(r"^#{1,6} ")


@dataclass(frozen=True)
class Result:
    """One current benchmark result: its files under benchmarks/results and what the index
    says of it."""

    stem: str  # the file name without its suffix: tropical_gemm-nvidia-h200
    files: tuple[str, ...]  # the names of its files that exist (.md, .json, .log, .png)
    what: str
    commit: str
    status: str


def current(results: Path) -> list[Result]:
    """The benchmarks the results index lists as current, in its order."""
    index = (results / "README.md").read_text("utf-8")
    benchmarks = index.split("## Benchmarks", 1)[1].split("\n## ", 1)[0]
    found = []
    for line in benchmarks.splitlines():
        row = _ROW.match(line.strip())
        if row is None or not row["status"].strip().startswith("current"):
            continue
        stem = row["file"].rsplit(".", 1)[0]
        files = tuple(
            f"{stem}{suffix}"
            for suffix in (".md", ".json", ".log", ".png")
            if (results / f"{stem}{suffix}").exists()
        )
        found.append(Result(stem, files, row["what"].strip(), row["commit"].strip(),
                            row["status"].strip()))  # fmt: skip
    return found


def _date(results: Path, result: Result, facts: dict[str, Any]) -> str | None:
    if facts.get("date"):
        return str(facts["date"])
    try:  # the day the file was committed, where the checkout has its history
        day = subprocess.run(
            ["git", "log", "-1", "--format=%cs", "--", *result.files],
            cwd=results, capture_output=True, text=True, timeout=30, check=False,
        ).stdout.strip()  # fmt: skip
    except OSError:
        return None
    return day or None


def _facts_line(facts: dict[str, Any], day: str | None, commit: str) -> str:
    """GPU (or machine), driver, CUDA runtime, CuPy, NVRTC, Python, date and commit, as the
    result's JSON names them."""
    parts = []
    where = facts.get("gpu") or facts.get("machine")
    if where:
        parts.append(str(where))
    driver = facts.get("driver") or facts.get("driver_cuda")
    if isinstance(driver, int):  # the CUDA version the driver runs, as CUDA encodes it
        parts.append(f"driver for CUDA {driver // 1000}.{driver % 1000 // 10}")
    elif driver:  # the driver's own release
        parts.append(f"driver {driver}")
    for key, label in (("cupy", "CuPy"), ("nvrtc", "NVRTC"), ("python", "Python"),
                       ("cpus", "CPUs"), ("aionvrtc", "aionvrtc")):  # fmt: skip
        if facts.get(key):
            parts.append(f"{label} {facts[key]}" if key != "cpus" else f"{facts[key]} CPUs")
    if day:
        parts.append(day)
    if commit:
        parts.append(f"commit {commit}")
    return ", ".join(parts)


def _body(markdown: str) -> str:
    """A result's markdown without its title, its headings placed below the page's (the
    highest of them at level 3, under the result's own heading)."""
    lines = markdown.splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    levels = [len(line) - len(line.lstrip("#")) for line in lines if _HEADING.match(line)]
    shift = 3 - min(levels) if levels else 0
    return _from_results(
        "\n".join("#" * shift + line if _HEADING.match(line) else line for line in lines)
    )


def _from_results(text: str) -> str:
    """Markdown written beside the results, its links made relative to the page: the results
    folder is results/ from there."""
    return re.sub(r"\]\((?!https?:|#|/)([^)]+)\)", r"](results/\1)", text)


def page(results: Path) -> tuple[str, dict[str, bytes]]:
    """The performance page's markdown (included by docs/performance.md) and its plots, by
    file name."""
    out: list[str] = []
    drawn: dict[str, bytes] = {}
    for result in current(results):
        facts: dict[str, Any] = {}
        data: Any = None
        if f"{result.stem}.json" in result.files:
            data = json.loads((results / f"{result.stem}.json").read_text("utf-8"))
            facts = data.get("facts", {}) if isinstance(data, dict) else {}
        title = result.stem
        if f"{result.stem}.md" in result.files:
            text = (results / f"{result.stem}.md").read_text("utf-8")
            if text.startswith("# "):
                title = text.splitlines()[0][2:].strip()
        out += [f"## {title}", "", f"{_from_results(result.what)}.", ""]
        facts_line = _facts_line(facts, _date(results, result, facts), result.commit)
        if facts_line:
            out += [f"*{facts_line}.*", ""]
        if data is not None:
            png = plots.draw(result.stem, data)
            if png is not None:
                name = f"{result.stem}.png"
                drawn[name] = png
                out += [f"![{title}](results/plots/{name})", ""]
        if f"{result.stem}.md" in result.files:
            out += [_body((results / f"{result.stem}.md").read_text("utf-8")), ""]
        links = ", ".join(f"[{name}](results/{name})" for name in result.files)
        out += [f"Files: {links}.", ""]
    return "\n".join(out), drawn
