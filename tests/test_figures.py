"""The figures of the README and the documentation's pages are the committed results' figures,
and every page speaks to users.

Each measured figure a page quotes is listed in ``FIGURES``: a pattern that finds it on the
pages (one group per figure, matching exactly once on all of them), the committed file under
benchmarks/results/ it comes from, and how to read the same figure from that file. A quoted
figure agrees with the file's when the file's value, rounded half up to the quoted digits,
equals it (``12`` for 12.05 ms, ``2.5`` for 2.45), or, for a bound (``under 4 us``), when every
value the file holds is below it. A figure that stands for several of the file's values (``1.2 s
cold or warm``) must agree with each. The tensor-network table is compared row by row with the
JSON of its run.

So a re-run that changes a file, an edit that changes a figure and a phrase that moves away
from its figure all fail here. Two rules keep the list honest: each file a figure comes from is
linked from the page that quotes it (the reader can check it), and in a paragraph that links a
result, every number with a unit of time, rate or count of tests is one of the checked figures,
so a figure added beside a link without an entry here fails too. The pages are the README and
the site's sources under docs/ (which link the results as ``results/...``, the copy the site
serves); the results themselves are on the site too, so they are held to its language."""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import pytest

from .support import ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"
RESULTS = ROOT / "benchmarks" / "results"
# Where a page's links to results point: the README at the committed folder, a site page at
# the copy the site serves.
RESULT_FOLDERS = ("benchmarks/results/", "docs/results/")
# An sdist ships no logs or plots (pyproject.toml); there the figures read from them are not
# checked, and everything else is.
IN_SDIST = (ROOT / "PKG-INFO").exists()
LEFT_OUT_OF_SDIST = (".log", ".png")
NEEDS_LOGS = pytest.mark.skipif(
    not (RESULTS / "test-logs").is_dir(), reason="an sdist ships no test logs"
)

# Linked for what they show, not for a figure the README quotes from them.
NO_FIGURES = {
    "tensor_network_published-paths.json",
    "experiments/tropical_experiments-nvidia-h200.md",
}

# Words of the team's work, not of the library: goals and whether they were met, what was aimed
# for, the "anchors" the team measures against, issue numbers, and the team's machines.
TEAM_LANGUAGE = [
    r"\bgoals?\b",
    r"\btargets?\b\s*[\d|:]",  # a target as a goal ("target 85%", a "target" column); not an arch
    r"\b(?:not )?met\b",
    r"\baim(?:s|ed)?\b",
    r"\btenfold\b",
    r"\banchors?\b",
    r"\bissue[\s_#-]*\d",
    r"\bdev[\s_-]?vms?\b",
    r"\blent\b",
    r"\bdevice machine\b",
    r"\bborrowed\b",
    r"\bwe measured\b",
]

# A figure read from a file: one value, or several that the one quoted figure stands for.
Measured = Decimal | Sequence[Decimal]
Read = Callable[[Path], Sequence[Measured]]


def burst(run: dict[str, Any], scenario: str, which: str, *fields: str) -> list[Any]:
    """``fields`` of a first_burst result's scenario, its first or its warm burst."""
    (found,) = [r for r in run["results"] if r["scenario"] == scenario]
    return [found[which][field] for field in fields]


def queries(run: dict[str, Any], row: str) -> dict[str, Any]:
    """A program_batching result's row."""
    (found,) = [r for r in run["results"]["rows"] if r["row"] == row]
    return dict(found)


@dataclass(frozen=True)
class Figure:
    quote: str  # a regex over the README, its whitespace collapsed; one group per figure
    source: str  # under benchmarks/results/
    read: Read  # the same figures from the file, in the quote's order
    bound: bool = False  # the quote is an upper bound ("under 4 us")


def number(text: str | float) -> Decimal:
    """The first number in ``text`` (thousands separators dropped), or a JSON number as
    written (``repr``), so that rounding it half up is exact."""
    if not isinstance(text, str):
        return Decimal(repr(text))
    found = re.search(r"-?\d[\d,]*(?:\.\d+)?", text)
    if found is None:
        raise ValueError(f"no number in {text!r}")
    return Decimal(found[0].replace(",", ""))


def matched(pattern: str, path: Path, *, last: bool = False) -> list[Decimal]:
    """The groups of ``pattern``'s first match in the file (or its last: a pytest summary)."""
    matches = list(re.finditer(pattern, path.read_text(encoding="utf-8"), re.S))
    if not matches:
        raise LookupError(f"{pattern!r} is not in {path.name}")
    return [number(group) for group in matches[-1 if last else 0].groups()]


def find(pattern: str, *, last: bool = False) -> Read:
    return lambda path: matched(pattern, path, last=last)


def table(path: Path) -> dict[str, list[str]]:
    """A markdown file's table rows (headers left out): the first cell to the others, stripped."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line[:1] == "|"]
    split = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines]
    rule = [set("".join(cells)) <= set("-: ") for cells in split]
    return {
        cells[0]: cells[1:]
        for i, cells in enumerate(split)
        if not rule[i] and not (i + 1 < len(rule) and rule[i + 1])
    }


def column(path: Path, index: int, *names: str, scale: str = "1") -> list[Decimal]:
    """The numbers in column ``index`` (after the first) of the rows ``names``; a name ending
    in ``*`` stands for every row that starts with it."""
    rows, out = table(path), []
    for name in names:
        picked = (
            [row for key, row in rows.items() if key.startswith(name[:-1])]
            if name.endswith("*")
            else [rows[name]]
        )
        out += [number(row[index]) * Decimal(scale) for row in picked]
    return out


def cells(index: int, *names: str, scale: str = "1") -> Read:
    """One figure per row of ``names``: column ``index``."""
    return lambda path: column(path, index, *names, scale=scale)


def every(index: int, *names: str) -> Read:
    """One figure that every row of ``names`` (``*``: rows starting with) must agree with."""
    return lambda path: [column(path, index, *names)]


def spread(index: int, *names: str) -> Read:
    """Two figures, a quoted range "a to b": the least and the greatest of the rows' values."""

    def read(path: Path) -> list[Decimal]:
        values = column(path, index, *names)
        return [min(values), max(values)]

    return read


def joined(*reads: Read) -> Read:
    return lambda path: [value for read in reads for value in read(path)]


def data(pick: Callable[[Any], Sequence[float]]) -> Read:
    """Figures computed from a JSON result."""
    return lambda path: [number(x) for x in pick(json.loads(path.read_text(encoding="utf-8")))]


def prop(result: Any, vertices: int, name: str, scale: float) -> float:
    """A property's seconds (times ``scale``) on the random 3-regular graph's independent set
    of ``vertices`` vertices, from a problem_properties run."""
    (row,) = [
        r for r in result["results"]
        if r["network"].startswith(f"MIS of the random 3-regular graph ({vertices} vertices")
    ]  # fmt: skip
    (entry,) = [e for e in row["properties"] if e["property"] == name]
    return float(entry["seconds"]) * scale


def network(result: Any, problem: str, graph: str, vertices: int) -> dict[str, Any]:
    """The tensor-network run's row of one network."""
    found = [
        row
        for row in result["rows"]
        if (row["problem"], row["graph"], row["vertices"]) == (problem, graph, vertices)
    ]
    assert len(found) == 1, f"{problem} on a {graph} of {vertices} vertices: {len(found)} rows"
    row: dict[str, Any] = found[0]
    return row


