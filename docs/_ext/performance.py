"""The performance pages, drawn from the committed results alone: for every benchmark that
``benchmarks/results/README.md`` lists as current, its facts (GPU or machine, driver, versions,
date), its table and a plot drawn from its JSON by the plotter registered for it in ``plots``;
and on top, a table of headline figures read from the results' JSON.

The results are grouped by what they measure (``GROUPS``): each group is a page of its own,
``docs/performance/<page>.md``, which says what the group is about and includes what is
generated here. Each result has a title written here; a current result that no group places, a
result placed that is not current, or a title given twice fails the build.

Nothing here holds a figure: a re-run that replaces a result file changes the pages, the
headline table and the plots.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
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
class Group:
    """The results on one page: ``docs/performance/<page>.md``, each result with its title."""

    page: str
    results: tuple[tuple[str, str], ...]  # (its stem, its title), in the page's order


GROUPS = (
    Group("compile-service", (
        ("compile_service-2-vcpus-asyncio", "Requests to the compile service on asyncio, 2 vCPUs"),
        ("compile_service-2-vcpus-trio", "Requests to the compile service on trio, 2 vCPUs"),
        ("import_time-2-vcpus", "Import and first use, 2 vCPUs"),
        ("disk_tier-2-vcpus", "The disk tier at 50,000 entries, 2 vCPUs"),
        ("gpu_start-nvidia-h200", "Start-up on the GPU against CuPy's RawModule, H200"),
        ("warm_cache-nvidia-h200-gpu", "A warm cache shipped to a fresh process, H200"),
        ("warm_cache-2-vcpus-cpu", "A warm cache shipped to a fresh process, no GPU"),
        ("soak-2-vcpus", "The reliability soak, 2 vCPUs"),
    )),
    Group("products", (
        ("tropical_gemm-nvidia-h200", "Tropical GEMM against its peers and the probe, H200"),
        ("sustained-nvidia-h200", "Clocks and power under sustained load, H200"),
        ("tile_sweep-nvidia-h200-all-classes", "Every shape class's tiles, H200"),
        ("tile_sweep-nvidia-h200", "The large shape class's tiles, H200"),
        ("tile_sweep-nvidia-h200-argmax-shared-index", "The argmax kernels' tiles, H200"),
        ("sweep_steps-nvidia-h100-80gb-hbm3", "A row sweep's skinny products by kernel, H100"),
        ("counted_products-nvidia-h100-80gb-hbm3", "Counted products beside the value's, H100"),
    )),
    Group("contractions", (
        ("tropical_einsum-nvidia-h200", "Compiled contractions against JAX and PyTorch, H200"),
        ("tensor_network-nvidia-h200", "Graph problems of up to 225 vertices, H200"),
        ("tensor_network_published_unsliced-nvidia-h200", "The published networks, H200"),
        ("tensor_network_published_sliced-two-nvidia-h200",
         "The published networks sliced, on one H200 and on two"),
        ("tensor_network_published-nvidia-h200", "The published networks' first run, H200"),
        ("tensor_network_kings_subgraph-nvidia-h100-80gb-hbm3", "A 38 x 38 king's subgraph, H100"),
        ("tensor_network_spin_glass-nvidia-h100-80gb-hbm3",
         "A 32 x 32 spin glass swept row by row, H100"),
        ("einsum_slices-nvidia-h100-80gb-hbm3", "Slices on one H100 and on two"),
        ("sliced_programs-nvidia-h100-80gb-hbm3",
         "The published networks whole and in slices, with each slice's program, H100"),
        ("relayout-nvidia-h200", "Before and after the split into products and networks, H200"),
    )),
    Group("planning", (
        ("einsum_planners-2-vcpus", "Contraction orders by planner, 2 vCPUs"),
        ("einsum_orders-2-vcpus", "Contraction orders by their modelled time on an H200"),
    )),
    Group("problems", (
        ("problem_properties-2-vcpus", "Every property of a problem on the CPU, 2 vCPUs"),
    )),
    Group("serving", (
        ("launch-h100-80gb-hbm3", "Launch cost and batched requests, H100"),
        ("server_load-nvidia-h100-80gb-hbm3", "The shortest-paths server under load, H100"),
        ("first_burst-nvidia-h100-80gb-hbm3", "A server's first burst at a new batch size, H100"),
        ("program_batching-nvidia-h100-80gb-hbm3", "Many weighted queries of one network, H100"),
    )),
)  # fmt: skip


@dataclass(frozen=True)
class Headline:
    """A row of the headline table: what was measured, and its figure read from the JSON of
    the result ``stem``."""

    what: str
    stem: str
    figure: Callable[[Any], str]


def _row(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any]:
    (found,) = [row for row in rows if all(row[key] == value for key, value in match.items())]
    return found


def _hot_hit(data: Any) -> str:
    hit = data["results"]["now"]["hot_hit"]
    return f"{hit['hot_hit_ns']:.0f} ns, {hit['ratio']:.2f}x awaiting a trivial coroutine"


def _disk_read(data: Any) -> str:
    return f"{_row(data['results'], entries=50_000)['now']['read_hit_s'] * 1e6:.0f} us"


def _warm_start(data: Any) -> str:
    start = data["results"]["warm_start"]
    ours, cupy = start["aionvrtc, 31-kernel source"], start["CuPy RawModule, 31-kernel source"]
    return f"{ours['get_ms']:.1f} ms; CuPy `RawModule`: {cupy['get_ms']:.1f} ms"


def _gemm(data: Any) -> str:
    gemm = data["results"]["gemm"]["maxplus float32 8192"]
    return (
        f"{gemm['ops_per_s'] / 1e12:.1f} T ops/s, {gemm['ratio_to_probe']:.0%} of the add+max probe"
    )


def _host_call(data: Any) -> str:
    call = _row(data["results"]["host"]["rows"], call="tropical.matmul_sync(a, b)")
    return (
        f"{call['us']:.1f} us, {call['ratio']:.2f}x an empty `RawKernel` launch of as many "
        "arguments"
    )


def _replays(data: Any) -> str:
    ratios = [row["program_ms"] / row["jax_ms"] for row in data["results"]]
    steps = [row["steps"] for row in data["results"]]
    return (
        f"{min(ratios):.2f} to {max(ratios):.2f} times JAX `jit`'s time, at {min(steps)} to "
        f"{max(steps)} steps"
    )


def _kings(data: Any) -> str:
    row = data["rows"][0]
    return f"{row['gpu_ms']:.1f} ms; with the set itself {row['gpu_argmax_ms']:.1f} ms"


def _sliced(data: Any) -> str:
    row = _row(data["results"], vertices=220)
    return (
        f"{row['one_gpu_ms']:.0f} ms in {row['slices']} slices on one GPU, "
        f"{row['two_gpus_ms']:.0f} ms on two"
    )


def _served(data: Any) -> str:
    run = _row(data["results"]["runs"], mode="batch", body="npz")
    level = _row(run["levels"], concurrency=64)
    return f"{level['requests_per_s']:,.0f} requests/s, p99 {level['p99_ms']:.1f} ms"


HEADLINES = (
    Headline(
        "A memory hit, `await compiler.compile(spec)`", "compile_service-2-vcpus-asyncio", _hot_hit
    ),
    Headline("A read hit of the disk tier at 50,000 entries", "disk_tier-2-vcpus", _disk_read),
    Headline(
        "A fresh process's first usable kernel from a warm cache, a 31-kernel source",
        "gpu_start-nvidia-h200",
        _warm_start,
    ),
    Headline("Max-plus float32 GEMM, 8192^3", "tropical_gemm-nvidia-h200", _gemm),
    Headline(
        "The host's time for a hot 8x8x8 `tropical.matmul_sync(a, b)`",
        "launch-h100-80gb-hbm3",
        _host_call,
    ),
    Headline(
        "A compiled contraction's replay, graph problems' networks",
        "tropical_einsum-nvidia-h200",
        _replays,
    ),
    Headline(
        "The maximum independent set of a 38 x 38 king's subgraph (1,155 vertices)",
        "tensor_network_kings_subgraph-nvidia-h100-80gb-hbm3",
        _kings,
    ),
    Headline(
        "A random 3-regular graph of 220 vertices, sliced to fit",
        "einsum_slices-nvidia-h100-80gb-hbm3",
        _sliced,
    ),
    Headline(
        "The shortest-paths server, 64 clients sending `.npz` bodies, requests solved together",
        "server_load-nvidia-h100-80gb-hbm3",
        _served,
    ),
)


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
        return str(facts["date"])[:10]  # the day ("2026-11-23 00:53:12 +0000" in some)
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


def _sentence(text: str) -> str:
    """The index's description of a result as a sentence: a capital first, a full stop last."""
    text = text[:1].upper() + text[1:]
    return text if text.endswith(".") else f"{text}."


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
    """Markdown written beside the results, its links made relative to a group's page
    (``docs/performance/<page>.md``): the results folder is ../results from there."""
    return re.sub(r"\]\((?!https?:|#|/)([^)]+)\)", r"](../results/\1)", text)


