"""Every step of a tensor network timed on the GPU against its own bound, and the network's time
against its roofline.

    python benchmarks/einsum_roofline.py [--out DIR] [--published] [--repeats 5]
        [--paths benchmarks/results/tensor_network_published-paths.json] [--also PATHS ...]

A step's bound is the longer of its add+max pairs (batch * M * N * K) at the GPU's register probe
and the elements it must move (each operand read once, the result written once, a copy read and
written) at its device-to-device copy's bandwidth, both measured in the same run
(``tropical.device_figures``); the network's roofline is their sum (``EinsumPlan.roofline``). The
networks: those of ``benchmarks/tropical_einsum.py`` (examples/tensor_network.py's, along their
seeded random-greedy or row-by-row orders; PYTHONHASHSEED=0 for the same orders) and, with
``--published``, the 200- and 220-vertex random 3-regular graphs and the 38 x 38 king's subgraph
along the kept paths of ``--paths`` and of each ``--also`` file, the random graphs along
``optimize="auto"``'s order, and the 200-vertex graph along the order "auto" took before its
candidates were ranked by the roofline model (one random-greedy search of 256 trials).

Each network's steps are prepared once (the eager run's launches) and enqueued ``--repeats``
times with a CUDA event after every launch: a step's time is the median of its launches' spans
summed over its launches. The network's own time is the median of whole runs without events.
The steps' value is checked against an eager ``einsum_sync`` of the same plan (itself tested
against the NumPy reference) before any time is quoted. A group of small steps that one launch
contracts is timed on the group's first step. The steps are summed by class (a sum over a long K
into few outputs, a product thin on one side, a batch of small products, a short K, a
reduction, the rest), each class's time beside its bound.

Then the batched 1024 x 64^3 product (the "small" class's own shape) beside its floor: its pairs
at the probe and a device copy of as many bytes as it moves, timed the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import itertools

import numpy as np

from aionvrtc import Compiler, tropical
from aionvrtc.tropical.networks._runs import steps_for
from aionvrtc.tropical.products import semiring as lookup
from benchmarks._results import RESULTS, gpu_facts, median_s, write
from benchmarks.tropical_einsum import PUBLISHED_PATHS, example

TOP = 10  # the steps a network's table lists: those that lose most against their bounds


def networks(published: bool, paths: Path, also: list[Path]) -> list[Any]:
    """The networks, each with its operands (NumPy) and its order."""
    tn = example()
    if not published:
        args = argparse.Namespace(
            regular=[60, 100, 150], kings=[10, 15], kings_subgraph=[], filling=0.8,
            spin_glass=[100], square_spin_glass=[], seed=2026, planner="random-greedy",
            trials=64, plan_time=60.0,
        )  # fmt: skip
        return list(tn.networks(args))
    args = argparse.Namespace(
        regular=[200, 220], kings=[], kings_subgraph=[38], filling=0.8, spin_glass=[],
        square_spin_glass=[], seed=2026, planner="auto", trials=256, plan_time=60.0,
    )  # fmt: skip
    found = []
    for file in [paths, *also]:
        nets = tn.networks(args)
        tn.use_paths(nets, json.loads(file.read_text()), str(file))
        found += [net for net in nets if net.path_from]
    for net in tn.networks(args):
        if net.graph.startswith("random"):
            net.planner = "auto: 8 seeded random-greedy searches of 32 trials, ranked"
            found.append(net)
    import cotengra

    before = tn.networks(args)[0]  # 200 vertices
    before.optimize = cotengra.RandomGreedyOptimizer(max_repeats=256, seed=0, parallel=False)
    before.planner = "one random-greedy search of 256 trials (auto, unranked)"
    found.append(before)
    return found


def step_class(b: int, m: int, n: int, k: int, reduction: bool) -> str:
    """What kind of product a step is, for the profile's sums by class."""
    if reduction:
        return "reduction (a sum over K)"
    if k >= 512 and b * m * n < 132 * 2048:
        return "few outputs over a long K"
    if min(m, n) <= 16 and max(m, n) >= 4096:
        return "thin: one side at most 16, the other 4096+"
    if b >= 64 and m * n <= 64 * 64:
        return "a batch of small products"
    if k <= 8:
        return "short K (at most 8)"
    return "tiled products"