def served(result: Any, mode: str, body: str, concurrency: int, *keys: str) -> list[float]:
    """The server benchmark's figures ``keys`` at one level of one (mode, body) run."""
    (run,) = [r for r in result["results"]["runs"] if (r["mode"], r["body"]) == (mode, body)]
    (level,) = [lv for lv in run["levels"] if lv["concurrency"] == concurrency]
    return [level[key] for key in keys]


def curve(result: Any, path: str, tasks: int) -> dict[str, Any]:
    """The launch benchmark's row of requests at ``tasks`` tasks along ``path``."""
    (row,) = [
        r
        for r in result["results"]["requests"]["curve"]
        if (r["path"], r["tasks"]) == (path, tasks)
    ]
    found: dict[str, Any] = row
    return found


def einsum_row(result: Any, prefix: str) -> dict[str, Any]:
    """The einsum benchmark's row of the network whose name starts with ``prefix``."""
    found = [row for row in result["results"] if row["network"].startswith(prefix)]
    assert len(found) == 1, f"{prefix}: {len(found)} rows"
    row: dict[str, Any] = found[0]
    return row


def spread_of(result: Any, ratio: Callable[[dict[str, Any]], float]) -> list[float]:
    """The least and the greatest of ``ratio`` over the einsum benchmark's networks."""
    values = [ratio(row) for row in result["results"]]
    return [min(values), max(values)]


def planned(vertices: int, planner: str, cell: int) -> Read:
    """A 3-regular graph's row in the planners' table: space (0), time (1) or search s (2)."""
    edges = vertices * 3 // 2
    cells = r"(?:[\d.]+) \| " * cell + r"([\d.]+)"
    return find(rf"\({vertices} vertices, {edges} edges\) \| \d+ \| {planner} \| {cells}")


def ordered(network: str, order: str, key: str, scale: float = 1.0) -> Read:
    """Figures of the orders' result (einsum_orders): ``key`` (times ``scale``) of the row of
    the network and the order that start so."""

    def read(result: Any) -> list[float]:
        rows = [r for r in result["results"]
                if r["network"].startswith(network) and r["order"].startswith(order)]  # fmt: skip
        assert len(rows) == 1, f"{network} / {order}: {len(rows)} rows"
        value = rows[0][key] * scale
        return [float(f"{value:.12g}")]  # (ms from s without float noise: 0.01359... -> 13.59...)

    return data(read)


REGULAR = tuple(f"MIS of the random 3-regular graph ({n} vertices" for n in (200, 220))
KINGS = "MIS of the 38x38 king's subgraph"
KEPT = "cotengra HyperOptimizer (greedy, labels), 20 s (kept: tensor_network_published-paths"
HYPER = "HyperOptimizer (greedy, labels), 90"


def trials(network: str, objective: str, pattern: str = r"\((\d+) trials\)") -> Read:
    """A number in the name of a HyperOptimizer's row of the orders' result: its trials, by
    default."""

    def read(result: Any) -> list[float]:
        (row,) = [r for r in result["results"] if r["network"].startswith(network)
                  and r["order"].startswith(f"{HYPER} s, scored by {objective}")]  # fmt: skip
        return [float(re.search(pattern, row["order"])[1])]  # type: ignore[index]

    return data(read)


def soak_waiters(path: Path) -> list[Decimal]:
    """Results, cancellations and CompilerClosed, asyncio's then trio's of each."""
    asyncio, trio = (
        matched(rf"\({backend}\) \| (\d+) results, (\d+) cancelled, (\d+) CompilerClosed", path)
        for backend in ("asyncio", "trio")
    )
    return [figure for pair in zip(asyncio, trio, strict=True) for figure in pair]


def soak_planted(path: Path) -> list[Decimal]:
    served, failed, compiles, planted, seconds = matched(
        r"(\d+) served, (\d+) failed; (\d+) compiles, (\d+) planted entries dropped and counted; "
        r"([\d.]+) s",
        path,
    )
    return [served, failed, seconds, compiles, planted]


def bundle_p90(path: Path) -> list[Decimal]:
    return [number(table(path)["bundle layer, empty writable dir"][1].split("(")[1])]


SERVER = "server_load-nvidia-h100-80gb-hbm3.json"
FIRST_BURST = "first_burst-nvidia-h100-80gb-hbm3.json"
PROGRAM_BATCHING = "program_batching-nvidia-h100-80gb-hbm3.json"
JOINED_64 = "ProgramBatcher(max_batch=64, stacked=True, host=True)"
JOINED_32 = "ProgramBatcher(max_batch=32, stacked=True, host=True)"
JAX_ROW = "JAX jit(vmap), 64 stacked queries"
BATCHED_ROW = "batched program, 64 stacked queries"
LAUNCH = "launch-h100-80gb-hbm3.md"
LAUNCH_JSON = "launch-h100-80gb-hbm3.json"
SERVICE = "compile_service-2-vcpus-{}.md"
GPU_START = "gpu_start-nvidia-h200.md"
GEMM = "tropical_gemm-nvidia-h200.md"
GEMM_JSON = "tropical_gemm-nvidia-h200.json"
TENSOR = "tensor_network-nvidia-h200.json"
EINSUM = "tropical_einsum-nvidia-h200.json"
EINSUM_FIRST = "tropical_einsum-nvidia-h200-first-run.json"
SOAK = "soak-2-vcpus.md"
WARM_GPU = "warm_cache-nvidia-h200-gpu.md"
ARGMAX = ("maxplus float32 {} argmax", "maxplus int32 {} argmax", "maxplus float64 {} argmax")
HOT_HIT = r"hot hit `await compiler.compile\(spec\)` \| (\d+) ns \(([\d.]+)x"
F32_8192 = ("maxplus float32 8192", "minplus float32 8192", "maxmul float32 8192")
I32_8192 = ("maxplus int32 8192", "minplus int32 8192")

COUNTED = "counted_products-nvidia-h100-80gb-hbm3.json"


def counted(product: str, *forms: str) -> Read:
    """The seconds (as ms) of ``product``'s forms in the counted products' run."""
    return data(lambda r: [r["results"]["products"][product][f]["seconds"] * 1e3 for f in forms])


SLICED = "sliced_programs-nvidia-h100-80gb-hbm3.json"
SLICED_NETS = (
    "MIS of the random 3-regular graph (200 vertices, 300 edges)",
    "MIS of the random 3-regular graph (220 vertices, 330 edges)",
    "MIS of the 38x38 king's subgraph at filling 0.8 (1155 vertices, 3548 edges)",
)


def sliced(net: int, *keys: str, scale: float = 1e3) -> Read:
    """``keys`` of the sliced programs' run's row of network ``net`` (of SLICED_NETS)."""

    def pick(result: Any) -> list[float]:
        (row,) = [r for r in result["results"] if r["network"] == SLICED_NETS[net]]
        return [row[key] * scale for key in keys]

    return data(pick)


