"""An asyncio HTTP service (aiohttp) answering all-pairs shortest-path queries on weighted
graphs with min-plus matrix squaring on the GPU, paths rebuilt from the argmax, and saying in
each answer's ``Server-Timing`` header where the request's time went.

    .venv/bin/pip install -e '.[cu13,examples]'    # from a checkout; cu12 for a CUDA 12 driver
    python examples/shortest_paths_server.py [--port 8080] [--arch sm_90] [--sizes 64 256 1024]
                                             [--no-batch]

    POST /shortest-paths  {"weights": [[0, 4, null], [null, 0, 1], [2, null, 0]],
                           "pairs": [[0, 2], [2, 1]]}
    ->  {"n": 3, "squarings": 1, "distances": [5.0, 6.0], "paths": [[0, 1, 2], [2, 0, 1]]}
        Server-Timing: parse;dur=<ms>, gpu;dur=<ms>, respond;dur=<ms>
    POST /shortest-paths  with Content-Type: application/x-npz (or application/octet-stream):
                          the bytes of np.savez(f, weights=W, pairs=P), same answer
    GET /stats            the compiler's statistics, and the batcher's

In JSON ``null`` is no edge; in an .npz, ``weights`` is an n x n float32 or float64 array with
``inf`` for no edge and ``pairs`` (optional) a p x 2 integer array. Weights are non-negative and
are computed in float32 whatever the body's format. D <- D (min,+) D, repeated until no distance
changes (at most log2(n) times), gives every shortest distance; the argmax of each product (the
k through which i reaches j) updates the first hop of every path, in one kernel of our own per
squaring (``HOPS``), and the queried pairs' entries are gathered on the GPU and read back
without blocking the event loop. Kernels come from one Compiler through ``await
compiler.get``: any number of concurrent requests share one compile.
Concurrent requests' squarings of one size go to the GPU as one batched launch
(``tropical.Batcher``); ``--no-batch`` launches each one alone (``tropical.matmul``).

``Server-Timing`` durations are milliseconds of wall time in the handler: ``parse`` reads and
decodes the body; ``gpu`` enqueues the squarings and the answers' gather and copy back, and
waits for them (in the batcher, then for the stream without blocking the event loop), which
includes the time other requests' tasks run meanwhile; ``respond`` builds the JSON answer.
What a client measures beyond their sum was spent outside the handler: the network, HTTP
parsing, waiting for the event loop.

Without a GPU the service compiles its kernels for ``--arch`` (default ``$AIONVRTC_ARCH``, else
sm_90) and says what it would serve.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import time
from typing import Any

import anyio
import numpy as np

from aionvrtc import (
    Compiler,
    KernelSpec,
    ModuleLoadError,
    NoDeviceError,
    resolve_target,
    synchronize,
    tropical,
)

MAX_NODES = 4096
# The largest body read, and the most an .npz may decompress to: a zip's members can expand far
# beyond its bytes on the wire. Room for float64 weights of MAX_NODES and as many pairs.
MAX_BODY = 256 << 20
NPZ_TYPES = frozenset({"application/x-npz", "application/octet-stream"})
NPZ_MESSAGE = 'an .npz body must be np.savez bytes holding "weights" (and "pairs")'

Query = tuple[np.ndarray[Any, Any], list[tuple[int, int]]]

# The work around the squarings, one launch each: the first hops from the weights, each
# squaring's hops (and whether any distance got shorter), the answers' entries. Written with
# CuPy's elementwise functions they took six launches a squaring, each costing the host more
# than the GPU, and a blocking read a squaring.
HOPS = KernelSpec(
    r"""
extern "C" __global__ void first_hops(float* dist, int* hop, int n) {
    // Each node 0 from itself; a pair's first hop is its target where an edge joins them.
    const int j = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
    if (j >= n) return;
    const size_t at = (size_t)i * n + j;
    if (i == j) dist[at] = 0.0f;
    hop[at] = isinf(dist[at]) ? -1 : j;
}

extern "C" __global__ void next_hops(const float* shorter, const float* dist, const int* via,
                                     const int* hop, int* next, int* changed, int n) {
    // Where i reaches j by a shorter way, through via: first the hop towards via. Only where
    // shorter: on a tie the way found first is kept (taking the new one, two nodes joined by
    // zero weights could each name the other as the first hop).
    const int j = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
    if (j >= n) return;
    const size_t at = (size_t)i * n + j;
    const bool better = shorter[at] < dist[at];
    next[at] = better ? hop[(size_t)i * n + via[at]] : hop[at];
    if (better) *changed = 1;
}

extern "C" __global__ void distances(const float* dist, const int* pairs, int* out, int p,
                                     int n) {
    // Pair q's distance, as its float's bits (out holds the hops' columns too).
    const int q = blockIdx.x * blockDim.x + threadIdx.x;
    if (q >= p) return;
    out[q] = __float_as_int(dist[(size_t)pairs[2 * q] * n + pairs[2 * q + 1]]);
}

