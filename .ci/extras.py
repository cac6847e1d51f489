"""Exercise one extra of aionvrtc in an environment that holds only it (beside cu13), so that a
module the extra needs but does not declare fails here: ``python .ci/extras.py EXTRA``.

redis: the README's Redis snippet, twice, against a real redis-server (the second run, with a
fresh cache dir, reads the kernel from Redis). metrics: a compile's counters in Prometheus'
text format. torch: the autograd module imports and refuses CPU tensors with its own error.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _page_snippet(page: str, first_line: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), re.DOTALL)
    found = [block for block in blocks if block.startswith(first_line)]
    assert len(found) == 1, f"{len(found)} snippets of {page} start with {first_line!r}"
    return found[0]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def redis() -> None:
    server = shutil.which("redis-server")
    if server is None:
        sys.exit("redis-server is not installed: apt-get install redis-server")
    port = _free_port()
    process = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        snippet = _page_snippet("docs/operating/fleets.md", "# needs a Redis server")
        outputs = []
        for _ in range(2):  # each with a cache dir of its own: the second finds it in Redis
            with tempfile.TemporaryDirectory() as cache:
                env = {
                    **os.environ,
                    "REDIS_URL": f"redis://127.0.0.1:{port}/0",
                    "AIONVRTC_REMOTE_SECRET": "ci-secret",
                    "AIONVRTC_CACHE_DIR": cache,
                }
                run = subprocess.run(
                    [sys.executable, "-c", snippet], env=env, capture_output=True, text=True,
                    timeout=300, check=False,
                )  # fmt: skip
                assert run.returncode == 0, run.stdout + run.stderr
                outputs.append(run.stdout)
        assert "remote hits 0, misses 1" in outputs[0], outputs
        assert "remote hits 1, misses 0" in outputs[1], outputs
    finally:
        process.terminate()
        process.wait(10)


def metrics() -> None:
    code = """
import anyio
from prometheus_client import CollectorRegistry, generate_latest
from aionvrtc import Compiler, KernelSpec
from aionvrtc.metrics import register

async def main():
    async with Compiler(arch="sm_90") as compiler:
        registry = CollectorRegistry()
        register(compiler, registry=registry)
        await compiler.compile(KernelSpec('extern "C" __global__ void k() {}'))
        print(generate_latest(registry).decode())

anyio.run(main)
"""
    with tempfile.TemporaryDirectory() as cache:
        run = subprocess.run(
            [sys.executable, "-c", code], env={**os.environ, "AIONVRTC_CACHE_DIR": cache},
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.search(r"^aionvrtc_compiles_total(\{[^}]*\})? 1\.0$", run.stdout, re.M), run.stdout


def torch() -> None:
    import torch as pytorch

    from aionvrtc.tropical.torch import matmul

    a = pytorch.ones(2, 2)
    message = None
    try:
        matmul(a, a)
    except TypeError as exc:
        message = str(exc)
    assert message == "a and b must be CUDA tensors", message


if __name__ == "__main__":
    extras = {"redis": redis, "metrics": metrics, "torch": torch}
    if len(sys.argv) != 2 or sys.argv[1] not in extras:
        sys.exit(f"usage: python .ci/extras.py {{{','.join(extras)}}}")
    extras[sys.argv[1]]()
    print(f"aionvrtc[{sys.argv[1]}]: ok")
