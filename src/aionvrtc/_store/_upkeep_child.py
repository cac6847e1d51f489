"""One maintenance pass of a large cache dir, run in a child process.

A pass over 50,000 entries is a second or more of Python (the walk's stats, the sort, the
index rebuilt). In the tier's own thread it shares the GIL with the process's requests: however
it is paced, a read hit in another thread gives the GIL up at each of its system calls and waits
behind the pass to take it back, 8 ms at worst at 50,000 entries (1.4 ms at 10,000). A reader in
another process waits at most about 1 ms during the same pass. So from ``AWAY_ENTRIES`` on, the
tier's maintenance thread starts a child process (its entry point: _upkeep_pass) and waits for
it. The child
takes the dir's maintenance lock as any other process of the host would.

The child is isolated (``python -I``: no PYTHON* variables, user site or working folder; nothing
a monitoring agent puts on PYTHONPATH runs in it) and imports this very copy of the package: its
import root goes on its path before site-packages. It checks that it writes the same format
version as its parent (a package upgraded in place under a running service would not).

Where no child can be started (a frozen application, no interpreter at ``sys.executable``,
process limits), or one gives no answer (it died, or another copy of the package answered), the
pass runs in the thread, and so does every later pass of the process: a broken set-up is not
tried again at each write. A child that runs past ``CHILD_TIMEOUT`` is killed and the pass
failed (a hung file system would hang the thread too).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from ._disk_base import _VERSION, logger

__all__ = ["AWAY_ENTRIES", "CHILD_TIMEOUT", "maintain_in_child"]

AWAY_ENTRIES = 10_000  # entries in the index from which a pass runs in a child process
CHILD_TIMEOUT = 600.0  # seconds: a pass at 50,000 entries takes 1.5 s on 2 CPUs
# The folder this copy of the package is imported from (aionvrtc._store._upkeep_child: three
# levels up; more where the package is vendored as app._vendor.aionvrtc).
_IMPORT_ROOT = str(Path(__file__).resolve().parents[__name__.count(".")])
_INTERPRETER = re.compile(r"(python|pypy)[0-9.]*[a-z]?(\.exe)?", re.IGNORECASE)
# The child's entry point: a module above the disk tier (it makes one), named here and imported
# only in the child, so that this module, below the tier, imports nothing above it. Not ``-m``:
# the package's own imports load that module before runpy would run it as __main__.
_ENTRY = f"{__name__.rpartition('.')[0]}._upkeep_pass"
_RUN = (
    "import sys; root = sys.argv[1]; "
    "at = next((n for n, p in enumerate(sys.path) if p.endswith(('site-packages', "
    "'dist-packages'))), len(sys.path)); sys.path.insert(at, root); "
    f"from {_ENTRY} import main; main(sys.argv[2:])"
)
_broken: list[str] = []  # why the child path failed in this process, once it has


def maintain_in_child(root: Path, limit: int, shared: bool) -> tuple[bool, int] | None:
    """One pass over the cache dir at ``root`` in a child process: whether it left the dir in
    order (within ``limit``, an index that parses) and how many entries it evicted; None if no
    child can make it (the caller then makes the pass itself)."""
    # A frozen application's sys.executable is the application; an embedding server's (uWSGI)
    # can be the server, which the arguments below would start.
    interpreter = Path(sys.executable or ".").name
    if _broken or getattr(sys, "frozen", False) or not _INTERPRETER.fullmatch(interpreter):
        return None
    import subprocess  # 6 ms: only a process that keeps a large cache pays it

    command = [
        sys.executable, "-I", "-c", _RUN, _IMPORT_ROOT, str(root), str(limit), str(int(shared)),
        _VERSION,
    ]  # fmt: skip
    try:
        done = subprocess.run(
            command, stdin=subprocess.DEVNULL, capture_output=True, check=False,
            timeout=CHILD_TIMEOUT,
            start_new_session=True,  # a Ctrl-C meant for this process does not cut a pass short
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        logger.warning(
            "the disk cache's maintenance at %s ran past %s s in a child process and was "
            "stopped; it is tried again later", root, CHILD_TIMEOUT,
        )  # fmt: skip
        return False, 0
    except (OSError, subprocess.SubprocessError) as exc:
        _give_up(f"cannot start {command[0]}: {exc}")
        return None
    said = done.stderr.decode(errors="replace").strip()
    try:
        answer = json.loads(done.stdout.decode().splitlines()[-1])
        result = bool(answer["ok"]), int(answer["evicted"])
    except (ValueError, IndexError, KeyError, TypeError):
        tail = f": {said[-2000:]}" if said else ""
        _give_up(f"{command[0]} ended with status {done.returncode} and no answer{tail}")
        return None
    if said:  # what the child logged (a damaged shard it found, say) is this process's to tell
        logger.warning("disk cache maintenance at %s (in a child process): %s", root, said)
    return result


def _give_up(why: str) -> None:
    """No child makes this process's passes any more: said once."""
    if not _broken:
        _broken.append(why)
        logger.warning(
            "the disk cache's maintenance runs in this process from now on, not in a child "
            "process: %s", why,
        )  # fmt: skip