def kernel_name(spec: Any) -> str:
    """A step kernel's name expression (its template and tile), shortened for a table."""
    name = " ".join(str(n) for n in spec.name_expressions) or str(getattr(spec, "name", "?"))
    return name.replace("unsigned ", "u").replace(", ", ",")


async def prepared(net: Any, compiler: Any) -> tuple[Any, ...]:
    """``net``'s operands on the GPU, its plan, its steps and their modules, every kernel (the
    program's too) compiled concurrently first."""
    import cupy

    arrays = [cupy.asarray(x) for x in net.operands]
    plan = await asyncio.to_thread(
        tropical.einsum_plan, net.subscripts, *arrays, optimize=net.optimize
    )
    specs = plan.kernel_specs(net.semiring, arrays[0].dtype, program=True)
    await asyncio.gather(*(compiler.get(spec) for spec in specs))
    device = cupy.cuda.Device().id
    steps = await asyncio.to_thread(
        steps_for, plan, lookup(net.semiring), arrays[0].dtype, argmax=False, device=device
    )
    assert steps is not None
    modules = [await compiler.get(spec) for spec in steps.specs]
    return arrays, plan, steps, modules


def profile(net: Any, figures: Any, repeats: int, ready: tuple[Any, ...]) -> dict[str, Any]:
    import cupy

    arrays, plan, steps, modules = ready
    dtype = arrays[0].dtype
    stream = cupy.cuda.get_current_stream()
    arena = cupy.cuda.alloc(max(steps.nbytes, 1))
    result = cupy.empty(steps.shape, dtype)
    pointers = [x.data.ptr for x in arrays]

    def run(marks: list[Any] | None = None) -> None:
        steps.enqueue(modules, pointers, arena.ptr, result.data.ptr, stream, marks=marks)

    run()
    stream.synchronize()
    expected = tropical.einsum_sync(net.subscripts, *arrays, semiring=net.semiring,
                                    optimize=plan)  # fmt: skip
    assert float(result) == float(expected), (net.graph, float(result), float(expected))

    def eager() -> None:
        run()
        stream.synchronize()

    whole = median_s(eager, repeats)
    program = tropical.einsum_program_sync(net.subscripts, *arrays, semiring=net.semiring,
                                           optimize=plan)  # fmt: skip
    assert float(program.run_sync(*arrays)) == float(expected)
    device_sync = cupy.cuda.Device().synchronize
    replayed = median_s(lambda: (program.run_sync(*arrays), device_sync()), repeats)
    spans: list[list[float]] = [[] for _ in steps.ops]
    for _ in range(repeats):
        marks: list[Any] = []
        run(marks)
        marks[-1].synchronize()
        for n, (before, after) in enumerate(itertools.pairwise(marks)):
            spans[n].append(cupy.cuda.get_elapsed_time(before, after) / 1e3)
    per_step: dict[int, float] = {}
    kernels: dict[int, str] = {}
    for op, times in zip(steps.ops, spans, strict=True):
        per_step[op.step] = per_step.get(op.step, 0.0) + statistics.median(times)
        if op.step < len(plan.steps) and op.step not in kernels:
            kernels[op.step] = kernel_name(steps.specs[op.module])
    costs = plan.step_costs()
    rows = []
    itemsize = np.dtype(dtype).itemsize
    total = sum(per_step.values())
    for number, (step, cost) in enumerate(zip(plan.steps, costs, strict=True)):
        seconds = per_step.get(number, 0.0)
        bound = cost.bound(figures, dtype)
        b, m, k = step.first.shape
        n = step.second.shape[2] if step.second is not None else 1
        rows.append({
            "step": number, "shape": [b, m, n, k], "kernel": kernels.get(number, "-"),
            "class": step_class(b, m, n, k, step.second is None),
            "pairs": cost.pairs, "bytes": cost.elements * itemsize, "seconds": seconds,
            "bound_s": bound, "pairs_per_s": cost.pairs / seconds if seconds else None,
            "bytes_per_s": cost.elements * itemsize / seconds if seconds else None,
            "share": seconds / total if total else 0.0,
        })  # fmt: skip
    roofline = plan.roofline(figures, dtype)
    return {
        "network": f"{net.problem} of the {net.graph} ({net.n} vertices)",
        "planner": net.planner
        if not net.path_from
        else f"{net.planner} (kept: {Path(net.path_from).name})",
        "steps": len(plan.steps),
        "launches": len(steps.ops),
        "pairs": sum(c.pairs for c in costs),
        "bytes": sum(c.elements for c in costs) * itemsize,
        "roofline_s": roofline,
        "seconds": whole,
        "program_seconds": replayed,
        "steps_seconds": total,
        "rows": rows,
    }


