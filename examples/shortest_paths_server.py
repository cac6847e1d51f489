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
    GET /stats            the compiler's statistics, and the requests and groups solved

In JSON ``null`` is no edge; in an .npz, ``weights`` is an n x n float32 or float64 array with
``inf`` for no edge and ``pairs`` (optional) a p x 2 integer array. Weights are non-negative and
are computed in float32 whatever the body's format. D <- D (min,+) D, repeated until no distance
changes (at most log2(n) times), gives every shortest distance; the argmax of each product (the
k through which i reaches j) updates the first hop of every path, in one kernel of our own per
squaring (``HOPS``), and the queried pairs' entries are gathered on the GPU and read back
without blocking the event loop. Kernels come from one Compiler through ``await
compiler.get``: any number of concurrent requests share one compile.

Concurrent requests of one graph size are solved together, as a model server batches
requests (``Solver``): their weights stacked, each squaring one batched min-plus launch
(``tropical.matmul`` over a batch) and one of the hops' kernel for all of them, one copy back.
A group forms while the GPU runs the groups before it, and is squared until every one of its
graphs has settled (each answer's ``squarings`` counts its own graph's); ``--no-batch`` solves
each request alone.

``Server-Timing`` durations are milliseconds of wall time in the handler: ``parse`` reads and
decodes the body; ``gpu`` waits for the request's group to form and be solved (without
blocking the event loop), which includes the time other requests' tasks run meanwhile;
``respond`` builds the JSON answer. What a client measures beyond their sum was spent outside
the handler: the network, HTTP parsing, waiting for the event loop.

Without a GPU the service compiles its kernels for ``--arch`` (default ``$AIONVRTC_ARCH``, else
sm_90) and says what it would serve.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import time
from dataclasses import dataclass, field
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
MAX_PAIRS = 1 << 16  # a request's; each pair's path is in the answer
# The largest body read, and the most an .npz may decompress to: a zip's members can expand far
# beyond its bytes on the wire. Room for float64 weights of MAX_NODES and as many pairs.
MAX_BODY = 256 << 20
NPZ_TYPES = frozenset({"application/x-npz", "application/octet-stream"})
NPZ_MESSAGE = 'an .npz body must be np.savez bytes holding "weights" (and "pairs")'

Query = tuple[np.ndarray[Any, Any], list[tuple[int, int]]]
# The pairs' distances, the first hops towards each distinct target, each pair's column of
# them, and the squarings taken.
Answer = tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], list[int], int]

# The work around the squarings, one launch each: the first hops from the weights, each
# squaring's hops (and which graphs got a shorter distance), the answers' entries. Written with
# CuPy's elementwise functions they took six launches a squaring, each costing the host more
# than the GPU, and a blocking read a squaring.
HOPS = KernelSpec(
    r"""
// A group's graphs are stacked: blockIdx.z the graph, blockIdx.y the row, x the column.
extern "C" __global__ void first_hops(float* dist, int* hop, int n) {
    // Each node 0 from itself; a pair's first hop is its target where an edge joins them.
    const int j = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
    if (j >= n) return;
    const size_t at = ((size_t)blockIdx.z * n + i) * n + j;
    if (i == j) dist[at] = 0.0f;
    hop[at] = isinf(dist[at]) ? -1 : j;
}

extern "C" __global__ void next_hops(const float* shorter, const float* dist, const int* via,
                                     const int* hop, int* next, int* changed, int n) {
    // Where i reaches j by a shorter way, through via: first the hop towards via. Only where
    // shorter: on a tie the way found first is kept (taking the new one, two nodes joined by
    // zero weights could each name the other as the first hop).
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    const size_t row = ((size_t)blockIdx.z * n + blockIdx.y) * n, at = row + j;
    const bool better = shorter[at] < dist[at];
    next[at] = better ? hop[row + via[at]] : hop[at];
    if (better) changed[blockIdx.z] = 1;
}

extern "C" __global__ void answers(const float* dist, const int* hop, const int* asked,
                                   int* out, int pairs, int columns, int n) {
    // out: each pair's distance (its float's bits), at asked's (row, column) of the stacked
    // distances; then each column asked for, every node's first hop towards its target (all
    // that a path's walk reads), asked as (the graph's first row, the target).
    const size_t q = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (q < pairs) {
        out[q] = __float_as_int(dist[(size_t)asked[2 * q] * n + asked[2 * q + 1]]);
        return;
    }
    const size_t c = (q - pairs) / n, r = (q - pairs) % n;
    if (c >= columns) return;
    const int* column = asked + 2 * (pairs + c);
    out[q] = hop[((size_t)column[0] + r) * n + column[1]];
}
""",
    name_expressions=("first_hops", "next_hops", "answers"),
    name="shortest_paths.cu",
)
THREADS = 256
# Squarings enqueued ahead of the last whose flags were read: the GPU kept busy, and at most
# this many run after the first that changed nothing.
AHEAD = 2
# A group's requests at most, and the groups of one size on the GPU at once: while they run, the
# requests arriving form the next group.
MAX_BATCH = 64
IN_FLIGHT = 2
# A group's GPU memory at most (fewer graphs of a large size): IN_FLIGHT times this a size.
GROUP_BYTES = 1 << 30


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
    if len(pairs) > MAX_PAIRS:
        raise ValueError(f'"pairs" holds {len(pairs)} pairs: at most {MAX_PAIRS} a request')
    return single, [(int(s), int(t)) for s, t in pairs.tolist()]


