"""The command line run as a user runs it: a process, its JSON read back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

# The and-or semiring on bool has the fewest tropical kernels (the generic kernel's variants).
WARM = ["warm", "tropical", "--arch", "sm_90", "--semirings", "andor", "--dtypes", "bool"]


def cli(*args: str, cache: Path, status: int = 0, timeout: float = 300) -> Any:
    """Run ``python -m aionvrtc ARGS --json --cache-dir CACHE``; its JSON output, parsed."""
    proc = subprocess.run(
        [sys.executable, "-m", "aionvrtc", *args, "--json", "--cache-dir", str(cache)],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    assert proc.returncode == status, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)