def by_class(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each class's steps: their time, their bound and their count."""
    classes: dict[str, dict[str, float]] = {}
    for row in rows:
        entry = classes.setdefault(row["class"], {"seconds": 0.0, "bound_s": 0.0, "steps": 0})
        entry["seconds"] += row["seconds"]
        entry["bound_s"] += row["bound_s"]
        entry["steps"] += 1
    return classes


def batched_floor(figures: Any, repeats: int) -> dict[str, Any]:
    """The batched 1024 x 64^3 f32 product (CUDA-graph replays) beside its pairs at the probe
    and a device copy moving as many bytes (A and B read, C written), timed the same way."""
    import cupy

    from aionvrtc.tropical import reference
    from aionvrtc.tropical.tuning import timed

    rng = np.random.default_rng(45)
    a = cupy.asarray(rng.standard_normal((1024, 64, 64), np.float32))
    b = cupy.asarray(rng.standard_normal((1024, 64, 64), np.float32))
    out = cupy.empty((1024, 64, 64), np.float32)
    tropical.matmul_sync(a, b, "maxplus", out=out)
    want = reference.matmul(cupy.asnumpy(a[:4]), cupy.asnumpy(b[:4]), "maxplus")
    assert np.array_equal(cupy.asnumpy(out[:4]), want)
    product = timed(lambda: tropical.matmul_sync(a, b, "maxplus", out=out), repeats)
    moved = 3 * a.nbytes  # read A and B, write C
    src = cupy.ones(moved // 8, np.float32)  # a copy of N bytes reads N and writes N
    dst = cupy.empty_like(src)
    copy = timed(lambda: dst.__setitem__(Ellipsis, src), repeats)
    pairs = 1024 * 64**3
    probe = pairs / figures.pairs_per_s["float32"]
    return {
        "product_s": product, "pairs_at_probe_s": probe, "bytes_at_copy_s": copy,
        "of_probe": probe / product, "pairs": pairs, "bytes": moved,
    }  # fmt: skip


def table(results: list[dict[str, Any]], figures: Any, floor: dict[str, Any] | None) -> str:
    rates = ", ".join(f"{k} {v / 1e12:.2f} T pairs/s" for k, v in figures.pairs_per_s.items())
    lines = [
        f"Probe: {rates}; copy {figures.copy_bytes_per_s / 1e12:.2f} TB/s (read and written).",
        "",
        "| network | order | steps | pairs | bytes | roofline | program | off by | eager | "
        "steps' sum |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        lines.append(
            f"| {r['network']} | {r['planner']} | {r['steps']} | 2^{math.log2(r['pairs']):.1f} | "
            f"{r['bytes'] / 1e9:.2f} GB | {r['roofline_s'] * 1e3:.2f} ms | "
            f"{r['program_seconds'] * 1e3:.2f} ms | "
            f"{r['program_seconds'] / r['roofline_s']:.1f}x | {r['seconds'] * 1e3:.2f} ms | "
            f"{r['steps_seconds'] * 1e3:.2f} ms |"
        )
    for r in results:
        lines += [
            "", f"### {r['network']}, {r['planner']}", "",
            "| step class | steps | time | bound | of its bound | share |",
            "| --- | --- | --- | --- | --- | --- |",
        ]  # fmt: skip
        total = r["steps_seconds"] or 1.0
        for name, c in sorted(by_class(r["rows"]).items(), key=lambda kv: -kv[1]["seconds"]):
            lines.append(
                f"| {name} | {int(c['steps'])} | {c['seconds'] * 1e3:.3f} ms | "
                f"{c['bound_s'] * 1e3:.3f} ms | "
                f"{c['bound_s'] / c['seconds'] * 100 if c['seconds'] else 0:.0f}% | "
                f"{c['seconds'] / total * 100:.1f}% |"
            )
        lines += [
            "", f"The {TOP} steps that lose most against their bounds:", "",
            "| step | batch x M x N x K | kernel | time | bound | off by | pairs/s | bytes/s | "
            "share |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]  # fmt: skip
        worst = sorted(r["rows"], key=lambda row: row["bound_s"] - row["seconds"])[:TOP]
        for row in worst:
            b, m, n, k = row["shape"]
            off = row["seconds"] / row["bound_s"] if row["bound_s"] else math.inf
            lines.append(
                f"| {row['step']} | {b} x {m} x {n} x {k} | `{row['kernel']}` | "
                f"{row['seconds'] * 1e6:.1f} us | {row['bound_s'] * 1e6:.1f} us | {off:.1f}x | "
                f"{(row['pairs_per_s'] or 0) / 1e12:.3f} T | "
                f"{(row['bytes_per_s'] or 0) / 1e9:.0f} G | "
                f"{row['share'] * 100:.1f}% |"
            )
    if floor is not None:
        lines += [
            "", "### The batched 1024 x 64^3 f32 product beside its floor", "",
            "| product | its pairs at the probe | its bytes copied | the two added | "
            "of the probe |",
            "| --- | --- | --- | --- | --- |",
            f"| {floor['product_s'] * 1e6:.1f} us | {floor['pairs_at_probe_s'] * 1e6:.1f} us | "
            f"{floor['bytes_at_copy_s'] * 1e6:.1f} us | "
            f"{(floor['pairs_at_probe_s'] + floor['bytes_at_copy_s']) * 1e6:.1f} us | "
            f"{floor['of_probe'] * 100:.0f}% |",
        ]  # fmt: skip
    return "\n".join(lines) + "\n"


async def main(args: argparse.Namespace) -> None:
    began = time.perf_counter()
    facts = gpu_facts()
    label = facts["gpu"] + ("-published" if args.published else "")
    which = "published problems" if args.published else "networks of tropical_einsum.py"
    head = (
        f"# Tensor networks against their roofline, step by step: the {which}, {facts['gpu']}"
        f"\n\nDriver {facts['driver']}, CuPy {facts['cupy']}, {time.strftime('%Y-%m-%d')}. "
        "Each step's bound: the longer of its add+max pairs at the probe and the bytes it must "
        "move at the copy's bandwidth, both measured in this run; a network's roofline is "
        "their sum. program: the median `einsum_program(...).run_sync` (a CUDA-graph replay, to "
        "the synchronised result); eager: the median run of the same launches enqueued from "
        "the host; steps' sum: the launches' CUDA-event spans, medians, added.\n\n"
    )
    async with Compiler(concurrency=os.cpu_count() or 1) as compiler:
        figures = await tropical.device_figures(compiler=compiler, remeasure=True)
        floor = None if args.published else batched_floor(figures, 20)
        results: list[dict[str, Any]] = []
        for net in networks(args.published, args.paths, args.also):
            if time.perf_counter() - began > args.deadline:
                print(f"skipped (past --deadline): {net.name}, {net.planner}", flush=True)
                continue
            started = time.perf_counter()
            ready = await prepared(net, compiler)
            repeats = 1 if "unranked" in net.planner else args.repeats
            results.append(await asyncio.to_thread(profile, net, figures, repeats, ready))
            print(f"{results[-1]['network']}, {net.planner}: "
                  f"{time.perf_counter() - started:.1f} s", flush=True)  # fmt: skip
            del ready
            # Written after each network: a run cut short keeps what it measured.
            write(args.out, "einsum_roofline", label=label, facts=facts,
                  results={"figures": figures.to_json(), "networks": results, "batched": floor},
                  table=head + table(results, figures, floor))  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--published", action="store_true")
    parser.add_argument("--paths", type=Path, default=PUBLISHED_PATHS)
    parser.add_argument("--also", type=Path, nargs="*", default=[])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--deadline", type=float, default=math.inf,
                        help="seconds after which no further network is started")  # fmt: skip
    asyncio.run(main(parser.parse_args()))
