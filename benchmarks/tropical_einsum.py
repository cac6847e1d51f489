"""Tensor networks contracted again and again, side by side in one run along the same path: a
compiled program replayed (``tropical.einsum_program``), with its assignment, the eager
``einsum_sync``, a JAX ``jit`` of the same pairwise steps (XLA fuses each step's broadcast sum
into its max) and PyTorch eager broadcasting; optionally the eager ``einsum_sync`` of an older
aionvrtc (``--baseline SRC``, in a process of its own). The networks of
examples/tensor_network.py.

    python benchmarks/tropical_einsum.py [--out DIR] [--regular 60 100 150] [--kings 10 15]
        [--spin-glass 100] [--repeats 30] [--baseline SRC] [--no-jax] [--no-torch]

Every engine's value is checked against the others' and (for the programs) the assignment
against the value. Times are wall times per call to the synchronised result, medians after a
warm-up. The first call of a program is timed from a plan of the path alone (no order search:
JAX is handed the same path) with the kernels compiled before (a warm cache): planning the
steps, preparing their launches, capturing the graph, one replay. The order search
(random-greedy) is timed apart.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aionvrtc import tropical
from benchmarks._results import RESULTS, gpu_facts, write

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "tensor_network.py"
# The published problems' kept paths (examples/tensor_network.py --paths).
PUBLISHED_PATHS = RESULTS / "tensor_network_published-paths.json"


def example() -> Any:
    spec = importlib.util.spec_from_file_location("tensor_network", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tensor_network"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def published(small: bool, *, kings: bool = True) -> list[Any]:
    """The published problems, each with its operands (NumPy) and its order: the maximum
    independent sets of the 200- and 220-vertex random 3-regular graphs and, with ``kings``, of
    the 38 x 38 king's subgraph at filling 0.8, along their kept paths; ``small``: the 60- and
    80-vertex graphs and the 10 x 10 king's subgraph, on random-greedy orders of their own."""
    tn = example()
    base = {"kings": [], "spin_glass": [], "square_spin_glass": [], "filling": 0.8,
            "seed": 2026, "trials": 64, "plan_time": 60.0}  # fmt: skip
    if small:
        return list(tn.networks(argparse.Namespace(
            regular=[60, 80], kings_subgraph=[10] if kings else [], planner="random-greedy",
            **base,
        )))  # fmt: skip
    nets = tn.networks(argparse.Namespace(
        regular=[200, 220], kings_subgraph=[38] if kings else [], planner="auto", **base,
    ))  # fmt: skip
    tn.use_paths(nets, json.loads(PUBLISHED_PATHS.read_text()), str(PUBLISHED_PATHS))
    nets = [net for net in nets if net.path_from]
    assert len(nets) == 2 + kings, "every published problem has a kept path"
    return nets


def median_ms(call: Callable[[], Any], sync: Callable[[], Any], repeats: int) -> float:
    call()
    sync()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e3


def paired_ms(
    first: Callable[[], Any], second: Callable[[], Any], sync: Callable[[], Any], repeats: int
) -> tuple[float, float]:
    """``median_ms`` of two calls taken in turn, ``repeats`` of each: a ratio of the two free
    of what drifts meanwhile (clocks, the host's other work)."""
    times: tuple[list[float], list[float]] = ([], [])
    for n in range(repeats + 1):
        for call, kept in ((first, times[0]), (second, times[1])):
            began = time.perf_counter()
            call()
            sync()
            if n:  # (the first of each: a warm-up)
                kept.append(time.perf_counter() - began)
    return statistics.median(times[0]) * 1e3, statistics.median(times[1]) * 1e3


def pairwise(
    plan: tropical.EinsumPlan, xp: Any, reduce: Callable[[Any, tuple[int, ...]], Any]
) -> Callable[..., Any]:
    """The scalar contraction along ``plan.path`` in an array library ``xp`` (jax.numpy,
    torch): each step the broadcast sum of its operands reduced over the indices nothing later
    needs, as a user of that library would write it."""
    inputs, output = list(plan.inputs), plan.output

    def expand(x: Any, have: str, union: str) -> Any:
        order = [have.index(i) for i in union if i in have]
        x = x.permute(*order) if hasattr(x, "permute") else xp.transpose(x, order)
        return x.reshape([plan.sizes[i] if i in have else 1 for i in union])

    def contract(*xs: Any) -> Any:
        live = list(zip(xs, inputs, strict=True))
        for positions in plan.path:
            chosen = [live[p] for p in positions]
            live = [t for n, t in enumerate(live) if n not in positions]
            keep = set(output).union(*(have for _, have in live))
            union = "".join(dict.fromkeys("".join(have for _, have in chosen)))
            total = None
            for x, have in chosen:
                part = expand(x, have, union)
                total = part if total is None else total + part
            summed = tuple(n for n, i in enumerate(union) if i not in keep)
            kept = "".join(i for i in union if i in keep)
            live.append((reduce(total, summed) if summed else total, kept))
        ((x, _),) = live
        return x

    return contract


