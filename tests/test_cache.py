"""KernelCache end to end: memory, disk and NVRTC for real, faults for real where possible."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from aionvrtc import CompileError, KernelCache, KernelSpec, kernel_key
from aionvrtc._artifact import encode

from .support import ENTRIES, make_spec, run_python


def test_memory_then_disk_then_compile(cache_dir: Path) -> None:
    spec = make_spec()
    cache = KernelCache("sm_90", cache_dir=cache_dir)
    first = cache.get_or_compile(spec)
    assert first.kind == "cubin"
    assert first.image[:4] == b"\x7fELF"
    assert first.key == kernel_key(spec, "sm_90")
    assert first.arch == "sm_90"
    assert first.compile_seconds > 0
    assert cache.get_or_compile(spec) is first
    stats = cache.stats()
    assert (stats.requests, stats.memory.hits, stats.disk.hits, stats.compiles) == (2, 1, 0, 1)
    assert stats.compile_seconds == pytest.approx(first.compile_seconds)
    assert stats.memory.entries == 1
    entry = cache_dir / ENTRIES / first.key[:2] / first.key
    assert entry.is_file()

    fresh = KernelCache("sm_90", cache_dir=cache_dir)
    again = fresh.get_or_compile(spec)
    assert again == first
    stats = fresh.stats()
    assert (stats.requests, stats.memory.hits, stats.disk.hits, stats.compiles) == (1, 0, 1, 0)


def test_round_trip_through_a_new_process(cache_dir: Path) -> None:
    spec = make_spec("newproc")
    art = KernelCache("sm_90", cache_dir=cache_dir).get_or_compile(spec)
    out = run_python(
        f"""
import json
from aionvrtc import KernelCache
from tests.support import make_spec
cache = KernelCache("sm_90", cache_dir={str(cache_dir)!r})
art = cache.get_or_compile(make_spec("newproc"))
s = cache.stats()
print(json.dumps({{"key": art.key, "image": art.image.hex(), "names": dict(art.lowered_names),
                  "compiles": s.compiles, "disk_hits": s.disk.hits}}))
