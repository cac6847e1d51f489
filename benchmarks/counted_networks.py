"""Counting on the GPU along the published problems' kept paths: the number of maximum independent
sets of the 200- and 220-vertex random 3-regular graphs and of the 38 x 38 king's subgraph, their
3 best sizes with their counts, and the ground-state count of the L x L spin glass (couplings
+-1) for L = 20 and 25, each beside the value's time along the same path in the same run; and
where at most LISTED configurations attain the optimum, every one listed on the GPU
(``tropical.configurations``).

    python benchmarks/counted_networks.py [--out DIR] [--repeats 3] [--small] [--only WORD ...]

Each count is checked by a second run along another slicing of the same order (``memory_limit``
a quarter of the largest intermediate): slices join their counts as the products do, so equal
counts from both say the joins and the steps agree. ``--small`` runs small instances (60- and
80-vertex graphs, 10 x 10 king's subgraph, L = 8 and 10), each also against the NumPy reference
(the configurations too, timed on this host's CPU beside the GPU's).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from aionvrtc import tropical
from aionvrtc.tropical import reference
from benchmarks._results import RESULTS, gpu_facts, median_s, write
from benchmarks.tropical_einsum import example, published

# The most optimal configurations listed (tropical.configurations' limit).
LISTED = 100_000
# The most the NumPy reference lists beside them (--small): its walk takes a row at a time, 80 s
# for the 10 x 10 king's subgraph's 14,786 on 2 vCPUs.
CPU_LISTED = 1_000


def instances(small: bool) -> list[Any]:
    """The networks, each with its operands (NumPy) and its order: the published problems along
    their kept paths, and the square spin glasses swept row by row."""
    mis = published(small)
    tn = example()
    base = {"kings": [], "spin_glass": [], "filling": 0.8, "seed": 2026, "trials": 64,
            "plan_time": 60.0}  # fmt: skip
    sides = [8, 10] if small else [20, 25]
    glasses = tn.networks(argparse.Namespace(
        regular=[], kings_subgraph=[], square_spin_glass=sides, planner="rows", **base,
    ))  # fmt: skip
    return [*mis, *glasses]


def timed(call: Any, repeats: int) -> tuple[float, Any]:
    """Median seconds of ``call`` with the GPU's work done, and its last result."""
    import cupy

    found: list[Any] = []

    def once() -> None:
        found[:] = [call()]
        cupy.cuda.get_current_stream().synchronize()

    once()  # compiles and loads every kernel first
    return median_s(once, repeats), found[0]


def host_count(count: Any) -> int:
    """A count as Python's int: a CuPy int64, or past it Python's int in a NumPy array."""
    return int(count.get()) if hasattr(count, "get") else int(count[()])


