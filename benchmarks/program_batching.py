"""Many weighted queries of one network from concurrent tasks: a server's calls of one compiled
program, alone, joined by ``ProgramBatcher``, as one batched program, and as JAX's ``jit`` of
``vmap`` over the same order, in one process on one GPU.

    python benchmarks/program_batching.py [--side 10] [--tasks 64] [--queries 4096] [--out DIR]
        [--no-jax] [--profile FILE]

The network: the maximum weighted independent set of a side x side king's graph
(``tropical.problems.independent_set``), each query with its own vertex weights (integers 1 to
9, exact in float32), the edges' tensors shared. Rows:

- ``program.run``: each task awaits its own call, then reads its value (a server's answer on
  the host): the calls replay one after another.
- ``ProgramBatcher`` (the edges' tensors given once, ``shared=``; warmed ahead): each call
  passes its vertices' tensors, one array each or stacked as one (n, 2) array
  (``stacked=True``), the calls of a moment joined into one replay of a batched program;
  values on the GPU (each task waits and reads its own) or on the host (``host=True``: the
  batch's read once); ``max_batch`` the tasks, or half (two groups in flight); value only,
  and with the assignment.
- the batched program on stacked weights (``einsum_program(..., batch=64)``): the ``vmap``
  form, one call per batch of 64 queries, values read back.
- JAX: ``jax.jit(jax.vmap(f))`` of the pairwise steps along the same path, ``f`` taking one
  query's (n, 2) array of vertex tensors (the edges' tensors its constants), on the same
  stacked weights, values read back (``block_until_ready`` and the copy to the host).

Per row: queries/s, for the served rows p50 and p99 latency, and the seconds before the first
query (JAX's first call compiles). Values of the first queries are checked against the NumPy
reference, and JAX's against ours. Writes results/program_batching-<gpu>.{json,md}; with
``--profile``, the host's time in a ProgramBatcher's calls by function (cProfile).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._results import RESULTS, gpu_facts, median_s, write
from benchmarks.tropical_einsum import pairwise

CHECKED = 4  # queries per row checked against the NumPy reference
STARTED = time.perf_counter()


def progress(what: str) -> None:
    """A line on stderr as each part ends (a call that runs out of time shows how far it got)."""
    print(f"{time.perf_counter() - STARTED:8.1f} s  {what}", file=sys.stderr, flush=True)


def kings_edges(side: int) -> list[tuple[int, int]]:
    return [
        (r * side + c, (r + dr) * side + c + dc)
        for r in range(side)
        for c in range(side)
        for dr, dc in ((0, 1), (1, -1), (1, 0), (1, 1))
        if 0 <= r + dr < side and 0 <= c + dc < side
    ]


async def served(
    run: Any, queries: list[list[Any]], tasks: int, *, argmax: bool, on_host: bool = False
) -> dict[str, Any]:
    """``queries`` served by ``tasks`` tasks, each awaiting ``run`` for its share one after
    another and reading its value on the host (``on_host``: ``run`` brought it there)."""
    import anyio

    import aionvrtc

    latencies = [0.0] * len(queries)
    values = [0.0] * len(queries)

    async def serve(first: int) -> None:
        for number in range(first, len(queries), tasks):
            began = time.perf_counter()
            done = await run(*queries[number])
            value = done[0] if argmax else done
            if not on_host:
                await aionvrtc.synchronize()
                value = value.get()
            values[number] = float(value)
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


class Queries(NamedTuple):
    """The network (``base``: its problem, ``plan``: every row's order) and the queries'
    operands on the GPU, each the ``n`` vertices' own tensors then the edges' shared ones;
    ``stacks`` each query's vertex tensors as one (n, 2) array."""

    base: Any
    plan: Any
    queries: list[list[Any]]
    stacks: list[Any]
    n: int

    def calls(self, *, stacked: bool) -> list[list[Any]]:
        """Each query's call of a ProgramBatcher: its vertices' tensors, or their stack."""
        return [[x] for x in self.stacks] if stacked else [q[: self.n] for q in self.queries]


class Way(NamedTuple):
    """How a ProgramBatcher is made (its arguments, and the program's argmax)."""

    max_batch: int
    stacked: bool = False
    host: bool = False
    argmax: bool = False

    def __str__(self) -> str:
        given = [f"max_batch={self.max_batch}"]
        given += ["stacked=True"] * self.stacked + ["host=True"] * self.host
        return f"ProgramBatcher({', '.join(given)})" + (
            ", with the assignment" if self.argmax else ""
        )


async def batcher(net: Queries, way: Way) -> Any:
    """A warmed ProgramBatcher of the program (the edges' tensors shared), and its warm-up's
    seconds."""
    from aionvrtc import tropical

    made = await tropical.einsum_program(
        net.base.subscripts, *net.queries[0], argmax=way.argmax, optimize=net.plan
    )
    given = {net.n + i: x for i, x in enumerate(net.queries[0][net.n :])}  # a call: its own
    joiner = tropical.ProgramBatcher(
        made, max_batch=way.max_batch, shared=given, stacked=way.stacked, host=way.host
    )
    began = time.perf_counter()
    await joiner.warm()
    return joiner, time.perf_counter() - began


async def batcher_row(
    net: Queries, way: Way, args: argparse.Namespace, check: Any
) -> dict[str, Any]:
    """The row of a ProgramBatcher made ``way``: warmed, its first group served, then every
    query."""
    joiner, warmed = await batcher(net, way)
    name = str(way)
    progress(f"{name} warmed: {warmed:.1f} s")
    own = net.calls(stacked=way.stacked)
    asked = {"argmax": way.argmax, "on_host": way.host}
    await served(joiner.run, own[: args.tasks], args.tasks, **asked)
    before = joiner.stats()
    joined = await served(joiner.run, own, args.tasks, **asked)
    after = joiner.stats()
    check(name, joined.pop("values"))
    progress(f"{name}: {joined['queries_per_second']:,.0f} queries/s")
    return {
        "row": name,
        **joined,
        "replays": after.replays - before.replays,
        "standins": after.standins - before.standins,
        "first_seconds": warmed,
    }


async def profiled(net: Queries, args: argparse.Namespace) -> None:
    """The host's time in a ProgramBatcher's calls, by function (cProfile), into
    ``args.profile``: where a joined query's time goes besides the GPU's."""
    import cProfile
    import pstats

    joiner, _ = await batcher(net, Way(args.tasks, stacked=True, host=True))
    own = net.calls(stacked=True)
    await served(joiner.run, own[: args.tasks], args.tasks, argmax=False, on_host=True)
    profile = cProfile.Profile()
    profile.enable()
    await served(joiner.run, own, args.tasks, argmax=False, on_host=True)
    profile.disable()
    with args.profile.open("w") as out:
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(40)
        pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(60)
    progress(f"profile written: {args.profile}")


def on_gpu(weights: Any, edges: list[Any]) -> tuple[list[list[Any]], list[Any]]:
    """Each query's operands on the GPU (its vertices' tensors, rows of one (n, 2) array,
    then ``edges``), and those arrays (its stack)."""
    import cupy

    n = weights.shape[1]
    queries, stacks = [], []
    for w in weights:
        own = cupy.asarray(np.stack([np.zeros(n, np.float32), w], axis=1))
        stacks.append(own)
        queries.append([own[v] for v in range(n)] + edges)
    # The queries' half a million arrays live through the run: out of the collector's way, or
    # its full passes over them would show as stalls of a few hundred ms in the latencies.
    gc.freeze()
    return queries, stacks


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
    queries, stacks = on_gpu(weights, shared[n:])
    plan = tropical.einsum_plan(base.subscripts, *base.operands)  # every row's order
    progress(f"planned: {len(plan.steps)} steps")
    began = time.perf_counter()
    program = await tropical.einsum_program(base.subscripts, *queries[0], optimize=plan)
    made = time.perf_counter() - began
    progress("program made")

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
    rows.append({"row": "program.run, each call alone", **alone, "first_seconds": made})
    progress(f"program.run: {alone['queries_per_second']:,.0f} queries/s")

    net = Queries(base, plan, queries, stacks, n)
    for way in (
        Way(args.tasks),
        Way(args.tasks, stacked=True),
        Way(args.tasks, stacked=True, host=True),
        Way(args.tasks // 2, stacked=True, host=True),
        Way(args.tasks, stacked=True, host=True, argmax=True),
    ):
        rows.append(await batcher_row(net, way, args, check))
    if args.profile:
        await profiled(net, args)

    batch = args.tasks
    stacked = [
        cupy.asarray(np.stack([np.zeros((batch, n), np.float32), weights[:batch]], axis=2)[:, v])
        for v in vertices
    ] + shared[n:]
    began = time.perf_counter()
    batched = await tropical.einsum_program(
        base.subscripts, *queries[0], batch=batch, batched=vertices, optimize=plan
    )
    made = time.perf_counter() - began

    def ours() -> Any:
        return batched.run_sync(*stacked).get()

    progress("batched program made")
    got = ours()
    check("batched program", [float(x) for x in got])
    seconds = median_s(ours, args.repeats)  # (ours() ran once: its check)
    rows.append({"row": f"batched program, {batch} stacked queries", "queries_per_second":
                 batch / seconds, "batch_ms": 1e3 * seconds, "first_seconds": made})  # fmt: skip

    progress(f"batched program: {rows[-1]['queries_per_second']:,.0f} queries/s")
    measured = {"rows": rows, "steps": len(plan.steps), "vertices": n, "edges": len(edges)}
    if args.jax:
        save(args, measured)  # (JAX's first call compiles for minutes: ours are kept meanwhile)
        rows.append(jax_row(plan, stacked, n, args, check))
    return measured


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
        "| how | queries/s | p50 ms | p99 ms | replays | vs JAX | made in s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ratio = f"{r['queries_per_second'] / jax_rate:.2f}x" if jax_rate else "-"
        p50 = f"{r['p50_ms']:.2f}" if "p50_ms" in r else "-"
        p99 = f"{r['p99_ms']:.2f}" if "p99_ms" in r else "-"
        replays = f"{r['replays']:,}" if "replays" in r else "-"
        lines.append(
            f"| {r['row']} | {r['queries_per_second']:,.0f} | {p50} | {p99} | {replays} "
            f"| {ratio} | {r['first_seconds']:.1f} |"
        )
    lines += [
        "",
        "Made in: the seconds before the first query (the program made, its batched programs "
        "warmed, or JAX's first call: its trace and XLA's compile).",
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
    parser.add_argument("--profile", type=Path, help="cProfile a ProgramBatcher's calls, here")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    import anyio

    save(args, anyio.run(measure, args))


def save(args: argparse.Namespace, measured: dict[str, Any]) -> None:
    """Write the rows measured so far."""
    facts = gpu_facts()
    if any(r["row"].startswith("JAX") for r in measured["rows"]):
        import jax

        facts["jax"] = jax.__version__
    write(args.out, "program_batching", label=facts["gpu"], facts=facts, results=measured,
          table=table(facts, measured, args))  # fmt: skip


if __name__ == "__main__":
    main()