extern "C" __global__ void columns(const int* hop, const int* targets, int* out, int n) {
    // Column c: every node's first hop towards targets[c], all that a path's walk reads.
    const int r = blockIdx.x * blockDim.x + threadIdx.x, c = blockIdx.y;
    if (r >= n) return;
    out[(size_t)c * n + r] = hop[(size_t)r * n + targets[c]];
}
""",
    name_expressions=("first_hops", "next_hops", "distances", "columns"),
    name="shortest_paths.cu",
)
THREADS = 256
# Squarings enqueued ahead of the last whose flag was read: the GPU kept busy, at most this many
# spare squarings once the distances have settled.
AHEAD = 2


def parse(content_type: str, body: bytes) -> Query:
    """Weights (float32, inf for no edge) and pairs from a request body: an .npz for the NPZ_TYPES,
    else JSON; ValueError names what is wrong."""
    if content_type in NPZ_TYPES:
        return from_npz(body)
    try:
        decoded = json.loads(body)
    except ValueError:  # not UTF-8 or not JSON
        raise ValueError(
            "the body is not JSON (send an .npz as application/x-npz or application/octet-stream)"
        ) from None
    return from_json(decoded)


def from_json(body: Any) -> Query:
    if not isinstance(body, dict) or "weights" not in body:
        raise ValueError('the body must be a JSON object with "weights" (and "pairs")')
    rows, pairs = body["weights"], body.get("pairs", [])
    square = f'"weights" must be a square list of lists, 1 to {MAX_NODES} rows'
    if not isinstance(rows, list) or not all(isinstance(row, list) for row in rows):
        raise ValueError(square)
    # float() would also take "1.5" and true: JSON numbers only.
    if not all(w is None or type(w) in (int, float) for row in rows for w in row):
        raise ValueError('"weights" must hold numbers or null')
    try:
        weights = np.array([[math.inf if w is None else w for w in r] for r in rows], np.float64)
    except ValueError:  # rows of unequal lengths
        raise ValueError(square) from None
    except OverflowError:  # an integer beyond float64
        raise ValueError('"weights" must fit in float32 (null for no edge)') from None
    if not isinstance(pairs, list) or not all(
        isinstance(p, list) and all(type(v) is int for v in p) for p in pairs
    ):
        raise ValueError(_pairs_message(len(rows)))
    try:
        pair_array = np.array(pairs, np.int64) if pairs else np.empty((0, 2), np.int64)
    except (ValueError, OverflowError):  # pairs of unequal lengths, an integer beyond int64
        raise ValueError(_pairs_message(len(rows))) from None
    return validate(weights, pair_array)


def from_npz(body: bytes) -> Query:
    try:
        npz = np.load(io.BytesIO(body), allow_pickle=False)
    except Exception as exc:  # np.load fails on malformed bytes under many types, all a bad body
        raise ValueError(f"{NPZ_MESSAGE}: not readable ({type(exc).__name__})") from None
    if not isinstance(npz, np.lib.npyio.NpzFile) or "weights" not in npz.files:
        raise ValueError(NPZ_MESSAGE)
    with npz:
        assert npz.zip is not None  # set while open
        if sum(info.file_size for info in npz.zip.infolist()) > MAX_BODY:
            raise ValueError(f"the .npz expands to more than {MAX_BODY >> 20} MiB")
        try:
            # A member without the .npy header comes back as bytes: asarray, and the checks say.
            weights = np.asarray(npz["weights"])
            pairs = np.asarray(npz["pairs"]) if "pairs" in npz.files else np.empty((0, 2), int)
        except Exception as exc:  # a corrupt member, or one of objects (pickles)
            raise ValueError(f"{NPZ_MESSAGE}: {type(exc).__name__}: {exc}") from None
    return validate(weights, pairs)


def validate(weights: np.ndarray[Any, Any], pairs: np.ndarray[Any, Any]) -> Query:
    """The checks of every body format, on arrays; returns contiguous float32 weights."""
    n = weights.shape[0] if weights.ndim == 2 else 0
    if weights.shape != (n, n) or not 1 <= n <= MAX_NODES:
        raise ValueError(f'"weights" must be square (n x n), n from 1 to {MAX_NODES}')
    if weights.dtype not in (np.float32, np.float64):
        raise ValueError(f'"weights" must be float32 or float64, not {weights.dtype}')
    if np.isnan(weights).any() or (weights < 0).any():
        raise ValueError('"weights" must be non-negative, inf (or null) for no edge, no NaN')
    # A finite weight beyond float32 would become inf, "no edge", unless refused here.
    with np.errstate(over="ignore"):
        single = np.ascontiguousarray(weights, np.float32)
    if (np.isinf(single) != np.isinf(weights)).any():
        raise ValueError('"weights" must fit in float32 (inf or null for no edge)')
    if (
        pairs.ndim != 2
        or pairs.shape[1] != 2
        or pairs.dtype.kind not in "iu"
        or ((pairs < 0) | (pairs >= n)).any()
    ):
        raise ValueError(_pairs_message(n))
    return single, [(int(s), int(t)) for s, t in pairs.tolist()]


def _pairs_message(n: int) -> str:
    return f'"pairs" must be [source, target] pairs (p x 2 integers) of nodes below {n}'


def pinned(count: int) -> np.ndarray[Any, Any]:
    """``count`` int32 in pinned host memory (a copy into it runs asynchronously); allocated
    in powers of two, as CuPy's pool keeps a freed block for its size alone."""
    import cupy

    size = 1 << max(count * 4 - 1, 1).bit_length()
    return np.frombuffer(cupy.cuda.alloc_pinned_memory(size), np.int32, count)