def jax_engine(plan: tropical.EinsumPlan, maximise: bool) -> Callable[..., Any]:
    import jax
    import jax.numpy as jnp

    def reduce(x: Any, axes: tuple[int, ...]) -> Any:
        return jnp.max(x, axis=axes) if maximise else jnp.min(x, axis=axes)

    return jax.jit(pairwise(plan, jnp, reduce))  # type: ignore[no-any-return]


def torch_engine(plan: tropical.EinsumPlan, maximise: bool) -> Callable[..., Any]:
    import torch

    def reduce(x: Any, axes: tuple[int, ...]) -> Any:
        return torch.amax(x, dim=axes) if maximise else torch.amin(x, dim=axes)

    return pairwise(plan, torch, reduce)


def measure(module: Any, net: Any, args: argparse.Namespace) -> dict[str, Any]:  # noqa: PLR0915
    import cupy

    began = time.perf_counter()
    searched = tropical.einsum_plan(net.subscripts, *net.operands, optimize=net.optimize)
    planning_s = time.perf_counter() - began
    path = [tuple(p) for p in searched.path]
    arrays = [cupy.asarray(x) for x in net.operands]
    stream = cupy.cuda.get_current_stream()
    ring = net.semiring
    row: dict[str, Any] = {
        "network": net.name,
        "steps": len(searched.steps),
        "largest_intermediate": searched.largest_intermediate,
        "copies": searched.copies,
        "copied_elements": searched.copied_elements,
        "planning_s": planning_s,
    }
    # Kernels compiled (and loaded) before the first-call timing: a warm cache.
    value = float(tropical.einsum_sync(net.subscripts, *arrays, semiring=ring, optimize=searched))
    warm = tropical.einsum_program_sync(net.subscripts, *arrays, semiring=ring, optimize=path)
    tropical.einsum_program_sync(
        net.subscripts, *arrays, semiring=ring, optimize=path, argmax=True
    ).run_sync(*arrays)
    assert float(warm.run_sync(*arrays)) == value
    del warm
    # The first call of a new plan: planning the path's steps, preparing them, the capture.
    tropical.clear_programs()
    clear_plans()
    began = time.perf_counter()
    program = tropical.einsum_program_sync(net.subscripts, *arrays, semiring=ring, optimize=path)
    first = float(program.run_sync(*arrays))
    row["program_first_s"] = time.perf_counter() - began
    assert first == value, (first, value)
    row["program_bytes"] = program.nbytes
    sync = stream.synchronize
    with_assignment = tropical.einsum_program_sync(
        net.subscripts, *arrays, semiring=ring, optimize=path, argmax=True
    )
    got, assignment = with_assignment.run_sync(*arrays)
    assert float(got) == value
    row["assignment"] = module.check(net, value, assignment)
    # The value alone and with the assignment in turn (their ratio is a goal); then each
    # reading its inputs in place (no gather): the GPU's part and the host's.
    repeats = args.repeats * 4
    row["program_ms"], row["program_argmax_ms"] = paired_ms(
        lambda: program.run_sync(*arrays), lambda: with_assignment.run_sync(*arrays), sync,
        repeats,
    )  # fmt: skip
    row["program_bound_ms"], row["program_argmax_bound_ms"] = paired_ms(
        program.run_sync, with_assignment.run_sync, sync, repeats
    )
    row["program_host_us"] = host_us(lambda: program.run_sync(*arrays), sync, args.repeats)
    row["backtrace_us"] = backtrace_us(with_assignment, args.repeats)
    row["ops"] = program.launches
    row["program_copies"] = program.copies
    row["chain_floor_ms"] = chain_floor(row["ops"], args.repeats)
    plan = program.plan
    eager = args.repeats  # (as many as the older aionvrtc's: host time is noisy)
    row["eager_ms"] = median_ms(
        lambda: tropical.einsum_sync(net.subscripts, *arrays, semiring=ring, optimize=plan),
        stream.synchronize,
        eager,
    )
    row["eager_argmax_ms"] = median_ms(
        lambda: tropical.einsum_sync(
            net.subscripts, *arrays, semiring=ring, optimize=plan, argmax=True
        ),
        stream.synchronize,
        eager,
    )
    maximise = ring == "maxplus"
    if args.jax and len(plan.steps) <= args.jax_max_steps:
        import jax
        import numpy as np

        contract = jax_engine(plan, maximise)
        xs = [jax.device_put(np.asarray(x)) for x in net.operands]
        began = time.perf_counter()
        got_jax = float(contract(*xs).block_until_ready())
        row["jax_first_s"] = time.perf_counter() - began
        assert got_jax == value, (got_jax, value)
        row["jax_ms"] = median_ms(
            lambda: contract(*xs).block_until_ready(), lambda: None, args.repeats
        )
    if args.torch:
        import torch

        contract = torch_engine(plan, maximise)
        ts = [torch.tensor(x).cuda() for x in net.operands]  # (a copy: read-only arrays)
        got_torch = float(contract(*ts))
        assert got_torch == value, (got_torch, value)
        row["torch_ms"] = median_ms(lambda: contract(*ts), torch.cuda.synchronize, eager)
    row["value"] = value
    print(json.dumps(row), flush=True)
    return row