def measure(net: Any, repeats: int, small: bool) -> dict[str, Any]:
    import cupy

    arrays = [cupy.asarray(x) for x in net.operands]
    began = time.perf_counter()
    plan = tropical.einsum_plan(net.subscripts, *arrays, optimize=net.optimize)
    planning = time.perf_counter() - began
    ring = net.semiring

    def value() -> Any:
        return tropical.einsum_sync(net.subscripts, *arrays, semiring=ring, optimize=plan)

    def counted() -> Any:
        return tropical.einsum_sync(net.subscripts, *arrays, semiring=ring, optimize=plan,
                                    count=True)  # fmt: skip

    def best3() -> Any:
        return tropical.einsum_sync(net.subscripts, *arrays, semiring=ring, optimize=plan, top=3)

    value_s, found = timed(value, repeats)
    counted_s, (counted_value, count) = timed(counted, repeats)
    top_s, (values, counts) = timed(best3, repeats)
    # Compiled: the value's program beside the counted one's (each a CUDA graph replayed).
    began = time.perf_counter()
    counting = tropical.counted_program_sync(net.subscripts, *arrays, semiring=ring,
                                             optimize=plan)  # fmt: skip
    counted_making = time.perf_counter() - began
    valuing = tropical.einsum_program_sync(net.subscripts, *arrays, semiring=ring, optimize=plan)
    value_program_s, replayed = timed(lambda: valuing.run_sync(*arrays), repeats)
    counted_program_s, (_, replayed_count) = timed(lambda: counting.run_sync(*arrays), repeats)
    assert float(replayed) == float(found), net.name
    assert float(counted_value) == float(found), (net.name, counted_value, found)
    assert float(values.get()[0]) == float(found), net.name
    total = host_count(count)
    assert host_count(replayed_count) == total, (net.name, host_count(replayed_count), total)
    assert int(counts.get()[0]) in (total, -1), net.name  # (-1: past int64, the lists' mark)
    # Another slicing of the same order: the counts joined over slices must agree.
    quarter = max(1, plan.largest_intermediate // 4) * arrays[0].itemsize
    try:
        sliced = tropical.einsum_plan(net.subscripts, *arrays, optimize=plan.path,
                                      memory_limit=quarter)  # fmt: skip
    except ValueError:  # no slicing of this order fits a quarter: half
        sliced = tropical.einsum_plan(net.subscripts, *arrays, optimize=plan.path,
                                      memory_limit=2 * quarter)  # fmt: skip
    again = tropical.einsum_sync(net.subscripts, *arrays, semiring=ring, optimize=sliced,
                                 count=True)  # fmt: skip
    assert host_count(again[1]) == total, (net.name, host_count(again[1]), total)
    row: dict[str, Any] = {
        "network": net.name,
        "planner": net.planner + (f" (path from {net.path_from})" if net.path_from else ""),
        "planning_s": planning,
        "steps": len(plan.steps),
        "largest_intermediate": plan.largest_intermediate,
        "value": float(found),
        "count": total,
        "best3": [[float(v), int(c)] for v, c in zip(values.get(), counts.get(), strict=True)],
        "value_s": value_s,
        "counted_s": counted_s,
        "top3_s": top_s,
        "counted_over_value": counted_s / value_s,
        "top3_over_value": top_s / value_s,
        "value_program_s": value_program_s,
        "counted_program_s": counted_program_s,
        "counted_program_over_value_program": counted_program_s / value_program_s,
        "counted_program_making_s": counted_making,
        "counted_program_bytes": counting.nbytes,
        "value_program_bytes": valuing.nbytes,
        "second_slicing": str(sliced.slicing.indices if sliced.slicing else None),
    }
    listed: Any = None
    if 0 < total <= LISTED and plan.slicing is None:  # every optimum, listed on the GPU
        row["configurations_s"], (_, _, listed) = timed(
            lambda: tropical.configurations_sync(net.subscripts, *arrays, semiring=ring,
                                                 optimize=plan, limit=LISTED),
            repeats,
        )  # fmt: skip
        assert len(listed) == total, (net.name, len(listed), total)
    if small:  # the NumPy reference along the same order
        want_value, want = reference.einsum(net.subscripts, *net.operands, semiring=ring,
                                            path=plan.path, count=True)  # fmt: skip
        assert (float(want_value), int(want)) == (row["value"], total), net.name
        if listed is not None and total <= CPU_LISTED:
            began = time.perf_counter()
            _, _, rows = reference.configurations(net.subscripts, *net.operands, semiring=ring,
                                                  path=plan.path, limit=LISTED)  # fmt: skip
            row["configurations_cpu_s"] = time.perf_counter() - began
            assert rows.tolist() == listed.get().tolist(), net.name
        row["reference"] = "agrees"
    shown = ("value", "count", "value_s", "counted_s", "top3_s", "value_program_s",
             "counted_program_s", "counted_program_bytes", "configurations_s")  # fmt: skip
    print(net.name, {k: row.get(k) for k in shown}, flush=True)
    return row


def table(f: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    lines = [
        f"# Counting on {f['gpu']}",
        "",
        f"Driver {f['driver']}, CuPy {f['cupy']}, NVRTC {f['nvrtc']}, {f['date']}. Each "
        "network along its kept path (the square spin glasses swept row by row), median "
        "seconds with the GPU's work done: the value (`einsum`), the value with its count "
        "(`count=True`) and the 3 best sizes with their counts (`top=3`), each launched step "
        "by step; then compiled, the value's program (`einsum_program`) beside the counted "
        "one's (`counted_program`), each a CUDA graph replayed. Each count agreed with a "
        "second run in other slices of the same order, and with the counted program's. Every "
        f"optimal configuration listed (`configurations`, where at most {LISTED:,}), beside "
        f"the NumPy reference's on the CPU where it ran (`--small`, at most {CPU_LISTED:,}).",
        "",
        "| network | value | count | 3 best (count) | value | counted | 3 best | value, "
        "program | counted, program | every optimum |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        best = ", ".join(f"{v:g} ({c:,})" for v, c in r["best3"])
        every = "-"
        if "configurations_s" in r:
            every = f"{r['configurations_s'] * 1e3:.1f} ms"
        if "configurations_cpu_s" in r:
            every += f" (CPU {r['configurations_cpu_s'] * 1e3:.1f} ms)"
        lines.append(
            f"| {r['network']} | {r['value']:g} | {r['count']:,} | {best} | "
            f"{r['value_s'] * 1e3:.1f} ms | {r['counted_s'] * 1e3:.1f} ms "
            f"({r['counted_over_value']:.1f}x) | {r['top3_s'] * 1e3:.1f} ms "
            f"({r['top3_over_value']:.1f}x) | {r['value_program_s'] * 1e3:.1f} ms | "
            f"{r['counted_program_s'] * 1e3:.1f} ms "
            f"({r['counted_program_over_value_program']:.1f}x) | {every} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--small", action="store_true", help="small instances, and the reference")
    parser.add_argument("--only", nargs="*", default=[], help="the networks whose names hold these")
    args = parser.parse_args()
    chosen = [
        n for n in instances(args.small) if not args.only or any(w in n.name for w in args.only)
    ]
    if not chosen:
        parser.error(f"no network's name holds any of {args.only}")
    f = gpu_facts()
    label = f["gpu"] + ("-small" if args.small else "")
    rows: list[dict[str, Any]] = []
    for net in chosen:
        began = time.perf_counter()
        rows.append(measure(net, args.repeats, args.small))
        print(f"{net.name}: {time.perf_counter() - began:.1f} s", flush=True)
        # Written after each network, so that a run cut short keeps what it measured.
        write(args.out, "counted_networks", label=label, facts=f, results=rows,
              table=table(f, rows))  # fmt: skip


if __name__ == "__main__":
    main()
