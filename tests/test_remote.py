"""The remote tier against a real redis-server that these tests start on a free loopback port
(.ci/run installs redis-server where it is missing): a fleet compiles a kernel once, a killed
Redis fails no request, tampered and unsigned entries are refused, entries expire."""

from __future__ import annotations

import json
import logging
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from aionvrtc import Compiler, RedisTier

from .conftest import make_slow_spec, make_spec

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # redis-py's async client runs on asyncio only (see the trio test below)


class RedisServer:
    """A redis-server process on 127.0.0.1:port, without persistence."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed (.ci/run installs it with apt-get)")
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if self.client().ping():
                    return
            except Exception:
                time.sleep(0.02)
        raise AssertionError("redis-server did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None

    def client(self) -> Any:
        import redis

        return redis.Redis.from_url(self.url, socket_timeout=2)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer(free_port())
    server.start()
    yield server
    server.stop()


def tier(server: RedisServer, **kwargs: Any) -> RedisTier:
    kwargs.setdefault("prefix", f"test{time.time_ns()}")
    return RedisTier(server.url, **kwargs)


HOST = r"""
import json, sys, time
import anyio
from aionvrtc import Compiler, KernelSpec, RedisTier

source, cache_dir, url, prefix, start = sys.argv[1:6]

async def main():
    remote = RedisTier(url, prefix=prefix, secret="fleet secret")
    async with Compiler(arch="sm_90", cache_dir=cache_dir, remote=remote) as compiler:
        await anyio.sleep(max(0.0, float(start) - time.time()))
        artifact = await compiler.compile(KernelSpec(source))
        s = compiler.stats()
        print(json.dumps({"compiles": s.compiles, "remote_hits": s.remote_hits,
                          "lock_waits": s.remote_lock_waits, "errors": s.remote_errors,
                          "size": len(artifact.image)}))

