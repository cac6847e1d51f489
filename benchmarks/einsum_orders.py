"""Contraction orders of the published problems by their modelled time on a GPU: each order's
steps, pairs, bytes and roofline (``EinsumPlan.roofline`` on ``MODEL_FIGURES``, an H200's
measured figures), and the time its search took. Planning only: no GPU.

    python benchmarks/einsum_orders.py [--out DIR] [--hyper 60]
        [--paths benchmarks/results/tensor_network_published-paths.json] [--also PATHS ...]

The orders: those kept in ``--paths`` and each ``--also`` file; ``optimize="auto"``'s (eight
seeded random-greedy searches of 32 trials, the order of least modelled time kept); one
random-greedy search of 256 trials, seed 0 (what "auto" kept before it ranked its candidates);
and with ``--hyper SECONDS`` cotengra's HyperOptimizer (greedy and label-propagation trials) for
that long on this machine's CPUs, once scored by products and writes ("combo") and once by
``tropical.roofline_objective()``, for the same time each.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aionvrtc import tropical
from aionvrtc.tropical.products import MODEL_FIGURES
from benchmarks._results import RESULTS, write
from benchmarks.tropical_einsum import PUBLISHED_PATHS, example


def orders(net: Any, args: argparse.Namespace, tn: Any) -> list[tuple[str, Any, float]]:
    """(what found it, the order, the seconds its search took) for ``net``."""
    import cotengra

    found: list[tuple[str, Any, float]] = []
    for file in [args.paths, *args.also]:
        entry = json.loads(file.read_text()).get(tn.path_key(net))
        if entry is not None:
            found.append((f"{entry['planner']} (kept: {file.name})", entry["path"], math.nan))
    began = time.perf_counter()
    auto = tropical.einsum_plan(net.subscripts, *net.operands)
    found.append(("auto: 8 seeded random-greedy searches of 32 trials, ranked", auto.path,
                  time.perf_counter() - began))  # fmt: skip
    single = cotengra.RandomGreedyOptimizer(max_repeats=256, seed=0, parallel=False)
    began = time.perf_counter()
    plan = tropical.einsum_plan(net.subscripts, *net.operands, optimize=single)
    found.append(("one random-greedy search of 256 trials, seed 0 (auto, unranked)", plan.path,
                  time.perf_counter() - began))  # fmt: skip
    if args.hyper:
        for name, minimize in (("combo", "combo"), ("roofline", tropical.roofline_objective())):
            hyper = cotengra.HyperOptimizer(
                methods=["greedy", "labels"], max_time=args.hyper, max_repeats=1_000_000,
                minimize=minimize, parallel=True, optlib="random", progbar=False,
            )  # fmt: skip
            began = time.perf_counter()
            what = f"HyperOptimizer (greedy, labels), {args.hyper:g} s, scored by {name}"
            try:
                path = tropical.einsum_plan(net.subscripts, *net.operands, optimize=hyper).path
            except ValueError:  # its best order holds an intermediate past 64-bit offsets
                path, what = None, f"{what}: no order with intermediates a GPU could hold"
            found.append((f"{what} ({len(hyper.scores)} trials)", path,
                          time.perf_counter() - began))  # fmt: skip
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--paths", type=Path, default=PUBLISHED_PATHS)
    parser.add_argument("--also", type=Path, nargs="*", default=[])
    parser.add_argument("--hyper", type=float, default=0.0)
    args = parser.parse_args()
    tn = example()
    nets = tn.networks(argparse.Namespace(
        regular=[200, 220], kings=[], kings_subgraph=[38], filling=0.8, spin_glass=[],
        square_spin_glass=[], seed=2026, planner="auto", trials=256, plan_time=60.0,
    ))  # fmt: skip
    rows = []
    for net in nets:
        for planner, path, seconds in orders(net, args, tn):
            if path is None:
                rows.append({"network": net.name, "order": planner, "search_s": seconds})
                print(json.dumps(rows[-1]), flush=True)
                continue
            plan = tropical.einsum_plan(net.subscripts, *net.operands, optimize=path)
            costs = plan.step_costs()
            rows.append({
                "network": net.name, "order": planner, "steps": len(plan.steps),
                "pairs": sum(c.pairs for c in costs),
                "bytes": 4 * sum(c.elements for c in costs),
                "largest_intermediate": plan.largest_intermediate,
                "roofline_s": plan.roofline(MODEL_FIGURES), "search_s": seconds,
            })  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    machine = f"{os.cpu_count()} vCPUs"
    facts: dict[str, Any] = {"machine": machine, "figures": MODEL_FIGURES.to_json(),
             "python": sys.version.split()[0], "date": time.strftime("%Y-%m-%d")}  # fmt: skip
    lines = [
        "# Contraction orders of the published problems by their modelled time on an H200", "",
        f"{facts['machine']}, Python {facts['python']}, {facts['date']}. Planning only: each "
        "order's roofline counted on an H200's measured figures (f32 probe 15.53 T pairs/s, "
        "copy 4.22 TB/s), its bytes for float32; search: the order's search on this machine.",
        "",
        "| network | order | steps | pairs | bytes | largest | roofline | search |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]  # fmt: skip
    for r in rows:
        search = "-" if math.isnan(r["search_s"]) else f"{r['search_s']:.1f} s"
        if "roofline_s" not in r:
            lines.append(f"| {r['network']} | {r['order']} | - | - | - | - | - | {search} |")
            continue
        lines.append(
            f"| {r['network']} | {r['order']} | {r['steps']} | 2^{math.log2(r['pairs']):.1f} | "
            f"{r['bytes'] / 1e9:.1f} GB | 2^{math.log2(r['largest_intermediate']):.0f} | "
            f"{r['roofline_s'] * 1e3:.2f} ms | {search} |"
        )
    write(args.out, "einsum_orders", label=machine, facts=facts, results=rows,
          table="\n".join(lines) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