def grid(n: int, rows: int = 1) -> tuple[tuple[int, int], tuple[int]]:
    """A launch of one thread per column of ``rows`` rows of ``n``."""
    return ((n + THREADS - 1) // THREADS, rows), (THREADS,)


async def solve(
    hops: Any,
    weights: np.ndarray[Any, Any],
    pairs: list[tuple[int, int]],
    batcher: tropical.Batcher | None,
    compiler: Compiler,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], list[int], int]:
    """The distances of ``pairs``, each queried target's column of first hops (every node's,
    -1: unreachable), each pair's column, and the squarings it took; the products through
    ``batcher`` if given.

    A squaring's flag (whether any distance got shorter) is copied to the host as it ends;
    before each squaring the loop waits, without blocking the event loop, for the flag of the
    one AHEAD before, and stops at the first that changed nothing (those enqueued after it
    change nothing either). The answers are gathered on the GPU and copied back the same way."""
    import cupy

    n, p = len(weights), len(pairs)
    stream = cupy.cuda.get_current_stream()
    targets, column = np.unique(np.array([t for _, t in pairs], np.int32), return_inverse=True)
    u = len(targets)
    dist = cupy.asarray(weights)
    hop = cupy.empty((n, n), cupy.int32)
    hops.get_function("first_hops")(*grid(n, n), (dist, hop, np.int32(n)), stream=stream)
    most = max(1, math.ceil(math.log2(max(n - 1, 1))))
    changed = cupy.zeros(most, cupy.int32)
    # Pinned host memory, so that the copies into it run asynchronously; let go only once
    # they have landed (the wait at the end).
    seen, host = pinned(most), pinned(p + u * n)
    marks: list[Any] = []
    step = hops.get_function("next_hops")
    try:
        while len(marks) < most:
            if len(marks) >= AHEAD:
                await synchronize(marks[len(marks) - AHEAD])
                if not seen[len(marks) - AHEAD]:
                    break
            if batcher is not None:
                shorter, via = await batcher.matmul(
                    dist, dist, "minplus", argmax=True, stream=stream
                )
            else:
                shorter, via = await tropical.matmul(
                    dist, dist, "minplus", argmax=True, compiler=compiler, stream=stream
                )
            following = cupy.empty_like(hop)
            flag = changed[len(marks) :][:1]
            args = (shorter, dist, via, hop, following, flag, np.int32(n))
            step(*grid(n, n), args, stream=stream)
            flag.get(stream=stream, out=seen[len(marks) :][:1], blocking=False)
            marks.append(cupy.cuda.Event(block=False, disable_timing=True))
            marks[-1].record(stream)
            dist, hop = shorter, following
        if p:
            out = cupy.empty(p + u * n, cupy.int32)
            asked = cupy.asarray(np.array(pairs, np.int32))
            hops.get_function("distances")(
                *grid(p), (dist, asked, out, np.int32(p), np.int32(n)), stream=stream
            )
            hops.get_function("columns")(
                *grid(n, u), (hop, cupy.asarray(targets), out[p:], np.int32(n)), stream=stream
            )
            out.get(stream=stream, out=host, blocking=False)
    finally:
        landed = cupy.cuda.Event(block=False, disable_timing=True)
        landed.record(stream)
        try:
            with anyio.CancelScope(shield=True):
                await synchronize(landed)
        except BaseException:  # (asyncio's own cancel reaches through a shield)
            landed.synchronize()  # the copies land before their memory goes back to the pool
            raise
    # The squarings until the first that changed nothing (the spare ones after it: not counted).
    squarings = next((s + 1 for s in range(len(marks)) if not seen[s]), len(marks))
    return host[:p].view(np.float32), host[p:].reshape(u, n), column.tolist(), squarings


