"""The README's main example, as a newcomer runs it (without a GPU here: compile only)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import has_gpu

ROOT = Path(__file__).resolve().parent.parent


def run_example(name: str, cache_dir: Path, *args: str) -> str:
    env = {**os.environ, "AIONVRTC_CACHE_DIR": str(cache_dir)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_quickstart_compiles_once_then_serves_from_disk(cache_dir: Path) -> None:
    if has_gpu():
        pytest.skip("with a GPU the example also runs its kernels: covered by gpu_suite.sh")
    first = run_example("quickstart.py", cache_dir)
    assert "no usable GPU here: compiling for sm_90 only" in first
    assert "100 requests, 1 compile(s), 99 joined, 0 disk hit(s): a cubin for sm_90" in first
    assert "axpy<float>    -> _Z4axpyIfEvT_PKS0_PS0_i" in first
    assert "would run: axpy<float> and axpy<double>" in first
    second = run_example("quickstart.py", cache_dir, "--arch", "sm_90")
    assert "100 requests, 0 compile(s), 99 joined, 1 disk hit(s)" in second
    assert "from the disk cache" in second