FIGURES = [
    # Whole and in slices, with each slice's program
    Figure(
        r"200-vertex graph ([\d.]+) ms and ([\d.]+) ms, the 220-vertex graph ([\d.]+) ms and "
        r"([\d.]+) ms, the king's subgraph ([\d.]+) ms and ([\d.]+) ms; with the assignment, "
        r"([\d.]+) ms and ([\d.]+) ms, ([\d.]+) ms and ([\d.]+) ms, ([\d.]+) ms and ([\d.]+) ms",
        SLICED,
        joined(
            *(sliced(net, "whole_s", "sliced_s") for net in range(3)),
            *(sliced(net, "whole_argmax_s", "sliced_argmax_s") for net in range(3)),
        ),
    ),
    Figure(
        r"maximum independent set holds ([\d.]+) MiB, where with every intermediate apart it held "
        r"([\d,.]+) MiB, beside a live set of ([\d.]+) MiB; those of the 200- and 220-vertex "
        r"random 3-regular graphs' slices hold ([\d.]+) MiB and ([\d.]+) MiB \(([\d.]+) MiB and "
        r"([\d.]+) MiB before\)",
        SLICED,
        joined(
            sliced(2, "program_bytes", "program_bytes_before", "live_bytes", scale=2**-20),
            sliced(0, "program_bytes", scale=2**-20),
            sliced(1, "program_bytes", scale=2**-20),
            sliced(0, "program_bytes_before", scale=2**-20),
            sliced(1, "program_bytes_before", scale=2**-20),
        ),
    ),
    # Counted products beside the value's
    Figure(
        r"max-plus product in float32 takes ([\d.]+) ms for the value, ([\d.]+) ms with "
        r"`counts=True` and ([\d.]+) ms with int64 counts given; a batch of 1024 products of "
        r"64 x 64 x 64 takes ([\d.]+) ms, ([\d.]+) ms and ([\d.]+) ms",
        COUNTED,
        joined(
            counted("square 4096 maxplus float32", "value", "ones", "exact"),
            counted("batched 1024 x 64^3 maxplus float32", "value", "ones", "exact"),
        ),
    ),
    # A contraction's roofline: orders by their modelled time (planning only)
    Figure(
        r"the order kept this way models at ([\d.]+) ms and ([\d.]+) ms on an H200, where the "
        r"order of fewest products of one search of the same 256 trials models at ([\d.]+) ms "
        r"and ([\d.]+) ms, its steps of short K streaming ([\d.]+) GB and ([\d.]+) GB; the "
        r"ranked search took ([\d.]+) s and ([\d.]+) s on 2 vCPUs",
        "einsum_orders-2-vcpus.json",
        joined(
            *(ordered(net, "auto", "roofline_s", 1e3) for net in REGULAR),
            *(ordered(net, "one random-greedy", "roofline_s", 1e3) for net in REGULAR),
            *(ordered(net, "one random-greedy", "bytes", 1e-9) for net in REGULAR),
            *(ordered(net, "auto", "search_s") for net in REGULAR),
        ),
    ),
    Figure(
        r"the kept orders of the published problems model at ([\d.]+) ms, ([\d.]+) ms and, for "
        r"the 38 x 38 king's subgraph, ([\d.]+) ms, where \"auto\" leaves ([\d.]+) ms",
        "einsum_orders-2-vcpus.json",
        joined(
            *(ordered(net, KEPT, "roofline_s", 1e3) for net in (*REGULAR, KINGS)),
            ordered(KINGS, "auto", "roofline_s", 1e3),
        ),
    ),
    Figure(
        r"in one search each of (\d+) seconds on 2 vCPUs, ([\d.]+) ms against ([\d.]+) ms for "
        r"200 vertices, ([\d.]+) ms against ([\d.]+) ms for 220, and for the king's subgraph, "
        r"whose trials take tens of seconds there, ([\d.]+) ms from (\d+) trials against "
        r"([\d.]+) ms from (\d+)",
        "einsum_orders-2-vcpus.json",
        joined(
            trials(KINGS, "combo", r"labels\), (\d+) s, "),
            *(
                ordered(net, f"{HYPER} s, scored by {by}", "roofline_s", 1e3)
                for net in REGULAR
                for by in ("combo", "roofline")
            ),
            ordered(KINGS, f"{HYPER} s, scored by combo", "roofline_s", 1e3),
            trials(KINGS, "combo"),
            ordered(KINGS, f"{HYPER} s, scored by roofline", "roofline_s", 1e3),
            trials(KINGS, "roofline"),
        ),
    ),
    # A server's first burst at a new batch size
    Figure(
        r"the first burst of 64 served ([\d,.]+) requests/s with a p99 of ([\d,.]+) ms, ([\d,]+) "
        r"of its ([\d,]+) launches on the stand-in.*?NVRTC,\s+([\d.]+)\s+times\s+the\s+rate\s+of"
        r"\s+the\s+same\s+burst\s+served\s+again\s+warm\s+\(([\d,.]+)\s+requests/s\)\s+and\s+"
        r"([\d.]+)\s+times\s+its\s+p99\s+\(([\d,.]+)\s+ms\)",
        FIRST_BURST,
        data(
            lambda r: [
                *burst(
                    r,
                    "probed",
                    "first",
                    "requests_per_second",
                    "p99_ms",
                    "standin_launches",
                    "launches",
                ),
                burst(r, "probed", "first", "requests_per_second")[0]
                / burst(r, "probed", "warm", "requests_per_second")[0],
                *burst(r, "probed", "warm", "requests_per_second"),
                burst(r, "probed", "first", "p99_ms")[0] / burst(r, "probed", "warm", "p99_ms")[0],
                *burst(r, "probed", "warm", "p99_ms"),
            ]
        ),
    ),
    Figure(
        r"after `Batcher\.warm`, the first burst served ([\d,.]+) requests/s with a p99 of "
        r"([\d,.]+) ms; served again warm, ([\d,.]+) requests/s with a p99 of ([\d,.]+) ms",
        FIRST_BURST,
        data(
            lambda r: [
                *burst(r, "warmed", "first", "requests_per_second", "p99_ms"),
                *burst(r, "warmed", "warm", "requests_per_second", "p99_ms"),
            ]
        ),
    ),
    Figure(
        r"its batch kernel's compile: ([\d,.]+) requests/s, p99 ([\d,.]+) s",
        FIRST_BURST,
        data(
            lambda r: [
                *burst(r, "cold", "first", "requests_per_second"),
                burst(r, "cold", "first", "p99_ms")[0] / 1000,
            ]
        ),
    ),
    # Many queries of one network: joined calls, the batched program and JAX
    Figure(
        r"each call alone on the program serves ([\d,.]+) queries/s; joined by a "
        r"`ProgramBatcher`, ([\d,.]+) with a call's 100 vertex tensors one array each, "
        r"([\d,.]+) stacked, ([\d,.]+) stacked with `host=True` \(p99 ([\d,.]+) ms\), and "
        r"([\d,.]+) with `max_batch=32` as well \(p99 ([\d,.]+) ms",
        PROGRAM_BATCHING,
        data(
            lambda r: [
                queries(r, "program.run, each call alone")["queries_per_second"],
                queries(r, "ProgramBatcher(max_batch=64)")["queries_per_second"],
                queries(r, "ProgramBatcher(max_batch=64, stacked=True)")["queries_per_second"],
                *(queries(r, JOINED_64)[k] for k in ("queries_per_second", "p99_ms")),
                *(queries(r, JOINED_32)[k] for k in ("queries_per_second", "p99_ms")),
            ]
        ),
    ),
    Figure(
        r"serves ([\d,.]+) queries/s, ([\d.]+)x that; its first call took ([\d,.]+) s \(the "
        r"trace and XLA's compile\), where the batched programs were made in ([\d.]+) s\. The "
        r"batched program itself on the same stacked weights serves ([\d,.]+) queries/s, "
        r"([\d.]+)x JAX's rate",
        PROGRAM_BATCHING,
        data(
            lambda r: [
                queries(r, JAX_ROW)["queries_per_second"],
                queries(r, JAX_ROW)["queries_per_second"]
                / queries(r, JOINED_32)["queries_per_second"],
                queries(r, JAX_ROW)["first_seconds"],
                queries(r, JOINED_32)["first_seconds"],
                queries(r, BATCHED_ROW)["queries_per_second"],
                queries(r, BATCHED_ROW)["queries_per_second"]
                / queries(r, JAX_ROW)["queries_per_second"],
            ]
        ),
    ),
    # Every property of a problem, on the CPU
    Figure(
        r"the maximum independent set of the published 100-vertex random 3-regular graph takes "
        r"([\d.]+) ms; counting its optima ([\d.]+) ms, one optimal configuration ([\d.]+) ms, "
        r"100 samples ([\d.]+) ms and the partition function ([\d.]+) ms, while the four best "
        r"sizes take ([\d.]+) s \(each intermediate a list of 4\) and the independence "
        r"polynomial ([\d.]+) s",
        "problem_properties-2-vcpus.json",
        data(
            lambda r: [
                prop(r, 100, name, scale)
                for name, scale in (
                    ("SizeMax() (the value)", 1e3),
                    ("CountingMax()", 1e3),
                    ("SingleConfigMax()", 1e3),
                    ("SampleMax(100)", 1e3),
                    ("PartitionFunction(1.0, log=True)", 1e3),
                    ("SizeMax(4)", 1),
                    ("GraphPolynomial()", 1),
                )
            ]
        ),
    ),
    # The examples and the shortest-paths server
    Figure(
        r"One client with JSON bodies gets ([\d,.]+) requests/s, its p50 of ([\d,.]+) ms mostly "
        r"spent parsing 65,536 weights \(([\d,.]+) ms\)",
        SERVER,
        data(lambda r: served(r, "batch", "json", 1, "requests_per_s", "p50_ms", "parse_p50_ms")),
    ),
    Figure(
        r"with `\.npz` bodies, ([\d,.]+) requests/s and a p50 of ([\d,.]+) ms",
        SERVER,
        data(lambda r: served(r, "batch", "npz", 1, "requests_per_s", "p50_ms")),
    ),
    Figure(
        r"requests solved together serve ([\d,.]+) and ([\d,.]+) requests/s \(p99 ([\d,.]+) ms at "
        r"64\), each solved\s+alone ([\d,.]+) and ([\d,.]+) \(p99 ([\d,.]+) ms\)",
        SERVER,
        data(
            lambda r: [
                *served(r, "batch", "npz", 16, "requests_per_s"),
                *served(r, "batch", "npz", 64, "requests_per_s", "p99_ms"),
                *served(r, "no batch", "npz", 16, "requests_per_s"),
                *served(r, "no batch", "npz", 64, "requests_per_s", "p99_ms"),
            ]
        ),
    ),
    Figure(
        r"A start until serving takes ([\d,.]+) s cold and ([\d,.]+) s warm",
        SERVER,
        data(lambda r: [r["results"]["cold_start_s"], r["results"]["warm_start_s"]]),
    ),
    Figure(
        r"took ([\d,.]+) ms in ([\d,]+) slices of 2\^24 elements on one GPU and ([\d,.]+) ms on "
        r"two",
        "einsum_slices-nvidia-h100-80gb-hbm3.md",
        joined(cells(5, "220"), cells(1, "220"), cells(6, "220")),
    ),
    Figure(
        r"random 3-regular graph of 220 vertices \(space\s+complexity ([\d.]+), planned by "
        r"cotengra in ([\d.]+) s:",
        "einsum_slices-nvidia-h100-80gb-hbm3.md",
        joined(cells(0, "220"), cells(2, "220")),
    ),
    # The caches and the compile service, on 2 CPUs
    Figure(
        r"the longest read hit while it evicted from 50,000 entries took\s+([\d,.]+) ms, "
        r"([\d,.]+) ms in a thread of the process without pauses",
        "disk_tier-2-vcpus.md",
        joined(
            cells(4, "longest read hit during that eviction"),
            cells(5, "longest read hit during that eviction"),
        ),
    ),
    Figure(
        r"walk the dir once\s+\(([\d,.]+) s, ([\d,.]+) s and ([\d,.]+) s at 50,000 entries",
        "disk_tier-2-vcpus.md",
        cells(
            4,
            "`cache ls --json` (main() in-process)",
            "`cache info --json` (main() in-process)",
            "`cache prune` of 1% (main() in-process)",
            scale="0.001",
        ),
    ),
    *(
        Figure(
            r"under ([\d,.]+) us an insert at the limit with 100,000 entries",
            SERVICE.format(b),
            find(r"100k entries \| [\d.]+ us / [\d.]+ us / ([\d.]+) us"),
            bound=True,
        )
        for b in ("asyncio", "trio")
    ),
    Figure(
        r"suspending: ([\d,.]+) ns on 2 CPUs, ([\d,.]+)x awaiting a trivial coroutine, under "
        r"asyncio",
        SERVICE.format("asyncio"),
        find(HOT_HIT),
    ),
    Figure(r"([\d,.]+) ns \(([\d,.]+)x\) under trio", SERVICE.format("trio"), find(HOT_HIT)),
    Figure(
        r"cold kernel cost ([\d,.]+) us each",
        SERVICE.format("asyncio"),
        find(r"plain anyio.Event \| ([\d.]+) us each"),
    ),
    Figure(
        r"each \(([\d,.]+) us under trio\)",
        SERVICE.format("trio"),
        find(r"plain anyio.Event \| ([\d.]+) us each"),
    ),
    Figure(r"took ([\d,.]+) ms each at p99", SERVICE.format("asyncio"), find(r"p99 ([\d.]+) ms")),
    Figure(r"at p99 \(([\d,.]+) ms under trio\)", SERVICE.format("trio"), find(r"p99 ([\d.]+) ms")),
    Figure(
        r"during a cold compile was ([\d,.]+) ms",
        SERVICE.format("asyncio"),
        find(r"during a cold compile, aionvrtc \| max ([\d.]+) ms"),
    ),
    Figure(
        r"\(([\d,.]+) ms under trio\), against",
        SERVICE.format("trio"),
        find(r"during a cold compile, aionvrtc \| max ([\d.]+) ms"),
    ),
    Figure(
        r"against ([\d,.]+) ms \([\d,.]+ ms\) when CuPy's NVRTC",
        SERVICE.format("asyncio"),
        find(r"called on the loop \| max ([\d.]+) ms"),
    ),
    Figure(
        r"against [\d,.]+ ms \(([\d,.]+) ms\) when CuPy's NVRTC",
        SERVICE.format("trio"),
        find(r"called on the loop \| max ([\d.]+) ms"),
    ),
    # The README's figures, a table of the few that matter most
    Figure(
        r"\(CUDA context excluded\), a 31-kernel source \| ([\d,.]+) ms [^|]*\| CuPy "
        r"`RawModule`: ([\d,.]+) ms",
        GPU_START,
        cells(3, "aionvrtc, 31-kernel source", "CuPy RawModule, 31-kernel source"),
    ),
    Figure(
        r"`await compiler.compile\(spec\)`, 2 vCPUs \| ([\d,.]+) ns [^|]*\), ([\d,.]+)x "
        r"awaiting a trivial coroutine",
        SERVICE.format("asyncio"),
        find(HOT_HIT),
    ),
    Figure(
        r"max-plus f32 GEMM, 8192\^3 \| ([\d,.]+) T ops/s, ([\d,.]+)% of the add\+max probe "
        r"[^|]*\| CuPy broadcast-reduce: ([\d,.]+) T ops/s",
        GEMM,
        joined(
            cells(0, "maxplus float32 8192"),
            cells(2, "maxplus float32 8192"),
            find(r"CuPy broadcast-reduce ([\d.]+) T"),
        ),
    ),
    Figure(
        r"networks of ([\d,]+) to ([\d,]+) steps \| ([\d,.]+) to ([\d,.]+) times JAX `jit`'s "
        r"time [^|]*\| JAX's first call: ([\d,.]+) to ([\d,.]+) s",
        EINSUM,
        data(
            lambda r: [
                *spread_of(r, lambda row: row["steps"]),
                *spread_of(r, lambda row: row["program_ms"] / row["jax_ms"]),
                *spread_of(r, lambda row: row["jax_first_s"]),
            ]
        ),
    ),
    Figure(
        r"king's subgraph \(1155 vertices\), H100 \| ([\d,.]+) ms",
        "tensor_network_kings_subgraph-nvidia-h100-80gb-hbm3.json",
        data(lambda r: [r["rows"][0]["gpu_ms"]]),
    ),
    # On the GPU
    Figure(
        r"kept the loop's largest lag at ([\d,.]+) ms \(launches and allocations\), against "
        r"([\d,.]+) ms",
        GPU_START,
        find(
            r"awaiting `synchronize` \| max ([\d.]+) ms.*?blocking `stream.synchronize\(\)` "
            r"on the loop \| max ([\d.]+) ms"
        ),
    ),
    Figure(
        r"\| ([\d,.]+) ms \(one kernel, lazy\); ([\d,.]+) ms \(31-kernel source\) \| ([\d,.]+) ms",
        GPU_START,
        cells(
            3,
            "aionvrtc, one kernel (lazy)",
            "aionvrtc, 31-kernel source",
            "CuPy RawModule, 31-kernel source",
        ),
    ),
    Figure(
        r"\| ([\d,.]+) s \(that kernel alone\) \| ([\d,.]+) s \(the whole 31-kernel source\)",
        GPU_START,
        cells(5, "aionvrtc, one kernel (lazy)", "CuPy RawModule, 31-kernel source"),
    ),
    Figure(
        r"\| ([\d,.]+) ns, ([\d,.]+)x awaiting a trivial coroutine \(([\d,.]+) ns\) on that run",
        GPU_START,
        find(
            r"hot `await compiler.get\(spec\)` \(module memoised\) \| (\d+) ns \(([\d.]+)x a "
            r"trivial coroutine, (\d+) ns\)"
        ),
    ),
    # Tropical GEMM
    Figure(
        r"the whole suite, ([\d,]+) passed and (\d+) skipped on an H100",
        "test-logs/gpu_tests-nvidia-h100.log",
        find(r"(\d+) passed, (\d+) skipped", last=True),
    ),
    Figure(
        r"tropical GPU tests alone, ([\d,]+) passed",
        "test-logs/tropical_gpu_tests-nvidia-h200.log",
        find(r"(\d+) passed", last=True),
    ),
    Figure(r"f32 ([\d,.]+) T pairs/s", GEMM, find(r"Peak probe [^\n]*?f32 ([\d.]+) T")),
    Figure(
        r"The SM clock held ([\d,.]+) MHz throughout", "sustained-nvidia-h200.md", every(1, "*")
    ),
    Figure(
        r"max-times f32, 8192\^3 \| ([\d,.]+) / ([\d,.]+) / ([\d,.]+) \| ([\d,.]+)%",
        GEMM,
        joined(cells(0, *F32_8192), every(2, *F32_8192)),
    ),
    Figure(
        r"8192\^3 \(DPX `__viaddmax_s32`\) \| ([\d,.]+) \| ([\d,.]+)% of the DPX probe",
        GEMM,
        joined(every(0, *I32_8192), every(2, *I32_8192)),
    ),
    Figure(
        r"max-plus f64, 8192\^3 \| ([\d,.]+) \| ([\d,.]+)%",
        GEMM,
        joined(cells(0, "maxplus float64 8192"), cells(2, "maxplus float64 8192")),
    ),
    *(
        Figure(
            rf"with argmax, {size}\^3: f32 / i32 / f64 \| ([\d.]+) / ([\d.]+) / ([\d.]+) \| "
            r"(\d+)% / (\d+)% / (\d+)%",
            GEMM,
            joined(
                cells(0, *(name.format(size) for name in ARGMAX)),
                cells(2, *(name.format(size) for name in ARGMAX)),
            ),
        )
        for size in (8192, 4096)
    ),
    Figure(
        r"batched 1024 x 64\^3 f32, one launch \| ([\d,.]+) \| ([\d,.]+)%",
        GEMM,
        joined(cells(0, "batched 1024 x 64^3 f32"), cells(2, "batched 1024 x 64^3 f32")),
    ),
    Figure(
        r"f32 1024\^3 / 512\^3 / 256\^3 \| ([\d,.]+) / ([\d,.]+) / ([\d,.]+)",
        GEMM_JSON,
        data(
            lambda r: [r["results"]["curve"]["aionvrtc"][n] / 1e12 for n in ("1024", "512", "256")]
        ),
    ),
    # In the README's order: CuPy, aionvrtc, PyTorch.
    Figure(
        r"f32 2048x256x2048 \| ([\d,.]+) \| \(aionvrtc at that shape: ([\d,.]+)\) \| \| PyTorch "
        r"broadcast-reduce, same shape \| ([\d,.]+)",
        GEMM,
        joined(
            find(r"CuPy broadcast-reduce ([\d.]+) T"),
            find(r"aionvrtc ([\d.]+) T, CuPy"),
            find(r"PyTorch broadcast-reduce ([\d.]+) T"),
        ),
    ),
    Figure(
        r"moves ([\d,.]+) to ([\d,.]+)% of a device copy's bandwidth at N = K = 4\.\.16",
        GEMM,
        spread(1, *(f"{shape}={k}" for k in (4, 8, 16) for shape in ("tall n=k", "wide m=k"))),
    ),
    Figure(
        r"both kernels move ([\d,.]+) to ([\d,.]+)% of the copy",
        GEMM,
        spread(1, "tall n=k=32*", "wide m=k=32*"),
    ),
    Figure(
        r"reaches ([\d,.]+) to ([\d,.]+)% of that roofline",
        GEMM,
        spread(2, "tall n=k=64*", "wide m=k=64*"),
    ),
    # Launch plans and the batcher
    Figure(
        r"a hot `matmul_sync` costs ([\d,.]+) us, `await matmul` ([\d,.]+) us and `backward_sync` "
        r"([\d,.]+) us",
        LAUNCH,
        cells(
            0,
            "tropical.matmul_sync(a, b)",
            "await tropical.matmul(a, b)",
            "tropical.backward_sync(g, a, b, idx)",
        ),
    ),
    Figure(
        r"an empty `RawKernel` of as many arguments costs ([\d,.]+) us, or ([\d,.]+) us with",
        LAUNCH,
        cells(
            0,
            "RawKernel, 19 args, out preallocated (forward floor)",
            "RawKernel, 19 args, out allocated (forward floor)",
        ),
    ),
    Figure(r"`torch\.mm` of 8x8 took ([\d,.]+) us", LAUNCH, cells(0, "torch.mm*")),
    Figure(
        r"read back: ([\d,.]+) requests/s from one task, ([\d,.]+) from 64 tasks launching "
        r"directly and ([\d,.]+) from 64 tasks through the batcher \(([\d,.]+) products a launch\)",
        LAUNCH_JSON,
        data(
            lambda r: [
                curve(r, "direct", 1)["requests_per_s"],
                curve(r, "direct", 64)["requests_per_s"],
                curve(r, "batcher", 64)["requests_per_s"],
                curve(r, "batcher", 64)["batcher"]["mean_batch"],
            ]
        ),
    ),
    Figure(
        r"one request alone takes ([\d,.]+) ms either way",
        LAUNCH_JSON,
        lambda path: [
            [
                number(json.loads(path.read_text())["results"]["requests"]["alone"][key] * 1e3)
                for key in ("direct_s", "batcher_s")
            ]
        ],
    ),
    Figure(
        r"One launch of 64 such products takes ([\d,.]+) ms, 64 single launches ([\d,.]+) ms",
        LAUNCH_JSON,
        data(
            lambda r: [
                r["results"]["requests"]["batched_floor"][key] * 1e3
                for key in ("batched_s", "singles_s")
            ]
        ),
    ),
    Figure(
        r"no product computed, manage ([\d,.]+) requests/s from 64 tasks",
        LAUNCH_JSON,
        data(lambda r: [r["results"]["requests"]["loop_floors"]["views, 64 tasks"]]),
    ),
    # The tropical einsum
    Figure(
        r"the whole GPU suite, ([\d,]+) passed and (\d+) skipped",
        "test-logs/gpu_tests-in-place-two-nvidia-h200.log",
        find(r"(\d+) passed, (\d+) skipped", last=True),
    ),
    Figure(
        r"A replay takes ([\d,.]+) to ([\d,.]+) times JAX's time",
        EINSUM,
        data(lambda r: spread_of(r, lambda row: row["program_ms"] / row["jax_ms"])),
    ),
    Figure(
        r"its ([\d,]+) steps run as ([\d,]+) launches",
        EINSUM,
        data(
            lambda r: [
                einsum_row(r, "MIS of the 15x15 king's graph")["steps"],
                einsum_row(r, "MIS of the 15x15 king's graph")["ops"],
            ]
        ),
    ),
    Figure(
        r"A program's first call takes at most ([\d,.]+) times JAX's",
        EINSUM,
        data(lambda r: spread_of(r, lambda row: row["program_first_s"] / row["jax_first_s"])[1:]),
        bound=True,
    ),
    Figure(
        r"The assignment costs ([\d,.]+) to ([\d,.]+) times the value alone",
        EINSUM,
        data(lambda r: spread_of(r, lambda row: row["program_argmax_ms"] / row["program_ms"])),
    ),
    Figure(
        r"walk back through the tree \(([\d,.]+) to ([\d,.]+) us on the GPU\)",
        EINSUM,
        data(lambda r: spread_of(r, lambda row: row["backtrace_us"])),
    ),
    Figure(
        r"A replay is ([\d,.]+) to ([\d,.]+) times faster than `einsum_sync`",
        EINSUM,
        data(lambda r: spread_of(r, lambda row: row["eager_ms"] / row["program_ms"])),
    ),
    Figure(
        r"`einsum_sync` copies ([\d,]+) to ([\d,]+) operands on these networks where it copied "
        r"([\d,]+)\s+to ([\d,]+) before",
        EINSUM,
        data(
            lambda r: [
                *spread_of(r, lambda row: row["copies"]),
                *spread_of(r, lambda row: row["baseline_copies"]),
            ]
        ),
    ),
    Figure(
        r"measured a replay at ([\d,.]+) to ([\d,.]+) times JAX's time and the assignment "
        r"at ([\d,.]+) to ([\d,.]+) times the value",
        EINSUM_FIRST,
        data(
            lambda r: [
                *spread_of(r, lambda row: row["program_ms"] / row["jax_ms"]),
                *spread_of(r, lambda row: row["program_argmax_ms"] / row["program_ms"]),
            ]
        ),
    ),
    Figure(
        r"row by row \(`--planner rows --memory-limit 34359738368`: a largest intermediate of "
        r"2\^(\d+) elements, 2\^([\d.]+) products, one copy;.* here ([\d,]+) bytes;",
        "tensor_network_spin_glass-nvidia-h100-80gb-hbm3.log",
        joined(
            find(
                r"row by row \([\d.]+ s\): 1983 steps, largest intermediate 2\^(\d+) .*?, "
                r"2\^([\d.]+) products, 1 copies"
            ),
            find(r"for the walk back: ([\d,]+) bytes"),
        ),
    ),
    Figure(
        r"its energy is (-\d+), contracted in ([\d.]+) s \(planned in ([\d.]+) s\)",
        "tensor_network_spin_glass-nvidia-h100-80gb-hbm3.json",
        data(
            lambda r: [
                r["rows"][0]["value"],
                r["rows"][0]["gpu_ms"] / 1e3,
                r["rows"][0]["planning_s"],
            ]
        ),
    ),
    Figure(
        r"in place at (\d+)% of a device-to-device copy's bandwidth \(2\^(\d+) rows, min-plus "
        r"float32\), where the generic kernel ran them at (\d+)%, and a CuPy or PyTorch "
        r"broadcast-and-reduce at (\d+)% and (\d+)%",
        "sweep_steps-nvidia-h100-80gb-hbm3.json",
        data(
            lambda r: [
                100 * r["results"]["steps"]["tall, A strided (sweep)"][way]["of_copy"]
                if way != "log2_m"
                else r["facts"]["log2_m"]
                for way in (
                    "aionvrtc matmul",
                    "log2_m",
                    "generic kernel",
                    "CuPy broadcast-reduce",
                    "PyTorch broadcast-reduce",
                )
            ]
        ),
    ),
    Figure(
        r"the king's graphs' known answer \((\d+) for the 20 x 20 grid\)",
        TENSOR,
        data(lambda r: [network(r, "MIS", "20x20 king's graph", 400)["value"]]),
    ),
    Figure(
        r"one greedy order leaves a largest intermediate of 2\^(\d+) elements and 2\^([\d.]+) "
        r"and 2\^([\d.]+) products, one seeded search of the 256 trials 2\^(\d+) and 2\^(\d+) "
        r"elements and 2\^([\d.]+) and 2\^([\d.]+) products, in ([\d.]+) and ([\d.]+) s on 2 vCPUs",
        "einsum_planners-2-vcpus.md",
        joined(
            *(planned(n, "opt_einsum greedy", cell) for n, cell in ((200, 0), (200, 1), (220, 1))),
            *(
                planned(n, "cotengra random-greedy, 256 trials", cell)
                for cell in (0, 1, 2)
                for n in (200, 220)
            ),
        ),
    ),
    Figure(
        r"at filling 0\.8 \(1155 vertices, seeded; space complexity (\d+), planned in "
        r"([\d.]+) s\) is (\d+), contracted in ([\d.]+) ms, ([\d.]+) ms with its assignment",
        "tensor_network_kings_subgraph-nvidia-h100-80gb-hbm3.json",
        data(
            lambda r: [
                r["rows"][0][k]
                for k in ("space_complexity", "planning_s", "value", "gpu_ms", "gpu_argmax_ms")
            ]
        ),
    ),
    Figure(
        r"of 200 and 220 vertices took ([\d.]+) ms and ([\d.]+) ms \(space complexity (\d+) and "
        r"(\d+), unsliced\), and the king's subgraph ([\d.]+) ms",
        "tensor_network_published-nvidia-h200.log",
        joined(
            find(r"independent set of 89 vertices\. GPU ([\d.]+) ms"),
            find(r"independent set of 98 vertices\. GPU ([\d.]+) ms"),
            find(r"\(200 vertices, 300 edges\), cotengra [^:]*: 499 steps, largest [^2]*2\^(\d+)"),
            find(r"\(220 vertices, 330 edges\), cotengra [^:]*: 549 steps, largest [^2]*2\^(\d+)"),
            find(r"independent set of 344 vertices\. GPU ([\d.]+) ms"),
        ),
    ),
    Figure(
        r"unsliced on one GPU, ([\d.]+) ms, ([\d.]+) ms and ([\d.]+) ms",
        "tensor_network_published_unsliced-nvidia-h200.json",
        data(lambda r: [row["gpu_ms"] for row in r["rows"]]),
    ),
    Figure(
        r"sliced to 2\^27 bytes \(`--memory-limit 134217728`: (\d+), (\d+) and (\d+) slices\), "
        r"([\d.]+) ms, ([\d.]+) ms and ([\d.]+) ms on one GPU and ([\d.]+) ms, ([\d.]+) ms and "
        r"([\d.]+) ms over both",
        "tensor_network_published_sliced-two-nvidia-h200.json",
        data(lambda r: [row[key] for key in ("slices", "gpu_ms", "gpus_ms") for row in r["rows"]]),
    ),
    # Reliability
    Figure(
        r"NVRTC ([\d,.]+); ([\d,.]+) s in all",
        SOAK,
        find(r"NVRTC ([\d.]+), [^\n]*?; (\d+) s in all"),
    ),
    Figure(r"killed with SIGKILL, ([\d,.]+) times", SOAK, find(r"\| (\d+) kills,")),
    Figure(
        r"\| ([\d,.]+) kills landed mid-write; every surviving entry verifies, ([\d,.]+) corrupt; "
        r"([\d,.]+) tmp files, all removed by the next scan",
        SOAK,
        find(r"(\d+) of them mid-write[^|]*?(\d+) corrupt; (\d+) tmp files, 0 after the next"),
    ),
    Figure(
        r"\| ([\d,.]+) compiles in all \(each kernel once\), ([\d,.]+) disk hits, ([\d,.]+) memory "
        r"hits, ([\d,.]+) corrupt reads, ([\d,.]+) errors; ([\d,.]+) requests/s",
        SOAK,
        find(
            r"(\d+) compiles in all, (\d+) disk hits, (\d+) memory hits, (\d+) corrupt, (\d+) "
            r"errors; [\d.]+ s, (\d+) requests/s"
        ),
    ),
    Figure(
        r"got a result \((\d+); (\d+)\), its cancellation \((\d+); (\d+)\) or `CompilerClosed` "
        r"\((\d+); (\d+)\)",
        SOAK,
        soak_waiters,
    ),
    Figure(
        r"\| ([\d,.]+) served, ([\d,.]+) failed, in ([\d,.]+) s; ([\d,.]+) compiles; the "
        r"([\d,.]+) planted",
        SOAK,
        soak_planted,
    ),
    Figure(
        r"\| ([\d,.]+) well-checksummed entries with crafted headers [^|]*\| ([\d,.]+) refused "
        r"\(`CacheCorruptError`\), ([\d,.]+) accepted",
        SOAK,
        find(
            r"decoder fuzz: (\d+) well-checksummed[^|]*\| (\d+) CacheCorruptError, (\d+) "
            r"accepted"
        ),
    ),
    # Shipping a warm cache
    Figure(
        r"in ([\d,.]+) ms after the CUDA context existed \(p90 ([\d,.]+) ms\), as fast as from a "
        r"warm cache dir \(([\d,.]+) ms\)",
        WARM_GPU,
        joined(
            cells(1, "bundle layer, empty writable dir"), bundle_p90, cells(1, "warm cache dir")
        ),
    ),
    Figure(
        r"Opening the Compiler with the bundle took ([\d,.]+) ms",
        WARM_GPU,
        cells(0, "bundle layer, empty writable dir"),
    ),
    Figure(
        r"took ([\d,.]+)x a warm disk hit \(([\d,.]+) ms against ([\d,.]+) ms on 2 CPUs",
        "warm_cache-2-vcpus-cpu.md",
        joined(
            find(r"first compile\(\): ([\d.]+)x"),
            cells(1, "bundle layer, empty writable dir", "warm cache dir"),
        ),
    ),
]

