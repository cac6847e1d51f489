"""The blocking facade (compile_sync, get_sync and the process-wide Compiler): a memory hit
served in the calling thread, and fork(): a child of a process that has used compile_sync gets
its own Compiler on first use and exits normally (PyTorch DataLoader workers, gunicorn
--preload). The fork scenario runs in a fresh interpreter with a timeout, so a regression that
hangs fails the test instead of the suite."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from .support import run_python

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")


PARENT = r"""
import json, multiprocessing, os, sys
import aionvrtc
from tests.support import make_spec

def child_compiles(tag):
    artifact = aionvrtc.compile_sync(make_spec(tag))
    return len(artifact.image) > 0, aionvrtc.default_compiler().stats().compiles

parent_spec = make_spec("parent")
aionvrtc.compile_sync(parent_spec)  # the parent's Compiler and its event-loop thread run now
parent = aionvrtc.default_compiler()

# fork-start Pool workers use compile_sync (before: it never returned).
with multiprocessing.get_context("fork").Pool(2) as pool:
    pooled = pool.map(child_compiles, ["a", "b", "c", "d"])

# A plain fork() whose child compiles and exits normally, atexit handlers and all (before: the
# child hung at exit, closing the parent's Compiler whose thread it does not have).
pid = os.fork()
if pid == 0:
    ok = aionvrtc.compile_sync(make_spec("forked")).image.startswith(b"\x7fELF")
    sys.exit(0 if ok and aionvrtc.default_compiler() is not parent else 3)
_, status = os.waitpid(pid, 0)

# The parent's own Compiler is untouched and still serves.
again = aionvrtc.compile_sync(parent_spec)
print(json.dumps({"pooled": pooled, "child_status": os.waitstatus_to_exitcode(status),
                  "parent_same": aionvrtc.default_compiler() is parent,
                  "parent_stats": [parent.stats().compiles, parent.stats().memory.hits]}))
"""


def test_a_forked_child_gets_its_own_default_compiler_and_exits(tmp_path: Path) -> None:
    env = {"AIONVRTC_ARCH": "sm_90", "AIONVRTC_CACHE_DIR": str(tmp_path / "cache")}
    result = json.loads(run_python(PARENT, timeout=180, env=env).splitlines()[-1])
    # Each worker compiled through a Compiler of its own (the parent's is not in the child).
    assert all(ok for ok, _ in result["pooled"]), result
    assert all(compiles >= 1 for _, compiles in result["pooled"]), result
    assert result["child_status"] == 0
    assert result["parent_same"] is True
    assert result["parent_stats"] == [1, 1]  # one compile, then a memory hit


def test_a_memory_hit_from_a_plain_thread_does_not_wait_for_the_event_loop(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # compile_sync hopped to the Compiler's event loop even for a memory hit (157 us; issue 16).
    # With the loop held busy, a hit must still return: it is served in the calling thread.
    import threading

    import aionvrtc

    from .support import make_spec

    monkeypatch.setenv("AIONVRTC_ARCH", "sm_90")
    monkeypatch.setenv("AIONVRTC_CACHE_DIR", str(tmp_path / "cache"))
    aionvrtc.close_default_compiler()
    spec = make_spec()
    compiler = aionvrtc.default_compiler()
    try:
        first = aionvrtc.compile_sync(spec)
        hits = compiler.stats().memory.hits
        busy, release = threading.Event(), threading.Event()

        async def hold_the_loop() -> None:
            busy.set()
            release.wait(30)  # blocks the loop's thread: nothing else runs there meanwhile

        assert compiler._portal is not None
        compiler._portal.start_task_soon(hold_the_loop)
        assert busy.wait(10)
        results: list[object] = []
        caller = threading.Thread(target=lambda: results.append(aionvrtc.compile_sync(spec)))
        caller.start()
        caller.join(10)
        served_while_busy = not caller.is_alive()
        release.set()
        caller.join(30)
        assert served_while_busy, "the memory hit waited for the event loop"
        assert results == [first]
        assert compiler.stats().memory.hits == hits + 1
    finally:
        aionvrtc.close_default_compiler()


WITHOUT_A_GPU = r"""
import json
import aionvrtc
from tests.support import make_spec

named = aionvrtc.compile_sync(make_spec(), arch="sm_90")
try:
    aionvrtc.compile_sync(make_spec())
    unnamed = "compiled"
except aionvrtc.NoDeviceError as exc:
    unnamed = str(exc)
compiler = aionvrtc.default_compiler()
try:
    target = compiler.target.arch
