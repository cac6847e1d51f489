"""The host's cost of a launch, and what concurrent requests gain from batching, measured side by
side in one process on one GPU.

    python benchmarks/launch.py [--out DIR] [--seed N] [--quick]

A. Host time per call (us; median over repeats of a loop of calls timed with perf_counter, no
   synchronisation inside a loop, the device synchronised between repeats) of hot 8x8x8 float32
   ``matmul_sync`` (plain, ``out=``, ``argmax=True``), ``await matmul`` (plain, argmax),
   ``backward_sync`` and ``await backward``, against the floor: a CuPy ``RawKernel`` launch of an
   empty kernel taking as many arguments as the tropical kernel that serves the call (CuPy arrays
   and NumPy scalars, as a user passes them), with its output allocated per call or preallocated;
   beside CuPy's ``a + a`` and ``cupy.matmul`` and PyTorch's ``torch.mm`` of 8x8.
B. Requests/s at 1 to 256 asyncio tasks, a request being 8 dependent 256^3 min-plus products with
   argmax and one value read back (``await aionvrtc.synchronize()``, then ``float(x[0, 0])``):
   direct ``await tropical.matmul``, ``tropical.Batcher``, and a plain ``matmul_sync`` loop; one
   request's latency alone; and the floor, one 64 x 256^3 batched launch against 64 single ones.
Results are checked first (batcher against direct against NumPy in float64).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import importlib
import random
import statistics
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aionvrtc
from aionvrtc import tropical
from aionvrtc.tropical import reference
from benchmarks._results import RESULTS, gpu_facts, write

# Requests/s of 64 concurrent tasks before plans were cached and launches batched (DESIGN.md,
# H100, driver 580, CuPy 14.2): the figure the batcher is judged against.
BEFORE_64_TASKS = 773.0

STEPS = 8  # dependent products per request
SIZE = 256  # each product is SIZE^3
LEVELS = (1, 4, 16, 64, 256)
BATCH = 64  # the batched floor's batch, and the Batcher's max_batch

# Targets, as ratios.
GOAL_SYNC = 1.5  # hot matmul_sync / backward_sync against the floor
GOAL_AWAIT = 2.0  # await matmul / await backward against the floor
GOAL_ALONE = 1.1  # a request alone through the batcher against direct
GOAL_BEFORE = 10.0  # batcher at 64 tasks against BEFORE_64_TASKS
GOAL_SCALING = 5.0  # batcher at 64 tasks against its own 1 task

# Argument counts measured for reference (a tiled product: 4 pointers, 16
# int64, 1 int32; a backward: 6 pointers, 17 int64). The floors that ratios use are counted from
# the kernels that serve the calls in this run; these are measured beside them for reference.
NOMINAL_FORWARD = (4, 16, 1)
NOMINAL_BACKWARD = (6, 17, 0)


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    repeats: int  # of each host-cost loop
    calls: int  # per loop
    requests: int  # per concurrency level and path
    cap_s: float  # most seconds per level and path
    levels: tuple[int, ...]
    alone: int  # requests timed one by one
    floor_repeats: int


FULL = Settings(repeats=30, calls=200, requests=2048, cap_s=15.0, levels=LEVELS, alone=200,
                floor_repeats=20)  # fmt: skip
QUICK = Settings(repeats=5, calls=50, requests=256, cap_s=5.0, levels=(1, 16, 64), alone=20,
                 floor_repeats=5)  # fmt: skip


def device_sync() -> None:
    import cupy

    cupy.cuda.Device().synchronize()


# -- A. host cost per call ------------------------------------------------------------------


Timed = tuple[Callable[[], Any], bool, Callable[[], None]]  # call, awaited, synchronise


def per_call(calls: dict[str, Timed], s: Settings) -> dict[str, float]:
    """Median seconds of host time per call of each of ``calls``, over ``s.repeats`` loops of
    ``s.calls`` calls, in turns (a loop of each, then again), so that a drift of the host's
    speed reaches every call alike; awaited calls loop inside one coroutine of an asyncio
    loop. The garbage collector is off inside a loop, as timeit has it."""

    async def measure() -> dict[str, float]:
        times: dict[str, list[float]] = {name: [] for name in calls}
        for call, awaited, sync in calls.values():  # compiled, planned, allocated once
            await call() if awaited else call()
            sync()
        for _ in range(s.repeats):
            for name, (call, awaited, sync) in calls.items():
                sync()
                gc.disable()
                began = time.perf_counter()
                if awaited:
                    for _ in range(s.calls):
                        await call()
                else:
                    for _ in range(s.calls):
                        call()
                times[name].append((time.perf_counter() - began) / s.calls)
                gc.enable()
        device_sync()
        return {name: statistics.median(samples) for name, samples in times.items()}

    return asyncio.run(measure())


def signature(launch: Any, *, backward: bool) -> tuple[int, int, int]:
    """(pointers, int64 arguments, int32 arguments) of the kernel behind a planned launch, read
    from its packed arguments (private to aionvrtc: for references where they are gone)."""
    try:
        total = len(launch._values)
        name = launch.spec.name_expressions[0]
    except (AttributeError, IndexError, TypeError):
        return NOMINAL_BACKWARD if backward else NOMINAL_FORWARD
    pointers = 6 if backward else 3 if name.startswith("tropical_gemm_rows") else 4
    int32s = 1 if getattr(launch, "_flags", False) else 0
    return pointers, total - pointers - int32s, int32s


def kernel_name(launch: Any) -> str:
    try:
        return str(launch.spec.name_expressions[0])
    except (AttributeError, IndexError, TypeError):
        return "?"


def empty_kernel(sig: tuple[int, int, int]) -> Any:
    import cupy

    pointers, int64s, int32s = sig
    params = [f"float* p{i}" for i in range(pointers)]
    params += [f"long long s{i}" for i in range(int64s)]
    params += [f"int f{i}" for i in range(int32s)]
    source = f'extern "C" __global__ void k({", ".join(params)}) {{}}\n'
    return cupy.RawKernel(source, "k")


def floor_calls(
    sig: tuple[int, int, int], outputs: int, a: Any, b: Any
) -> dict[str, Callable[[], object]]:
    """An empty kernel's launch with ``sig``'s arguments: ``outputs`` arrays allocated per call,
    as ``matmul_sync(a, b)`` allocates C (and the argmax), and preallocated, as with ``out=``."""
    import cupy

    kernel = empty_kernel(sig)
    pointers, int64s, int32s = sig
    scalars = (*(np.int64(8) for _ in range(int64s)), *(np.int32(0) for _ in range(int32s)))
    extra = tuple(cupy.empty((8, 8), np.float32) for _ in range(pointers - 3))
    out = cupy.empty((8, 8), np.float32)
    fresh = max(0, min(outputs, pointers - 2) - 1)  # allocated beside C, in the extra slots

    def allocated() -> None:
        c = cupy.empty((8, 8), np.float32)
        more = tuple(cupy.empty((8, 8), np.float32) for _ in range(fresh))
        kernel((1,), (32,), (a, b, c, *more, *extra[fresh:], *scalars))

    def preallocated() -> None:
        kernel((1,), (32,), (a, b, out, *extra, *scalars))

    return {"allocated": allocated, "preallocated": preallocated}


def host_costs(s: Settings) -> dict[str, Any]:
    import cupy

    from aionvrtc.tropical.products import _plan_cache

    a = cupy.random.standard_normal((8, 8), dtype=np.float32)
    b = cupy.random.standard_normal((8, 8), dtype=np.float32)
    out = cupy.empty((8, 8), np.float32)
    _, idx = tropical.matmul_sync(a, b, argmax=True)
    g = cupy.random.standard_normal((8, 8), dtype=np.float32)
    tropical.backward_sync(g, a, b, idx)
    device_sync()

    # The floors take as many arguments as the kernels that serve these calls take.
    forward, _ = _plan_cache.find(a, b, "maxplus", argmax=False, out=None, accumulate=False)
    argmax_fwd, _ = _plan_cache.find(a, b, "maxplus", argmax=True, out=None, accumulate=False)
    backward = _plan_cache.planned_backward(g, a, b, idx, "maxplus")
    sigs = {
        "forward": signature(forward.launch, backward=False),
        "forward_argmax": signature(argmax_fwd.launch, backward=False),
        "backward": signature(backward, backward=True),
        "nominal_forward": NOMINAL_FORWARD,
        "nominal_backward": NOMINAL_BACKWARD,
    }
    kernels = {
        "forward": kernel_name(forward.launch),
        "forward_argmax": kernel_name(argmax_fwd.launch),
        "backward": kernel_name(backward),
    }
    # Arrays each call allocates: C; C and the argmax; both gradients in one allocation.
    outputs = {"forward_argmax": 2}
    timed: dict[str, Timed] = {}
    for key, sig in sigs.items():
        for how, launch in floor_calls(sig, outputs.get(key, 1), a, b).items():
            timed[f"floor {key} {how}"] = (launch, False, device_sync)
    # (call, how it is called, the floor it is judged against, how that floor's output is
    # made, the ratio it should stay within)
    cases: list[tuple[str, Timed, str | None, str, float | None]] = [
        ("tropical.matmul_sync(a, b)", (lambda: tropical.matmul_sync(a, b), False, device_sync),
         "forward", "allocated", GOAL_SYNC),
        ("tropical.matmul_sync(a, b, out=out)",
         (lambda: tropical.matmul_sync(a, b, out=out), False, device_sync),
         "forward", "preallocated", GOAL_SYNC),
        ("tropical.matmul_sync(a, b, argmax=True)",
         (lambda: tropical.matmul_sync(a, b, argmax=True), False, device_sync),
         "forward_argmax", "allocated", GOAL_SYNC),
        ("await tropical.matmul(a, b)", (lambda: tropical.matmul(a, b), True, device_sync),
         "forward", "allocated", GOAL_AWAIT),
        ("await tropical.matmul(a, b, argmax=True)",
         (lambda: tropical.matmul(a, b, argmax=True), True, device_sync),
         "forward_argmax", "allocated", GOAL_AWAIT),
        ("tropical.backward_sync(g, a, b, idx)",
         (lambda: tropical.backward_sync(g, a, b, idx), False, device_sync),
         "backward", "allocated", GOAL_SYNC),
        ("await tropical.backward(g, a, b, idx)",
         (lambda: tropical.backward(g, a, b, idx), True, device_sync),
         "backward", "allocated", GOAL_AWAIT),
        ("cupy: a + a (8x8 float32)", (lambda: a + a, False, device_sync),
         "forward", "allocated", None),
        ("cupy.matmul(a, b) (8x8 float32)", (lambda: cupy.matmul(a, b), False, device_sync),
         "forward", "allocated", None),
    ]  # fmt: skip
    torch_note = None
    try:
        import torch
    except ImportError as exc:
        torch_note = f"PyTorch not measured: {exc}"
    else:
        try:
            x = torch.randn(8, 8, device="cuda", dtype=torch.float32)
            y = torch.randn(8, 8, device="cuda", dtype=torch.float32)
            torch.mm(x, y)
            torch.cuda.synchronize()
        except Exception as exc:  # a torch without CUDA, or built for another CUDA
            torch_note = f"PyTorch not measured: {type(exc).__name__}: {exc}"
        else:
            label = f"torch.mm(x, y) (8x8 float32, torch {torch.__version__})"
            cases.append((label, (lambda: torch.mm(x, y), False, torch.cuda.synchronize),
                          "forward", "allocated", None))  # fmt: skip
    for name, how_called, *_ in cases:
        timed[name] = how_called
    seconds = per_call(timed, s)
    floors = {
        key: {how: seconds[f"floor {key} {how}"] for how in ("allocated", "preallocated")}
        for key in sigs
    }

    rows: list[dict[str, Any]] = []

    def row(call: str, took: float, key: str | None, how: str, goal: float | None) -> None:
        against = floors[key][how] if key else None
        strict = floors[key]["preallocated"] if key else None
        rows.append({
            "call": call,
            "us": took * 1e6,
            "floor": f"RawKernel, {sum(sigs[key])} args, out {how}" if key else None,
            "ratio": took / against if against else None,
            "ratio_preallocated": took / strict if strict else None,
            "goal": goal,
        })  # fmt: skip

    for name, _, against, how, goal in cases:
        row(name, seconds[name], against, how, goal)
    for key, sig in sigs.items():
        for how in ("allocated", "preallocated"):
            tag = "for reference" if key.startswith("nominal") else f"{key} floor"
            row(f"RawKernel, {sum(sig)} args, out {how} ({tag})", floors[key][how], None, how, None)
    return {"rows": rows, "signatures": sigs, "kernels": kernels, "torch_note": torch_note}


# -- B. concurrent requests -----------------------------------------------------------------

Product = Callable[[Any, Any], Awaitable[Any]]


async def request(product: Product, x: Any, bs: Sequence[Any]) -> Any:
    """A request's products, its result read back without blocking the event loop."""
    for b in bs:
        x, _ = await product(x, b)
    await aionvrtc.synchronize()
    return float(x[0, 0])


