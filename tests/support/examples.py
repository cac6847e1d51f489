"""An example run as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .processes import ROOT


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