def _pairs_message(n: int) -> str:
    return f'"pairs" must be [source, target] pairs (p x 2 integers) of nodes below {n}'


def pinned(shape: tuple[int, ...], dtype: Any) -> np.ndarray[Any, Any]:
    """An array in pinned host memory (a copy to or from it runs asynchronously); allocated in
    powers of two, as CuPy's pool keeps a freed block for its size alone."""
    import cupy

    count = math.prod(shape)
    size = 1 << max(count * np.dtype(dtype).itemsize - 1, 1).bit_length()
    return np.frombuffer(cupy.cuda.alloc_pinned_memory(size), dtype, count).reshape(shape)


def blocks(threads: int) -> int:
    return (threads + THREADS - 1) // THREADS


@dataclass
class Ask:
    """One request's query, and once its group is solved, its answer or the group's error."""

    weights: np.ndarray[Any, Any]
    pairs: list[tuple[int, int]]
    done: anyio.Event = field(default_factory=anyio.Event)
    answer: Answer | None = None
    error: BaseException | None = None


class Solver:
    """Concurrent requests of one graph size solved together, as a model server batches
    requests: their weights stacked into one (batch, n, n) array, each squaring one batched
    min-plus launch (``tropical.matmul``) and one launch of the hops' kernel for all of them,
    the answers gathered and copied back at once. So a request costs the host its parse and
    answer, and a share of a group's few launches, whatever the number of squarings.

    A group forms while the GPU is busy: its task waits for one of ``in_flight`` slots of its
    size, and every request of that size arriving meanwhile joins it, up to ``max_batch`` (and
    GROUP_BYTES of GPU memory). The groups run in the solver's own task group, each on a
    stream of its own: a client that goes away cancels its own wait, never its group's work.
    """

    def __init__(
        self, compiler: Compiler, hops: Any, tasks: Any, *, max_batch: int, in_flight: float
    ) -> None:
        self.compiler, self.hops, self.tasks = compiler, hops, tasks
        self.max_batch, self.in_flight = max_batch, in_flight
        self.forming: dict[int, list[Ask]] = {}
        self.slots: dict[int, anyio.CapacityLimiter] = {}
        self.streams: list[Any] = []  # one per group on the GPU; reused
        self.requests = self.groups = 0

    def largest(self, n: int) -> int:
        """The most graphs of ``n`` nodes in a group: ``max_batch``, fewer where their
        matrices (six of n x n 4-byte values each, at most) would pass GROUP_BYTES."""
        return max(1, min(self.max_batch, GROUP_BYTES // (24 * n * n)))

    async def solve(self, weights: np.ndarray[Any, Any], pairs: list[tuple[int, int]]) -> Answer:
        """The distances of ``pairs``, each queried target's column of first hops (every
        node's; -1: unreachable), each pair's column, and the squarings it took."""
        n, ask = len(weights), Ask(weights, pairs)
        group = self.forming.get(n)
        if group is None or len(group) >= self.largest(n):
            group = self.forming[n] = []
            self.tasks.start_soon(self.run, n, group)
        group.append(ask)
        self.requests += 1
        await ask.done.wait()
        if ask.answer is None:  # (one error object, raised anew in each of its requests)
            raise RuntimeError("the request's group failed") from ask.error
        return ask.answer

    async def run(self, n: int, group: list[Ask]) -> None:
        """Waits for a slot of size ``n`` (requests join meanwhile), then solves the group.
        Every request of the group gets its answer, or an error, whatever happens here."""
        try:
            async with self.slots.setdefault(n, anyio.CapacityLimiter(self.in_flight)):
                if self.forming.get(n) is group:
                    del self.forming[n]  # closed: later requests start the next group
                self.groups += 1
                stream = self.streams.pop() if self.streams else None
                try:
                    if stream is None:
                        stream = self.stream()
                    answers = await self.squarings(group, stream)
                finally:
                    if stream is not None:
                        self.streams.append(stream)
            for ask, answer in zip(group, answers, strict=True):
                ask.answer = answer
        except Exception as exc:  # the group's error is each of its requests' error
            for ask in group:
                ask.error = exc
        finally:  # (cancelled too: the server is closing)
            if self.forming.get(n) is group:
                del self.forming[n]
            for ask in group:
                ask.done.set()

    @staticmethod
    def stream() -> Any:
        import cupy

        return cupy.cuda.Stream(non_blocking=True)

    async def squarings(self, group: list[Ask], stream: Any) -> list[Answer]:
        """The answers of ``group``'s requests (of one size), computed on ``stream``.

        A squaring's flags (which graphs got a shorter distance) are copied to the host as it
        ends; before each squaring the loop waits, without blocking the event loop, for the
        flags of the one AHEAD before, and stops at the first that changed no graph (those
        enqueued after it change nothing either). The answers are gathered on the GPU and
        copied back the same way.

        Every array is allocated with ``stream`` current (in blocks without an await: the
        current stream is the thread's): CuPy's pool hands memory freed on a stream out again
        only to allocations on that stream, after the work queued there, and these are freed
        while their squarings may still run."""
        import cupy

        b, n = len(group), len(group[0].weights)
        # The stacking (megabytes) off the event loop.
        host = await anyio.to_thread.run_sync(Staged, group)
        kernel = self.hops.get_function
        marks: list[Any] = []
        try:
            with stream:
                dist = cupy.empty((b, n, n), cupy.float32)
                dist.set(host.weights)
                hop = cupy.empty((b, n, n), cupy.int32)
                kernel("first_hops")((blocks(n), n, b), (THREADS,), (dist, hop, np.int32(n)))
                changed = cupy.zeros(host.seen.shape, cupy.int32)
            while len(marks) < len(changed):
                if len(marks) >= AHEAD:
                    await synchronize(marks[len(marks) - AHEAD])
                    if not host.seen[len(marks) - AHEAD].any():
                        break
                with stream:
                    shorter, via = cupy.empty_like(dist), cupy.empty_like(hop)
                    following = cupy.empty_like(hop)
                await tropical.matmul(
                    dist, dist, "minplus", argmax=True, out=(shorter, via),
                    compiler=self.compiler, stream=stream,
                )  # fmt: skip
                with stream:
                    flags = changed[len(marks)]
                    args = (shorter, dist, via, hop, following, flags, np.int32(n))
                    kernel("next_hops")((blocks(n), n, b), (THREADS,), args)
                    flags.get(out=host.seen[len(marks)], blocking=False)
                    marks.append(stream.record())
                dist, hop = shorter, following
            if len(host.out):
                with stream:
                    out = cupy.empty(len(host.out), cupy.int32)
                    asked = cupy.empty(host.asked.shape, cupy.int32)
                    asked.set(host.asked)
                    counts = (np.int32(host.pairs), np.int32(host.columns), np.int32(n))
                    kernel("answers")(
                        (blocks(len(out)),), (THREADS,), (dist, hop, asked, out, *counts)
                    )
                    out.get(out=host.out, blocking=False)
        finally:
            landed = stream.record()
            try:
                with anyio.CancelScope(shield=True):
                    await synchronize(landed)
            except BaseException:  # (asyncio's own cancel reaches through a shield)
                landed.synchronize()  # the copies land before their memory goes back to the pool
                raise
        return host.answers(len(marks))


class Staged:
    """A group's host side, in pinned memory (so that the copies run asynchronously; kept
    until they have landed): the weights stacked, the gather's addresses, and room for each
    squaring's flags and for the answers."""

    def __init__(self, group: list[Ask]) -> None:
        self.group, b, n = group, len(group), len(group[0].weights)
        # Each request's distinct targets: a pair's path reads its target's column alone.
        self.targets = [np.unique([t for _, t in ask.pairs], return_inverse=True) for ask in group]
        self.pairs = sum(len(ask.pairs) for ask in group)
        self.columns = sum(len(distinct) for distinct, _ in self.targets)
        self.weights = pinned((b, n, n), np.float32)
        for member, ask in enumerate(group):
            self.weights[member] = ask.weights
        # The gather's addresses: each pair's (row, column) in the stacked matrices, then each
        # distinct target's (its graph's first row, the target).
        self.asked = pinned((self.pairs + self.columns, 2), np.int32)
        at = 0
        for member, ask in enumerate(group):
            self.asked[at : at + len(ask.pairs)] = np.reshape(ask.pairs, (-1, 2))
            self.asked[at : at + len(ask.pairs), 0] += member * n
            at += len(ask.pairs)
        for member, (distinct, _) in enumerate(self.targets):
            self.asked[at : at + len(distinct)] = np.column_stack(
                (np.full(len(distinct), member * n), distinct)
            )
            at += len(distinct)
        # Row s: which graphs squaring s changed; log2(n - 1) squarings settle every distance.
        self.seen = pinned((max(1, math.ceil(math.log2(max(n - 1, 1)))), b), np.int32)
        self.out = pinned((self.pairs + self.columns * n,), np.int32)

    def answers(self, enqueued: int) -> list[Answer]:
        """Each request's answer, once ``enqueued`` squarings and the gather have landed."""
        n = len(self.group[0].weights)
        distances = self.out[: self.pairs].view(np.float32)
        hops = self.out[self.pairs :].reshape(self.columns, n)
        answers: list[Answer] = []
        first_pair = first_column = 0
        for member, (ask, (distinct, column)) in enumerate(
            zip(self.group, self.targets, strict=True)
        ):
            # The squarings until the first that changed nothing (the spare ones after it, and
            # those the other graphs needed: not counted).
            settled = np.flatnonzero(self.seen[:enqueued, member] == 0)
            squarings = int(settled[0]) + 1 if len(settled) else enqueued
            pairs, columns = len(ask.pairs), len(distinct)
            answers.append(
                (
                    distances[first_pair : first_pair + pairs].copy(),
                    hops[first_column : first_column + columns].copy(),
                    column.tolist(),
                    squarings,
                )
            )
            first_pair, first_column = first_pair + pairs, first_column + columns
        return answers


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


def make_app(compiler: Compiler | None, solver: Solver | None = None) -> Any:
    """The service's routes; without a solver (and compiler), bad bodies are turned away all
    the same."""
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
        assert solver is not None
        distances, towards, column, squarings = await solver.solve(weights, pairs)
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
        assert compiler is not None
        assert solver is not None
        s = compiler.stats()
        return web.json_response(
            {"requests": s.requests, "compiles": s.compiles, "joined": s.joined,
             "memory_hits": s.memory.hits, "disk_hits": s.disk.hits,
             "solved": {"requests": solver.requests, "groups": solver.groups}}
        )  # fmt: skip

    app = web.Application(client_max_size=MAX_BODY)
    app.add_routes([web.post("/shortest-paths", shortest_paths), web.get("/stats", stats)])
    return app


async def main(port: int, arch: str | None, sizes: list[int], batch: bool) -> None:
    # --arch, else $AIONVRTC_ARCH, else this GPU's; sm_90 on a machine without one.
    target = resolve_target(arch, default="sm_90")
    max_batch = MAX_BATCH if batch else 1
    async with Compiler(arch=target) as compiler:
        # Warm the kernels of the expected graph sizes before taking traffic; a batch's size
        # picks its tiles, so each size's kernels for every batch a group can make.
        specs = {
            spec
            for n in sizes
            for spec in tropical.batch_specs(n, n, n, "minplus", argmax=True, max_batch=max_batch)
        }
        async with anyio.create_task_group() as group:
            for spec in (*specs, HOPS):
                group.start_soon(compiler.compile, spec)
        batching = f"batches up to {max_batch}" if batch else "no batching"
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

        async with anyio.create_task_group() as tasks:
            # Alone, each request is solved at once; batched, IN_FLIGHT groups of a size at once.
            in_flight = IN_FLIGHT if batch else math.inf
            solver = Solver(compiler, hops, tasks, max_batch=max_batch, in_flight=in_flight)
            runner = web.AppRunner(make_app(compiler, solver))
            await runner.setup()
            # A burst of new clients beyond the default backlog (128) waits a 1 s SYN retry.
            await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
            print(f"serving on http://127.0.0.1:{port} ({batching})", flush=True)
            try:
                await anyio.sleep_forever()
            finally:
                with anyio.CancelScope(shield=True):
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
        help="solve each request alone, not in groups of concurrent requests",
    )  # fmt: skip
    args = parser.parse_args()
    anyio.run(main, args.port, args.arch, args.sizes, args.batch)
