"""The remote tier against a real redis-server that these tests start on a free loopback port
(.ci/run installs redis-server where it is missing): a fleet compiles a kernel once, a killed
Redis fails no request, tampered and unsigned entries are refused, entries expire, and whoever
can write to the Redis cannot stall (foreign locks), flood (oversize values, values pulled on
every poll) or poison (no secret without an explicit opt-in) the fleet."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import pytest

from aionvrtc import Artifact, Compiler, KernelCache, RedisTier, kernel_key
from aionvrtc._store import DiskTier
from aionvrtc._store.remote import MAGIC
from aionvrtc._store.tier import Hold, Locking

from .support import ENTRIES, FakeDriver, make_slow_spec, make_spec
from .support.redis import RedisServer, free_port

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    # The Compiler tests here run once, under asyncio; the tier is blocking and serves trio and
    # plain threads alike (the tests that say so below, and one host of the fleet's).
    return "asyncio"


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer(free_port())
    server.start()
    yield server
    server.stop()


def tier(server: RedisServer, **kwargs: Any) -> RedisTier:
    """A tier on ``server`` with a fresh prefix, signed unless the test says otherwise."""
    kwargs.setdefault("prefix", f"test{time.time_ns()}")
    kwargs.setdefault("secret", "test secret")
    return RedisTier(server.url, **kwargs)


def fleet_lock(holder: RedisTier, key: str) -> Hold:
    """``key``'s fleet lock, taken on ``holder`` as another host's compile holds it."""
    taken = holder.hold(key, "sm_90")
    assert taken is not None
    assert taken.held
    return taken


def net_output_bytes(server: RedisServer) -> int:
    """Bytes the server has sent to all its clients since it started."""
    return int(server.client().info("stats")["total_net_output_bytes"])


HOST = r"""
import json, sys, time
import anyio
from aionvrtc import Compiler, KernelSpec, RedisTier

source, cache_dir, url, prefix, start, backend = sys.argv[1:7]

async def main():
    remote = RedisTier(url, prefix=prefix, secret="fleet secret")
    async with Compiler(arch="sm_90", cache_dir=cache_dir, remote=remote) as compiler:
        await anyio.sleep(max(0.0, float(start) - time.time()))
        artifact = await compiler.compile(KernelSpec(source))
        s = compiler.stats()
        print(json.dumps({"compiles": s.compiles, "remote_hits": s.remote.hits,
                          "lock_waits": s.remote.lock_waits, "errors": s.remote.errors,
                          "size": len(artifact.image)}))

anyio.run(main, backend=backend)
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
                backend,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, backend in enumerate(["asyncio", "trio", "asyncio"])
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
        assert len(list((tmp_path / f"host{i}" / ENTRIES).glob("*/[0-9a-f]*"))) == 1


