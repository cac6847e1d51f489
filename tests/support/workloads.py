"""The reliability workloads, sized by their callers: tests/reliability runs them small in CI,
benchmarks/soak.py runs them at full size and commits the figures. Real processes, real files,
real NVRTC; the only fault injected by hand is the kill itself (SIGKILL, as a crash or the OOM
killer delivers it)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio

from aionvrtc import Compiler, CompilerClosed, KernelSpec, kernel_key
from aionvrtc._store.disk import STALE_TMP_SECONDS, DiskTier

# -- crash safety --------------------------------------------------------------------------------

# Writes entries of 0.5 to 4 MiB (a write takes long enough to be killed in the middle) over a
# few keys, forever, printing a line after each, until it is killed.
WRITER = r"""
import os, random, sys
from aionvrtc import Artifact
from aionvrtc._store.disk import DiskTier

tier = DiskTier(sys.argv[1])
rng = random.Random(int(sys.argv[2]))
keys = [f"{k:02x}" * 32 for k in range(8)]
while True:
    size = rng.randint(1 << 19, 1 << 22)
    image = rng.randbytes(size)
    tier.write(Artifact(key=rng.choice(keys), kind="ptx", image=image, arch="sm_90",
                        nvrtc_version="13.0"))
    print("wrote", flush=True)
"""


def crash_trials(root: Path, trials: int, seed: int) -> dict[str, Any]:
    """Kill a writer with SIGKILL at a random point ``trials`` times over one cache dir, then
    check every file: entries must verify, tmp files must be the only other thing left, and a
    scan must remove them once they are stale."""
    rng = random.Random(seed)
    mid_write = 0
    for trial in range(trials):
        before = set(root.rglob("*.tmp"))
        child = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(root), str(seed * 100_003 + trial)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        child.stdout.readline()  # imported and wrote once: the kill lands among writes
        time.sleep(rng.uniform(0.0, 0.05))
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        left = set(root.rglob("*.tmp"))
        mid_write += bool(left - before)
    tier = DiskTier(root)
    files = [p for p in root.rglob("*") if p.is_file()]
    entries = [p for p in files if len(p.name) == 64]
    leftovers = [p for p in files if p.name.endswith(".tmp")]
    others = [p for p in files if p not in entries and p not in leftovers]
    verified = sum(tier.read(p.name) is not None for p in entries)
    old = time.time() - STALE_TMP_SECONDS - 60
    for path in leftovers:  # as if the next process started ten minutes later
        os.utime(path, (old, old))
    tier.scan()
    return {
        "trials": trials,
        "trials_that_left_a_tmp_file": mid_write,
        "entries": len(entries),
        "entries_verified": verified,
        "corrupt": tier.corrupt,
        "tmp_files_left": len(leftovers),
        "tmp_files_after_scan": len(list(root.rglob("*.tmp"))),
        # Lock files of writers killed while holding one, and the cache dir's index.
        "other_files": sorted(p.name for p in others if not p.name.endswith((".lock", ".index"))),
    }


# -- many processes, one cache dir ---------------------------------------------------------------

TEMPLATE = """
template <typename T>
__global__ void load_{tag}(T* x, T a, int n) {{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * a + T({tag});
}}
"""


def load_spec(tag: int, salt: str) -> KernelSpec:
    return KernelSpec(
        TEMPLATE.format(tag=tag),
        name_expressions=(f"load_{tag}<float>",),
        name=f"load_{salt}_{tag}.cu",
    )


CLIENT = r"""
import json, random, sys, time
import anyio
from aionvrtc import Compiler
from tests.support.workloads import load_spec

root, requests, keys, seed, salt, start = sys.argv[1:7]
rng = random.Random(int(seed))

async def main():
    async with Compiler(arch="sm_90", cache_dir=root, concurrency=2) as compiler:
        await anyio.sleep(max(0.0, float(start) - time.time()))
        bad = 0
        # Every key once in a random order, then random keys: each is asked for at least once.
        tags = rng.sample(range(int(keys)), int(keys))
        tags += [rng.randrange(int(keys)) for _ in range(int(requests) - len(tags))]
        for tag in tags:
            artifact = await compiler.compile(load_spec(tag, salt))
            bad += artifact.kind != "cubin" or not artifact.image.startswith(b"\x7fELF")
        s = compiler.stats()
        print(json.dumps({"compiles": s.compiles, "disk_hits": s.disk.hits,
                          "memory_hits": s.memory.hits, "corrupt": s.disk.corrupt_dropped,
                          "errors": s.errors, "bad": bad}))