def direct_product(x: Any, b: Any) -> Awaitable[Any]:
    return tropical.matmul(x, b, "minplus", argmax=True)


def batcher_product(batcher: tropical.Batcher) -> Product:
    def call(x: Any, b: Any) -> Awaitable[Any]:
        return batcher.matmul(x, b, "minplus", argmax=True)

    return call


def sequential(inputs: Sequence[Any], bs: Sequence[Any], cap_s: float) -> tuple[int, float]:
    """Requests served one after another by ``matmul_sync``, the read blocking."""
    began = time.perf_counter()
    done = 0
    for first in inputs:
        x = first
        for b in bs:
            x, _ = tropical.matmul_sync(x, b, "minplus", argmax=True)
        float(x[0, 0])
        done += 1
        if time.perf_counter() - began > cap_s:
            break
    return done, time.perf_counter() - began


async def concurrent(
    product: Product, tasks: int, inputs: Sequence[Any], bs: Sequence[Any], cap_s: float
) -> tuple[int, float]:
    """``tasks`` asyncio tasks taking requests from ``inputs`` until all are served or ``cap_s``
    has passed: (requests served, seconds)."""
    queue = iter(inputs)
    done = 0
    began = time.perf_counter()
    deadline = began + cap_s

    async def worker() -> None:
        nonlocal done
        for x in queue:
            await request(product, x, bs)
            done += 1
            if time.perf_counter() > deadline:
                return

    async with asyncio.TaskGroup() as group:
        for _ in range(tasks):
            group.create_task(worker())
    return done, time.perf_counter() - began


