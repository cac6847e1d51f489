"""An asyncio HTTP service (aiohttp) answering all-pairs shortest-path queries on weighted
graphs with min-plus matrix squaring on the GPU, paths rebuilt from the argmax.

    .venv/bin/pip install -e '.[cu13,examples]'    # from a checkout; cu12 for a CUDA 12 driver
    python examples/shortest_paths_server.py [--port 8080] [--arch sm_90] [--sizes 64 256 1024]

    POST /shortest-paths  {"weights": [[0, 4, null], [null, 0, 1], [2, null, 0]],
                           "pairs": [[0, 2], [2, 1]]}
    ->  {"n": 3, "squarings": 2, "distances": [5.0, 6.0], "paths": [[0, 1, 2], [2, 0, 1]]}
    GET /stats            the compiler's statistics

``null`` is no edge; weights are non-negative. D <- D (min,+) D, repeated until no distance
changes (at most log2(n) times), gives every shortest distance; the argmax of each product (the
k through which i reaches j) updates the first hop of every path. Kernels come from one
Compiler through ``await compiler.get``: any number of concurrent requests share one compile.
Without a GPU the service compiles its kernels for ``--arch`` (default ``$AIONVRTC_ARCH``, else
sm_90) and says what it would serve.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import anyio
import numpy as np

from aionvrtc import (
    Compiler,
    ModuleLoadError,
    NoDeviceError,
    resolve_target,
    synchronize,
    tropical,
)

MAX_NODES = 4096


def parse(body: Any) -> tuple[np.ndarray[Any, Any], list[tuple[int, int]]]:
    """Weights (inf for no edge) and pairs from a request; ValueError names what is wrong."""
    if not isinstance(body, dict) or "weights" not in body:
        raise ValueError('the body must be a JSON object with "weights" (and "pairs")')
    rows = body["weights"]
    n = len(rows) if isinstance(rows, list) else 0
    if not 1 <= n <= MAX_NODES or any(not isinstance(r, list) or len(r) != n for r in rows):
        raise ValueError(f'"weights" must be a square list of lists, 1 to {MAX_NODES} rows')
    try:
        weights = np.array(
            [[math.inf if w is None else float(w) for w in row] for row in rows], np.float32
        )
    except (TypeError, ValueError):
        raise ValueError('"weights" must hold numbers or null') from None
    if (weights < 0).any() or np.isnan(weights).any():
        raise ValueError('"weights" must be non-negative (null for no edge)')
    pairs = body.get("pairs", [])
    if not isinstance(pairs, list) or not all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(v, int) and 0 <= v < n for v in p)
        for p in pairs
    ):
        raise ValueError(f'"pairs" must be a list of [source, target] nodes below {n}')
    return weights, [(int(s), int(t)) for s, t in pairs]


async def all_pairs(compiler: Compiler, weights: np.ndarray[Any, Any]) -> tuple[Any, Any, int]:
    """Distances and first hops (-1: unreachable) of every pair, and the squarings it took."""
    import cupy

    n = len(weights)
    dist = cupy.asarray(weights)
    dist[cupy.arange(n), cupy.arange(n)] = 0
    rows = cupy.arange(n)[:, None]
    hop = cupy.where(cupy.isfinite(dist), cupy.broadcast_to(cupy.arange(n), (n, n)), -1)
    squarings = 0
    while squarings < max(1, math.ceil(math.log2(max(n - 1, 1)))):
        shorter, via = await tropical.matmul(dist, dist, "minplus", argmax=True, compiler=compiler)
        squarings += 1
        # i reaches j through via: first the hop towards via (unless via is i itself).
        through = hop[rows, cupy.maximum(via, 0)]
        hop = cupy.where((via >= 0) & (via != rows), through, hop)
        changed = bool((shorter < dist).any())
        dist = shorter
        if not changed:
            break
    await synchronize()
    return dist, hop, squarings


def path(hop: np.ndarray[Any, Any], source: int, target: int) -> list[int]:
    if source == target:
        return [source]
    if hop[source, target] < 0:
        return []
    nodes = [source]
    while nodes[-1] != target and len(nodes) <= len(hop):
        nodes.append(int(hop[nodes[-1], target]))
    return nodes


def make_app(compiler: Compiler) -> Any:
    from aiohttp import web

    async def shortest_paths(request: web.Request) -> web.Response:
        try:
            weights, pairs = parse(await request.json())
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        dist, hop, squarings = await all_pairs(compiler, weights)
        dist_h, hop_h = dist.get(), hop.get()
        return web.json_response(
            {
                "n": len(weights),
                "squarings": squarings,
                "distances": [
                    None if math.isinf(dist_h[s, t]) else float(dist_h[s, t]) for s, t in pairs
                ],
                "paths": [path(hop_h, s, t) for s, t in pairs],
            }
        )

    async def stats(request: web.Request) -> web.Response:
        s = compiler.stats()
        return web.json_response(
            {"requests": s.requests, "compiles": s.compiles, "joined": s.joined,
             "memory_hits": s.memory.hits, "disk_hits": s.disk.hits}
        )  # fmt: skip

    app = web.Application(client_max_size=256 << 20)
    app.add_routes([web.post("/shortest-paths", shortest_paths), web.get("/stats", stats)])
    return app


async def main(port: int, arch: str | None, sizes: list[int]) -> None:
    # --arch, else $AIONVRTC_ARCH, else this GPU's; sm_90 on a machine without one.
    target = resolve_target(arch, default="sm_90")
    async with Compiler(arch=target) as compiler:
        # Warm the kernels of the expected graph sizes before taking traffic.
        specs = {tropical.kernel_spec(n, n, n, "minplus", argmax=True) for n in sizes}
        async with anyio.create_task_group() as group:
            for spec in specs:
                group.start_soon(compiler.compile, spec)
        print(f"compiled {len(specs)} min-plus kernel(s) with argmax for {target}", flush=True)
        try:
            for spec in specs:
                await compiler.get(spec)  # loaded before the first request needs them
        except (NoDeviceError, ModuleLoadError) as exc:  # no GPU here, or a driver too old
            print(
                f"no usable GPU for {target} here ({type(exc).__name__}): would serve "
                f"POST /shortest-paths and GET /stats on port {port}",
                flush=True,
            )
            return
        from aiohttp import web

        runner = web.AppRunner(make_app(compiler))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        print(f"serving on http://127.0.0.1:{port}", flush=True)
        try:
            await anyio.sleep_forever()
        finally:
            await runner.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--arch", help="default: $AIONVRTC_ARCH, else the GPU's, else sm_90")
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024])
    args = parser.parse_args()
    anyio.run(main, args.port, args.arch, args.sizes)