# The tensor-network table's rows: the einsum benchmark's network each shows, by its name.
TENSOR_ROWS: list[tuple[str, Callable[[str], str]]] = [
    (
        r"MIS, random 3-regular graph, (\d+) vertices",
        lambda n: f"MIS of the random 3-regular graph ({n} vertices,",
    ),
    (r"MIS, (\d+) x \1 king's graph", lambda s: f"MIS of the {s}x{s} king's graph"),
    (r"spin glass, (\d+) spins", lambda n: f"spin glass of the random 3-regular graph ({n} "),
]
TENSOR_HEADER = (
    "| network | steps | compiled program | with the assignment | JAX jit | first call (JAX's) "
    "| `einsum_sync` | PyTorch eager |"
)
# A number with a unit of time, rate or a count of tests: a measured figure, not a size or a
# setting ("90% of the limit", "256-node graphs").
MEASURED = re.compile(
    r"(?<![\w.^])(\d[\d,]*(?:\.\d+)?)(?:x| ?(?:ms|s|us|ns|T|MHz|requests/s|passed|skipped))"
    r"(?![\w^])"
)


def paragraphs(text: str) -> list[str]:
    """A page's paragraphs (tables and lists too), each on one line."""
    return [" ".join(block.split()) for block in re.split(r"\n[ \t]*\n", text)]