except aionvrtc.NoDeviceError as exc:
    target = type(exc).__name__
stats = compiler.stats()
print(json.dumps({"named": [named.kind, named.arch], "unnamed": unnamed, "target": target,
                  "archs": sorted(stats.archs), "compiles": stats.compiles}))
"""


def test_compile_sync_for_a_named_arch_needs_no_gpu(tmp_path: Path) -> None:
    # It raised NoDeviceError telling the caller to pass the arch='sm_90' it had passed. No GPU:
    # none visible to CUDA (on a GPU machine too), and no $AIONVRTC_ARCH (empty is unset).
    env = {
        "CUDA_VISIBLE_DEVICES": "", "AIONVRTC_ARCH": "",
        "AIONVRTC_CACHE_DIR": str(tmp_path / "cache"),
    }  # fmt: skip
    result = json.loads(run_python(WITHOUT_A_GPU, env=env).splitlines()[-1])
    assert result["named"] == ["cubin", "sm_90"]
    assert (result["archs"], result["compiles"], result["target"]) == (
        ["sm_90"],
        1,
        "NoDeviceError",
    )
    # Naming none is what needs the GPU: then the advice to name one fits.
    assert result["unnamed"].startswith("cannot detect the GPU architecture: ")
    assert result["unnamed"].endswith("; name the target: arch='sm_90', or $AIONVRTC_ARCH=sm_90")


def test_the_default_compilers_async_methods_run_on_its_own_loop_from_any_other(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Awaited from another event loop, the default Compiler's async methods waited forever on
    # a loop that never heard of them (tropical.device_figures did, without compiler=).
    # on_default runs them there from a worker thread, on asyncio and on trio alike.
    import anyio

    import aionvrtc
    from aionvrtc._sync import on_default

    from .support import make_spec

    monkeypatch.setenv("AIONVRTC_ARCH", "sm_90")
    monkeypatch.setenv("AIONVRTC_CACHE_DIR", str(tmp_path / "cache"))
    aionvrtc.close_default_compiler()
    spec = make_spec()

    async def main() -> tuple[object, ...]:
        with anyio.fail_after(120):
            saved = await anyio.to_thread.run_sync(
                on_default, lambda c: c.save_record("figures", b"kept")
            )
            read = await anyio.to_thread.run_sync(on_default, lambda c: c.load_record("figures"))
            built = await anyio.to_thread.run_sync(on_default, lambda c: c.compile(spec))
        return saved, read, built.arch

    try:
        for backend in ("asyncio", "trio"):
            assert anyio.run(main, backend=backend) == (True, b"kept", "sm_90")
        assert aionvrtc.default_compiler().stats().compiles == 1  # the second run: a hit
    finally:
        aionvrtc.close_default_compiler()


@pytest.mark.gpu
def test_autotune_without_a_compiler_tunes_on_the_default_compilers_loop(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # autotune() without compiler= awaited the process-wide Compiler's methods from the
    # caller's event loop (the bug device_figures had): now its work runs there through
    # on_default, from asyncio and trio alike. The first run tunes; the second, after the
    # process's own tiles are cleared, reads the record the first kept.
    import anyio

    import aionvrtc
    from aionvrtc import tropical
    from aionvrtc.tropical.products import _shape_classes
    from aionvrtc.tropical.tuning import CANDIDATES, tile_fits

    monkeypatch.setenv("AIONVRTC_CACHE_DIR", str(tmp_path / "cache"))
    aionvrtc.close_default_compiler()
    reports: list[dict[str, Any]] = []

    async def main() -> Any:
        with anyio.fail_after(300):
            tuned = await tropical.autotune(
                ["float32"], kinds=["small"], argmax=[False], repeats=2, report=reports.append
            )
        return tuned["small"]["f4"]

    try:
        first = anyio.run(main, backend="asyncio")
        compiles = aionvrtc.default_compiler().stats().compiles
        _shape_classes._installed.clear()  # as a new process would start
        again = anyio.run(main, backend="trio")
        assert aionvrtc.default_compiler().stats().compiles == compiles
    finally:
        _shape_classes._installed.clear()
        aionvrtc.close_default_compiler()
    candidates = [t for t in CANDIDATES["small"] if tile_fits(t, 4)]
    assert [tuple(r["tile"]) for r in reports] == candidates
    assert first == again == tuple(min(reports, key=lambda r: r["seconds"])["tile"])
    assert compiles == len(candidates) + 1  # and the generic kernel they are checked against
