"""A network contracted again through Ray: the direct call on one GPU (``tropical.einsum``,
in slices), ``tropical.cluster.einsum`` (the slices as Ray tasks, every call putting the
operands and planning again), and a ``tropical.cluster.Contraction`` called again (the
operands put once, actors holding the plan, the operands and the programs), side by side in
one run on a local Ray cluster of this machine's GPUs: the maximum independent sets of the
published random 3-regular graphs (200 and 220 vertices) along their kept paths, in slices of
--slice-bytes.

    python benchmarks/cluster_contraction.py [--out DIR] [--repeats 5] [--slice-bytes 2**27]
        [--small] [--backend cupy|numpy]

Each value is checked against the direct call's. ``--small`` takes the 60- and 80-vertex
graphs (random-greedy orders); ``--backend numpy`` runs the cluster's actors and tasks with the
NumPy reference on CPU workers (the direct call then too): a smoke test for machines without
GPUs, its times not the GPU's.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aionvrtc import tropical
from aionvrtc.tropical import reference
from benchmarks._results import RESULTS, gpu_facts, median_s, write
from benchmarks.tropical_einsum import published


def measure(net: Any, args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from aionvrtc.tropical import cluster

    whole = tropical.einsum_plan(net.subscripts, *net.operands, optimize=net.optimize)
    plan = tropical.einsum_plan(net.subscripts, *net.operands, optimize=whole.path,
                                memory_limit=args.slice_bytes)  # fmt: skip
    slices = plan.slicing.count if plan.slicing is not None else 1
    ring = net.semiring
    if args.backend == "cupy":
        import cupy

        arrays = [cupy.asarray(x) for x in net.operands]

        def direct() -> Any:
            value = tropical.einsum_sync(net.subscripts, *arrays, semiring=ring, optimize=plan)
            return float(value.get())
    else:

        def direct() -> Any:
            return float(reference.einsum(net.subscripts, *net.operands, semiring=ring,
                                          path=plan.path))  # fmt: skip

    want = direct()  # (compiles and plans first)
    direct_s = median_s(direct, args.repeats)

    def tasks() -> Any:
        return float(cluster.einsum(net.subscripts, *net.operands, semiring=ring, optimize=plan,
                                    backend=args.backend))  # fmt: skip

    assert tasks() == want, net.name
    tasks_s = median_s(tasks, args.repeats)
    with cluster.Contraction(net.subscripts, *net.operands, semiring=ring, optimize=plan,
                             backend=args.backend, actors=1) as held:  # fmt: skip
        assert float(held()) == want, net.name  # (the actor fetches, plans and compiles)
        held_s = median_s(lambda: float(held()), args.repeats)
        changed = list(net.operands)
        changed[0] = changed[0].copy()  # equal: nothing put again
        again_s = median_s(lambda: float(held(*changed)), args.repeats)
    del ray
    row = {
        "network": net.name,
        "slices": slices,
        "slice_bytes": args.slice_bytes,
        "value": want,
        "direct_s": direct_s,
        "tasks_s": tasks_s,
        "contraction_s": held_s,
        "contraction_given_s": again_s,
        "tasks_over_direct": tasks_s / direct_s,
        "contraction_over_direct": held_s / direct_s,
    }
    print(net.name, row)
    return row


def table(f: dict[str, Any], backend: str, rows: list[dict[str, Any]]) -> str:
    where = f["gpu"] if backend == "cupy" else "CPU workers (the NumPy reference)"
    lines = [
        f"# A contraction called again through Ray, on {where}",
        "",
        f"Driver {f['driver']}, CuPy {f['cupy']}, {f['date']}. A local Ray cluster of this "
        "machine; median seconds of each call to its value on the host: the direct call "
        "(`tropical.einsum` in the plan's slices), `tropical.cluster.einsum` (the slices as Ray "
        "tasks) and a `tropical.cluster.Contraction` called again (one actor), with no "
        "operands and with every operand given anew (equal: none put again).",
        "",
        "| network | slices | direct | cluster.einsum | Contraction | Contraction, operands "
        "given |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['network']} | {r['slices']} | {r['direct_s'] * 1e3:.1f} ms | "
            f"{r['tasks_s'] * 1e3:.1f} ms ({r['tasks_over_direct']:.2f}x) | "
            f"{r['contraction_s'] * 1e3:.1f} ms ({r['contraction_over_direct']:.2f}x) | "
            f"{r['contraction_given_s'] * 1e3:.1f} ms |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    import ray

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--slice-bytes", type=int, default=2**27)
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--backend", choices=["cupy", "numpy"], default="cupy")
    args = parser.parse_args()
    gpus = 0
    if args.backend == "cupy":
        import cupy

        gpus = cupy.cuda.runtime.getDeviceCount()
    ray.init(num_cpus=2, num_gpus=gpus, include_dashboard=False, logging_level=logging.ERROR)
    try:
        rows = [measure(net, args) for net in published(args.small, kings=False)]
    finally:
        ray.shutdown()
    f = gpu_facts() if args.backend == "cupy" else {
        "gpu": "cpu", "driver": "-", "cupy": "-", "date": "-"}  # fmt: skip
    label = f["gpu"] + ("-small" if args.small else "")
    write(args.out, "cluster_contraction", label=label, facts=f, results=rows,
          table=table(f, args.backend, rows))  # fmt: skip


if __name__ == "__main__":
    main()
