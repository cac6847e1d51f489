"""One plot for each current benchmark, drawn from its committed JSON with matplotlib (no
figure is typed here: every value comes from the file). ``draw`` picks the plotter registered
for the result's benchmark (the file name before its machine) and returns a PNG, or None for a
result that has no plotter (the page then shows its table alone)."""

from __future__ import annotations

import io
import itertools
import textwrap
from collections.abc import Callable
from typing import Any, cast

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import NullLocator

Plotter = Callable[[Axes, dict[str, Any]], None]
Step = Callable[[dict[str, Any]], float]  # one figure read from one run
PLOTTERS: dict[str, Plotter] = {}


def plotter(*benchmarks: str) -> Callable[[Plotter], Plotter]:
    """Register a plotter for the results of ``benchmarks`` (file names start with one)."""

    def register(draw: Plotter) -> Plotter:
        for name in benchmarks:
            PLOTTERS[name] = draw
        return draw

    return register


def _value(value: float) -> str:
    """A bar's value as written beside it: three figures, whole numbers from 1000."""
    return f"{value:,.0f}" if value >= 1000 else f"{value:.3g}"


def _bars(ax: Axes, labels: list[str], values: list[float], *, xlabel: str) -> None:
    """Horizontal bars, one per label, top to bottom in the order given, each with its value."""
    positions = range(len(labels))
    ax.barh(positions, values, color="#3b6ea5")
    ax.set_yticks(list(positions), labels)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    for y, value in zip(positions, values, strict=True):
        ax.annotate(_value(value), (value, y), xytext=(3, 0), textcoords="offset points",
                    va="center", fontsize=8)  # fmt: skip


def _grouped(ax: Axes, labels: list[str], series: dict[str, list[float | None]], *,
             xlabel: str, log: bool | None = None) -> None:  # fmt: skip
    """Horizontal bars in groups, one group per label (top to bottom) and one bar per series in
    each (the first series ours, drawn first), each with its value; None draws no bar. The axis
    is logarithmic where ``log`` says, or by default where the values span over a decade."""
    height = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        ys = [g + (i - (len(series) - 1) / 2) * height for g in range(len(labels))]
        shown = [(y, v) for y, v in zip(ys, values, strict=True) if v is not None and v > 0]
        ax.barh([y for y, _ in shown], [v for _, v in shown], height, label=name, color=f"C{i}")
        for y, value in shown:
            ax.annotate(_value(value), (value, y), xytext=(2, 0), textcoords="offset points",
                        va="center", fontsize=7)  # fmt: skip
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    present = [value for row in series.values() for value in row if value]
    log = max(present) > 10 * min(present) if log is None else log
    ax.set_xlabel(f"{xlabel} (log)" if log else xlabel)
    if log:
        ax.set_xscale("log")
    ax.margins(x=0.12)
    ax.legend(fontsize=8, loc="best")


def _lines(ax: Axes, series: dict[str, tuple[list[float], list[float]]], *, xlabel: str,
           ylabel: str, dashed: tuple[str, ...] = (), logy: bool = True) -> None:  # fmt: skip
    """One line of points per series over a swept parameter (a log x axis); the series named in
    ``dashed`` (the alternatives) dashed."""
    for i, (name, (xs, ys)) in enumerate(series.items()):
        ax.plot(xs, ys, "--" if name in dashed else "-", marker="o", label=name, color=f"C{i}")
    _swept(ax, sorted({x for xs, _ in series.values() for x in xs}))
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)


def _swept(ax: Axes, values: list[float]) -> None:
    """A log x axis marked at the swept parameter's values alone."""
    ax.set_xscale("log")
    ax.set_xticks(values, [f"{value:,}" for value in values])
    ax.xaxis.set_minor_locator(NullLocator())


def _figure(ax: Axes) -> Figure:
    """The figure ``ax`` is drawn on (``draw`` makes every one with ``plt.subplots``)."""
    return cast(Figure, ax.figure)


