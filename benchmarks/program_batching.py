"""Many weighted queries of one network from concurrent tasks: a server's calls of one compiled
program, alone, joined by ``ProgramBatcher``, as one batched program, and as JAX's ``jit`` of
``vmap`` over the same order, in one process on one GPU.

    python benchmarks/program_batching.py [--side 10] [--tasks 64] [--queries 4096] [--out DIR]
        [--no-jax]

The network: the maximum weighted independent set of a side x side king's graph
(``tropical.problems.independent_set``), each query with its own vertex weights (integers 1 to
9, exact in float32), the edges' tensors shared. Rows:

- ``program.run``: each task awaits its own call, then reads its value (a server's answer on
  the host): the calls replay one after another.
- ``ProgramBatcher`` (the edges' tensors given once, ``shared=``; warmed ahead), value only
  and with the assignment: each call passes its vertices' tensors, the calls of a moment
  joined into one replay of a batched program.
- the batched program on stacked weights (``einsum_program(..., batch=64)``): the ``vmap``
  form, one call per batch of 64 queries, values read back.
- JAX: ``jax.jit(jax.vmap(f))`` of the pairwise steps along the same path, ``f`` taking one
  query's (n, 2) array of vertex tensors (the edges' tensors its constants), on the same
  stacked weights, values read back (``block_until_ready`` and the copy to the host).

Per row: queries/s and, for the served rows, p50 and p99 latency. Values of the first queries
are checked against the NumPy reference, and JAX's against ours. Writes
results/program_batching-<gpu>.{json,md}.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._results import RESULTS, gpu_facts, median_s, write
from benchmarks.tropical_einsum import pairwise

CHECKED = 4  # queries per row checked against the NumPy reference


def kings_edges(side: int) -> list[tuple[int, int]]:
    return [
        (r * side + c, (r + dr) * side + c + dc)
        for r in range(side)
        for c in range(side)
        for dr, dc in ((0, 1), (1, -1), (1, 0), (1, 1))
        if 0 <= r + dr < side and 0 <= c + dc < side
    ]


async def served(run: Any, queries: list[list[Any]], tasks: int, argmax: bool) -> dict[str, Any]:
    """``queries`` served by ``tasks`` tasks, each awaiting ``run`` for its share one after
    another and reading its value on the host."""
    import anyio

    import aionvrtc

    latencies = [0.0] * len(queries)
    values = [0.0] * len(queries)

    async def serve(first: int) -> None:
        for number in range(first, len(queries), tasks):
            began = time.perf_counter()
            done = await run(*queries[number])
            value = done[0] if argmax else done
            await aionvrtc.synchronize()
            values[number] = float(value.get())
            latencies[number] = time.perf_counter() - began

    began = time.perf_counter()
    async with anyio.create_task_group() as group:
        for first in range(tasks):
            group.start_soon(serve, first)
    seconds = time.perf_counter() - began
    ordered = sorted(latencies)
    return {
        "queries_per_second": len(queries) / seconds,
        "p50_ms": 1e3 * ordered[len(ordered) // 2],
        "p99_ms": 1e3 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "values": values,
    }


def jax_row(
    plan: Any, stacked: list[Any], n: int, args: argparse.Namespace, check: Any
) -> dict[str, Any]:
    """JAX's jit of vmap over the pairwise steps along ``plan``'s path, as a JAX user writes a
    query: one (n, 2) array of the vertices' tensors, the edges' tensors constants of the
    function; on the same stacked weights (one (batch, n, 2) array)."""
    import jax
    import jax.numpy as jnp

    def reduce(x: Any, axes: tuple[int, ...]) -> Any:
        return jnp.max(x, axis=axes)

    contract_all = pairwise(plan, jnp, reduce)
    edges = [jnp.asarray(x.get()) for x in stacked[n:]]

    def query(vertices: Any) -> Any:
        return contract_all(*(vertices[v] for v in range(n)), *edges)

    contract = jax.jit(jax.vmap(query))
    weights = np.stack([x.get() for x in stacked[:n]], axis=1)  # (batch, n, 2)
    on_jax = jax.device_put(weights)
    began = time.perf_counter()
    first = np.asarray(contract(on_jax).block_until_ready())
    jax_first = time.perf_counter() - began
    check("JAX", [float(x) for x in first])

    def theirs() -> Any:
        return np.asarray(contract(on_jax).block_until_ready())

    theirs()  # (a warm-up)
    seconds = median_s(theirs, args.repeats)
    return {"row": f"JAX jit(vmap), {args.tasks} stacked queries",
            "queries_per_second": args.tasks / seconds, "batch_ms": 1e3 * seconds,
            "first_seconds": jax_first}  # fmt: skip


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    import cupy

    from aionvrtc import tropical

    edges = kings_edges(args.side)
    n = args.side * args.side
    rng = np.random.default_rng(20261207)
    weights = rng.integers(1, 10, size=(args.queries, n)).astype(np.float32)
    base = tropical.problems.independent_set(edges, [1.0] * n, vertices=range(n))
    vertices = list(range(n))  # the operands that vary: the vertices' tensors, first
    shared = [cupy.asarray(x) for x in base.operands]
    queries = []
    for w in weights:
        own = cupy.asarray(np.stack([np.zeros(n, np.float32), w], axis=1))
        queries.append([own[v] for v in vertices] + shared[n:])
    plan = tropical.einsum_plan(base.subscripts, *base.operands)  # every row's order
    program = await tropical.einsum_program(base.subscripts, *queries[0], optimize=plan)

    def reference(number: int) -> float:
        operands = [np.array([0, x], np.float32) for x in weights[number]]
        operands += [np.asarray(x) for x in base.operands[n:]]
        return float(tropical.reference.einsum(base.subscripts, *operands, path=plan.path))

    want = [reference(q) for q in range(CHECKED)]
    rows: list[dict[str, Any]] = []

    def check(name: str, values: list[float]) -> None:
        if values[:CHECKED] != want:
            raise AssertionError(f"{name}: {values[:CHECKED]} on the GPU, reference {want}")

    # Warm every path first (the program's replays, the batched programs, CuPy's kernels).
    await served(program.run, queries[: args.tasks], args.tasks, argmax=False)
    alone = await served(program.run, queries, args.tasks, argmax=False)
    check("program.run", alone.pop("values"))
    rows.append({"row": "program.run, each call alone", **alone})

    for argmax in (False, True):
        made = await tropical.einsum_program(
            base.subscripts, *queries[0], argmax=argmax, optimize=plan
        )
        given = {n + i: x for i, x in enumerate(shared[n:])}  # once: a call passes its own
        batcher = tropical.ProgramBatcher(made, max_batch=args.tasks, shared=given)
        began = time.perf_counter()
        await batcher.warm()
        warmed = time.perf_counter() - began
        own = [q[:n] for q in queries]
        await served(batcher.run, own[: args.tasks], args.tasks, argmax=argmax)
        before = batcher.stats()
        joined = await served(batcher.run, own, args.tasks, argmax=argmax)
        after = batcher.stats()
        check("ProgramBatcher", joined.pop("values"))
        rows.append({
            "row": "ProgramBatcher" + (", with the assignment" if argmax else ""),
            **joined,
            "replays": after.replays - before.replays,
            "standins": after.standins - before.standins,
            "warm_seconds": warmed,
        })  # fmt: skip

    batch = args.tasks
    stacked = [
        cupy.asarray(np.stack([np.zeros((batch, n), np.float32), weights[:batch]], axis=2)[:, v])
        for v in vertices
    ] + shared[n:]
    batched = await tropical.einsum_program(
        base.subscripts, *queries[0], batch=batch, batched=vertices, optimize=plan
    )

    def ours() -> Any:
        return batched.run_sync(*stacked).get()

    got = ours()
    check("batched program", [float(x) for x in got])
    seconds = median_s(ours, args.repeats)  # (ours() ran once: its check)
    rows.append({"row": f"batched program, {batch} stacked queries", "queries_per_second":
                 batch / seconds, "batch_ms": 1e3 * seconds})  # fmt: skip

    if args.jax:
        rows.append(jax_row(plan, stacked, n, args, check))
    return {"rows": rows, "steps": len(plan.steps), "vertices": n, "edges": len(edges)}


def table(facts: dict[str, Any], measured: dict[str, Any], args: argparse.Namespace) -> str:
    rows = measured["rows"]
    jax_rate = next((r["queries_per_second"] for r in rows if r["row"].startswith("JAX")), None)
    lines = [
        f"# Many weighted queries of one network, {facts['gpu']}",
        "",
        f"The maximum weighted independent set of a {args.side} x {args.side} king's graph "
        f"({measured['vertices']} vertices, {measured['edges']} edges, {measured['steps']} "
        f"steps), each query with its own vertex weights: {args.queries} queries from "
        f"{args.tasks} tasks (each awaits its call, then reads its value on the host), or "
        f"batches of {args.tasks} stacked queries (median of {args.repeats}, values read "
        f"back). {facts['date']}, aionvrtc {facts['aionvrtc']}, CuPy {facts['cupy']}, NVRTC "
        f"{facts['nvrtc']}" + (f", JAX {facts['jax']}" if "jax" in facts else "") + ".",
        "",
        "| how | queries/s | p50 ms | p99 ms | replays | vs JAX |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ratio = f"{r['queries_per_second'] / jax_rate:.2f}x" if jax_rate else "-"
        p50 = f"{r['p50_ms']:.2f}" if "p50_ms" in r else "-"
        p99 = f"{r['p99_ms']:.2f}" if "p99_ms" in r else "-"
        replays = f"{r['replays']:,}" if "replays" in r else "-"
        lines.append(
            f"| {r['row']} | {r['queries_per_second']:,.0f} | {p50} | {p99} | {replays} | {ratio} |"
        )
    lines += [
        "",
        f"The first {CHECKED} queries' values of every row matched the NumPy reference "
        "(`tropical.reference.einsum` along the same path).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--side", type=int, default=10)
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--queries", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--no-jax", dest="jax", action="store_false")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    import anyio

    measured = anyio.run(measure, args)
    facts = gpu_facts()
    if args.jax:
        import jax

        facts["jax"] = jax.__version__
    write(args.out, "program_batching", label=facts["gpu"], facts=facts, results=measured,
          table=table(facts, measured, args))  # fmt: skip


if __name__ == "__main__":
    main()
