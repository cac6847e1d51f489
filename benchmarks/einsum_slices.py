"""A tensor network contracted in slices (``memory_limit=``) on one GPU and spread over two
(``devices=``), side by side in one run, against the same network unsliced where it fits: the
maximum independent set of random 3-regular graphs (examples/tensor_network.py's networks),
planned with cotengra's HyperOptimizer.

    python benchmarks/einsum_slices.py [--out DIR] [--regular 200 220] [--slice-log2 24]
        [--repeats 3] [--max-time 20]

For each graph: the plan's space and time complexity, the slicing to 2**--slice-log2 elements
a slice (float32), the planning time (cotengra's search and the slicing, apart), then wall
times to the synchronised result, medians of --repeats after a warm-up: unsliced (where its
largest intermediate fits in a quarter of the GPU's memory), in slices on GPU 0, in slices on
GPUs 0 and 1 (where there are two). Every value is checked against the others.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aionvrtc import tropical
from benchmarks._results import RESULTS, gpu_facts, write
from benchmarks.tropical_einsum import example, median_ms


def measure(n: int, args: argparse.Namespace, net: Any) -> dict[str, Any]:
    import cotengra
    import cupy
    import numpy as np

    rng = np.random.default_rng(args.seed + n)
    edges = net.random_regular_graph(n, 3, rng)
    mis = tropical.problems.independent_set(edges, vertices=range(n))
    subscripts, operands = mis.subscripts, mis.operands
    arrays = [cupy.asarray(x) for x in operands]
    began = time.perf_counter()
    optimizer = cotengra.HyperOptimizer(
        methods=["greedy"], max_time=args.max_time, max_repeats=10_000, parallel=False,
        minimize="combo", progbar=False,
    )  # fmt: skip
    whole = tropical.einsum_plan(subscripts, *arrays, optimize=optimizer)
    planned_s = time.perf_counter() - began
    began = time.perf_counter()
    limit = 2**args.slice_log2 * 4
    plan = tropical.einsum_plan(subscripts, *arrays, optimize=whole, memory_limit=limit)
    sliced_s = time.perf_counter() - began
    row: dict[str, Any] = {
        "vertices": n,
        "edges": len(edges),
        "space_complexity": whole.space_complexity,
        "time_complexity": whole.time_complexity,
        "planning_s": planned_s,
        "slicing_s": sliced_s,
        "slices": plan.slicing.count if plan.slicing else 1,
        "slice_space_complexity": plan.space_complexity,
        "slice_time_complexity": plan.time_complexity,
    }
    sync = cupy.cuda.Device(0).synchronize
    values = {}

    def run(**kwargs: Any) -> Any:
        values[tuple(kwargs)] = float(tropical.einsum_sync(subscripts, *arrays, **kwargs))

    free, _ = cupy.cuda.Device(0).mem_info
    if 2**whole.space_complexity * 4 * 4 <= free:
        try:
            row["unsliced_ms"] = median_ms(lambda: run(optimize=whole), sync, args.repeats)
        except cupy.cuda.memory.OutOfMemoryError:
            row["unsliced"] = "out of memory"
        cupy.get_default_memory_pool().free_all_blocks()
    row["one_gpu_ms"] = median_ms(lambda: run(optimize=plan, devices=[0]), sync, args.repeats)
    if cupy.cuda.runtime.getDeviceCount() > 1:

        def both() -> None:
            cupy.cuda.Device(1).synchronize()
            sync()

        row["two_gpus_ms"] = median_ms(
            lambda: run(optimize=plan, devices=[0, 1]), both, args.repeats
        )
    assert len(set(values.values())) == 1, values
    row["mis"] = next(iter(values.values()))
    print(row, flush=True)
    return row


def table(facts: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    def ms(row: dict[str, Any], key: str) -> str:
        return f"{row[key]:.1f} ms" if key in row else row.get(key.removesuffix("_ms"), "-")

    lines = [
        f"# Tensor networks in slices on {facts['gpu']}",
        "",
        f"{facts['gpus']} GPU(s), aionvrtc {facts['aionvrtc']}, CuPy {facts['cupy']}, "
        f"{facts['date']}. The MIS of random 3-regular graphs (float32), planned by cotengra's "
        f"HyperOptimizer (greedy trials for {facts['max_time']} s), sliced to "
        f"2^{facts['slice_log2']} elements a slice. Medians of {facts['repeats']} after a "
        "warm-up; every value checked against the others.",
        "",
        "| vertices | sc / tc | slices (sc / tc of all) | planning | slicing | unsliced "
        "| sliced, 1 GPU | sliced, 2 GPUs | MIS |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['vertices']} | {r['space_complexity']:.1f} / {r['time_complexity']:.1f} | "
            f"{r['slices']} ({r['slice_space_complexity']:.1f} / "
            f"{r['slice_time_complexity']:.1f}) | {r['planning_s']:.1f} s | "
            f"{r['slicing_s'] * 1e3:.0f} ms | {ms(r, 'unsliced_ms')} | {ms(r, 'one_gpu_ms')} | "
            f"{ms(r, 'two_gpus_ms')} | {r['mis']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--regular", type=int, nargs="+", default=[200, 220])
    parser.add_argument("--slice-log2", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-time", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    import cupy

    net = example()
    rows = [measure(n, args, net) for n in args.regular]
    facts = {
        **gpu_facts(),
        "gpus": cupy.cuda.runtime.getDeviceCount(),
        "max_time": args.max_time,
        "slice_log2": args.slice_log2,
        "repeats": args.repeats,
        "seed": args.seed,
    }
    write(args.out, "einsum_slices", label=facts["gpu"], facts=facts, results=rows,
          table=table(facts, rows))  # fmt: skip


if __name__ == "__main__":
    main()