def _tall(ax: Axes, rows: int) -> None:
    """Room for ``rows`` bars (the default figure holds about twenty)."""
    width, height = _figure(ax).get_size_inches()
    _figure(ax).set_size_inches(width, max(height, 1.5 + 0.16 * rows))


def _short(network: str) -> str:
    """A network's name on two lines or three: what it is, then its size."""
    what, _, size = network.partition(" (")
    return textwrap.fill(what, 40) + (f"\n({size}" if size else "")


@plotter("tropical_gemm")
def _tropical_gemm(ax: Axes, data: dict[str, Any]) -> None:
    gemm = data["results"]["gemm"]
    labels = list(gemm)
    _bars(ax, labels, [gemm[k]["ratio_to_probe"] * 100 for k in labels],
          xlabel="% of the add+max probe's pairs/s (same GPU, same run)")  # fmt: skip
    ax.set_xlim(0, 100)
    ax.set_title("Tropical GEMM against the peak probe")


# The compile service's measures that have something beside them, what they divide by what (the
# labels filled in from the first run's figures).
_SERVICE: dict[str, Callable[[dict[str, Any]], float]] = {
    "hot hit / a trivial coroutine": lambda r: r["hot_hit"]["ratio"],
    "joined waiter / a waiter on an anyio.Event":
        lambda r: r["joined"]["per_waiter_us"] / r["joined"]["plain_per_waiter_us"],
    "loop lag, a cold compile / CuPy's NVRTC on the loop":
        lambda r: r["loop_lag"]["aionvrtc"]["max_lag_ms"]
        / r["loop_lag"]["cupy_nvrtc_on_loop"]["max_lag_ms"],
    "{lanes[disk_hits]} disk hits during compiles / a plain read loop":
        lambda r: r["lanes"]["ratio_to_plain"],
    "{at_once[keys]} disk-warm keys at once / a plain read loop": lambda r: r["at_once"]["ratio"],
    "loop lag, {burst[keys]} keys at once / a bare spawn": lambda r: r["burst"]["ratio"],
    "a live compile while {prefetching[prefetched]} prefetch / one alone":
        lambda r: r["prefetching"]["max_ratio"],
    "hit with a new equal spec / the same object": lambda r: r["equal_spec"]["ratio"],
    "compile_sync from a thread / a portal call":
        lambda r: r["blocking"]["compile_sync_ns"] / r["blocking"]["portal_call_ns"],
}  # fmt: skip


@plotter("compile_service")
def _compile_service(ax: Axes, data: dict[str, Any]) -> None:
    runs = data["results"]
    first = next(iter(runs.values()))
    _grouped(ax, [label.format(**first) for label in _SERVICE],
             {run: [ratio(runs[run]) for ratio in _SERVICE.values()] for run in runs},
             xlabel="ours / what it is measured beside (under 1: ours takes less)")  # fmt: skip
    ax.axvline(1, color="grey", lw=0.8)
    ax.set_title(f"The compile service on {data['facts']['backend']}, now and before")


@plotter("import_time")
def _import_time(ax: Axes, data: dict[str, Any]) -> None:
    runs = data["results"]
    steps: dict[str, Step] = {"import aionvrtc": lambda r: r["import_ms"],
             "first use of Compiler": lambda r: r["first_use_ms"],
             "import and first use": lambda r: r["import_ms"] + r["first_use_ms"],
             "aionvrtc --version (a process)": lambda r: r["version_ms"]}  # fmt: skip
    _grouped(ax, list(steps), {run: [step(runs[run]) for step in steps.values()] for run in runs},
             xlabel="ms, median of fresh interpreters")  # fmt: skip
    ax.set_title("Starting a program, now and before")