def label(stem: str) -> str:
    """The target a page links a result's section by (``{ref}``), whatever its title."""
    return f"result-{stem}"


def placed(results: Path, groups: tuple[Group, ...] = GROUPS) -> dict[str, Result]:
    """The current results by stem, each placed in exactly one of ``groups``; else ValueError,
    which names the result and what to do."""
    found = {result.stem: result for result in current(results)}
    stems = [stem for group in groups for stem, _ in group.results]
    for stem in found:
        if stem not in stems:
            raise ValueError(
                f"the current result {stem} is on no performance page: add it, with a title, "
                "to a group of GROUPS in docs/_ext/performance.py"
            )
    for stem in stems:
        if stem not in found or stems.count(stem) > 1:
            raise ValueError(
                f"GROUPS in docs/_ext/performance.py places {stem} "
                + ("twice" if stem in found else "but the results index lists it as not current")
            )
    titles = [title for group in groups for _, title in group.results]
    for title in titles:
        if titles.count(title) > 1:
            raise ValueError(
                f"GROUPS in docs/_ext/performance.py titles two results {title!r}: give each "
                "a title of its own"
            )
    return found


def _section(results: Path, result: Result, title: str) -> tuple[list[str], dict[str, bytes]]:
    """One result's section of its group's page, and its plot by file name."""
    facts: dict[str, Any] = {}
    data: Any = None
    if f"{result.stem}.json" in result.files:
        data = json.loads((results / f"{result.stem}.json").read_text("utf-8"))
        facts = data.get("facts", {}) if isinstance(data, dict) else {}
    out = [f"({label(result.stem)})=", f"## {title}", ""]
    out += [_from_results(_sentence(result.what)), ""]
    facts_line = _facts_line(facts, _date(results, result, facts), result.commit)
    if facts_line:
        out += [f"*{facts_line}.*", ""]
    drawn: dict[str, bytes] = {}
    if data is not None:
        png = plots.draw(result.stem, data, title)
        if png is not None:
            name = f"{result.stem}.png"
            drawn[name] = png
            out += [f"![{title}](../results/plots/{name})", ""]
    if f"{result.stem}.md" in result.files:
        out += [_body((results / f"{result.stem}.md").read_text("utf-8")), ""]
    links = ", ".join(f"[{name}](../results/{name})" for name in result.files)
    out += [f"Files: {links}.", ""]
    return out, drawn


