"""Hold the README's test time to CI's own run: ``python .ci/test_time.py PYTEST_LOG``.

The README tells a newcomer how long the README's test command takes on an idle machine with
2 CPUs ("the tests take about N minutes"). CI runs that command, keeps its output, and this
reads pytest's closing line ("... in 621.03s (0:10:21) ...") and the README's figure. On a
machine with 2 CPUs, a run more than TOLERANCE times slower or faster than the README says
fails CI with both figures and the line to change; elsewhere the figures are printed only (the
sentence is about 2 CPUs).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Run-to-run spread of one machine is a few percent; machines of one kind differ more. A
# figure off by half again is no longer "about" true.
TOLERANCE = 1.5
CLAIM = re.compile(r"the tests take about (\d+) minutes")
DURATION = re.compile(r"^=+ .* in ([0-9.]+)s(?: \([0-9:]+\))? =+$", re.MULTILINE)


def claimed_minutes(readme: str) -> int:
    found = CLAIM.findall(" ".join(readme.split()))
    if len(found) != 1:
        raise SystemExit(
            f"README.md must say once 'the tests take about N minutes' (found {len(found)})"
        )
    return int(found[0])


def measured_seconds(log: str) -> float:
    found = DURATION.findall(log)
    if not found:
        raise SystemExit("no pytest summary line ('=== ... in 12.34s ===') in the log")
    return float(found[-1])


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        raise SystemExit("usage: python .ci/test_time.py PYTEST_LOG [README]")
    readme = Path(argv[1]) if len(argv) == 2 else ROOT / "README.md"
    claimed = claimed_minutes(readme.read_text()) * 60
    took = measured_seconds(Path(argv[0]).read_text())
    cpus = len(os.sched_getaffinity(0))  # what nproc counts: the CPUs this run may use
    ratio = took / claimed
    print(
        f"the tests took {took / 60:.1f} min on {cpus} CPUs; the README says about "
        f"{claimed // 60} min on 2 CPUs ({ratio:.2f}x)"
    )
    if cpus == 2 and not 1 / TOLERANCE <= ratio <= TOLERANCE:
        print(
            f"error: the README's test time is off by more than {TOLERANCE}x: change "
            f"'the tests take about {claimed // 60} minutes' to about {round(took / 60)}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