@plotter("disk_tier")
def _disk_tier(ax: Axes, data: dict[str, Any]) -> None:
    sizes = data["results"]
    entries = [size["entries"] for size in sizes]
    steps = {
        "longest read hit during an eviction": "read_max_s",
        "eviction to the low water": "evicted_by_s",
        "cache ls --json": "ls_json_s",
        "cache prune --max-size to half": "prune_half_s",
        "a read hit": "read_hit_s",
    }
    for i, (name, key) in enumerate(steps.items()):
        for run, style in (("now", "-"), ("before", "--")):
            ax.plot(entries, [size[run][key] * 1e3 for size in sizes], style, marker="o",
                    color=f"C{i}", label=name if run == "now" else None)  # fmt: skip
    _swept(ax, entries)
    ax.set_yscale("log")
    ax.set_xlabel("entries in the cache (log)")
    ax.set_ylabel("ms, median (log)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, title=f"solid: now; dashed: before ({data['facts']['before']})",
              title_fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))  # fmt: skip
    _figure(ax).set_size_inches(10, 4.5)
    ax.set_title("The disk tier as it grows")


@plotter("gpu_start")
def _gpu_start(ax: Axes, data: dict[str, Any]) -> None:
    paths = data["results"]["warm_start"]
    steps: dict[str, Step] = {"import (with CuPy)": lambda p: p["import__ms"],
             "CUDA context": lambda p: p["context_ms"], "open Compiler": lambda p: p["open_ms"],
             "get (warm disk cache)": lambda p: p["get_ms"],
             "first launch": lambda p: p["launch_ms"],
             "cold get (empty disk cache)": lambda p: p["cold_get_s"] * 1e3}  # fmt: skip
    _grouped(ax, list(steps), {path: [step(paths[path]) for step in steps.values()]
                               for path in paths},
             xlabel="ms in a fresh process, median")  # fmt: skip
    ax.set_title("A fresh process's start on the GPU, against CuPy's RawModule")


@plotter("warm_cache")
def _warm_cache(ax: Axes, data: dict[str, Any]) -> None:
    call = "get()" if data["facts"]["mode"] == "gpu" else "compile()"
    steps = {
        "opening the Compiler": "open_ms",
        f"first {call}": "first_ms",
        f"first {call}, p90": "first_p90_ms",
    }
    cases = [case for case, value in data["results"].items() if isinstance(value, dict)
             and "open_ms" in value]  # fmt: skip
    _grouped(ax, list(steps), {case: [data["results"][case][key] for key in steps.values()]
                               for case in cases},
             xlabel="ms in a fresh process, median")  # fmt: skip
    ax.set_title("A shipped bundle layer against a warm cache dir")


@plotter("server_load")
def _server_load(ax: Axes, data: dict[str, Any]) -> None:
    runs = data["results"]["runs"]
    _lines(ax, {f"{run['mode']}, {run['body']} bodies":
                ([level["concurrency"] for level in run["levels"]],
                 [level["requests_per_s"] for level in run["levels"]]) for run in runs},
           xlabel="concurrent clients (log)", ylabel="requests/s", logy=False,
           dashed=tuple(f"{run['mode']}, {run['body']} bodies" for run in runs
                        if run["mode"] != "batch"))  # fmt: skip
    ax.set_ylim(bottom=0)
    ax.set_title(f"Shortest-path server, {data['results']['nodes']} nodes, batched and alone")


@plotter("launch")
def _launch(ax: Axes, data: dict[str, Any]) -> None:
    requests = data["results"]["requests"]
    paths = list(dict.fromkeys(row["path"] for row in requests["curve"]))
    _lines(ax, {path: ([row["tasks"] for row in requests["curve"] if row["path"] == path],
                       [row["requests_per_s"] for row in requests["curve"]
                        if row["path"] == path]) for path in paths},
           xlabel="concurrent asyncio tasks (log)", ylabel="requests/s (log)",
           dashed=tuple(path for path in paths if path != "batcher"))  # fmt: skip
    ax.axhline(requests["batched_floor"]["ceiling_requests_per_s"], color="grey", ls=":",
               label="ceiling: the batched launches alone")  # fmt: skip
    ax.axhline(requests["batcher_64"]["before_requests_per_s"], color="black", ls="-.", lw=0.8,
               label="64 tasks before launch plans and batching")  # fmt: skip
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    _figure(ax).set_size_inches(10, 4.5)
    ax.set_title("Requests of dependent min-plus products, direct and batched")