async def loop_floor(tasks: int, inputs: Sequence[Any], *, views: bool) -> float:
    """Requests/s that the event loop and CuPy allow a batched request without the batcher or
    the GPU: each of a request's steps is one wait for a future shared by the step's group of
    ``tasks`` (the last to arrive sets it), where ``views`` with each member's value and argmax
    made as arrays over one batched output, as a batch's results are; then the read
    (``await synchronize()``, ``float(x[0, 0])``). No product is computed."""
    import cupy

    loop = asyncio.get_running_loop()
    per_task = len(inputs) // tasks
    values = cupy.empty((tasks, SIZE, SIZE), np.float32)
    where = cupy.empty((tasks, SIZE, SIZE), np.int32)

    def slices(batch: Any) -> list[Any]:
        shape, dtype, step, memory = batch.shape[1:], batch.dtype, batch.strides[0], batch.data
        return [cupy.ndarray(shape, dtype, memory + i * step) for i in range(tasks)]

    groups: dict[tuple[int, int], list[Any]] = {}

    async def worker(first: int) -> None:
        for r in range(per_task):
            x = inputs[first + r]
            for step in range(STEPS):
                group = groups.setdefault((r, step), [loop.create_future(), 0])
                slot, group[1] = group[1], group[1] + 1
                if group[1] == tasks:
                    del groups[r, step]
                    group[0].set_result((slices(values), slices(where)) if views else None)
                made = await group[0]
                if made is not None:
                    x, _ = made[0][slot], made[1][slot]
            await aionvrtc.synchronize()
            float(x[0, 0])

    began = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for t in range(tasks):
            group.create_task(worker(t * per_task))
    return per_task * tasks / (time.perf_counter() - began)


