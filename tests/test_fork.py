"""The process-wide Compiler across fork(): a child of a process that has used compile_sync gets
its own on first use, and exits normally (PyTorch DataLoader workers, gunicorn --preload).

Each scenario runs in a fresh interpreter with a timeout, so a regression that hangs fails the
test instead of the suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")

ROOT = Path(__file__).resolve().parent.parent

PARENT = r"""
import json, multiprocessing, os, sys
import aionvrtc
from tests.conftest import make_spec

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
                  "parent_stats": [parent.stats().compiles, parent.stats().memory_hits]}))
"""


def test_a_forked_child_gets_its_own_default_compiler_and_exits(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "AIONVRTC_ARCH": "sm_90",
        "AIONVRTC_CACHE_DIR": str(tmp_path / "cache"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path]),
    }
    done = subprocess.run(
        [sys.executable, "-c", PARENT], capture_output=True, text=True, env=env, timeout=180,
        cwd=ROOT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    # Each worker compiled through a Compiler of its own (the parent's is not in the child).
    assert all(ok for ok, _ in result["pooled"]), result
    assert all(compiles >= 1 for _, compiles in result["pooled"]), result
    assert result["child_status"] == 0
    assert result["parent_same"] is True
    assert result["parent_stats"] == [1, 1]  # one compile, then a memory hit