def headlines(results: Path) -> str:
    """The headline table: each row's figure read from its result's JSON, linked to its
    section."""
    rows = ["| measured | figure | on |", "| --- | --- | --- |"]
    for row in HEADLINES:
        data = json.loads((results / f"{row.stem}.json").read_text("utf-8"))
        facts = data.get("facts", {})
        # The GPU by its model ("NVIDIA H100 80GB HBM3": H100), else the machine.
        gpu = str(facts.get("gpu") or "").removeprefix("NVIDIA ").split(" ")[0]
        where = gpu or facts.get("machine") or ""
        rows.append(f"| [{row.what}](#{label(row.stem)}) | {row.figure(data)} | {where} |")
    return "\n".join(rows) + "\n"


def pages(results: Path) -> tuple[dict[str, str], dict[str, bytes]]:
    """Each group's generated markdown by its page (included by docs/performance/<page>.md),
    the headline table (``"headlines"``, included by docs/performance.md), and the plots by
    file name."""
    found = placed(results)
    out: dict[str, str] = {"headlines": headlines(results)}
    drawn: dict[str, bytes] = {}
    for group in GROUPS:
        lines: list[str] = []
        for stem, title in group.results:
            section, plotted = _section(results, found[stem], title)
            lines += section
            drawn.update(plotted)
        out[group.page] = "\n".join(lines)
    return out, drawn