def uvloop_curve(s: Settings) -> list[dict[str, Any]] | None:
    """The batcher and the direct path at 1 and 64 tasks on uvloop (None where it is not
    installed): the event loop's share of a request's host time."""
    try:
        uvloop = importlib.import_module("uvloop")  # not a dependency: used where installed
    except ImportError:
        return None
    import cupy

    async def run() -> list[dict[str, Any]]:
        bs = [cupy.random.standard_normal((SIZE, SIZE), dtype=np.float32) for _ in range(STEPS)]
        inputs = [cupy.random.standard_normal((SIZE, SIZE), dtype=np.float32)
                  for _ in range(s.requests)]  # fmt: skip
        await warm_b(bs, inputs)
        rows = []
        for tasks in (1, 64):
            for path in ("direct", "batcher"):
                batcher = new_batcher() if path == "batcher" else None
                product = batcher_product(batcher) if batcher is not None else direct_product
                device_sync()
                done, seconds = await concurrent(product, tasks, inputs, bs, s.cap_s)
                rows.append({"path": path, "tasks": tasks, "requests_per_s": done / seconds,
                             "batcher": batcher_stats(batcher) if batcher else None})  # fmt: skip
        rows += [
            {"path": f"floor: {what}", "tasks": tasks,
             "requests_per_s": await loop_floor(tasks, inputs, views=what == "views")}
            for what in ("futures", "views") for tasks in (1, 64)
        ]  # fmt: skip
        return rows

    rows: list[dict[str, Any]] = uvloop.run(run())
    return rows