async def test_a_remote_hit_lists_lowered_names_in_the_specs_order(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # Another host compiled it; this one reads it from Redis (as the disk read it, sorted).
    names = ("scale_remote<float>", "scale_remote<double>", "scale_remote<int>")
    spec = make_spec("remote", name_expressions=names)
    prefix = f"order{time.time_ns()}"
    remote = tier(redis_server, prefix=prefix)
    async with Compiler(arch="sm_90", cache_dir=tmp_path / "a", remote=remote) as compiler:
        await compiler.compile(spec)
    remote = tier(redis_server, prefix=prefix)
    async with Compiler(arch="sm_90", cache_dir=tmp_path / "b", remote=remote) as compiler:
        fetched = await compiler.compile(spec)
        assert (compiler.stats().remote.hits, compiler.stats().compiles) == (1, 0)
    assert tuple(fetched.lowered_names) == names != tuple(sorted(names))


async def test_a_killed_redis_fails_no_request(
    redis_server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    remote = tier(redis_server, timeout=0.5)
    async with Compiler(arch="sm_90", cache_dir=tmp_path, remote=remote) as compiler:
        await compiler.compile(make_spec())
        assert compiler.stats().remote.errors == 0
        redis_server.stop()
        with caplog.at_level(logging.WARNING, logger="aionvrtc"):
            started = time.monotonic()
            down = [await compiler.compile(make_spec()) for _ in range(3)]
            elapsed = time.monotonic() - started
        assert all(a.image.startswith(b"\x7fELF") for a in down)
        stats = compiler.stats()
        assert stats.compiles == 4
        assert stats.remote.errors >= 1
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
        assert (stats.remote.rejected, stats.compiles, stats.remote.hits) == (1, 1, 0)
    # An unsigned entry (a writer without the secret) is refused by a reader with one.
    other = make_spec()
    unsigned = tier(redis_server, prefix=prefix, secret=None, allow_unsigned=True)
    async with Compiler(arch="sm_90", cache_dir=tmp_path / "c", remote=unsigned) as compiler:
        await compiler.compile(other)
    strict = tier(redis_server, prefix=prefix, secret=b"k1")
    async with Compiler(arch="sm_90", cache_dir=tmp_path / "d", remote=strict) as compiler:
        await compiler.compile(other)
        stats = compiler.stats()
        assert (stats.remote.rejected, stats.compiles) == (1, 1)
    # A wrong secret is as bad as none.
    wrong = tier(redis_server, prefix=prefix, secret=b"k2")
    async with Compiler(arch="sm_90", cache_dir=tmp_path / "e", remote=wrong) as compiler:
        await compiler.compile(spec)
        assert compiler.stats().remote.rejected == 1


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
        assert (stats.remote.misses, stats.remote.hits, stats.compiles) == (1, 0, 1)


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


def test_two_compilers_under_trio_share_the_fleets_entry(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    prefix = f"trio{time.time_ns()}"
    spec = make_spec()
    seen: list[tuple[int, int, int]] = []

    async def host(name: str) -> bytes:
        remote = tier(redis_server, prefix=prefix)
        async with Compiler(arch="sm_90", cache_dir=tmp_path / name, remote=remote) as compiler:
            artifact = await compiler.compile(spec)
            stats = compiler.stats()
        seen.append((stats.compiles, stats.remote.hits, stats.remote.errors))
        return artifact.image

    async def main() -> list[bytes]:
        return [await host("a"), await host("b")]

    first, second = anyio.run(main, backend="trio")
    assert first == second
    assert seen == [(1, 0, 0), (0, 1, 0)]
    key = kernel_key(spec, "sm_90")
    assert redis_server.client().exists(f"{prefix}:entry:{key}") == 1


def test_a_kernel_cache_with_a_remote_tier_serves_plain_threads(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # Eight threads of one host ask for one kernel at once: one compile, stored in Redis; a
    # second host's cache (its own disk) then reads it from there, from threads too.
    prefix = f"threads{time.time_ns()}"
    spec = make_slow_spec(40)
    first = KernelCache("sm_90", cache_dir=tmp_path / "a", remote=tier(redis_server, prefix=prefix))
    with ThreadPoolExecutor(8) as pool:
        images = list(pool.map(lambda _: first.get_or_compile(spec).image, range(8)))
    assert len(set(images)) == 1
    stats = first.stats()
    assert (stats.compiles, stats.requests, stats.joined) == (1, 8, 7)
    second = KernelCache(
        "sm_90", cache_dir=tmp_path / "b", remote=tier(redis_server, prefix=prefix)
    )
    with ThreadPoolExecutor(4) as pool:
        again = list(pool.map(lambda _: second.get_or_compile(spec).image, range(4)))
    assert set(again) == set(images)
    assert second.stats().compiles == 0
    assert second.remote is not None
    assert second.remote.stats().hits == 1
    # The fleet's tier is read after the disk, and its lock is taken after the disk's.
    assert [(t.origin, t.local, isinstance(t, Locking)) for t in second.tiers] == [
        ("disk", True, True),
        ("remote", False, True),
    ]
    for cache in (first, second):
        assert cache.remote is not None
        cache.remote.close()


async def test_the_compile_lock_is_renewed_while_the_compile_runs(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # A lock taken for 0.3 s around a compile of about a second: renewed every 0.1 s, it is
    # still held long after 0.3 s, and released when the compile is done.
    remote = tier(redis_server, lock_ttl=0.3)
    spec = make_slow_spec(150)
    lock = f"{remote.prefix}:lock:{kernel_key(spec, 'sm_90')}"
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


# -- stalls, floods and poison ---------------------------------------------------------------------

LOCK_TOKEN = re.compile(r"aionvrtc-lock:1:[0-9a-f]{32}:[0-9a-f]{64}")


def plant_lock(server: RedisServer, name: str, case: str, owner: RedisTier, key: str) -> None:
    """Put a lock that is not to be waited on at ``name`` (``owner`` makes well-formed ones)."""
    client = server.client()
    if case == "no expiry":  # well formed and signed, but it would never lapse
        client.set(name, owner._lock_token(key))
    elif case == "long expiry":  # well formed and signed, longer than any lock_ttl of ours
        client.set(name, owner._lock_token(key), px=600_000)
    elif case == "wrong signature":
        other = RedisTier(server.url, prefix=owner.prefix, secret="another secret")
        client.set(name, other._lock_token(key), px=20_000)
    elif case == "unsigned":  # the format of a fleet without a secret
        client.set(name, owner._lock_token(key).rsplit(":", 1)[0], px=20_000)
    elif case == "not ours":
        client.set(name, b"locked", px=20_000)
    elif case == "huge":  # never sent back: the script reads its length only
        client.set(name, b"x" * (1 << 20), px=20_000)
    elif case == "not a string":
        client.rpush(name, b"a", b"b")
        client.pexpire(name, 20_000)
    else:
        raise AssertionError(case)


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("no expiry", "no expiry"),
        ("long expiry", "after lock_ttl"),
        ("wrong signature", "not signed with this secret"),
        ("unsigned", "not signed with this secret"),
        ("not ours", "not an aionvrtc lock"),
        ("huge", "not an aionvrtc lock"),
        ("not a string", "not an aionvrtc lock"),
    ],
)
async def test_a_foreign_lock_is_not_waited_on(
    redis_server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str, why: str
) -> None:
    # wait_timeout 30 s: a host that waited on the planted lock would take 30 s per kernel.
    remote = tier(redis_server, wait_timeout=30.0)
    client = redis_server.client()
    specs = [make_spec(), make_spec()]
    locks = [f"{remote.prefix}:lock:{kernel_key(spec, 'sm_90')}" for spec in specs]
    for spec, lock in zip(specs, locks, strict=True):
        plant_lock(redis_server, lock, case, remote, kernel_key(spec, "sm_90"))
    before = net_output_bytes(redis_server)
    async with Compiler(arch="sm_90", cache_dir=tmp_path, remote=remote) as compiler:
        with caplog.at_level(logging.WARNING, logger="aionvrtc"):
            started = time.monotonic()
            artifacts = [await compiler.compile(spec) for spec in specs]
            elapsed = time.monotonic() - started
        stats = compiler.stats()
    assert elapsed < 10.0, elapsed  # a host that waited would take 30 s per kernel
    assert (stats.compiles, stats.remote.lock_waits, stats.remote.errors) == (2, 0, 0)
    assert remote.foreign_locks == stats.remote.foreign_locks == 2
    warnings = [r.message for r in caplog.records if "ignoring the compile lock" in r.message]
    assert len(warnings) == 1, warnings  # once per tier
    for words in (why, "foreign_locks", "at most wait_timeout"):
        assert words in warnings[0], warnings[0]
    # The planted locks are left alone, and the kernels reach the fleet all the same.
    assert all(client.exists(lock) == 1 for lock in locks)
    for artifact in artifacts:
        assert client.exists(f"{remote.prefix}:entry:{artifact.key}") == 1
    assert net_output_bytes(redis_server) - before < 256 << 10  # a 1 MiB lock never came back


@pytest.mark.parametrize("case", ["no expiry", "not ours"])
async def test_a_fleet_without_a_secret_ignores_foreign_locks_too(
    redis_server: RedisServer, tmp_path: Path, case: str
) -> None:
    remote = tier(redis_server, secret=None, allow_unsigned=True, wait_timeout=30.0)
    spec = make_spec()
    key = kernel_key(spec, "sm_90")
    plant_lock(redis_server, f"{remote.prefix}:lock:{key}", case, remote, key)
    async with Compiler(arch="sm_90", cache_dir=tmp_path, remote=remote) as compiler:
        started = time.monotonic()
        await compiler.compile(spec)
        elapsed = time.monotonic() - started
        stats = compiler.stats()
    assert elapsed < 10.0, elapsed  # a host that waited would take 30 s per kernel
    assert (stats.compiles, stats.remote.lock_waits, remote.foreign_locks) == (1, 0, 1)


async def test_a_genuine_lock_is_waited_on_and_a_refused_entry_is_read_once(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # Another host holds the lock while the entry key holds a large, badly signed value: the
    # waiter polls the lock only, reads the entry once before and once after the wait (both
    # refused), compiles, and closes at once.
    prefix = f"poll{time.time_ns()}"
    spec = make_spec()
    key = kernel_key(spec, "sm_90")
    client = redis_server.client()
    holder = tier(redis_server, prefix=prefix)
    claimed = fleet_lock(holder, key)
    assert (claimed.found, claimed.local) == (None, False)
    lock = f"{prefix}:lock:{key}"
    token = client.get(lock).decode()
    assert LOCK_TOKEN.fullmatch(token), token
    assert 0 < client.pttl(lock) <= 30_000  # ours are set to lock_ttl, never beyond
    bad = MAGIC + b"\1" + bytes(32) + b"x" * (8 << 20)  # under max_entry_bytes: it is read
    client.set(f"{prefix}:entry:{key}", bad)
    waiter = tier(redis_server, prefix=prefix, wait_timeout=30.0, poll=0.02)
    before = net_output_bytes(redis_server)
    async with Compiler(arch="sm_90", cache_dir=tmp_path, remote=waiter) as compiler:
        async with anyio.create_task_group() as group:
            group.start_soon(compiler.compile, spec)
            await anyio.sleep(2.0)  # about 100 polls
            during = net_output_bytes(redis_server) - before
            waiting = compiler.stats()
            claimed.release()
        stats = compiler.stats()
        closing = time.monotonic()
    closed_in = time.monotonic() - closing
    total = net_output_bytes(redis_server) - before
    holder.close()
    assert (waiting.remote.lock_waits, waiting.compiles, waiting.remote.rejected) == (1, 0, 1)
    assert during < 1.5 * len(bad), during  # one read, before the lock was found taken
    assert total < 2.5 * len(bad), total  # and one more once the lock was ours
    assert (stats.compiles, stats.remote.rejected, stats.remote.hits) == (1, 2, 0)
    assert waiter.foreign_locks == 0
    assert closed_in < 10.0, closed_in  # generous for a loaded CI box; the wait is 30 s


def test_an_entry_found_after_waiting_is_on_disk_before_this_hosts_lock_is_let_go(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another host compiles while this one waits for the fleet lock, holding its file lock. A
    # process of this host waiting for that file lock must find the entry on disk once it gets
    # the lock: were the lock let go first, it would take the then free fleet lock and compile.
    prefix = f"order{time.time_ns()}"
    spec = make_spec()
    artifact = KernelCache("sm_90", cache_dir=tmp_path / "other").get_or_compile(spec)
    holder = tier(redis_server, prefix=prefix)
    held = fleet_lock(holder, artifact.key)
    cache = KernelCache(
        "sm_90", cache_dir=tmp_path / "here", remote=tier(redis_server, prefix=prefix, poll=0.02)
    )
    assert cache.disk is not None
    written = cache.disk.write
    locked_while_written: list[bool] = []

    def watched(entry: Artifact) -> bool:
        probe = DiskTier(tmp_path / "here").try_lock(entry.key)  # another open of the dir
        locked_while_written.append(probe is None)
        if probe is not None:
            probe.release()
        return written(entry)

    monkeypatch.setattr(cache.disk, "write", watched)  # observed, then written as it was
    with ThreadPoolExecutor(1) as pool:
        claimed = pool.submit(cache.claim, artifact.key)
        time.sleep(0.3)  # holding the file lock, waiting for the fleet's
        assert holder.write(artifact)
        held.release()
        claim = claimed.result(timeout=10)
    assert claim.found == (artifact, "remote")
    assert locked_while_written == [True]
    after = DiskTier(tmp_path / "here").try_lock(artifact.key)  # let go after
    assert after is not None
    after.release()


def test_close_stops_a_claim_waiting_on_a_lock(redis_server: RedisServer) -> None:
    prefix = f"close{time.time_ns()}"
    key = "ab" * 32
    holder = tier(redis_server, prefix=prefix)
    taken = fleet_lock(holder, key)
    redis_server.client().set(f"{prefix}:entry:{key}", MAGIC + b"\1" + b"x" * (8 << 20))
    waiter = tier(redis_server, prefix=prefix, wait_timeout=30.0, poll=0.02)
    with ThreadPoolExecutor(1) as pool:
        claimed = pool.submit(waiter.hold, key, "sm_90")
        time.sleep(0.5)
        assert not claimed.done()
        started = time.monotonic()
        waiter.close()
        result = claimed.result(timeout=10)
        waited = time.monotonic() - started
    taken.release()
    holder.close()
    # Generous for a loaded CI box: a claim that kept waiting would take 30 s.
    assert waited < 5.0, waited  # the claim stopped at once
    assert result == Hold(local=False)  # holding nothing: compile without the lock
    assert (waiter.errors, waiter.lock_waits) == (0, 1)


def test_close_under_a_call_in_flight_fails_nothing(redis_server: RedisServer) -> None:
    # close() closes the connection that another thread is reading a reply from (the server is
    # busy with a slow script, so the waiter's poll is in flight): that call is skipped, as
    # every call after close() is, and the claim ends without an error. It raised "I/O
    # operation on closed file" from redis-py's reader.
    prefix = f"inflight{time.time_ns()}"
    key = "ef" * 32
    holder = tier(redis_server, prefix=prefix)
    taken = fleet_lock(holder, key)
    waiter = tier(redis_server, prefix=prefix, wait_timeout=30.0, poll=0.02, timeout=10.0)

    def busy() -> None:
        slow = "local i = 0 while i < 40000000 do i = i + 1 end return i"
        with contextlib.suppress(Exception):  # its own reply may time out: not what is tested
            redis_server.client().eval(slow, 0)

    server_busy = threading.Thread(target=busy)
    with ThreadPoolExecutor(1) as pool:
        claimed = pool.submit(waiter.hold, key, "sm_90")
        time.sleep(0.3)  # waiting on the holder's lock, polling it
        server_busy.start()
        time.sleep(0.2)  # the next poll now waits for the server
        waiter.close()
        assert claimed.result(timeout=20) == Hold(local=False)
    server_busy.join()
    taken.release()
    holder.close()
    assert waiter.errors == 0


def test_cancel_ends_a_claims_wait_and_release_stops_the_renewal(
    redis_server: RedisServer,
) -> None:
    prefix = f"cancel{time.time_ns()}"
    key = "cd" * 32
    holder = tier(redis_server, prefix=prefix, lock_ttl=0.3)
    earlier = {t for t in threading.enumerate() if t.name == "aionvrtc-redis-lock"}
    taken = fleet_lock(holder, key)
    lock = f"{prefix}:lock:{key}"
    time.sleep(0.8)  # renewed by the holder's thread every 0.1 s: still there
    assert redis_server.client().exists(lock) == 1
    waiter = tier(redis_server, prefix=prefix, wait_timeout=30.0, poll=0.02)
    assert waiter.hold(key, "sm_90", wait=False) is None  # genuine, held: the caller waits
    cancel = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        claimed = pool.submit(waiter.hold, key, "sm_90", cancel=cancel)
        time.sleep(0.3)
        cancel.set()
        assert claimed.result(timeout=10) == Hold(local=False)
    renewers = [
        t for t in threading.enumerate() if t.name == "aionvrtc-redis-lock" and t not in earlier
    ]
    assert len(renewers) == 1, renewers  # the holder's; the waiter took no lock
    taken.release()
    assert redis_server.client().exists(lock) == 0
    renewers[0].join(timeout=5)  # woken by release(), not by its next period
    assert not renewers[0].is_alive()
    for remote in (holder, waiter):
        remote.close()


async def test_an_entry_over_max_entry_bytes_is_refused_unread(
    redis_server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    remote = tier(redis_server, max_entry_bytes=1 << 20)
    client = redis_server.client()
    big, listed = make_spec(), make_spec()
    big_key, listed_key = kernel_key(big, "sm_90"), kernel_key(listed, "sm_90")
    client.set(f"{remote.prefix}:entry:{big_key}", MAGIC + b"\1" + b"x" * (4 << 20))
    client.rpush(f"{remote.prefix}:entry:{listed_key}", b"not", b"an entry")
    before = net_output_bytes(redis_server)
    async with Compiler(arch="sm_90", cache_dir=tmp_path, remote=remote) as compiler:
        with caplog.at_level(logging.WARNING, logger="aionvrtc"):
            await compiler.compile(big)
            await compiler.compile(listed)
        stats = compiler.stats()
    sent = net_output_bytes(redis_server) - before
    assert sent < 64 << 10, sent  # the 4 MiB value never left the server
    assert (stats.compiles, stats.remote.rejected, stats.remote.hits) == (2, 2, 0)
    assert stats.remote.errors == 0  # a list where an entry should be is refused, not an error
    messages = [r.message for r in caplog.records]
    assert any(
        big_key[:16] in m and f"{4 * (1 << 20) + len(MAGIC) + 1} bytes" in m
        and "over max_entry_bytes (1048576)" in m
        for m in messages
    ), messages  # fmt: skip
    assert any(listed_key[:16] in m and "a Redis list, not a string" in m for m in messages)
    # Both were compiled here and written over the planted values, within the bound.
    assert len(client.get(f"{remote.prefix}:entry:{big_key}")) < 1 << 20


async def test_an_entry_over_max_entry_bytes_is_not_uploaded(
    redis_server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    remote = tier(redis_server, max_entry_bytes=64)  # smaller than any cubin
    async with Compiler(arch="sm_90", cache_dir=tmp_path, remote=remote) as compiler:
        with caplog.at_level(logging.WARNING, logger="aionvrtc"):
            artifact = await compiler.compile(make_spec())
        assert compiler.stats().compiles == 1
    assert redis_server.client().exists(f"{remote.prefix}:entry:{artifact.key}") == 0
    assert remote.writes == 0
    assert any(
        "not storing" in r.message and "over max_entry_bytes (64)" in r.message
        for r in caplog.records
    )


def test_a_tier_without_a_secret_refuses_to_start() -> None:
    url = "redis://127.0.0.1:1/0"  # never reached
    with pytest.raises(ValueError, match="without a secret") as raised:
        RedisTier(url)
    message = str(raised.value)
    for words in ("plant", "secret=", "AIONVRTC_REMOTE_SECRET", "allow_unsigned=True"):
        assert words in message, message
    assert RedisTier(url, allow_unsigned=True).allow_unsigned
    assert not RedisTier(url, secret="s").allow_unsigned
    with pytest.raises(ValueError, match="secret is empty"):
        RedisTier(url, secret="")
    with pytest.raises(ValueError, match="max_entry_bytes must be a positive byte count, got 0"):
        RedisTier(url, secret="s", max_entry_bytes=0)
    # Times: NaN and infinity refused too (an infinite poll would hang a request).
    for name in ("timeout", "lock_ttl", "poll"):
        for bad in (0, -1.0, math.nan, math.inf):
            times: dict[str, Any] = {name: bad}
            with pytest.raises(ValueError, match=f"{name} must be positive, finite seconds"):
                RedisTier(url, secret="s", **times)
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="wait_timeout must be finite seconds >= 0"):
            RedisTier(url, secret="s", wait_timeout=bad)
        with pytest.raises(ValueError, match="ttl must be positive seconds or None"):
            RedisTier(url, secret="s", ttl=bad)
    assert RedisTier(url, secret="s", wait_timeout=0).wait_timeout == 0


async def test_an_unsigned_tier_runs_when_allowed(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    remote = tier(redis_server, secret=None, allow_unsigned=True)
    async with Compiler(arch="sm_90", cache_dir=tmp_path, remote=remote) as compiler:
        artifact = await compiler.compile(make_spec())
    value = redis_server.client().get(f"{remote.prefix}:entry:{artifact.key}")
    assert value is not None
    assert value[len(MAGIC)] == 0


async def test_from_environment_needs_a_secret_or_allow_unsigned(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIONVRTC_REMOTE_URL", redis_server.url)
    monkeypatch.delenv("AIONVRTC_REMOTE_SECRET", raising=False)
    monkeypatch.delenv("AIONVRTC_REMOTE_ALLOW_UNSIGNED", raising=False)
    with pytest.raises(ValueError, match=r"AIONVRTC_REMOTE_ALLOW_UNSIGNED.*trusted"):
        RedisTier.from_environment()
    with pytest.raises(ValueError, match="without a secret"):
        Compiler(arch="sm_90", cache_dir=tmp_path)
    monkeypatch.setenv("AIONVRTC_REMOTE_ALLOW_UNSIGNED", "0")
    with pytest.raises(ValueError, match="without a secret"):
        RedisTier.from_environment()
    monkeypatch.setenv("AIONVRTC_REMOTE_ALLOW_UNSIGNED", "maybe")
    with pytest.raises(ValueError, match="AIONVRTC_REMOTE_ALLOW_UNSIGNED must be 1 or 0"):
        RedisTier.from_environment()
    monkeypatch.setenv("AIONVRTC_REMOTE_ALLOW_UNSIGNED", "1")
    async with Compiler(arch="sm_90", cache_dir=tmp_path) as compiler:
        assert compiler.remote is not None
        assert compiler.remote.allow_unsigned
        artifact = await compiler.compile(make_spec())
    value = redis_server.client().get(f"aionvrtc:entry:{artifact.key}")
    assert value is not None
    assert value[len(MAGIC)] == 0


async def test_an_image_the_driver_refuses_from_the_remote_tier_is_compiled_and_replaced(
    redis_server: RedisServer, tmp_path: Path, gpu: FakeDriver
) -> None:
    import dataclasses

    spec = make_spec()
    prefix = f"refused{time.time_ns()}"
    # The fleet's entry holds an image under the right key that this GPU's driver refuses.
    async with Compiler(arch="sm_90", cache_dir=tmp_path / "a", remote=tier(redis_server,
                        prefix=prefix)) as first:  # fmt: skip
        good = await first.compile(spec)
        bad = dataclasses.replace(good, image=b"\x7fELF" + bytes(range(256)) * 4)
        remote = first._cache.remote
        assert remote is not None
        assert remote.write(bad)
    gpu.refused[bad.image] = "CUDA_ERROR_INVALID_IMAGE"
    # A new host: an empty disk, the remote tier's refused image. Dropping it must not send the
    # compile back to the remote tier for the same image.
    async with Compiler(arch="sm_90", cache_dir=tmp_path / "b", remote=tier(redis_server,
                        prefix=prefix)) as second:  # fmt: skip
        module = await second.get(spec)
        assert module.artifact.image == good.image
        stats = second.stats()
        assert (stats.compiles, stats.remote.hits) == (1, 1)
        assert gpu.loaded == [good.image]
        remote = second._cache.remote
        assert remote is not None
        again = remote.read(good.key, arch="sm_90")
        assert again is not None
        assert again.image == good.image  # the fleet's entry replaced by the new image
