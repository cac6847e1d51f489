"""One maintenance pass of a large cache dir, run in a child process.

A pass over 50,000 entries is a second or more of Python (the walk's stats, the sort, the
index rebuilt). In the tier's own thread it shares the GIL with the process's requests: however
it is paced, a read hit in another thread gives the GIL up at each of its system calls and waits
behind the pass to take it back, 8 ms at worst at 50,000 entries (1.4 ms at 10,000). A reader in
another process waits at most about 1 ms during the same pass. So from ``AWAY_ENTRIES`` on, the
tier's maintenance thread starts this module in a child process and waits for it. The child
takes the dir's maintenance lock as any other process of the host would.

Where no child can be started (a frozen application, no interpreter at ``sys.executable``,
process limits) or it dies without saying how the pass went, the pass runs in the thread.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from ._disk_base import logger

__all__ = ["AWAY_ENTRIES", "main", "maintain_in_child"]

AWAY_ENTRIES = 10_000  # entries in the index from which a pass runs in a child process
_PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent.parent)
_INTERPRETER = re.compile(r"(python|pypy)[0-9.]*[a-z]?(\.exe)?", re.IGNORECASE)
# Not ``-m``: the package's own imports load this module before runpy would run it as __main__.
_RUN = f"import sys; from {__name__} import main; main(sys.argv[1:])"


def maintain_in_child(root: Path, limit: int, shared: bool) -> tuple[bool, int] | None:
    """One pass over the cache dir at ``root`` in a child process: whether it left the dir in
    order (within ``limit``, an index that parses) and how many entries it evicted; None if no
    child could be started or it gave no answer (the caller then makes the pass itself)."""
    # A frozen application's sys.executable is the application; an embedding server's (uWSGI)
    # can be the server, which the arguments below would start.
    interpreter = Path(sys.executable or ".").name
    if getattr(sys, "frozen", False) or not _INTERPRETER.fullmatch(interpreter):
        return None
    import subprocess  # 6 ms: only a process that keeps a large cache pays it

    # The child imports this package from where this process did, whatever PYTHONPATH and the
    # working folder hold (-P: the working folder is not put first on its path).
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_PACKAGE_PARENT, path]))}
    command = [sys.executable, "-P", "-c", _RUN, str(root), str(limit), str(int(shared))]
    try:
        done = subprocess.run(
            command, stdin=subprocess.DEVNULL, capture_output=True, env=env, check=False,
            start_new_session=True,  # a Ctrl-C meant for this process does not cut a pass short
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        logger.info("cannot start the disk cache's maintenance in a child process: %s", exc)
        return None
    # What the child logged (a damaged shard it found, say) is this process's to tell.
    for line in done.stderr.decode(errors="replace").splitlines()[-20:]:
        logger.warning("disk cache maintenance (child process %s): %s", command[0], line)
    try:
        answer = json.loads(done.stdout.decode().splitlines()[-1])
        return bool(answer["ok"]), int(answer["evicted"])
    except (ValueError, IndexError, KeyError, TypeError):
        logger.warning(
            "the disk cache's maintenance in a child process (%s) ended with status %s and no "
            "answer; it runs in this process instead", command[0], done.returncode,
        )  # fmt: skip
        return None


def main(argv: list[str]) -> None:
    """In the child, with ``ROOT LIMIT SHARED``: one pass, then a JSON line on stdout."""
    from .disk import DiskTier

    root, limit, shared = argv
    tier = DiskTier(root, limit=int(limit), shared_cache=shared == "1")
    ok = tier._maintain_safely(here=True)
    print(json.dumps({"ok": ok, "evicted": tier.evictions}), flush=True)
