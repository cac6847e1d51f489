"""A network contracted whole and in slices on one GPU, with what each slice's compiled program
holds: the published problems (the 200- and 220-vertex random 3-regular graphs and the 38 x 38
king's subgraph at filling 0.8, their maximum independent sets) along their kept paths, in
slices of --slice-bytes.

    python benchmarks/sliced_programs.py [--out DIR] [--repeats 5] [--slice-log2 27]
        [--small]

For each network: the slices, the peak live set of a slice's intermediates along its order
(``EinsumPlan.live_elements``), the slice's program (``EinsumProgram.nbytes``, its arena's
bytes, placed by lifetimes, and its intermediates side by side as the steps place them, which a
program held before), whether the program cache keeps it (``MAX_PROGRAM_BYTES``: else the
slices launch their steps one by one); then median wall times to the value on the host, whole
and in slices, and with the assignment (``argmax=True``), each checked against the whole
value. ``--small`` takes the 60- and 80-vertex graphs and the 10 x 10 king's subgraph
(random-greedy orders) and slices of 2**9 bytes by default.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aionvrtc import tropical
from benchmarks._results import RESULTS, gpu_facts, median_s, write
from benchmarks.tropical_einsum import published


def measure(net: Any, args: argparse.Namespace) -> dict[str, Any]:
    import cupy

    from aionvrtc.tropical.networks import _programs

    arrays = [cupy.asarray(x) for x in net.operands]
    whole = tropical.einsum_plan(net.subscripts, *arrays, optimize=net.optimize)
    plan = tropical.einsum_plan(net.subscripts, *arrays, optimize=whole.path,
                                memory_limit=args.slice_bytes)  # fmt: skip
    assert plan.slicing is not None, f"{net.name}: not sliced at {args.slice_bytes} bytes"
    views = plan.slicing.views(plan.inputs, arrays, 0)
    each = tropical.einsum_plan(plan.slicing.subscripts, *views, optimize=list(plan.path))
    began = time.perf_counter()
    program = tropical.einsum_program_sync(
        plan.slicing.subscripts, *[v.shape for v in views], dtype=arrays[0].dtype,
        optimize=each, semiring=net.semiring,
    )  # fmt: skip
    made_s = time.perf_counter() - began
    # What a program held before its buffers were placed by lifetimes: its steps' blocks side
    # by side (the steps of a program are prepared so, then placed anew).
    every = program._steps.nbytes
    itemsize = arrays[0].dtype.itemsize

    def call(optimize: Any, argmax: bool = False) -> Any:
        got = tropical.einsum_sync(net.subscripts, *arrays, semiring=net.semiring,
                                   optimize=optimize, argmax=argmax)  # fmt: skip
        return float((got[0] if argmax else got).get())

    want = call(whole)
    times: dict[str, float] = {}
    for name, optimize, argmax in (("whole", whole, False), ("sliced", plan, False),
                                   ("whole_argmax", whole, True),
                                   ("sliced_argmax", plan, True)):  # fmt: skip
        for _ in range(3):  # planned, compiled, and the slices' program made and loaded
            assert call(optimize, argmax) == want, (net.name, name)
            time.sleep(0.5)
        times[name] = median_s(lambda o=optimize, a=argmax: call(o, a), args.repeats)
    row = {
        "network": net.name,
        "steps": len(whole.steps),
        "slices": plan.slicing.count,
        "slice_bytes": args.slice_bytes,
        "value": want,
        "live_bytes": each.live_elements * itemsize,
        "program_bytes": program.nbytes,
        "arena_bytes": program.arena_bytes,
        "every_intermediate_bytes": every,
        "program_bytes_before": program.nbytes - program.arena_bytes + every,
        "kept": program.nbytes <= _programs.MAX_PROGRAM_BYTES,
        "program_made_s": made_s,
        **{f"{name}_s": t for name, t in times.items()},
        "sliced_over_whole": times["sliced"] / times["whole"],
        "sliced_argmax_over_whole": times["sliced_argmax"] / times["whole_argmax"],
    }
    print(net.name, row, flush=True)
    return row


def table(f: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    mib = 1 << 20
    lines = [
        f"# Whole and in slices, with each slice's program, on {f['gpu']}",
        "",
        f"Driver {f['driver']}, CuPy {f['cupy']}, {f['date']}. A slice's program holds its "
        "inputs, its result and its arena, where the intermediates share bytes by their "
        "lifetimes along the graph's order; before, it held every intermediate at once. Median "
        "wall seconds to the value on the host, every value checked against the whole's.",
        "",
        "| network | slices | live set | program (arena) | before | kept | whole | in slices "
        "| whole, assignment | in slices, assignment |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['network']} | {r['slices']} | {r['live_bytes'] / mib:,.1f} MiB | "
            f"{r['program_bytes'] / mib:,.1f} MiB ({r['arena_bytes'] / mib:,.1f}) | "
            f"{r['program_bytes_before'] / mib:,.1f} MiB | {'yes' if r['kept'] else 'no'} | "
            f"{r['whole_s'] * 1e3:.1f} ms | {r['sliced_s'] * 1e3:.1f} ms "
            f"({r['sliced_over_whole']:.2f}x) | {r['whole_argmax_s'] * 1e3:.1f} ms | "
            f"{r['sliced_argmax_s'] * 1e3:.1f} ms ({r['sliced_argmax_over_whole']:.2f}x) |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--slice-log2", type=int, help="log2 of a slice's bytes (27; small 9)")
    parser.add_argument("--small", action="store_true")
    args = parser.parse_args()
    args.slice_bytes = 1 << (args.slice_log2 or (9 if args.small else 27))
    facts = gpu_facts()
    rows = [measure(net, args) for net in published(args.small)]
    label = facts["gpu"] + ("-small" if args.small else "")
    write(args.out, "sliced_programs", label=label, facts=facts, results=rows,
          table=table(facts, rows))  # fmt: skip


if __name__ == "__main__":
    main()