def _stacked(ax: Axes, bars: dict[str, dict[str, float]], *, xlabel: str) -> None:
    """One bar per label, split into its parts' shares, each part written in where it fits and
    above or below the bar (in turn) where it does not."""
    for y, parts in enumerate(bars.values()):
        total, left, narrow = sum(parts.values()), 0.0, 0
        for i, (name, count) in enumerate(parts.items()):
            share = count / total * 100
            ax.barh(y, share, 0.45, left=left, color=f"C{i}", edgecolor="white")
            inside = share > 25
            narrow += share > 0 and not inside
            ax.annotate(f"{count:g} {name}", (min(left + share / 2, 99), y),
                        xytext=(0, 0 if inside else (-11 if narrow % 2 else 11)),
                        textcoords="offset points", ha="center" if inside or share / 2 + left
                        < 88 else "right", va="center", fontsize=7)  # fmt: skip
            left += share
    ax.set_yticks(range(len(bars)), list(bars), fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel(xlabel)


@plotter("soak")
def _soak(ax: Axes, data: dict[str, Any]) -> None:
    r = data["results"]
    crash, load, hostile = r["crash"], r["load"], r["hostile"]
    mid = crash["trials_that_left_a_tmp_file"]
    bars = {
        f"{crash['trials']} writers killed\n{crash['corrupt']} corrupt":
            {"mid-write": mid, "not mid-write": crash["trials"] - mid},
        f"{load['processes']} processes, {load['requests']} requests\n"
        f"{load['errors']} errors, {load['corrupt']} corrupt":
            {"memory hits": load["memory_hits"], "disk hits": load["disk_hits"],
             "compiles": load["compiles"]},
        **{f"{storm['waiters']} waiters, closed ({name})\n{storm['other']} other outcomes":
           {"results": storm["result"], "cancelled": storm["cancelled"],
            "CompilerClosed": storm["closed"]} for name, storm in r["storms"].items()},
        f"{hostile['kernels']} kernels, entries planted\n{hostile['error']} failed":
            {"served, planted entry dropped": hostile["corrupt_dropped"],
             "served": hostile["result"] - hostile["corrupt_dropped"]},
        f"decoder fuzz, {r['fuzz']['inputs']} entries": r["fuzz"]["outcomes"],
    }  # fmt: skip
    _stacked(ax, bars, xlabel="% of the workload's outcomes")
    ax.set_title("Soak: what every workload ended in")


_ENGINES = {
    "aionvrtc": ("gpu_ms", 1),
    "aionvrtc, with the assignment": ("gpu_argmax_ms", 1),
    "torch-semiring-einsum": ("tse_ms", 1),
    "NumPy (CPU)": ("numpy_s", 1e3),
}


@plotter("tensor_network")
def _tensor_network(ax: Axes, data: dict[str, Any]) -> None:
    rows = [row for row in data["rows"] if "gpu_ms" in row]
    for i, (engine, (key, to_ms)) in enumerate(_ENGINES.items()):
        timed = [row for row in rows if key in row]
        ax.scatter([row["products"] for row in timed], [row[key] * to_ms for row in timed],
                   label=engine, color=f"C{i}", marker="osD^"[i])  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("products along the path (log)")
    ax.set_ylabel("ms per contraction, median (log)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title("MIS and spin glasses, one network a point")


@plotter("tensor_network_kings_subgraph", "tensor_network_spin_glass",
         "tensor_network_published_unsliced", "tensor_network_published_sliced")  # fmt: skip
def _tensor_network_rows(ax: Axes, data: dict[str, Any]) -> None:
    rows = data["rows"]
    gpus = next((row["gpus"] for row in rows if "gpus" in row), None)
    times = {"contraction, 1 GPU": ("gpu_ms", 1e-3),
             "with the assignment": ("gpu_argmax_ms", 1e-3), f"{gpus} GPUs": ("gpus_ms", 1e-3),
             "planning the order": ("planning_s", 1)}  # fmt: skip
    series = {
        name: [row[key] * to_s if key in row else None for row in rows]
        for name, (key, to_s) in times.items()
        if any(key in row for row in rows)
    }
    labels = [
        f"{row['problem']}, {row['graph']}\n{row['vertices']} vertices, "
        + (f"{row['slices']} slices" if row["slices"] > 1 else "unsliced")
        for row in rows
    ]
    _grouped(ax, labels, series, xlabel="seconds, a contraction's the median of its repeats")
    ax.set_title("Large networks: planning and contraction")


@plotter("tropical_einsum")
def _tropical_einsum(ax: Axes, data: dict[str, Any]) -> None:
    rows = data["results"]
    engines = {"program (CUDA graph)": "program_ms", "JAX jit": "jax_ms",
               "einsum_sync": "eager_ms", "einsum_sync before": "baseline_eager_ms",
               "PyTorch eager": "torch_ms"}  # fmt: skip
    _tall(ax, len(rows) * len(engines))
    _grouped(ax, [_short(row["network"]) for row in rows],
             {name: [row[key] for row in rows] for name, key in engines.items()},
             xlabel="ms per call, median")  # fmt: skip
    ax.set_title("A network contracted again and again, one order")


@plotter("einsum_planners")
def _einsum_planners(ax: Axes, data: dict[str, Any]) -> None:
    rows = data["results"]
    networks = list(dict.fromkeys(row["network"] for row in rows))
    planners = list(dict.fromkeys(row["planner"] for row in rows))
    for row in rows:
        ax.scatter(row["search_s"], row["time_complexity"], s=40,
                   color=f"C{networks.index(row['network'])}",
                   marker="os^vD"[planners.index(row["planner"])])  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("search time, s (log)")
    ax.set_ylabel("log2 of the order's products")
    ax.grid(alpha=0.3, which="both")
    first = ax.legend(handles=[Line2D([], [], ls="", marker="o", color=f"C{i}",
                                      label=_short(network))
                               for i, network in enumerate(networks)], fontsize=7,
                      loc="upper left", bbox_to_anchor=(1, 1))  # fmt: skip
    ax.add_artist(first)
    ax.legend(handles=[Line2D([], [], ls="", marker="os^vD"[i], color="grey", label=planner)
                       for i, planner in enumerate(planners)], fontsize=7,
              loc="lower left", bbox_to_anchor=(1, 0))  # fmt: skip
    _figure(ax).set_size_inches(10, 5)
    ax.set_title("Contraction orders: their cost against the search's time")


@plotter("einsum_orders")
def _einsum_orders(ax: Axes, data: dict[str, Any]) -> None:
    rows = [row for row in data["results"] if "roofline_s" in row]
    networks = list(dict.fromkeys(row["network"] for row in rows))
    kinds = {"kept": "a kept HyperOptimizer order", "auto": "auto (ranked)",
             "one random-greedy": "one search (unranked)", "HyperOptimizer": "HyperOptimizer, 90 s",
             "cotengra HyperOptimizer (greedy, labels), 90": "hyper-roofline, kept"}  # fmt: skip

    def kind(order: str) -> str:
        if "(kept: tensor_network_published-paths" in order:
            return kinds["kept"]
        return next(label for start, label in reversed(kinds.items()) if order.startswith(start))

    series: dict[str, list[float | None]] = {}
    for row in rows:
        name = kind(row["order"])
        if "scored by" in row["order"] and "kept" not in row["order"]:
            name += ", " + row["order"].split("scored by ")[1].split(" (")[0]
        values = series.setdefault(name, [None] * len(networks))
        values[networks.index(row["network"])] = row["roofline_s"] * 1e3
    _grouped(ax, [_short(n) for n in networks], series, xlabel="modelled ms on an H200", log=True)
    _figure(ax).set_size_inches(10, 6)
    ax.set_title("Contraction orders by their modelled time on the GPU")


@plotter("einsum_slices")
def _einsum_slices(ax: Axes, data: dict[str, Any]) -> None:
    rows = data["results"]
    runs = {"unsliced": "unsliced_ms", "sliced, 1 GPU": "one_gpu_ms",
            f"sliced, {data['facts']['gpus']} GPUs": "two_gpus_ms"}  # fmt: skip
    _grouped(ax, [f"{row['vertices']} vertices\n{row['slices']} slices" for row in rows],
             {name: [row.get(key) for row in rows] for name, key in runs.items()},
             xlabel="ms per contraction, median")  # fmt: skip
    ax.set_title("MIS of random 3-regular graphs in slices")


@plotter("sweep_steps")
def _sweep_steps(ax: Axes, data: dict[str, Any]) -> None:
    steps = data["results"]["steps"]
    engines = list(dict.fromkeys(name for step in steps.values() for name, value in step.items()
                                 if isinstance(value, dict)))  # fmt: skip
    _grouped(ax, list(steps),
             {name: [step[name]["of_copy"] * 100 for step in steps.values()] for name in engines},
             xlabel="% of a device-to-device copy's bandwidth", log=False)  # fmt: skip
    ax.set_xlim(0, 100)
    ax.set_title("A row sweep's skinny steps against the copy bandwidth")


@plotter("tile_sweep")
def _tile_sweep(ax: Axes, data: dict[str, Any]) -> None:
    speeds: dict[tuple[str, str], list[float]] = {}
    for tile in data["results"]["candidates"]:
        speeds.setdefault((tile["class"], tile["variant"]), []).append(tile["pairs_per_s"] / 1e12)
    classes = list(dict.fromkeys(shape for shape, _ in speeds))
    variants = list(dict.fromkeys(variant for _, variant in speeds))
    best = [[max(speeds.get((c, v), [float("nan")])) for v in variants] for c in classes]
    image = ax.imshow(best, cmap="viridis", aspect="auto")
    drawn = [max(tiles) for tiles in speeds.values() if tiles]
    low, high = min(drawn), max(drawn)  # the colour map's ends
    for (y, shape), (x, variant) in itertools.product(enumerate(classes), enumerate(variants)):
        if tiles := speeds.get((shape, variant)):
            # Dark text on the light end of the colour map, light text on the dark end.
            light = max(tiles) - low > 0.6 * (high - low)
            ax.text(x, y, f"{max(tiles):.2f}\nx{max(tiles) / min(tiles):.1f}", ha="center",
                    va="center", fontsize=7, color="black" if light else "white")  # fmt: skip
    ax.set_xticks(range(len(variants)), variants, fontsize=8)
    ax.set_yticks(range(len(classes)), classes, fontsize=8)
    ax.set_xlabel("variant (in a cell: the best tile's T pairs/s; x: how many times the slowest's)")
    _figure(ax).colorbar(image, ax=ax, label="the best tile's T pairs/s")
    ax.set_title("Every tile tried, by shape class and variant")


def draw(stem: str, data: Any, title: str) -> bytes | None:
    """The PNG of the plot for the result ``stem`` (its JSON ``data``, its page's ``title``),
    or None."""
    benchmark = next((name for name in sorted(PLOTTERS, key=len, reverse=True)
                      if stem.startswith(name)), None)  # fmt: skip
    if benchmark is None:
        return None
    figure, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    try:
        PLOTTERS[benchmark](ax, data)
        what = ax.get_title()  # the plotter's own short title, above the result's
        ax.set_title("")  # over the whole figure instead, where a long title has room
        figure.suptitle((f"{what}\n" if what else "") + title, fontsize=10)
        figure.tight_layout()
        out = io.BytesIO()
        # No timestamp in the file: the same JSON draws the same bytes.
        figure.savefig(out, format="png", metadata={"Software": None})
        return out.getvalue()
    finally:
        plt.close(figure)
