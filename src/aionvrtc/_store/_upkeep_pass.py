"""The child process's side of a large cache dir's maintenance pass (see _upkeep_child, which
starts it): the dir opened as a disk tier and one pass made here, its answer a JSON line."""

from __future__ import annotations

import contextlib
import json
import os
import sys

from ._disk_base import _VERSION
from .disk import DiskTier

__all__ = ["main"]


def main(argv: list[str]) -> None:
    """In the child, with ``ROOT LIMIT SHARED VERSION``: one pass, then a JSON line on stdout;
    nothing if this copy of the package writes another format version."""
    root, limit, shared, version = argv
    if version != _VERSION:
        print(f"the package here writes {_VERSION}, its parent {version}", file=sys.stderr)
        raise SystemExit(3)
    with contextlib.suppress(OSError):
        os.nice(10)  # after the process's requests
    tier = DiskTier(root, limit=int(limit), shared_cache=shared == "1")
    ok = tier.maintain_here()
    print(json.dumps({"ok": ok, "evicted": tier.evictions}), flush=True)
