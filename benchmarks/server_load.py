"""The shortest-path server (examples/shortest_paths_server.py) under rising concurrency, on a GPU.

    python benchmarks/server_load.py [--nodes 256] [--requests 400] [--concurrency 1 4 16 64]

Starts the server twice on a fresh cache dir, cold (its kernel compiled at start-up) and warm
(read from disk), timing each start until it serves (each process with an empty CUDA_CACHE_PATH,
so that NVRTC's cross-process cache cannot make the cold start warm); then, against the warm
one, sends ``--requests`` queries (random graphs of ``--nodes`` nodes, each answer checked
against Floyd-Warshall first) at each concurrency, loopback only and bounded in count and time.
Writes results/server_load-<gpu>.{json,md,png}: p50 and p99 latency and throughput per level.
"""

from __future__ import annotations

import argparse
import asyncio
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


def start_server(
    port: int, cache_dir: str, nodes: int, scratch: str
) -> tuple[subprocess.Popen[str], float]:
    env = fresh_nvrtc_cache(scratch, {**os.environ, "AIONVRTC_CACHE_DIR": cache_dir})
    started = time.perf_counter()
    server = subprocess.Popen(
        [sys.executable, str(SERVER), "--port", str(port), "--sizes", str(nodes)],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert server.stdout is not None
    deadline = time.monotonic() + 300
    while "serving on" not in server.stdout.readline():
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
    return server, time.perf_counter() - started


def graph(rng: np.random.Generator, nodes: int) -> tuple[np.ndarray[Any, Any], dict[str, Any]]:
    weights = rng.integers(1, 100, size=(nodes, nodes)).astype(float)
    weights[rng.random((nodes, nodes)) < 0.95] = np.inf
    pairs = [[int(rng.integers(nodes)), int(rng.integers(nodes))] for _ in range(8)]
    body = {"weights": [[None if np.isinf(w) else w for w in row] for row in weights],
            "pairs": pairs}  # fmt: skip
    return weights, body


def floyd_warshall(weights: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    dist = weights.copy()
    np.fill_diagonal(dist, 0)
    for k in range(len(dist)):
        dist = np.minimum(dist, dist[:, k : k + 1] + dist[k : k + 1, :])
    return dist


async def level(port: int, bodies: list[bytes], concurrency: int) -> dict[str, float]:
    import aiohttp

    latencies: list[float] = []
    queue = list(bodies)
    url = f"http://127.0.0.1:{port}/shortest-paths"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:

        async def client() -> None:
            while queue:
                body = queue.pop()
                started = time.perf_counter()
                async with session.post(
                    url, data=body, headers={"Content-Type": "application/json"}
                ) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"status {r.status}")
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    latencies.sort()
    return {
        "concurrency": concurrency,
        "requests": len(latencies),
        "p50_ms": statistics.median(latencies) * 1e3,
        "p99_ms": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] * 1e3,
        "requests_per_s": len(latencies) / seconds,
    }


async def check(port: int, rng: np.random.Generator, nodes: int) -> int:
    """Answers against Floyd-Warshall before any speed is quoted; returns pairs checked."""
    import aiohttp

    checked = 0
    async with aiohttp.ClientSession() as session:
        for _ in range(5):
            weights, body = graph(rng, nodes)
            async with session.post(f"http://127.0.0.1:{port}/shortest-paths", json=body) as r:
                answer = await r.json()
            want = floyd_warshall(weights)
            for (s, t), got in zip(body["pairs"], answer["distances"], strict=True):
                ok = got is None if np.isinf(want[s, t]) else abs(got - want[s, t]) < 1e-3
                if not ok:
                    raise AssertionError(f"distance {s}->{t}: {got}, want {want[s, t]}")
                checked += 1
    return checked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    rng = np.random.default_rng()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as cache_dir, tempfile.TemporaryDirectory() as scratch:
        cold, cold_s = start_server(port, cache_dir, args.nodes, scratch)
        cold.terminate()
        cold.wait(timeout=30)
        server, warm_s = start_server(port, cache_dir, args.nodes, scratch)
        try:
            checked = asyncio.run(check(port, rng, args.nodes))
            bodies = [json.dumps(graph(rng, args.nodes)[1]).encode() for _ in range(args.requests)]
            levels = [asyncio.run(level(port, bodies, c)) for c in args.concurrency]
        finally:
            server.terminate()
            server.wait(timeout=30)
    facts = gpu_facts()
    results = {"nodes": args.nodes, "cold_start_s": cold_s, "warm_start_s": warm_s,
               "pairs_checked": checked, "levels": levels}  # fmt: skip
    lines = [
        f"# Shortest-path server on {facts['gpu']}",
        "",
        f"Driver {facts['driver']}, CuPy {facts['cupy']}, NVRTC {facts['nvrtc']}, "
        f"{facts['date']}. Random graphs of {args.nodes} nodes (5% of edges), 8 queried pairs "
        f"each; {checked} answers checked against Floyd-Warshall first. Loopback, aiohttp client.",
        "",
        f"Start until serving: cold cache {cold_s:.2f} s, warm cache {warm_s:.2f} s. {COLD_NOTE}",
        "",
        "| concurrency | requests | p50 ms | p99 ms | requests/s |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {lv['concurrency']} | {lv['requests']} | {lv['p50_ms']:.2f} | {lv['p99_ms']:.2f} | "
        f"{lv['requests_per_s']:.0f} |"
        for lv in levels
    ]
    write(args.out, "server_load", label=facts["gpu"], facts=facts, results=results,
          table="\n".join(lines) + "\n")  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    xs = [lv["concurrency"] for lv in levels]
    ax.plot(xs, [lv["p50_ms"] for lv in levels], marker="o", label="p50 latency")
    ax.plot(xs, [lv["p99_ms"] for lv in levels], marker="o", label="p99 latency")
    ax.set(xscale="log", xlabel="concurrent clients", ylabel="ms")
    twin = ax.twinx()
    twin.plot(xs, [lv["requests_per_s"] for lv in levels], color="gray", ls="--", marker="s",
              label="requests/s")  # fmt: skip
    twin.set_ylabel("requests/s")
    ax.legend(loc="upper left")
    twin.legend(loc="lower right")
    ax.set_title(f"Shortest-path server, {args.nodes} nodes, on {facts['gpu']}")
    slug = facts["gpu"].lower().replace(" ", "-")
    fig.savefig(args.out / f"server_load-{slug}.png", dpi=120, bbox_inches="tight")


if __name__ == "__main__":
    main()
