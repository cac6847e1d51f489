"""Other processes and users: a fresh interpreter, a forked child as another user."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]  # the project root


def run_python(code: str, *, timeout: float = 120, env: dict[str, str] | None = None) -> str:
    """Run ``code`` in a fresh interpreter (the project root importable, so ``tests.*`` too,
    with ``env`` added to the environment); return its stdout. A child that outlives
    ``timeout`` fails the test instead of hanging the suite."""
    path = os.pathsep.join([str(ROOT), *sys.path])
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
        check=False, cwd=ROOT, env={**os.environ, "PYTHONPATH": path, **(env or {})},
    )  # fmt: skip
    if proc.returncode != 0:
        raise AssertionError(f"child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout


NOBODY = 65534  # uid and gid of a user that owns nothing here


as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown to another user")


def as_other_user(work: Callable[[], dict[str, Any]], *, timeout: float = 60) -> dict[str, Any]:
    """Run ``work`` in a forked child as uid and gid 65534 (as root; otherwise as this user,
    who is then not root either); its result comes back as JSON through a pipe. The child
    cannot read /root, where the interpreter's library lives: what ``work`` needs must be
    imported, and used once, before."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: it must never return into pytest
        payload = b'{"error": "the child failed before it could report"}'
        try:
            os.close(read_end)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            payload = json.dumps(work()).encode()
        except BaseException as exc:
            payload = json.dumps({"error": repr(exc)}).encode()
        finally:
            os.write(write_end, payload)
            os._exit(0)
    os.close(write_end)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            ready, _, _ = select.select([read_end], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                pytest.fail(f"the child as uid {NOBODY} did not finish in {timeout} s")
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    result: dict[str, Any] = json.loads(b"".join(chunks))
    assert "error" not in result, result["error"]
    return result