def host_us(call: Callable[[], Any], sync: Callable[[], Any], repeats: int) -> float:
    """The host's time to enqueue ``call`` (us), the GPU idle before each."""
    times = []
    for _ in range(repeats + 1):
        sync()
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    sync()
    return statistics.median(times[1:]) * 1e6


def backtrace_us(program: Any, repeats: int) -> float:
    """The GPU time of an argmax program's backtrace kernel alone (us, CUDA events): the launch
    its graph ends with (which walks the program's groups of steps, not the steps one by one)."""
    import cupy

    from aionvrtc.tropical.networks._steps import walks

    ((launcher, module, pointers),) = [
        launch for launch in program._units()[-1] if walks(launch[0])
    ]
    cupy.cuda.Device().synchronize()  # (the units' tables are uploaded on the current stream)
    stream = cupy.cuda.Stream(non_blocking=True)
    times = []
    for _ in range(repeats):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        launcher.run_pointers(module, pointers, stream)
        end.record(stream)
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) * 1e3)
    return float(statistics.median(times))


def chain_floor(count: int, repeats: int) -> float:
    """A CUDA graph of ``count`` empty kernels one after the other, replayed (ms): what a
    program of as many launches costs where none runs beside another."""
    import cupy

    empty = cupy.RawKernel('extern "C" __global__ void empty() {}', "empty")
    stream = cupy.cuda.Stream(non_blocking=True)
    empty((1,), (1,), (), stream=stream)
    stream.synchronize()
    stream.begin_capture()
    for _ in range(count):
        empty((1,), (1,), (), stream=stream)
    graph = stream.end_capture()
    graph.upload(stream)
    return median_ms(lambda: graph.launch(stream), stream.synchronize, repeats)


def clear_plans() -> None:
    from aionvrtc.tropical.networks import _planner, _steps

    _planner._plans.clear()
    _planner._cached_path.cache_clear()
    _steps._prepared.clear()


