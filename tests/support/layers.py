"""A cache tree's contents, to show that reading a layer changed nothing in it."""

from __future__ import annotations

from pathlib import Path


def tree(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file under ``root``: (mode, mtime in ns, bytes), to show nothing was touched."""
    files = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            info = path.stat()
            files[str(path.relative_to(root))] = (info.st_mode, info.st_mtime_ns, path.read_bytes())
    return files