def batcher_stats(batcher: Any) -> dict[str, Any]:
    stats = batcher.stats() if hasattr(batcher, "stats") else None
    requests = getattr(stats, "requests", None)
    launches = getattr(stats, "launches", None)
    return {
        "requests": requests,
        "launches": launches,
        "alone": getattr(stats, "alone", None),
        "mean_batch": requests / launches if requests and launches else None,
    }


def new_batcher() -> tropical.Batcher:
    return tropical.Batcher(max_batch=BATCH)


async def check(bs: Sequence[Any], bs64: Sequence[Any], seed: int) -> dict[str, Any]:
    """A few requests, run concurrently through the batcher (so that they are batched) and
    directly, against each other (values and argmax, exactly) and against NumPy's min-plus in
    float64. A failure is recorded and shouted, and the run goes on: its table says so."""
    import cupy

    rng = np.random.default_rng(seed)
    xs = [cupy.asarray(rng.standard_normal((SIZE, SIZE), dtype=np.float32)) for _ in range(4)]

    async def final(product: Product, x: Any) -> tuple[Any, Any]:
        idx = None
        for b in bs:
            x, idx = await product(x, b)
        await aionvrtc.synchronize()
        return cupy.asnumpy(x), cupy.asnumpy(idx)

    batcher = new_batcher()
    batched = await asyncio.gather(*(final(batcher_product(batcher), x) for x in xs))
    direct = [await final(direct_product, x) for x in xs]
    equal, worst = True, 0.0
    for (bx, bi), (dx, di), x in zip(batched, direct, xs, strict=True):
        equal = equal and np.array_equal(bx, dx) and np.array_equal(bi, di)
        want = cupy.asnumpy(x).astype(np.float64)
        for b in bs64:
            want, _ = reference.matmul(want, b, "minplus", argmax=True)
        worst = max(worst, float(np.max(np.abs(dx - want) / (1e-4 + 1e-5 * np.abs(want)))))
    ok = equal and worst <= 1.0
    if not ok:
        print(f"CHECK FAILED: batcher equals direct {equal}, worst error {worst:.3g} of the "
              "tolerance (atol 1e-4, rtol 1e-5)", file=sys.stderr, flush=True)  # fmt: skip
    return {
        "ok": ok,
        "requests": len(xs),
        "batcher_equals_direct": equal,
        "worst_vs_float64_in_tolerances": worst,  # |got - want| / (1e-4 + 1e-5 |want|)
        "batcher": batcher_stats(batcher),
    }


async def latency_alone(
    products: tuple[Product, Product], inputs: Sequence[Any], bs: Sequence[Any]
) -> tuple[float, float]:
    """Median seconds of one request with nothing else running, by each path: the paths take
    turns, request by request, so that a drift of the GPU's clock reaches both alike."""
    times: tuple[list[float], list[float]] = ([], [])
    for x in inputs:
        for product, samples in zip(products, times, strict=True):
            began = time.perf_counter()
            await request(product, x, bs)
            samples.append(time.perf_counter() - began)
    return statistics.median(times[0]), statistics.median(times[1])