def pages() -> dict[str, str]:
    """The pages written by hand, by path from the checkout: the README and the site's
    sources (not what the build generates, nor the results it copies in)."""
    found = {"README.md": README.read_text(encoding="utf-8")}
    for path in sorted(DOCS.rglob("*.md")):
        if path.relative_to(DOCS).parts[0] not in ("_generated", "results"):
            found[path.relative_to(ROOT).as_posix()] = path.read_text(encoding="utf-8")
    return found


def rounded(value: Decimal, like: Decimal) -> Decimal:
    """``value`` rounded half up to as many decimals as ``like`` has."""
    places = like.as_tuple().exponent
    assert isinstance(places, int), like  # not NaN or infinity
    return value.quantize(Decimal(1).scaleb(places), rounding=ROUND_HALF_UP)


def agrees(quoted: str, value: Decimal, *, bound: bool) -> bool:
    figure = number(quoted)
    return value < figure if bound else rounded(value, figure) == figure


def result_links(text: str, page: str = "README.md") -> list[str]:
    """The results ``text`` (of ``page``) links, by their path under benchmarks/results."""
    found = []
    for target in re.findall(r"\]\(([^)\s#]+)[^)]*\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path = posixpath.normpath(posixpath.join(posixpath.dirname(page), target))
        if path.startswith("docs/results/plots/"):
            continue  # the site's plots, drawn from the results when it is built
        found += [path[len(f) :] for f in RESULT_FOLDERS if path.startswith(f)]
    return found


def stem(source: str) -> str:
    """A result's name without its kind: a run's .md, .json and .log are one result."""
    return source.rsplit(".", 1)[0]


def left_out(source: str) -> bool:
    """Whether ``source`` is missing because this is an sdist, which ships no logs or plots."""
    missing = not (RESULTS / source).is_file()
    return missing and IN_SDIST and source.endswith(LEFT_OUT_OF_SDIST)


def figure_problems(texts: dict[str, str]) -> list[str]:
    """Where the pages (``texts``, by path) and the committed results disagree: one line
    each."""
    problems = []
    text = {page: "\n\n".join(paragraphs(body)) for page, body in texts.items()}
    links = {page: set(result_links(body, page)) for page, body in texts.items()}
    covered: dict[str, set[int]] = {page: set() for page in texts}
    for figure in FIGURES:
        matches = [(page, m) for page in text for m in re.finditer(figure.quote, text[page])]
        if len(matches) != 1:
            problems.append(f"{figure.quote!r} is on the pages {len(matches)} times, not once")
            continue
        page, match = matches[0]
        groups = range(1, len(match.groups()) + 1)
        covered[page].update(i for group in groups for i in range(*match.span(group)))
        if stem(figure.source) not in {stem(link) for link in links[page]}:
            problems.append(f"{page} never links {figure.source}, which {figure.quote!r} quotes")
        if left_out(figure.source):
            continue
        try:
            measured = figure.read(RESULTS / figure.source)
        except (OSError, LookupError, ValueError) as exc:
            problems.append(f"{figure.source}: {exc!r}")
            continue
        if len(measured) != len(match.groups()):
            problems.append(f"{figure.source}: {len(measured)} values for {figure.quote!r}")
            continue
        for quoted, values in zip(match.groups(), measured, strict=True):
            each = [values] if isinstance(values, Decimal) else list(values)
            if not each or not all(agrees(quoted, value, bound=figure.bound) for value in each):
                problems.append(
                    f"{page} says {quoted} in {match[0]!r}; {figure.source} says "
                    f"{', '.join(map(str, each)) or 'nothing'}"
                )
    for page, body in text.items():
        start = 0
        for paragraph in body.split("\n\n"):
            for found in MEASURED.finditer(paragraph) if result_links(paragraph, page) else ():
                if not set(range(start + found.start(1), start + found.end(1))) <= covered[page]:
                    problems.append(
                        f"{page}: {found[0]!r} beside a link to a result is not a checked figure "
                        f"(add it to FIGURES): {paragraph[:70]!r}..."
                    )
            start += len(paragraph) + 2
    sources = {stem(figure.source) for figure in FIGURES}
    for page, linked in links.items():
        for link in sorted(linked):
            if not (RESULTS / link).is_file() and not left_out(link):
                problems.append(f"{page} links benchmarks/results/{link}, which is not there")
            if link not in NO_FIGURES and stem(link) not in sources:
                problems.append(f"{page} links {link} but quotes no checked figure from it")
    return problems + tensor_table_problems("\n\n".join(texts.values()))


def tensor_table_problems(readme: str) -> list[str]:
    """The tensor-network table against its run's JSON, cell by cell."""
    if TENSOR_HEADER not in readme:
        return ["the tensor-network table (its header) is on no page"]
    result = json.loads((RESULTS / EINSUM).read_text(encoding="utf-8"))
    body = readme.split(TENSOR_HEADER, 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    problems = [] if body else ["the tensor-network table has no rows"]
    for line in body:
        name, *row = [cell.strip() for cell in line.strip().strip("|").split("|")]
        prefixes = [
            make(found[1])
            for pattern, make in TENSOR_ROWS
            if (found := re.fullmatch(pattern, name))
        ]
        if len(prefixes) != 1:
            problems.append(f"tensor-network table: which network is {name!r}?")
            continue
        run = einsum_row(result, prefixes[0])

        def ms(key: str, places: str, run: dict[str, Any] = run) -> str:
            return f"{rounded(number(run[key]), Decimal(places))} ms"

        first = rounded(number(run["program_first_s"]), Decimal("0.01"))
        jax_first = rounded(number(run["jax_first_s"]), Decimal("0.1"))
        expected = [
            str(run["steps"]),
            ms("program_ms", "0.01"),
            ms("program_argmax_ms", "0.01"),
            ms("jax_ms", "0.01"),
            f"{first} s ({jax_first} s)",
            ms("eager_ms", "0.1"),
            ms("torch_ms", "0.1"),
        ]
        if row != expected:
            problems.append(f"tensor-network table, {name}: page {row}, {EINSUM} {expected}")
    return problems


def team_language(readme: str) -> list[str]:
    return [
        f"line {readme.count(chr(10), 0, found.start()) + 1}: {found[0]!r}"
        for pattern in TEAM_LANGUAGE
        for found in re.finditer(pattern, readme, re.I)
    ]


def test_the_figures_are_the_committed_results() -> None:
    problems = figure_problems(pages())
    assert not problems, "\n".join(problems)


def on_the_site() -> dict[str, str]:
    """Every text the site shows that is written by hand: the pages, and the results' tables
    and notes (each a page of the site, and the performance page's tables)."""
    found = pages()
    for path in sorted(RESULTS.rglob("*.md")):
        found[path.relative_to(ROOT).as_posix()] = path.read_text(encoding="utf-8")
    return found


def test_every_page_speaks_to_users() -> None:
    found = [f"{page} {where}" for page, text in on_the_site().items()
             for where in team_language(text)]  # fmt: skip
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        # The drifts the checks were written for: figures older than the logs they link.
        pytest.param("1648 passed", "1647 passed", "says 1647 in", marks=NEEDS_LOGS),
        pytest.param("1068 passed", "1067 passed", "says 1067 in", marks=NEEDS_LOGS),
        ("| 1036 | 1.12 ms |", "| 1035 | 1.12 ms |", "tensor-network table, MIS, 15 x 15"),
        ("| 375 | 0.27 ms |", "| 375 | 0.28 ms |", "tensor-network table, MIS, random"),
        # A rounding that goes the wrong way, a bound that does not hold.
        ("p90 2.5 ms", "p90 2.4 ms", "says 2.4 in"),
        ("under 6 us an insert", "under 3 us an insert", "says 3 in"),
        # A figure added beside a link with no entry in FIGURES.
        ("as fast as from a warm", "in 7.5 ms, as fast as from a warm", "'7.5 ms' beside a link"),
        # A phrase reworded away from its figure.
        ("took 0.47 ms each at p99", "took 0.47 ms at p99", "is on the pages 0 times"),
        # A result linked but none of its figures checked.
        (
            "[trio](../results/compile_service-2-vcpus-trio.md)",
            "[trio](../results/compile_service-nvidia-h200-host-16-cpus-asyncio.md)",
            "quotes no checked figure",
        ),
    ],
)
def test_drift_is_caught(old: str, new: str, says: str) -> None:
    texts = pages()
    [page] = [page for page, text in texts.items() if old in text]
    problems = figure_problems({**texts, page: texts[page].replace(old, new, 1)})
    assert any(says in problem for problem in problems), problems


def test_team_language_is_caught() -> None:
    for phrase in [
        "277 ns (goal 2x: not met)",
        "| product | T ops/s | target |",
        "target 85%",
        "not the tenfold aimed for",
        "as the anchors quote it",
        "[log](benchmarks/results/test-logs/gpu_tests-issue20-nvidia-h200.log)",
        "soak-dev-vm-2-vcpus.md",
        "on the lent H200",
        "run it on the device machine",
    ]:
        assert team_language(phrase), phrase
    # An architecture is a target too, and stays one.
    assert not team_language("the target arch; `resolve_target`; compile()'s default target\n")
