"""Every property of ``Problem.solve`` on the CPU (the NumPy reference), timed beside the value
on the same network along the same order: the published networks of 60 and 100 vertices of
benchmarks/tropical_einsum.py (the maximum independent set of random 3-regular graphs, and the
spin glass on the 100-vertex one) and the 10 x 10 king's graph, row by row.

    PYTHONHASHSEED=0 python benchmarks/problem_properties.py [--out DIR] [--repeats 3]

Each order is found once (opt_einsum's random-greedy, 64 trials, seeded; PYTHONHASHSEED fixes
its ties) and passed to every call as a path, so every property contracts along it. Times are
the median of ``--repeats`` wall-clock calls in one process; every answer is checked against
the others (the value against the k best, the counts against the polynomial, each sample and
configuration rescored from the graph).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aionvrtc.tropical import einsum_plan, problems
from aionvrtc.tropical.problems import (
    ConfigsMax,
    CountingAll,
    CountingMax,
    GraphPolynomial,
    PartitionFunction,
    SampleMax,
    SingleConfigMax,
    SizeMax,
    SizeMin,
)
from benchmarks._results import RESULTS, write
from benchmarks.tropical_einsum import example


def timed(call: Callable[[], Any], repeats: int) -> tuple[Any, float]:
    times, found = [], None
    for _ in range(repeats):
        began = time.perf_counter()
        found = call()
        times.append(time.perf_counter() - began)
    return found, statistics.median(times)


def measure(net: Any, repeats: int) -> dict[str, Any]:
    problem: problems.Problem = net.built
    path = einsum_plan(problem.subscripts, *problem.operands, optimize=net.optimize).path
    best = SizeMin() if problem.semiring == "minplus" else SizeMax()
    end = "Min" if problem.semiring == "minplus" else "Max"
    asked: list[tuple[str, Any]] = [
        (f"Size{end}() (the value)", best),
        (f"Size{end}(4)", type(best)(4)),
        (f"Counting{end}()", CountingMax() if end == "Max" else problems.CountingMin()),
        (f"Counting{end}(4)", CountingMax(4) if end == "Max" else problems.CountingMin(4)),
        ("CountingAll()", CountingAll()),
        (f"SingleConfig{end}()", SingleConfigMax() if end == "Max" else problems.SingleConfigMin()),
        (f"Configs{end}()", ConfigsMax(100_000) if end == "Max" else problems.ConfigsMin(100_000)),
        (f"Sample{end}(100)", SampleMax(100, 1) if end == "Max" else problems.SampleMin(100, 1)),
        ("GraphPolynomial()", GraphPolynomial()),
        ("PartitionFunction(1.0, log=True)", PartitionFunction(1.0, log=True)),
    ]
    row: dict[str, Any] = {"network": net.name, "vertices": net.n, "properties": []}
    answers: dict[str, Any] = {}
    for name, wanted in asked:

        def call(wanted: Any = wanted) -> Any:
            try:
                return problem.solve(wanted, optimize=path)
            except ValueError as error:  # more optima than the limit: refused once counted
                if not str(error).endswith("count them alone with einsum(..., count=True)"):
                    raise
                return f"refused: {str(error).split(' assignments')[0]} configurations"

        found, seconds = timed(call, repeats)
        answers[name] = found
        row["properties"].append({"property": name, "seconds": seconds, "answer": _shown(found)})
        print(json.dumps({"network": net.name, "property": name, "seconds": seconds}), flush=True)
    _check(answers, end)
    value_s = row["properties"][0]["seconds"]
    for entry in row["properties"]:
        entry["times_the_value"] = entry["seconds"] / value_s
    return row


def _check(answers: dict[str, Any], end: str) -> None:
    """The answers agree: the value is the first of the k best, its count the polynomial's
    coefficient, every configuration and sample attains it (rescored from the graph)."""
    value = answers[f"Size{end}() (the value)"][0]
    assert answers[f"Size{end}(4)"][0] == value
    counted = answers[f"Counting{end}()"][0]
    assert counted.value == value
    poly = answers["GraphPolynomial()"]
    assert poly[int(value)] == counted.count
    assert sum(poly.values()) == answers["CountingAll()"]
    for got in answers[f"Counting{end}(4)"]:
        assert poly[int(got.value)] == got.count
    listed = answers[f"Configs{end}()"]
    if isinstance(listed, str):  # refused past the limit, naming the count
        assert listed == f"refused: {counted.count:,} configurations", listed
    else:
        assert len(listed) == counted.count
    for solution in [answers[f"SingleConfig{end}()"], *answers[f"Sample{end}(100)"]]:
        assert solution.value == value
    sign = 1 if end == "Max" else -1
    top = max(poly) if end == "Max" else min(poly)
    log_z = sign * top + math.log(
        math.fsum(c * math.exp(sign * (s - top)) for s, c in poly.items())
    )
    assert math.isclose(answers["PartitionFunction(1.0, log=True)"], log_z, rel_tol=1e-9)


def _shown(found: Any) -> Any:
    """An answer for the JSON: counts and values as they are, configurations by number."""
    if isinstance(found, dict):
        return {str(k): v for k, v in found.items()}
    if isinstance(found, str):
        return found
    if isinstance(found, list) and found and isinstance(found[0], problems.Solution):
        return f"{len(found)} configurations"
    if isinstance(found, problems.Solution):
        return f"a configuration of value {found.value}"
    if isinstance(found, list):
        return [[x.value, x.count] if isinstance(x, problems.Counted) else x for x in found]
    return found


def render(rows: list[dict[str, Any]], facts: dict[str, Any]) -> str:
    lines = [
        "# Every property of a problem on the CPU, beside its value", "",
        f"{facts['machine']}, Python {facts['python']}, NumPy {facts['numpy']}, {facts['date']}. "
        "The NumPy reference along one order per network (opt_einsum random-greedy, 64 trials, "
        f"seeded), the median of {facts['repeats']} calls of `problem.solve(property)`; every "
        "answer checked against the others.", "",
    ]  # fmt: skip
    for row in rows:
        lines += [f"## {row['network']}", "", "| property | time | times the value's |",
                  "| --- | ---: | ---: |"]  # fmt: skip
        for entry in row["properties"]:
            s = entry["seconds"]
            shown = f"{s * 1e3:,.1f} ms" if s < 1 else f"{s:,.2f} s"
            answer = entry["answer"]
            refused = f" ({answer} past the limit)" if str(answer).startswith("refused") else ""
            lines.append(
                f"| `{entry['property']}`{refused} | {shown} | {entry['times_the_value']:,.1f}x |"
            )
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--render", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.render:  # a run's table written again from its JSON
        run = json.loads(args.render.read_text())
        write(args.out, "problem_properties", label=run["facts"]["machine"], facts=run["facts"],
              results=run["results"], table=render(run["results"], run["facts"]))  # fmt: skip
        return
    import numpy as np

    module = example()
    nets = module.networks(
        argparse.Namespace(
            regular=[60, 100], kings=[10], spin_glass=[100], trials=64, planner="random-greedy",
            seed=2026, kings_subgraph=[], filling=0.8, square_spin_glass=[], plan_time=60.0,
        )
    )  # fmt: skip
    rows = [measure(net, args.repeats) for net in nets]
    machine = f"{os.cpu_count()} vCPUs"
    facts = {"machine": machine, "python": sys.version.split()[0], "numpy": np.__version__,
             "date": time.strftime("%Y-%m-%d"), "repeats": args.repeats}  # fmt: skip
    write(args.out, "problem_properties", label=machine, facts=facts, results=rows,
          table=render(rows, facts))  # fmt: skip


if __name__ == "__main__":
    main()