async def batched_floor(bs: Sequence[Any], repeats: int) -> dict[str, Any]:
    """One launch of BATCH x SIZE^3 min-plus with argmax, against BATCH launches of one
    product each, CUDA-event timed (host gaps included); and the batched kernel alone."""
    import cupy

    from aionvrtc.tropical.tuning import timed

    a3 = cupy.random.standard_normal((BATCH, SIZE, SIZE), dtype=np.float32)
    b = bs[0]
    singles = [a3[i] for i in range(BATCH)]
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()

    async def one_launch() -> None:
        await tropical.matmul(a3, b, "minplus", argmax=True)

    async def many_launches() -> None:
        for x in singles:
            await tropical.matmul(x, b, "minplus", argmax=True)

    def event_timed(work: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[float]]:
        async def once() -> float:
            device_sync()
            start.record()
            await work()
            stop.record()
            stop.synchronize()
            return float(cupy.cuda.get_elapsed_time(start, stop)) / 1e3

        return once

    results: dict[str, Any] = {}
    for name, work in (("batched", one_launch), ("singles", many_launches)):
        once = event_timed(work)
        await once()  # plans, and compiles if the warm-up did not
        results[f"{name}_s"] = statistics.median([await once() for _ in range(repeats)])
    c3 = cupy.empty((BATCH, SIZE, SIZE), np.float32)
    i3 = cupy.empty((BATCH, SIZE, SIZE), np.int32)
    results["batched_kernel_s"] = timed(
        lambda: tropical.matmul_sync(a3, b, "minplus", argmax=True, out=(c3, i3)), repeats
    )
    results["speedup"] = results["singles_s"] / results["batched_s"]
    # A request is STEPS products: BATCH requests need STEPS batched launches.
    results["ceiling_requests_per_s"] = BATCH / (STEPS * results["batched_s"])
    return results


async def warm_b(bs: Sequence[Any], inputs: Sequence[Any]) -> None:
    """Plans and kernels for every batch the batcher can form, and one pass of each path."""
    import cupy

    stack = cupy.stack(list(inputs[:BATCH]))
    for n in range(1, BATCH + 1):
        for b in bs[:1]:
            await tropical.matmul(stack[:n], b, "minplus", argmax=True)
    batcher = new_batcher()
    await concurrent(batcher_product(batcher), BATCH, inputs[: 2 * BATCH], bs, 60.0)
    await concurrent(direct_product, 4, inputs[:8], bs, 60.0)
    sequential(inputs[:4], bs, 60.0)
    device_sync()


async def requests_curve(s: Settings, seed: int) -> dict[str, Any]:
    import cupy

    bs = [cupy.random.standard_normal((SIZE, SIZE), dtype=np.float32) for _ in range(STEPS)]
    bs64 = [cupy.asnumpy(b).astype(np.float64) for b in bs]
    correctness = await check(bs, bs64, seed)
    # Each request's input is an allocation of its own, made before timing, as a server's
    # requests would bring (a batch of them is stacked into one operand: a copy).
    inputs = [cupy.random.standard_normal((SIZE, SIZE), dtype=np.float32)
              for _ in range(s.requests)]  # fmt: skip
    await warm_b(bs, inputs)

    alone_inputs = inputs[: s.alone]
    alone_batcher = new_batcher()
    device_sync()
    direct_alone, batcher_alone = await latency_alone(
        (direct_product, batcher_product(alone_batcher)), alone_inputs, bs
    )

    curve: list[dict[str, Any]] = []
    for tasks in s.levels:
        for path in ("direct", "batcher"):
            batcher = new_batcher() if path == "batcher" else None
            product = batcher_product(batcher) if batcher is not None else direct_product
            device_sync()
            done, seconds = await concurrent(product, tasks, inputs, bs, s.cap_s)
            curve.append({
                "path": path, "tasks": tasks, "requests": done, "seconds": seconds,
                "requests_per_s": done / seconds,
                "batcher": batcher_stats(batcher) if batcher is not None else None,
            })  # fmt: skip
    device_sync()
    done, seconds = sequential(inputs, bs, s.cap_s)
    curve.append({
        "path": "sequential matmul_sync", "tasks": 1, "requests": done, "seconds": seconds,
        "requests_per_s": done / seconds, "batcher": None,
    })  # fmt: skip

    # Each floor three times, in turns; the median of each.
    runs: dict[str, list[float]] = {}
    for _ in range(3):
        for what in ("futures", "views"):
            for tasks in (1, 64):
                measured = await loop_floor(tasks, inputs, views=what == "views")
                runs.setdefault(f"{what}, {tasks} tasks", []).append(measured)
    floors = {name: statistics.median(rates) for name, rates in runs.items()}
    floor = await batched_floor(bs, s.floor_repeats)
    rate = {(r["path"], r["tasks"]): r["requests_per_s"] for r in curve}
    at64 = rate.get(("batcher", 64))
    one = rate.get(("batcher", 1))
    return {
        "correctness": correctness,
        "alone": {
            "requests": len(alone_inputs),
            "direct_s": direct_alone,
            "batcher_s": batcher_alone,
            "ratio": batcher_alone / direct_alone,
            "goal": GOAL_ALONE,
            "batcher": batcher_stats(alone_batcher),
        },
        "curve": curve,
        "batcher_64": {
            "requests_per_s": at64,
            "vs_before": at64 / BEFORE_64_TASKS if at64 else None,
            "before_requests_per_s": BEFORE_64_TASKS,
            "goal_vs_before": GOAL_BEFORE,
            "vs_1_task": at64 / one if at64 and one else None,
            "goal_vs_1_task": GOAL_SCALING,
        },
        "batched_floor": floor,
        "loop_floors": floors,
    }