anyio.run(main)
"""


def test_three_hosts_with_separate_disks_compile_a_kernel_once(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    source = make_slow_spec().source
    prefix = f"fleet{time.time_ns()}"
    start = time.time() + 2.5  # every host has imported aionvrtc and opened its Compiler
    hosts = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                HOST,
                source,
                str(tmp_path / f"host{i}"),
                redis_server.url,
                prefix,
                str(start),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    outputs = [host.communicate(timeout=120) for host in hosts]
    assert all(host.returncode == 0 for host in hosts), [err for _, err in outputs]
    results = [json.loads(out) for out, _ in outputs]
    assert sum(r["compiles"] for r in results) == 1, results
    assert sum(r["remote_hits"] for r in results) == 2, results
    assert sum(r["lock_waits"] for r in results) >= 1, results  # they started together
    assert sum(r["errors"] for r in results) == 0
    assert len({r["size"] for r in results}) == 1
    for i in range(3):  # remote hits are written to each host's own disk
        assert len(list((tmp_path / f"host{i}" / "v2").glob("*/[0-9a-f]*"))) == 1


async def test_a_killed_redis_fails_no_request(
    redis_server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    remote = tier(redis_server, timeout=0.5)
    async with Compiler(arch="sm_90", cache_dir=tmp_path, remote=remote) as compiler:
        await compiler.compile(make_spec())
        assert compiler.stats().remote_errors == 0
        redis_server.stop()
        with caplog.at_level(logging.WARNING, logger="aionvrtc"):
            started = time.monotonic()
            down = [await compiler.compile(make_spec()) for _ in range(3)]
            elapsed = time.monotonic() - started
        assert all(a.image.startswith(b"\x7fELF") for a in down)
        stats = compiler.stats()
        assert stats.compiles == 4
        assert stats.remote_errors >= 1
        assert elapsed < 3.0  # after the first failure the tier is skipped, not waited on
        assert len([r for r in caplog.records if "unreachable" in r.message]) == 1
        redis_server.start()  # restarted, empty
        await anyio.sleep(0.6)  # past the first backoff
        spec = make_spec()
        artifact = await compiler.compile(spec)
        client = redis_server.client()
        assert client.exists(f"{remote.prefix}:entry:{artifact.key}") == 1  # reconnected


async def test_tampered_and_unsigned_entries_are_refused(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    prefix = f"sign{time.time_ns()}"
    spec = make_spec()
    signed = tier(redis_server, prefix=prefix, secret=b"k1")
    async with Compiler(arch="sm_90", cache_dir=tmp_path / "a", remote=signed) as compiler:
        artifact = await compiler.compile(spec)
    client = redis_server.client()
    name = f"{prefix}:entry:{artifact.key}"
    value = client.get(name)
    client.set(name, value[:-1] + bytes([value[-1] ^ 1]))  # one bit of the entry
    reader = tier(redis_server, prefix=prefix, secret=b"k1")
    async with Compiler(arch="sm_90", cache_dir=tmp_path / "b", remote=reader) as compiler:
        assert (await compiler.compile(spec)).image == artifact.image
        stats = compiler.stats()
        assert (stats.remote_rejected, stats.compiles, stats.remote_hits) == (1, 1, 0)
    # An unsigned entry (a writer without the secret) is refused by a reader with one.
    other = make_spec()
    unsigned = tier(redis_server, prefix=prefix)
    async with Compiler(arch="sm_90", cache_dir=tmp_path / "c", remote=unsigned) as compiler:
        await compiler.compile(other)
    strict = tier(redis_server, prefix=prefix, secret=b"k1")
    async with Compiler(arch="sm_90", cache_dir=tmp_path / "d", remote=strict) as compiler:
        await compiler.compile(other)
        stats = compiler.stats()
        assert (stats.remote_rejected, stats.compiles) == (1, 1)
    # A wrong secret is as bad as none.
    wrong = tier(redis_server, prefix=prefix, secret=b"k2")
    async with Compiler(arch="sm_90", cache_dir=tmp_path / "e", remote=wrong) as compiler:
        await compiler.compile(spec)
        assert compiler.stats().remote_rejected == 1


async def test_entries_expire_after_their_ttl(redis_server: RedisServer, tmp_path: Path) -> None:
    prefix = f"ttl{time.time_ns()}"
    spec = make_spec()
    remote = tier(redis_server, prefix=prefix, ttl=0.5)
    async with Compiler(arch="sm_90", cache_dir=tmp_path / "a", remote=remote) as compiler:
        artifact = await compiler.compile(spec)
    client = redis_server.client()
    name = f"{prefix}:entry:{artifact.key}"
    assert 0 < client.pttl(name) <= 500
    await anyio.sleep(0.7)
    assert client.exists(name) == 0
    later = tier(redis_server, prefix=prefix, ttl=0.5)
    async with Compiler(arch="sm_90", cache_dir=tmp_path / "b", remote=later) as compiler:
        await compiler.compile(spec)
        stats = compiler.stats()
        assert (stats.remote_misses, stats.remote_hits, stats.compiles) == (1, 0, 1)


async def test_configured_from_the_environment(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIONVRTC_REMOTE_URL", redis_server.url)
    monkeypatch.setenv("AIONVRTC_REMOTE_SECRET", "from env")
    async with Compiler(arch="sm_90", cache_dir=tmp_path) as compiler:
        assert compiler.remote is not None
        assert compiler.remote.url == redis_server.url
        artifact = await compiler.compile(make_spec())
    value = redis_server.client().get(f"aionvrtc:entry:{artifact.key}")
    assert value is not None
    assert value[len(b"AIONVRTC-R1")] == 1  # signed
    with pytest.raises(ValueError, match="ttl must be positive"):
        RedisTier(redis_server.url, ttl=0)


def test_under_trio_the_remote_tier_says_it_needs_asyncio(tmp_path: Path) -> None:
    remote = RedisTier("redis://127.0.0.1:1/0")  # never reached

    async def main() -> None:
        async with Compiler(arch="sm_90", cache_dir=tmp_path, remote=remote):
            pass

    with pytest.raises(RuntimeError, match="RedisTier\\) needs asyncio"):
        anyio.run(main, backend="trio")


async def test_the_compile_lock_is_renewed_while_the_compile_runs(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # A lock taken for 0.3 s around a compile of about a second: renewed every 0.1 s, it is
    # still held long after 0.3 s, and released when the compile is done.
    remote = tier(redis_server, lock_ttl=0.3)
    spec = make_slow_spec(150)
    lock = f"{remote.prefix}:lock:{spec.key('sm_90')}"
    client = redis_server.client()
    held_since: float | None = None
    held_for = 0.0

    async def watch() -> None:
        nonlocal held_since, held_for
        while held_since is None or client.exists(lock):
            if client.exists(lock):
                held_since = held_since or time.monotonic()
                held_for = time.monotonic() - held_since
            await anyio.sleep(0.02)

    compiler = Compiler(arch="sm_90", cache_dir=tmp_path, remote=remote)
    async with compiler, anyio.create_task_group() as group:
        group.start_soon(watch)
        artifact = await compiler.compile(spec)
    assert held_for > 0.45, held_for  # past the 0.3 s the lock was taken for
    assert client.exists(lock) == 0
    assert artifact.compile_seconds > held_for - 0.1
