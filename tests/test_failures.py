"""Remembered compile failures: bounded in count and bytes, least recently used dropped first,
and holding nothing alive (no traceback, so no spec source) beyond their own text."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

import pytest

from aionvrtc import CompileError, Compiler, KernelSpec, kernel_key
from aionvrtc._failures import Failures

pytestmark = pytest.mark.anyio

PADDING = 64 << 10  # characters of comment in each failing spec, as the issue measured


def failing_spec(tag: int) -> KernelSpec:
    padding = "// " + "x" * PADDING + "\n"
    return KernelSpec(f"{padding}__global__ void k{tag}() {{ undefined_{tag}(); }}\n")


async def test_failures_are_bounded_in_count_and_least_recently_used_go_first(
    cache_dir: Path,
) -> None:
    async with Compiler(arch="sm_90", cache_dir=cache_dir, disk=False) as compiler:
        compiler._scheduler.failures.limit = 4
        specs = [failing_spec(i) for i in range(6)]
        for spec in specs:
            with pytest.raises(CompileError, match=r"undefined_\d"):
                await compiler.compile(spec)
        assert compiler.stats().compiles == 0
        assert len(compiler._scheduler.failures) == 4
        assert compiler._scheduler.failures.dropped == 2
        # specs[2] is remembered: it fails fast (no NVRTC run); using it makes it most recent.
        errors = compiler._cache.stats().compile_errors
        with pytest.raises(CompileError, match="undefined_2"):
            await compiler.compile(specs[2])
        assert compiler._cache.stats().compile_errors == errors
        # specs[0] was dropped first: asking again runs NVRTC again (and fails again).
        with pytest.raises(CompileError, match="undefined_0"):
            await compiler.compile(specs[0])
        assert compiler._cache.stats().compile_errors == errors + 1
        # That pushed out the least recently used: specs[3], not specs[2].
        assert compiler._scheduler.failures.get(kernel_key(specs[3], "sm_90")) is None
        assert compiler._scheduler.failures.get(kernel_key(specs[2], "sm_90")) is not None


async def test_remembered_failures_keep_no_source_alive(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aionvrtc import _spec

    # What the failures keep, not the table of recent specs (bounded, and by design).
    monkeypatch.setattr(_spec, "INTERN_LIMIT", 0)
    count = 24
    async with Compiler(arch="sm_90", cache_dir=cache_dir, disk=False) as compiler:
        await compiler.compile(KernelSpec("__global__ void warm() {}"))  # first-use allocations
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(count):
                with pytest.raises(CompileError):
                    await compiler.compile(failing_spec(100 + i))
            gc.collect()
            kept = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert len(compiler._scheduler.failures) == count
    # Before: each failure's traceback held its frames, and so the 64 KiB spec (about 48 KiB
    # per failure measured). Now a failure keeps its message, log and options: about 1 KiB.
    per_failure = kept / count
    assert per_failure < 8 << 10, f"{per_failure:.0f} bytes kept per remembered failure"


def test_byte_bound_and_detached_copies() -> None:
    failures = Failures(limit=100, byte_limit=10_000)
    try:
        raise CompileError("boom", log="x" * 3000, program="k.cu", options=("-O3",))
    except CompileError as exc:
        try:
            raise exc from RuntimeError("cause")
        except CompileError as raised:
            error = raised
    assert error.__traceback__ is not None
    for i in range(5):
        failures.remember(f"key{i}", error)
    assert failures.bytes <= 10_000
    assert len(failures) == 2  # each costs 3000 + 4 + 3 + 4 + 512 bytes
    assert failures.dropped == 3
    kept = failures.get("key4")
    assert kept is not None
    assert kept is not error
    assert (kept.log, kept.program, kept.options, str(kept.args[0])) == (
        "x" * 3000, "k.cu", ("-O3",), "boom"
    )  # fmt: skip
    assert kept.__traceback__ is None
    assert isinstance(kept.__cause__, RuntimeError)
    assert kept.__cause__.__traceback__ is None
    huge = CompileError("big", log="y" * 20_000, program="k.cu", options=())
    failures.remember("huge", huge)
    assert "huge" not in failures  # larger than the whole bound: not remembered at all
    failures.pop("key4")
    failures.clear()
    assert (len(failures), failures.bytes) == (0, 0)