# -- report ---------------------------------------------------------------------------------


def fmt(x: float | None, spec: str = ".2f") -> str:
    return "" if x is None else format(x, spec)


def table(facts: dict[str, Any], s: Settings, seed: int, a: dict[str, Any],
          b: dict[str, Any]) -> str:  # fmt: skip
    sig = a["signatures"]
    lines = [
        f"# Launch cost and batched requests, {facts['gpu']}",
        "",
        f"Driver {facts['driver']}, CuPy {facts['cupy']}, NVRTC {facts['nvrtc']}, aionvrtc "
        f"{facts['aionvrtc']}, Python {facts['python']}, {facts['date']}; seed {seed}. One "
        "process, one run.",
        "",
        "## A. Host time per call (8x8x8 float32)",
        "",
        f"Median over {s.repeats} loops of {s.calls} calls, each loop timed with perf_counter and "
        "no synchronisation inside it (the device synchronised between loops, the garbage "
        "collector off inside them); the calls take turns, a loop of each in every round. The "
        "floor is a "
        "CuPy `RawKernel` launch of an empty kernel taking as many arguments as the kernel that "
        "serves the call (CuPy arrays and NumPy scalars): "
        f"forward `{a['kernels']['forward']}` {sum(sig['forward'])} args, with argmax "
        f"`{a['kernels']['forward_argmax']}` {sum(sig['forward_argmax'])}, backward "
        f"`{a['kernels']['backward']}` {sum(sig['backward'])}; its output allocated per call "
        "where the call allocates one (ratio), and preallocated (strict ratio).",
        "",
        "| call | us/call | floor | x floor | x floor (prealloc.) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in a["rows"]:
        lines.append(
            f"| {r['call']} | {r['us']:.1f} | {r['floor'] or ''} | {fmt(r['ratio'])} | "
            f"{fmt(r['ratio_preallocated'])} |"
        )
    if a["torch_note"]:
        lines += ["", a["torch_note"]]
    if "error" in b:
        lines += ["", "## B. Requests", "", f"Failed: {b['error']}", ""]
        return "\n".join(lines)
    alone, at64, floor = b["alone"], b["batcher_64"], b["batched_floor"]
    check_ = b["correctness"]
    lines += [
        "",
        f"## B. Requests of {STEPS} dependent {SIZE}^3 min-plus products with argmax",
        "",
        "A request's products are x, idx = x (x) B[i] for 8 fixed B, then `await "
        "aionvrtc.synchronize()` and `float(x[0, 0])`; each request's x is an allocation of its "
        f"own, made before timing. Up to {s.requests} requests (at most {s.cap_s:g} s) per level "
        f"and path; `Batcher(max_batch={BATCH})`, a new one per level. Checked first: "
        f"{check_['requests']} requests run concurrently through the batcher against the direct "
        "path's (values and argmax, exactly) and NumPy's float64 min-plus (atol 1e-4, rtol "
        f"1e-5): {'passed' if check_['ok'] else '**FAILED**'} (batcher equals direct: "
        f"{check_['batcher_equals_direct']}; worst error "
        f"{check_['worst_vs_float64_in_tolerances']:.2f} of the tolerance).",
        "",
        "| path | tasks | requests/s | requests | mean batch |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in b["curve"]:
        batch = (r["batcher"] or {}).get("mean_batch")
        lines.append(
            f"| {r['path']} | {r['tasks']} | {r['requests_per_s']:.0f} | {r['requests']} | "
            f"{fmt(batch, '.1f')} |"
        )
    lines += [
        "",
        f"- One request alone (median of {alone['requests']}): direct "
        f"{alone['direct_s'] * 1e3:.3f} ms, batcher {alone['batcher_s'] * 1e3:.3f} ms, ratio "
        f"{alone['ratio']:.2f}.",
        f"- Batcher at 64 tasks: {fmt(at64['requests_per_s'], '.0f')} requests/s, "
        f"{fmt(at64['vs_before'])}x the {BEFORE_64_TASKS:.0f}/s before launch plans and "
        f"batching, {fmt(at64['vs_1_task'])}x its own 1-task rate.",
        f"- Floor: {BATCH} x {SIZE}^3 min-plus with argmax in one `await tropical.matmul` of "
        f"3-D operands {floor['batched_s'] * 1e3:.3f} ms against {BATCH} single launches "
        f"{floor['singles_s'] * 1e3:.3f} ms ({floor['speedup']:.1f}x; CUDA events around the "
        f"calls, median of {s.floor_repeats}); the batched kernel alone (CUDA-graph replays) "
        f"{floor['batched_kernel_s'] * 1e3:.3f} ms. {STEPS} batched launches per {BATCH} "
        f"requests: a ceiling of {floor['ceiling_requests_per_s']:.0f} requests/s.",
        "- The event loop's floor (no product computed: each step one wait for a future that "
        "the step's group shares, then the read; \"views\" also makes each member's value and "
        "argmax over one batched output, as a batch's results are; the median of three runs), "
        "requests/s: " + ", ".join(f"{k} {v:.0f}" for k, v in b["loop_floors"].items()) + ".",
        "",
    ]
    if b.get("uvloop"):
        lines += [
            "On uvloop (the same requests, in the same process after the above):",
            "",
            "| path | tasks | requests/s | mean batch |",
            "| --- | --- | --- | --- |",
        ]
        for r in b["uvloop"]:
            batch = (r.get("batcher") or {}).get("mean_batch")
            lines.append(
                f"| {r['path']} | {r['tasks']} | {r['requests_per_s']:.0f} | {fmt(batch, '.1f')} |"
            )
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--seed", type=int, default=None, help="default: from the time")
    parser.add_argument("--quick", action="store_true", help="a fast smoke run")
    args = parser.parse_args()
    import cupy

    seed = args.seed if args.seed is not None else time.time_ns() % (1 << 31)
    print(f"seed {seed}", flush=True)
    random.seed(seed)
    np.random.seed(seed)
    cupy.random.seed(seed)
    try:
        import torch
    except ImportError:
        pass
    else:
        torch.manual_seed(seed)
    s = QUICK if args.quick else FULL
    facts = gpu_facts()
    a = host_costs(s)
    print("A: host costs measured", flush=True)
    try:
        b = asyncio.run(requests_curve(s, seed))
    except Exception as exc:  # A's results still get written
        traceback.print_exc()
        b = {"error": f"{type(exc).__name__}: {exc}"}
    if "error" not in b:
        b["uvloop"] = uvloop_curve(s)
    slug = facts["gpu"].replace("NVIDIA ", "")
    name = "launch-quick" if args.quick else "launch"
    facts = {**facts, "seed": seed, "settings": dataclasses.asdict(s)}
    results = {"host": a, "requests": b}
    write(
        args.out, name, label=slug, facts=facts, results=results, table=table(facts, s, seed, a, b)
    )


if __name__ == "__main__":
    main()