"""
    )
    child = json.loads(out)
    assert child == {
        "key": art.key,
        "image": art.image.hex(),
        "names": dict(art.lowered_names),
        "compiles": 0,
        "disk_hits": 1,
    }


def test_no_disk_tier(tmp_path: Path) -> None:
    cache = KernelCache("sm_90", cache_dir=tmp_path / "unused", disk=False)
    cache.get_or_compile(make_spec())
    assert not (tmp_path / "unused").exists()
    assert cache.stats().disk.writable is False


def test_default_cache_dir_comes_from_the_environment(tmp_path: Path) -> None:
    os.environ["AIONVRTC_CACHE_DIR"] = str(tmp_path / "from-env")
    cache = KernelCache("sm_90")
    art = cache.get_or_compile(make_spec())
    assert (tmp_path / "from-env" / ENTRIES / art.key[:2] / art.key).is_file()


# -- size management ---------------------------------------------------------------------


def _entries(cache_dir: Path) -> set[str]:
    return {p.name for p in (cache_dir / ENTRIES).glob("*/*") if not p.name.startswith(".")}


def test_disk_eviction_is_least_recently_used_first(cache_dir: Path) -> None:
    specs = {name: make_spec(f"evict_{name}") for name in "abcd"}
    probe = KernelCache("sm_90", disk=False).get_or_compile(specs["a"])
    size = len(encode(probe))
    # Room for three entries and a half: the fourth write evicts exactly one.
    cache = KernelCache("sm_90", cache_dir=cache_dir, disk_limit=int(size * 3.5))
    keys = {name: cache.key(spec) for name, spec in specs.items()}
    now = time.time()
    for age, name in zip((300, 200, 100), "abc", strict=True):
        cache.get_or_compile(specs[name])
        entry = cache_dir / ENTRIES / keys[name][:2] / keys[name]
        os.utime(entry, (now - age, now - age))
    # A disk hit refreshes recency: a is now the most recently used.
    assert KernelCache("sm_90", cache_dir=cache_dir).get_or_compile(specs["a"]).key == keys["a"]
    cache.get_or_compile(specs["d"])
    assert cache.disk is not None
    assert cache.disk.wait_maintenance(60)  # the write went over the limit: evicted after it
    assert _entries(cache_dir) == {keys["a"], keys["c"], keys["d"]}
    assert cache.stats().disk.evictions == 1


def test_memory_eviction_is_least_recently_used_first() -> None:
    specs = [make_spec(f"mem_{i}") for i in range(4)]
    probe = KernelCache("sm_90", disk=False).get_or_compile(specs[0])
    cache = KernelCache("sm_90", disk=False, memory_limit=int(probe.size * 3.5))
    a, b, c = (cache.get_or_compile(s) for s in specs[:3])
    assert cache.get_or_compile(specs[0]) is a  # a becomes most recently used
    cache.get_or_compile(specs[3])
    assert b.key not in cache.memory
    assert a.key in cache.memory
    assert c.key in cache.memory
    stats = cache.stats()
    assert (stats.memory.evictions, stats.memory.entries) == (1, 3)
    assert stats.memory.bytes <= cache.memory.limit


def test_clear_and_forget(cache_dir: Path) -> None:
    cache = KernelCache("sm_90", cache_dir=cache_dir)
    one, two = make_spec(), make_spec()
    cache.get_or_compile(one)
    cache.get_or_compile(two)
    cache.forget(one)
    assert len(_entries(cache_dir)) == 1
    assert len(cache.memory) == 1
    cache.clear()
    assert _entries(cache_dir) == set()
    assert len(cache.memory) == 0
    cache.get_or_compile(one)
    assert cache.stats().compiles == 3


# -- errors and concurrency ----------------------------------------------------------------


def test_compile_errors_reach_the_caller_and_are_not_stored(cache_dir: Path) -> None:
    cache = KernelCache("sm_90", cache_dir=cache_dir)
    broken = KernelSpec("__global__ void k() { undefined_call(); }", name="bad.cu")
    for _ in range(2):
        with pytest.raises(CompileError, match='identifier "undefined_call" is undefined'):
            cache.get_or_compile(broken)
    stats = cache.stats()
    assert (stats.compile_errors, stats.compiles, stats.memory.entries) == (2, 0, 0)
    assert _entries(cache_dir) == set()


def test_threads_share_one_compile_per_key(cache_dir: Path) -> None:
    cache = KernelCache("sm_90", cache_dir=cache_dir)
    specs = [make_spec() for _ in range(4)]
    start = threading.Barrier(16)
    results: list[str] = []

    def worker(index: int) -> None:
        start.wait()
        for spec in specs[index % 2 :: 1]:
            results.append(cache.get_or_compile(spec).key)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = cache.stats()
    assert stats.compiles == 4
    assert stats.requests == len(results) == 8 * 4 + 8 * 3
    assert stats.memory.hits + stats.joined + stats.compiles == stats.requests
    assert len(_entries(cache_dir)) == 4
    for spec in specs:
        assert KernelCache("sm_90", cache_dir=cache_dir).get_or_compile(spec).key == kernel_key(
            spec, "sm_90"
        )


def test_records_live_beside_the_kernels_verified_and_per_target(cache_dir: Path) -> None:
    from aionvrtc._spec import record_key

    cache = KernelCache("sm_90", cache_dir=cache_dir)
    assert cache.record("tuning/gpu") is None
    assert cache.put_record("tuning/gpu", b'{"large": 1}') is True
    assert cache.record("tuning/gpu") == b'{"large": 1}'
    assert KernelCache("sm_90", cache_dir=cache_dir).record("tuning/gpu") == b'{"large": 1}'
    assert KernelCache("sm_80", cache_dir=cache_dir).record("tuning/gpu") is None
    key = record_key("tuning/gpu", "sm_90")
    assert key not in {kernel_key(make_spec(), "sm_90"), record_key("tuning/gpu", "sm_80")}
    # A record is an entry like any other: a damaged one is dropped and counted, not returned.
    path = cache_dir / ENTRIES / key[:2] / key
    damaged = bytearray(path.read_bytes())
    damaged[-1] ^= 1
    path.write_bytes(bytes(damaged))
    assert cache.record("tuning/gpu") is None
    assert not path.exists()
    assert cache.stats().disk.corrupt_dropped == 1
    # No disk tier, no records.
    memory_only = KernelCache("sm_90", disk=False)
    assert memory_only.put_record("tuning/gpu", b"1") is False
    assert memory_only.record("tuning/gpu") is None


def test_memory_second_chance_holds_under_reads_replacements_and_discards() -> None:
    # The tier's ring against a plain model of second chance (CLOCK): random (seeded) reads,
    # writes of new and existing keys, and discards, at a limit of 8 entries. A read marks its
    # key; an insert over the limit takes keys from the front, placing a marked one at the back
    # unmarked and evicting the first unmarked one.
    import random

    from aionvrtc import Artifact
    from aionvrtc._store.memory import MemoryTier

    def artifact(key: str) -> Artifact:
        return Artifact(key=key, kind="data", image=b"x" * 100, arch="sm_90", nvrtc_version="13")

    size = artifact("k").size
    tier = MemoryTier(limit=8 * size)
    ring: list[str] = []  # the order keys were placed, oldest first
    marked: set[str] = set()
    evictions = second_chances = 0
    rng = random.Random(1622)
    for _ in range(5000):
        key = f"k{rng.randrange(20)}"
        action = rng.random()
        if action < 0.5:
            found = tier.read(key) is not None
            assert found == (key in ring), key
            if found:
                marked.add(key)
        elif action < 0.9:
            tier.write(artifact(key))
            if key in ring:
                ring.remove(key)
            marked.discard(key)
            ring.append(key)
            while len(ring) > 8:
                oldest = ring.pop(0)
                if oldest in marked or oldest == key:
                    marked.discard(oldest)
                    ring.append(oldest)
                    second_chances += oldest != key
                else:
                    evictions += 1
        else:
            assert tier.discard(key) == (key in ring)
            if key in ring:
                ring.remove(key)
                marked.discard(key)
        assert list(tier.entries) == ring
        assert {k for k, entry in tier.entries.items() if entry.used} == marked
        assert tier.bytes == size * len(ring)
    assert tier.evictions == evictions
    assert evictions > 100, evictions
    assert second_chances > 100, second_chances


def test_no_lock_file_is_left_per_key(cache_dir: Path) -> None:
    # A .lock file per key stayed forever: two inodes per entry (issue 16).
    cache = KernelCache("sm_90", cache_dir=cache_dir)
    artifacts = [cache.get_or_compile(make_spec()) for _ in range(3)]
    assert cache.disk is not None
    assert cache.disk.wait_maintenance(60)
    files = [p for p in (cache_dir / ENTRIES).rglob("*") if p.is_file()]
    files = [p for p in files if p.name not in (".events", ".index")]  # one each per cache dir
    assert sorted(p.name for p in files) == sorted(a.key for a in artifacts)


def test_a_claim_lets_go_last_taken_first_and_from_a_loop_only_what_needs_no_round_trip() -> None:
    from aionvrtc._cache import Claim
    from aionvrtc._store.tier import Hold

    let_go: list[str] = []
    claim = Claim("ab" * 32, needed=2)
    claim.holds += [
        Hold(release=lambda: let_go.append("file"), held=True, local=True),
        Hold(release=lambda: let_go.append("fleet"), held=True, local=False),
    ]
    assert claim.ready
    claim.release(local_only=True)  # from an event loop: the fleet's lock is kept for later
    assert (let_go, [hold.local for hold in claim.holds]) == (["file"], [False])
    claim.release()
    claim.release()  # idempotent
    assert (let_go, claim.holds) == (["file", "fleet"], [])


def test_a_failed_release_still_lets_go_of_the_rest() -> None:
    from aionvrtc._cache import Claim
    from aionvrtc._store.tier import Hold

    let_go: list[str] = []

    def broken() -> None:
        raise OSError("injected: the fleet's release failed")

    claim = Claim("ab" * 32, needed=2)
    claim.holds += [
        Hold(release=lambda: let_go.append("file"), held=True, local=True),
        Hold(release=broken, held=True, local=False),
    ]
    with pytest.raises(OSError, match="injected"):
        claim.release()
    assert (let_go, claim.holds) == (["file"], [])