def baseline(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The eager einsum_sync (and its plans' copies) of the aionvrtc at ``--baseline``, in a
    process of its own: by network name."""
    env = {**os.environ, "PYTHONPATH": f"{args.baseline}:{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, __file__, "--eager-only", "--repeats", str(args.repeats),
               "--regular", *map(str, args.regular), "--kings", *map(str, args.kings),
               "--spin-glass", *map(str, args.spin_glass)]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {row["network"]: row for row in rows}


def eager_only(nets: Sequence[Any], repeats: int) -> None:
    """This aionvrtc's eager einsum_sync and plan copies, one JSON line a network."""
    import cupy

    for net in nets:
        plan = tropical.einsum_plan(net.subscripts, *net.operands, optimize=net.optimize)
        arrays = [cupy.asarray(x) for x in net.operands]
        stream = cupy.cuda.get_current_stream()

        def call(net: Any = net, plan: Any = plan, arrays: Any = arrays) -> Any:
            return tropical.einsum_sync(
                net.subscripts, *arrays, semiring=net.semiring, optimize=plan
            )

        ms = median_ms(call, stream.synchronize, repeats)
        print(json.dumps({"network": net.name, "eager_ms": ms, "copies": plan.copies}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--regular", type=int, nargs="*", default=[60, 100, 150])
    parser.add_argument("--kings", type=int, nargs="*", default=[10, 15])
    # (150 spins: JAX's first call alone takes minutes)
    parser.add_argument("--spin-glass", type=int, nargs="*", default=[100])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--baseline", type=Path, default=None)
    parser.add_argument("--no-jax", dest="jax", action="store_false")
    parser.add_argument("--no-torch", dest="torch", action="store_false")
    parser.add_argument("--eager-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--jax-max-steps", type=int, default=1 << 30)
    parser.add_argument("--baseline-log", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--label", default="")
    parser.add_argument(
        "--combine", type=Path, nargs="*", default=None,
        help="results (JSON) of runs on one GPU to write as one table; no GPU needed",
    )  # fmt: skip
    args = parser.parse_args()
    if args.combine:
        runs = [json.loads(path.read_text()) for path in args.combine]
        facts, rows = runs[0]["facts"], [row for run in runs for row in run["results"]]
        if args.baseline_log:  # the --eager-only lines of the older aionvrtc's run
            lines = args.baseline_log.read_text().splitlines()
            before = {r["network"]: r for r in map(json.loads, lines) if r}
            for row in rows:
                if row["network"] in before:
                    row["baseline_eager_ms"] = before[row["network"]]["eager_ms"]
                    row["baseline_copies"] = before[row["network"]]["copies"]
        slug = facts["gpu"] + (f"-{args.label}" if args.label else "")
        write(args.out, "tropical_einsum", label=slug, facts=facts, results=rows,
              table=render(rows, facts))  # fmt: skip
        return
    module = example()
    nets = module.networks(
        argparse.Namespace(
            regular=args.regular, kings=args.kings, spin_glass=args.spin_glass, trials=64,
            planner="random-greedy", seed=2026, kings_subgraph=[], filling=0.8,
            square_spin_glass=[], plan_time=60.0,
        )
    )  # fmt: skip
    if args.eager_only:
        eager_only(nets, args.repeats)
        return
    before = baseline(args) if args.baseline else {}
    facts = gpu_facts()
    rows = []
    for net in nets:
        row = measure(module, net, args)
        if net.name in before:
            row["baseline_eager_ms"] = before[net.name]["eager_ms"]
            row["baseline_copies"] = before[net.name]["copies"]
        rows.append(row)
    table = render(rows, facts)
    slug = facts["gpu"] + (f"-{args.label}" if args.label else "")
    write(args.out, "tropical_einsum", label=slug, facts=facts, results=rows, table=table)


def render(rows: Sequence[dict[str, Any]], facts: dict[str, Any]) -> str:
    def ms(row: dict[str, Any], key: str) -> str:
        return f"{row[key]:.2f}" if key in row else "-"

    lines = [
        f"# Tensor networks contracted again and again, {facts['gpu']}",
        "",
        f"Driver {facts['driver']}, CuPy {facts['cupy']}, NVRTC {facts['nvrtc']}, "
        f"{facts['date']}. The networks of examples/tensor_network.py (seed 2026, PYTHONHASHSEED "
        "0; random-greedy 64 trials, king's graphs row by row), every engine on the same "
        "pairwise path. Wall time per call to the synchronised result, medians (ms). program: "
        "`einsum_program(...).run_sync(*operands)`, a CUDA-graph replay; its first call (s): "
        "planning the path's steps, preparing, capturing, one replay, kernels compiled before; "
        "with assignment: `argmax=True`, its calls taken in turn with the value's. "
        "JAX: `jax.jit` of the pairwise steps (first call: trace and compile). eager: "
        "`einsum_sync`; before: the eager call of the aionvrtc before compiled programs. "
        "launches: the kernels of the program's graph (products, copies; a chain of small steps "
        "is contracted in one, and a level's small groups of steps share one per size), and a "
        "graph of as many empty kernels in a chain, replayed.",
        "",
        "| network | steps | launches (chain of as many empty) | copies (before), in the program "
        "| program "
        "| with assignment | JAX jit | program / JAX | first call s (JAX) | eager (before) "
        "| PyTorch eager |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        ratio = f"{r['program_ms'] / r['jax_ms']:.2f}" if "jax_ms" in r else "-"
        jax_first = f"{r['jax_first_s']:.1f}" if "jax_first_s" in r else "-"
        before = f" ({r['baseline_eager_ms']:.1f})" if "baseline_eager_ms" in r else ""
        copies = f" ({r['baseline_copies']})" if "baseline_copies" in r else ""
        copies += f", {r['program_copies']} launched" if "program_copies" in r else ""
        assignment = r["program_argmax_ms"] / r["program_ms"]
        lines.append(
            f"| {r['network']} | {r['steps']} | {r['ops']} ({r['chain_floor_ms']:.2f}) | "
            f"{r['copies']}{copies} | {r['program_ms']:.2f} | "
            f"{r['program_argmax_ms']:.2f} ({assignment:.2f}x) | {ms(r, 'jax_ms')} | {ratio} | "
            f"{r['program_first_s']:.3f} ({jax_first}) | {r['eager_ms']:.1f}{before} | "
            f"{ms(r, 'torch_ms')} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
