"""The shortest-path server (examples/shortest_paths_server.py) under rising concurrency, on a GPU:
where a request's time goes, with JSON and .npz bodies, with and without request batching.

    python benchmarks/server_load.py [--nodes 256] [--requests 400]
                                     [--concurrency 1 4 16 64 256] [--seconds 20]

Starts the server twice on a fresh cache dir, cold (its kernels compiled at start-up) and warm
(read from disk), timing each start until it serves (each process with an empty CUDA_CACHE_PATH,
so that NVRTC's cross-process cache cannot make the cold start warm); the warm one solves
concurrent requests of one size together. After it, a third start, warm, with ``--no-batch``
(each request alone). Against each warm server: answers to JSON and to .npz bodies checked against
Floyd-Warshall first, then ``--requests`` queries (random graphs of ``--nodes`` nodes) at each
concurrency, per body format, loopback only, each level stopped after ``--seconds``.
Per level: the p50 of each phase the server reports in its Server-Timing header (parse, gpu,
respond) and of what the client waited beyond them (network, HTTP, event-loop queueing), the
client's p50 and p99 latency, requests/s, and the requests solved together per group.
Writes results/server_load-<gpu>.{json,md,png}.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._results import COLD_NOTE, RESULTS, fresh_nvrtc_cache, gpu_facts, write

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "examples" / "shortest_paths_server.py"
CONTENT_TYPES = {"json": "application/json", "npz": "application/x-npz"}
PHASES = ("parse", "gpu", "respond")


def start_server(
    port: int, cache_dir: str, nodes: int, scratch: str, *, batch: bool
) -> tuple[subprocess.Popen[str], float]:
    env = fresh_nvrtc_cache(scratch, {**os.environ, "AIONVRTC_CACHE_DIR": cache_dir})
    started = time.perf_counter()
    server = subprocess.Popen(
        [sys.executable, str(SERVER), "--port", str(port), "--sizes", str(nodes),
         *([] if batch else ["--no-batch"])],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert server.stdout is not None
    deadline = time.monotonic() + 300
    while "serving on" not in server.stdout.readline():
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
    return server, time.perf_counter() - started


def stop(server: subprocess.Popen[str]) -> None:
    server.terminate()
    server.wait(timeout=30)


def graph(rng: np.random.Generator, nodes: int) -> tuple[np.ndarray[Any, Any], list[list[int]]]:
    weights = rng.integers(1, 100, size=(nodes, nodes)).astype(np.float32)
    weights[rng.random((nodes, nodes)) < 0.95] = np.inf
    pairs = [[int(rng.integers(nodes)), int(rng.integers(nodes))] for _ in range(8)]
    return weights, pairs


def encode(weights: np.ndarray[Any, Any], pairs: list[list[int]], body: str) -> bytes:
    """The request body of one query, as JSON (null for no edge) or as .npz bytes."""
    if body == "json":
        rows = [[None if np.isinf(w) else float(w) for w in row] for row in weights]
        return json.dumps({"weights": rows, "pairs": pairs}).encode()
    buffer = io.BytesIO()
    np.savez(buffer, weights=weights, pairs=np.array(pairs, np.int64))
    return buffer.getvalue()


def server_timing(header: str) -> dict[str, float]:
    """``parse;dur=0.1, gpu;dur=3.4`` -> {"parse": 0.1, "gpu": 3.4} (ms)."""
    fields = (field.strip().split(";dur=") for field in header.split(","))
    return {name: float(ms) for name, ms in fields}


def floyd_warshall(weights: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    dist = weights.astype(np.float64)
    np.fill_diagonal(dist, 0)
    for k in range(len(dist)):
        dist = np.minimum(dist, dist[:, k : k + 1] + dist[k : k + 1, :])
    return dist


async def solved(session: Any, port: int) -> dict[str, int]:
    async with session.get(f"http://127.0.0.1:{port}/stats") as r:
        counts: dict[str, int] = (await r.json())["solved"]
    return counts


async def level(
    port: int, bodies: list[bytes], body: str, concurrency: int, seconds: float
) -> dict[str, Any]:
    import aiohttp

    latencies: list[float] = []
    phases: dict[str, list[float]] = {name: [] for name in (*PHASES, "outside")}
    queue = list(bodies)
    url = f"http://127.0.0.1:{port}/shortest-paths"
    headers = {"Content-Type": CONTENT_TYPES[body]}
    # aiohttp's client opens at most 100 connections by default: no limit, so that every
    # client of a level has one of its own.
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        before = await solved(session, port)
        deadline = time.perf_counter() + seconds

        async def client() -> None:
            while queue and time.perf_counter() < deadline:
                data = queue.pop()
                started = time.perf_counter()
                async with session.post(url, data=data, headers=headers) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"status {r.status}")
                    timing = server_timing(r.headers["Server-Timing"])
                latency = time.perf_counter() - started
                latencies.append(latency)
                for name in PHASES:
                    phases[name].append(timing[name])
                phases["outside"].append(latency * 1e3 - sum(timing[n] for n in PHASES))

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        after = await solved(session, port)
    latencies.sort()
    groups = after["groups"] - before["groups"]
    per_group = (after["requests"] - before["requests"]) / max(groups, 1)
    return {
        "concurrency": concurrency,
        "requests": len(latencies),
        "stopped_at_time_limit": bool(queue),
        **{f"{name}_p50_ms": statistics.median(values) for name, values in phases.items()},
        "p50_ms": statistics.median(latencies) * 1e3,
        "p99_ms": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] * 1e3,
        "requests_per_s": len(latencies) / elapsed,
        "requests_per_group": per_group,
    }


async def check(port: int, rng: np.random.Generator, nodes: int) -> int:
    """Answers to both body formats against Floyd-Warshall before any speed is quoted; returns
    the pairs checked."""
    import aiohttp

    checked = 0
    async with aiohttp.ClientSession() as session:
        for _ in range(5):
            weights, pairs = graph(rng, nodes)
            want = floyd_warshall(weights)
            for body, content_type in CONTENT_TYPES.items():
                async with session.post(
                    f"http://127.0.0.1:{port}/shortest-paths", data=encode(weights, pairs, body),
                    headers={"Content-Type": content_type},
                ) as r:  # fmt: skip
                    if r.status != 200:
                        raise AssertionError(f"{body}: status {r.status}: {await r.text()}")
                    answer = await r.json()
                    if set(server_timing(r.headers["Server-Timing"])) != set(PHASES):
                        raise AssertionError(f"Server-Timing: {r.headers['Server-Timing']}")
                for (s, t), got in zip(pairs, answer["distances"], strict=True):
                    ok = got is None if np.isinf(want[s, t]) else abs(got - want[s, t]) < 1e-3
                    if not ok:
                        raise AssertionError(f"{body}: distance {s}->{t}: {got}, want {want[s, t]}")
                    checked += 1
    return checked


def load(
    port: int, args: argparse.Namespace, graphs: list[Any], rng: np.random.Generator, mode: str
) -> tuple[int, list[dict[str, Any]]]:
    """Checks, then every level with each body format, against the server on ``port``."""
    checked = asyncio.run(check(port, rng, args.nodes))
    runs = []
    for body in CONTENT_TYPES:
        bodies = [encode(weights, pairs, body) for weights, pairs in graphs]
        levels = [asyncio.run(level(port, bodies, body, c, args.seconds)) for c in args.concurrency]
        runs.append({"mode": mode, "body": body, "body_bytes": len(bodies[0]), "levels": levels})
    return checked, runs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--requests", type=int, default=400, help="per level at most")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    parser.add_argument("--seconds", type=float, default=20, help="per level at most")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    rng = np.random.default_rng()
    graphs = [graph(rng, args.nodes) for _ in range(args.requests)]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as cache_dir, tempfile.TemporaryDirectory() as scratch:
        cold, cold_s = start_server(port, cache_dir, args.nodes, scratch, batch=True)
        stop(cold)
        server, warm_s = start_server(port, cache_dir, args.nodes, scratch, batch=True)
        try:
            checked, runs = load(port, args, graphs, rng, "batch")
        finally:
            stop(server)
        server, warm_no_batch_s = start_server(port, cache_dir, args.nodes, scratch, batch=False)
        try:
            checked_no_batch, runs_no_batch = load(port, args, graphs, rng, "no batch")
        finally:
            stop(server)
    checked += checked_no_batch
    runs += runs_no_batch
    facts = gpu_facts()
    results = {"nodes": args.nodes, "cold_start_s": cold_s, "warm_start_s": warm_s,
               "warm_start_no_batch_s": warm_no_batch_s, "pairs_checked": checked,
               "seconds_per_level": args.seconds, "runs": runs}  # fmt: skip
    sizes = ", ".join(f"{r['body']} {r['body_bytes'] / 1024:.0f} KiB" for r in runs[:2])
    lines = [
        f"# Shortest-path server on {facts['gpu']}",
        "",
        f"Driver {facts['driver']}, CuPy {facts['cupy']}, NVRTC {facts['nvrtc']}, "
        f"{facts['date']}. Random graphs of {args.nodes} nodes (5% of edges), 8 queried pairs "
        f"each, sent as JSON or as .npz (float32 weights; a body: {sizes}); {checked} answers "
        f"of both formats checked against Floyd-Warshall first. Loopback, aiohttp client, up to "
        f"{args.requests} requests per level, each level stopped after {args.seconds:g} s. "
        "Batch: concurrent requests of one size solved together (their weights stacked, each "
        "squaring one batched launch for all); no batch: the server started with --no-batch, "
        "each request solved alone.",
        "",
        f"Start until serving: cold cache {cold_s:.2f} s, warm cache {warm_s:.2f} s (batch; "
        f"its warm-up compiles each tile that a batch of up to 64 picks), no batch warm "
        f"{warm_no_batch_s:.2f} s. {COLD_NOTE}",
        "",
        "Phases are the p50 of the server's Server-Timing (ms of wall time in the handler): "
        "parse reads and decodes the body; gpu waits for the request's group to form and be "
        "solved (the event loop running other requests meanwhile); respond builds the JSON "
        "answer. Outside is the p50 of "
        "what the client waited beyond the three (network, HTTP, waiting for the event loop). "
        "Requests/group: the requests solved together per group during the level.",
        "",
        "| mode | body | concurrency | requests | parse ms | gpu ms | respond ms | outside ms "
        "| p50 ms | p99 ms | requests/s | requests/group |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for run in runs:
        for lv in run["levels"]:
            lines.append(
                f"| {run['mode']} | {run['body']} | {lv['concurrency']} | {lv['requests']}"
                f"{'*' if lv['stopped_at_time_limit'] else ''} | {lv['parse_p50_ms']:.2f} | "
                f"{lv['gpu_p50_ms']:.2f} | {lv['respond_p50_ms']:.2f} | "
                f"{lv['outside_p50_ms']:.2f} | {lv['p50_ms']:.2f} | {lv['p99_ms']:.2f} | "
                f"{lv['requests_per_s']:.0f} | "
                f"{lv['requests_per_group']:.1f} |"
            )
    if any(lv["stopped_at_time_limit"] for run in runs for lv in run["levels"]):
        lines += ["", f"\\* stopped at the {args.seconds:g} s limit of a level."]
    write(args.out, "server_load", label=facts["gpu"], facts=facts, results=results,
          table="\n".join(lines) + "\n")  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for run in runs:
        ax.plot(
            [lv["concurrency"] for lv in run["levels"]],
            [lv["requests_per_s"] for lv in run["levels"]],
            marker="o" if run["mode"] == "batch" else "s",
            ls="-" if run["body"] == "npz" else "--",
            label=f"{run['mode']}, {run['body']}",
        )
    ax.set(xscale="log", xlabel="concurrent clients", ylabel="requests/s")
    ax.legend()
    ax.set_title(f"Shortest-path server, {args.nodes} nodes, on {facts['gpu']}")
    slug = facts["gpu"].lower().replace(" ", "-")
    fig.savefig(args.out / f"server_load-{slug}.png", dpi=120, bbox_inches="tight")


if __name__ == "__main__":
    main()
