"""Contraction orders for large tensor networks: what each planner leaves (space and time
complexity, log2) and how long it searches, on the published problems of
examples/tensor_network.py. This is what set ``optimize="auto"``'s choice past 64 operands
(cotengra's random-greedy, 256 trials, seeded). CPU only.

    python benchmarks/einsum_planners.py [--out DIR] [--machine "2 vCPUs"] [--seed 2026]

Planners: opt_einsum's greedy ("auto" up to 64 operands, and past them without cotengra),
opt_einsum's random-greedy with 64 trials (minimising size, as the example used to; not on the
lattices, whose thousands of operands take it minutes), cotengra's
random-greedy with 256 trials (what "auto" runs) and with 1,024, and for the lattices the
row-by-row elimination order. Time is the search alone (``einsum_plan`` of the path after).
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aionvrtc import tropical
from benchmarks._results import RESULTS, write
from benchmarks.tropical_einsum import example


def cotengra_greedy(module: Any, trials: int) -> Any:
    optimizer, _ = module.planner("cotengra", trials)
    return optimizer


def planners(net: Any, module: Any) -> dict[str, Callable[[], Any]]:
    """Each planner by name, as the example builds it (seed 0 for cotengra's)."""
    found: dict[str, Callable[[], Any]] = {"opt_einsum greedy": lambda: "greedy"}
    if len(net.operands) < 1000:  # (its Python greedy takes 7 s an order of 4,703 operands)
        found["opt_einsum random-greedy, 64 trials"] = functools.partial(module.random_greedy, 64)
    for trials in (256, 1024):
        found[f"cotengra random-greedy, {trials} trials"] = functools.partial(
            cotengra_greedy, module, trials
        )
    if "lattice" in net.graph or "king" in net.graph:
        inputs = net.subscripts.split("->")[0].split(",")
        found["row by row"] = lambda: module.elimination_path(
            inputs, map(module.symbol, range(net.n))
        )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--machine", default="2 vCPUs")
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    import importlib.metadata

    module = example()
    nets = module.networks(
        argparse.Namespace(
            regular=[200, 220], kings=[], kings_subgraph=[38], filling=0.8, spin_glass=[],
            square_spin_glass=[32], planner="auto", trials=256, plan_time=60.0, seed=args.seed,
        )
    )  # fmt: skip
    rows = []
    for net in nets:
        for name, make in planners(net, module).items():
            started = time.perf_counter()
            optimize = make()
            if not isinstance(optimize, list):  # a search, planned within the time
                optimize = tropical.einsum_plan(net.subscripts, *net.operands, optimize=optimize)
            searched = time.perf_counter() - started
            # (a plan of these operands comes back as it is; an explicit order is planned here)
            plan = tropical.einsum_plan(net.subscripts, *net.operands, optimize=optimize)
            row = {
                "network": net.name, "operands": len(net.operands), "planner": name,
                "space_complexity": plan.space_complexity,
                "time_complexity": plan.time_complexity, "search_s": searched,
            }  # fmt: skip
            print(row, flush=True)
            rows.append(row)
    facts = {
        "machine": args.machine,
        "python": sys.version.split()[0],
        **{p: importlib.metadata.version(p) for p in ("cotengra", "cotengrust", "opt_einsum")},
        "date": time.strftime("%Y-%m-%d"),
    }
    lines = [
        f"# Contraction orders of examples/tensor_network.py's published problems, {args.machine}",
        "",
        f"Python {facts['python']}, cotengra {facts['cotengra']}, cotengrust "
        f"{facts['cotengrust']}, opt_einsum {facts['opt_einsum']}, {facts['date']}. Space and "
        "time complexity are log2 of the largest intermediate's elements and of all products; "
        "search time is the planner's (einsum_plan included; the rows' order is made by hand).",
        "",
        "| network | operands | planner | space | time | search s |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['network']} | {r['operands']} | {r['planner']} | {r['space_complexity']:.0f} "
            f"| {r['time_complexity']:.1f} | {r['search_s']:.2f} |"
        )
    write(args.out, "einsum_planners", label=args.machine, facts=facts, results=rows,
          table="\n".join(lines) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