def path(towards: np.ndarray[Any, Any], source: int, target: int) -> list[int]:
    """The path from ``source`` to ``target``, from each node's first hop towards ``target``."""
    if source == target:
        return [source]
    if towards[source] < 0:
        return []
    nodes = [source]
    while nodes[-1] != target and len(nodes) <= len(towards):
        nodes.append(int(towards[nodes[-1]]))
    return nodes


def server_timing(**seconds: float) -> dict[str, str]:
    """The standard Server-Timing header, durations in milliseconds."""
    return {"Server-Timing": ", ".join(f"{name};dur={s * 1e3:.3f}" for name, s in seconds.items())}


def make_app(compiler: Compiler, batcher: tropical.Batcher | None = None, hops: Any = None) -> Any:
    """The service's routes; ``hops``: the loaded module of HOPS."""
    from aiohttp import web

    async def shortest_paths(request: web.Request) -> web.Response:
        started = time.perf_counter()
        try:
            weights, pairs = parse(request.content_type, await request.read())
        except ValueError as exc:
            return web.json_response(
                {"error": str(exc)},
                status=400,
                headers=server_timing(parse=time.perf_counter() - started),
            )
        parsed = time.perf_counter()
        distances, towards, column, squarings = await solve(hops, weights, pairs, batcher, compiler)
        computed = time.perf_counter()
        answer = {
            "n": len(weights),
            "squarings": squarings,
            "distances": [None if math.isinf(d) else float(d) for d in distances.tolist()],
            "paths": [path(towards[column[q]], s, t) for q, (s, t) in enumerate(pairs)],
        }
        body = json.dumps(answer)
        timing = server_timing(
            parse=parsed - started, gpu=computed - parsed, respond=time.perf_counter() - computed
        )
        return web.Response(text=body, content_type="application/json", headers=timing)

    async def stats(request: web.Request) -> web.Response:
        s = compiler.stats()
        b = batcher.stats() if batcher is not None else None
        return web.json_response(
            {"requests": s.requests, "compiles": s.compiles, "joined": s.joined,
             "memory_hits": s.memory.hits, "disk_hits": s.disk.hits,
             "batcher": None if b is None else
                {"requests": b.requests, "launches": b.launches, "alone": b.alone}}
        )  # fmt: skip

    app = web.Application(client_max_size=MAX_BODY)
    app.add_routes([web.post("/shortest-paths", shortest_paths), web.get("/stats", stats)])
    return app


async def main(port: int, arch: str | None, sizes: list[int], batch: bool) -> None:
    # --arch, else $AIONVRTC_ARCH, else this GPU's; sm_90 on a machine without one.
    target = resolve_target(arch, default="sm_90")
    async with Compiler(arch=target) as compiler:
        batcher = tropical.Batcher(compiler) if batch else None
        # Warm the kernels of the expected graph sizes before taking traffic; a batch's size
        # picks its tiles, so each size's kernels for every batch the batcher can make.
        batches = range(1, batcher.max_batch + 1) if batcher is not None else [1]
        specs = {
            tropical.kernel_spec(n, n, n, "minplus", argmax=True, batch=b)
            for n in sizes
            for b in batches
        }
        async with anyio.create_task_group() as group:
            for spec in (*specs, HOPS):
                group.start_soon(compiler.compile, spec)
        batching = f"batches up to {batcher.max_batch}" if batcher is not None else "no batching"
        print(
            f"compiled {len(specs)} min-plus kernel(s) with argmax and the hops' kernels for "
            f"{target} ({batching})",
            flush=True,
        )
        try:
            for spec in specs:
                await compiler.get(spec)  # loaded before the first request needs them
            hops = await compiler.get(HOPS)
        except (NoDeviceError, ModuleLoadError) as exc:  # no GPU here, or a driver too old
            print(
                f"no usable GPU for {target} here ({type(exc).__name__}): would serve "
                f"POST /shortest-paths and GET /stats on port {port} (JSON or .npz bodies, "
                f"{batching})",
                flush=True,
            )
            return
        from aiohttp import web

        runner = web.AppRunner(make_app(compiler, batcher, hops))
        await runner.setup()
        # A burst of new clients beyond the default backlog (128) waits a 1 s SYN retry.
        await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
        print(f"serving on http://127.0.0.1:{port} ({batching})", flush=True)
        try:
            await anyio.sleep_forever()
        finally:
            await runner.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--arch", help="default: $AIONVRTC_ARCH, else the GPU's, else sm_90")
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument(
        "--no-batch", dest="batch", action="store_false",
        help="launch each request's squarings alone (tropical.matmul), not batched",
    )  # fmt: skip
    args = parser.parse_args()
    anyio.run(main, args.port, args.arch, args.sizes, args.batch)
