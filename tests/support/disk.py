"""Disk-tier entries of a chosen size, and what the cache dir holds: for the reliability tests and
the child processes they start."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from aionvrtc import Artifact
from aionvrtc._store import DiskTier
from aionvrtc._store._index import Totals

from . import ENTRIES


def artifact(n: int, size: int = 4000) -> Artifact:
    """A small entry of about ``size`` bytes, its key spread over the shards by ``n``."""
    key = hashlib.sha256(b"%d" % n).hexdigest()
    return Artifact(
        key=key, kind="cubin", image=b"\x7fELF" + bytes([n % 251]) * (size - 400),
        arch="sm_90", nvrtc_version="13.5", lowered_names={f"k_{n}<float>": f"_Z3k_{n}"},
        created=1_700_000_000.0 + n,
    )  # fmt: skip


def on_disk(root: Path) -> tuple[int, int]:
    """Entries and bytes, as a walk of the folders (not the tier) finds them."""
    files = [p for p in (root / ENTRIES).glob("*/*") if len(p.name) == 64]
    return len(files), sum(p.stat().st_size for p in files)


def header(root: Path) -> Totals | None:
    """The index header, as a process that uses the cache reads it."""
    version = os.open(root / ENTRIES, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return DiskTier(root)._index.totals(version)
    finally:
        os.close(version)


KEY = "ab" * 32
