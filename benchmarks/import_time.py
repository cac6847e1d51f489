"""What starting a program that uses aionvrtc costs: `import aionvrtc` after cupy and anyio, the
first use of `aionvrtc.Compiler` (what it imports), and `aionvrtc --version`, each in a fresh
interpreter, for this checkout and (``--baseline SRC``) another one, side by side in one run.

    python benchmarks/import_time.py --machine "2 vCPUs" [--baseline /path/to/old/src]

Writes benchmarks/results/import_time-<machine slug>.{json,md}. Medians of --repeats fresh
interpreters, the two checkouts taken in turn. Both checkouts are compiled to bytecode first
(into a cache of this run's own, PYTHONPYCACHEPREFIX), as pip compiles an installed package:
the interpreters read it, as a user's would, rather than compiling every module they import.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._results import RESULTS, write

SRC = Path(__file__).resolve().parent.parent / "src"

# Times inside the interpreter (what a program's start pays), printed as JSON.
_PROBE = """
import json, time
import cupy, anyio
began = time.perf_counter()
import aionvrtc
imported = time.perf_counter()
aionvrtc.Compiler
used = time.perf_counter()
print(json.dumps({"import_ms": (imported - began) * 1e3, "first_use_ms": (used - imported) * 1e3}))
"""


def environment(src: Path, pycache: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(src), "PYTHONPYCACHEPREFIX": str(pycache)}


def probe(src: Path, pycache: Path) -> dict[str, float]:
    env = environment(src, pycache)
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True
    )
    found: dict[str, float] = json.loads(done.stdout)
    began = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "aionvrtc", "--version"], env=env, capture_output=True, check=True
    )
    found["version_ms"] = (time.perf_counter() - began) * 1e3
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machine", required=True, help="a name for this machine")
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout's src")
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    sources = {"now": SRC, **({"before": args.baseline} if args.baseline else {})}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in sources}
    with tempfile.TemporaryDirectory(prefix="import-time-pycache-") as scratch:
        for name, src in sources.items():
            pycache = Path(scratch) / name
            compiled = [sys.executable, "-m", "compileall", "-q", str(src)]
            subprocess.run(compiled, env=environment(src, pycache), check=True)
        for _ in range(args.repeats + 1):
            for name, src in sources.items():
                runs[name].append(probe(src, Path(scratch) / name))
    results: dict[str, Any] = {
        name: {
            key: statistics.median(run[key] for run in found[1:])  # (the first: a warm-up)
            for key in ("import_ms", "first_use_ms", "version_ms")
        }
        for name, found in runs.items()
    }
    facts = {
        "machine": args.machine,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "repeats": args.repeats,
        "date": time.strftime("%Y-%m-%d"),
        "before": str(args.baseline) if args.baseline else None,
    }
    lines = [
        f"# Starting a program with aionvrtc, {args.machine}",
        "",
        f"Python {facts['python']}, {facts['cpus']} CPUs, {facts['date']}. Medians of "
        f"{args.repeats} fresh interpreters each, the checkouts taken in turn; cupy and anyio "
        "imported first, every module read from compiled bytecode. first use: "
        "`aionvrtc.Compiler` right after the import (what it imports); `--version`: "
        "`python -m aionvrtc --version`, the whole process.",
        "",
        "| checkout | `import aionvrtc` | first use of `Compiler` | import and first use "
        "| `aionvrtc --version` |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, found in results.items():
        lines.append(
            f"| {name} | {found['import_ms']:.1f} ms | {found['first_use_ms']:.1f} ms | "
            f"{found['import_ms'] + found['first_use_ms']:.1f} ms | {found['version_ms']:.0f} ms |"
        )
    write(args.out, "import_time", label=args.machine, facts=facts, results=results,
          table="\n".join(lines) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