anyio.run(main)
"""


def multi_process_load(
    root: Path, processes: int, requests: int, keys: int, seed: int
) -> dict[str, Any]:
    """``processes`` processes send ``requests`` requests each (at least ``keys``) over ``keys``
    kernels to one cache dir, all starting together. Returns the totals."""
    if requests < keys:
        raise ValueError(f"requests ({requests}) must cover the keys ({keys})")
    salt = f"{os.getpid()}_{seed}_{time.time_ns()}"  # fresh kernels: nothing cached anywhere
    start = time.time() + 3.0  # every child has imported aionvrtc by then
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), *sys.path])}
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                CLIENT,
                str(root),
                str(requests),
                str(keys),
                str(seed * 1000 + i),
                salt,
                str(start),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(processes)
    ]
    outputs = [child.communicate(timeout=1800) for child in children]
    for child, (_, err) in zip(children, outputs, strict=True):
        if child.returncode != 0:
            raise AssertionError(f"client failed ({child.returncode}):\n{err}")
    results = [json.loads(out) for out, _ in outputs]
    seconds = time.time() - start
    totals = {name: sum(r[name] for r in results) for name in results[0]}
    return {
        "processes": processes,
        "requests": processes * requests,
        "keys": keys,
        "seconds": round(seconds, 2),
        "requests_per_s": round(processes * requests / seconds, 1),
        **totals,
    }


# -- cancellation and shutdown storms ------------------------------------------------------------


async def storm(waiters: int, kernels: int, seed: int, cache_dir: Path) -> dict[str, Any]:
    """``waiters`` tasks ask for one of ``kernels`` fresh kernels; a random third are cancelled
    at a random moment, and the Compiler closes while they wait, after a random number of the
    kernels (at most half) are compiled. Every waiter must end with a
    result, its cancellation or CompilerClosed."""
    rng = random.Random(seed)
    salt = f"storm_{os.getpid()}_{seed}_{time.time_ns()}"
    specs = [load_spec(i, salt) for i in range(kernels)]
    outcomes = {"result": 0, "cancelled": 0, "closed": 0, "other": 0}
    others: list[str] = []
    in_flight_at_close: list[int] = []
    tasks_before = _task_count()

    async def waiter(compiler: Compiler, spec: KernelSpec, cancel_after: float | None) -> None:
        with anyio.CancelScope() as scope:
            if cancel_after is not None:
                scope.deadline = anyio.current_time() + cancel_after
            try:
                await compiler.compile(spec)
            except CompilerClosed:
                outcomes["closed"] += 1
                return
            except Exception as exc:
                outcomes["other"] += 1
                others.append(repr(exc))
                return
            outcomes["result"] += 1
        if scope.cancelled_caught:
            outcomes["cancelled"] += 1

    async def close_later(compiler: Compiler, done: int) -> None:
        # As a server's shutdown handler would, from a task of its own, in the middle of it
        # all: once ``done`` kernels are compiled, with others running and queued.
        while compiler.stats().compiles < done:
            await anyio.sleep(0.001)
        await compiler.aclose()
        in_flight_at_close.append(compiler.stats().in_flight)

    compiler = Compiler(arch="sm_90", cache_dir=cache_dir, concurrency=2)
    async with compiler, anyio.create_task_group() as group:
        for _ in range(waiters):
            cancel = rng.uniform(0.0, 2.0) if rng.random() < 1 / 3 else None
            group.start_soon(waiter, compiler, rng.choice(specs), cancel)
        group.start_soon(close_later, compiler, rng.randint(1, kernels // 2))
    stats = compiler.stats()
    tasks_after = _task_count()
    tasks_left = None if tasks_before is None or tasks_after is None else tasks_after - tasks_before
    return {
        "waiters": waiters,
        **outcomes,
        "other_errors": others[:5],
        "compiles": stats.compiles,
        "in_flight_when_aclose_returned": in_flight_at_close[0],
        "in_flight_after_close": stats.in_flight,
        "queued_after_close": stats.queued,
        "tasks_left": tasks_left,  # asyncio only: trio has no list of live tasks
        # Idle worker threads of anyio's or trio's pool may stay for reuse; anything else would
        # be a thread the Compiler left behind.
        "other_threads_after": sorted(
            t.name
            for t in threading.enumerate()
            if t is not threading.main_thread()
            and not t.name.startswith(("AnyIO worker thread", "Trio thread"))
        ),
    }


def _task_count() -> int | None:
    """Live tasks under asyncio (trio keeps no list of them)."""
    import asyncio

    try:
        return len(asyncio.all_tasks())
    except RuntimeError:  # no asyncio loop running: trio
        return None


# -- a hostile cache dir -------------------------------------------------------------------------

# What an unlucky disk or a hostile user with this user's rights can leave at an entry's path.
# Each must cost a recompile, never a failed, hung or wrong request.
HOSTILE_KINDS = (
    "fifo", "directory", "symlink", "huge_int", "deep_json", "truncated", "garbage", "fifo_lock",
)  # fmt: skip


def checksummed(header: bytes, image: bytes = b"\x7fELF", claimed: int | None = None) -> bytes:
    """An entry with a valid checksum around whatever header bytes it is given (``claimed``:
    the header length the prefix states, if not its own)."""
    import hashlib
    import struct

    from aionvrtc import FORMAT_VERSION
    from aionvrtc._artifact import MAGIC

    length = len(header) if claimed is None else claimed
    body = struct.pack(">8sHI", MAGIC, FORMAT_VERSION, length) + header
    body += struct.pack(">Q", len(image)) + image
    return body + hashlib.sha256(body).digest()


def plant(entry: Path, kind: str, good: bytes) -> None:
    """Leave ``kind`` at ``entry`` (the entry's path in its shard); ``good`` is a valid entry of
    another key, whose header the crafted ones start from."""
    from aionvrtc._artifact import read_header

    entry.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    import io

    header = read_header(io.BytesIO(good))
    header["key"] = entry.name
    if kind == "fifo":
        os.mkfifo(entry, 0o600)
    elif kind == "directory":
        entry.mkdir(mode=0o700)
        (entry / "inside").write_bytes(b"x")
    elif kind == "symlink":
        outside = entry.parent.parent.parent / f"outside-{entry.name}"
        outside.write_bytes(good)
        entry.symlink_to(outside)
    elif kind == "huge_int":
        header["created"] = 10**400
        entry.write_bytes(checksummed(json.dumps(header).encode(), b"\x7fELF"))
    elif kind == "deep_json":
        entry.write_bytes(checksummed(b"[" * 100_000 + b"]" * 100_000, b"\x7fELF"))
    elif kind == "truncated":
        entry.write_bytes(good[: len(good) // 2])
    elif kind == "garbage":
        entry.write_bytes(random.Random(entry.name).randbytes(4096))
    elif kind == "fifo_lock":
        os.mkfifo(entry.with_name(f".{entry.name}.lock"), 0o600)
    else:
        raise ValueError(f"unknown hostile kind {kind!r}")


HOSTILE_TIMEOUT = 120.0  # seconds for all the requests: they take about one compile each


def _open_fds() -> int | None:
    """File descriptors this process holds (Linux), to see none leak."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


async def hostile_cache(root: Path, kernels: int, seed: int) -> dict[str, Any]:
    """Plant one hostile item (cycling over HOSTILE_KINDS) at the path of each of ``kernels``
    fresh kernels, and a FIFO at the cache's ``.events``; then ask for them all at once from a
    Compiler of the default concurrency (1), within HOSTILE_TIMEOUT. Returns what happened."""
    from aionvrtc import FORMAT_VERSION, KernelCache

    salt = f"hostile_{os.getpid()}_{seed}_{time.time_ns()}"
    specs = [load_spec(i, salt) for i in range(kernels)]
    version_dir = root / f"v{FORMAT_VERSION}"
    donor = KernelCache("sm_90", cache_dir=root / "donor").get_or_compile(load_spec(kernels, salt))
    from aionvrtc._artifact import encode

    good = encode(donor)
    planted: dict[str, int] = dict.fromkeys(HOSTILE_KINDS, 0)
    for index, spec in enumerate(specs):
        key = kernel_key(spec, "sm_90")
        kind = HOSTILE_KINDS[index % len(HOSTILE_KINDS)]
        plant(version_dir / key[:2] / key, kind, good)
        planted[kind] += 1
    os.mkfifo(version_dir / ".events", 0o600)
    fds_before = _open_fds()
    outcomes = {"result": 0, "error": 0}
    errors: list[str] = []
    started = time.perf_counter()
    async with Compiler(arch="sm_90", cache_dir=root) as compiler:

        async def request(spec: KernelSpec) -> None:
            try:
                artifact = await compiler.compile(spec)
            except Exception as exc:
                outcomes["error"] += 1
                errors.append(repr(exc))
                return
            right = artifact.image.startswith(b"\x7fELF") and artifact.key == kernel_key(
                spec, "sm_90"
            )
            outcomes["result" if right else "error"] += 1

        with anyio.fail_after(HOSTILE_TIMEOUT):
            async with anyio.create_task_group() as group:
                for spec in specs:
                    group.start_soon(request, spec)
        seconds = time.perf_counter() - started
        stats = compiler.stats()
    fds_after = _open_fds()
    # A fresh cache on the same dir reads what the first one rewrote.
    again = KernelCache("sm_90", cache_dir=root)
    for spec in specs:
        again.get_or_compile(spec)
    return {
        "kernels": kernels,
        "planted": planted,
        **outcomes,
        "errors_seen": errors[:5],
        "compiles": stats.compiles,
        "corrupt_dropped": stats.disk.corrupt_dropped,
        "seconds": round(seconds, 3),
        "fds_leaked": None if fds_before is None or fds_after is None else fds_after - fds_before,
        "second_pass_disk_hits": again.stats().disk.hits,
        "second_pass_compiles": again.stats().compiles,
    }


# -- the entry decoder under a fuzzer ------------------------------------------------------------


def decoder_fuzz(inputs: int, seed: int) -> dict[str, Any]:
    """Well-checksummed entries whose headers a mutator has crafted (huge and non-finite
    numbers, deep nesting, wrong types, random bytes): the decoder may only accept an entry or
    raise CacheCorruptError. Returns the outcomes by exception type."""
    from aionvrtc import Artifact, CacheCorruptError
    from aionvrtc._artifact import decode

    rng = random.Random(seed)
    base = {
        "key": "ab" * 32, "kind": "cubin", "arch": "sm_90", "nvrtc_version": "13.5",
        "package_version": "0.1.0", "lowered_names": {"k": "_Z1kv"}, "created": 1.7e9,
        "compile_seconds": 0.1, "log": "",
    }  # fmt: skip
    values: list[Any] = [
        10**400, -(10**30), 1e308, 2**63, -1, 0, True, None, "", "x" * 300, [], {}, [[[[1]]]],
        {"a": {"b": {"c": {}}}}, 1.5, "sm_90",
    ]  # fmt: skip
    outcomes: dict[str, int] = {}
    for _ in range(inputs):
        header = dict(base)
        for _ in range(rng.randint(1, 3)):
            header[rng.choice([*base, "extra"])] = rng.choice(values)
        raw = json.dumps(header).encode()
        roll = rng.random()
        if roll < 0.1:
            depth = rng.randint(4, 200_000)
            raw = b"[" * depth + b"]" * depth
        elif roll < 0.15:  # an unterminated string of escaped quotes (a quadratic regex's bane)
            raw = b'{"log": "' + b'\\"' * rng.randint(1, 50_000)
        elif roll < 0.2:
            cut = rng.randrange(len(raw))
            raw = raw[:cut] + rng.randbytes(rng.randint(1, 8)) + raw[cut + 1 :]
        try:
            result = decode(checksummed(raw, b"\x7fELF" + rng.randbytes(8)))
            name = "accepted" if isinstance(result, Artifact) else "other"
        except CacheCorruptError:
            name = "CacheCorruptError"
        except Exception as exc:
            name = type(exc).__name__
        outcomes[name] = outcomes.get(name, 0) + 1
    return {"inputs": inputs, "seed": seed, "outcomes": outcomes}
