"""Every setting aionvrtc reads from the environment: its variable, what it takes and what holds
without it (``SETTINGS``, which the README's settings table is checked against), and how each
kind is read. A variable is read when it is needed, never at import: a program or a test may
set one at any time. Set but empty counts as unset, so that a script can clear one.
"""

from __future__ import annotations

import os

from ._units import parse_size, quoted

__all__ = [
    "ENV_ARCH",
    "ENV_CACHE_DIR",
    "ENV_CACHE_LAYERS",
    "ENV_DISK_LIMIT",
    "ENV_MANIFEST",
    "ENV_REMOTE_ALLOW_UNSIGNED",
    "ENV_REMOTE_SECRET",
    "ENV_REMOTE_URL",
    "ENV_SHARED_CACHE",
    "SETTINGS",
    "flag",
    "paths",
    "raw",
    "size",
    "text",
]

ENV_CACHE_DIR = "AIONVRTC_CACHE_DIR"
ENV_DISK_LIMIT = "AIONVRTC_DISK_LIMIT"
ENV_SHARED_CACHE = "AIONVRTC_SHARED_CACHE"
ENV_ARCH = "AIONVRTC_ARCH"
ENV_CACHE_LAYERS = "AIONVRTC_CACHE_LAYERS"
ENV_MANIFEST = "AIONVRTC_MANIFEST"
ENV_REMOTE_URL = "AIONVRTC_REMOTE_URL"
ENV_REMOTE_SECRET = "AIONVRTC_REMOTE_SECRET"
ENV_REMOTE_ALLOW_UNSIGNED = "AIONVRTC_REMOTE_ALLOW_UNSIGNED"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})

# Each variable: (what it takes, what holds without it).
SETTINGS: dict[str, tuple[str, str]] = {
    ENV_CACHE_DIR: ("a folder", "the platform's user cache dir (~/.cache/aionvrtc on Linux)"),
    ENV_DISK_LIMIT: ("a size: bytes, 500MiB, 2G", "1 GiB"),
    ENV_SHARED_CACHE: ("a switch: 1/0, true/false, yes/no, on/off", "off"),
    ENV_ARCH: ("an arch, such as sm_90", "the current GPU's"),
    ENV_CACHE_LAYERS: ("cache dirs and bundle files, separated by os.pathsep", "none"),
    ENV_MANIFEST: ("a file to record each distinct spec in", "none"),
    ENV_REMOTE_URL: ("a Redis URL", "no shared tier"),
    ENV_REMOTE_SECRET: ("the secret that signs entries and bundles", "none"),
    ENV_REMOTE_ALLOW_UNSIGNED: ("a switch: run the Redis tier without a secret", "off"),
}


def text(name: str) -> str | None:
    """Variable ``name``, or None where it is unset or empty."""
    return os.environ.get(name) or None


def raw(name: str) -> bytes | None:
    """Variable ``name`` as the bytes the environment holds (os.environb), or None where it is
    unset or empty: for a secret, which is any bytes, not always text that UTF-8 encodes."""
    value = text(name)
    return os.fsencode(value) if value is not None else None


def flag(name: str) -> bool:
    """Switch ``name`` (1/0, true/false, yes/no, on/off; unset: off). Raises ValueError naming
    the variable for anything else."""
    value = os.environ.get(name, "").strip().lower()
    if value not in _TRUE | _FALSE:
        raise ValueError(
            f"${name} must be 1 or 0 (true/false, yes/no, on/off), got {quoted(value)}"
        )
    return value in _TRUE


def size(name: str, default: int) -> int:
    """Bytes in ``name`` ("2G", "500MiB", bytes), else ``default``. Raises ValueError naming
    the variable."""
    value = text(name)
    if value is None:
        return default
    try:
        return parse_size(value)
    except ValueError as exc:
        raise ValueError(f"${name}: {exc}") from None


def paths(name: str) -> list[str]:
    """The paths in ``name``, separated by os.pathsep (empty parts dropped)."""
    return [part for part in (text(name) or "").split(os.pathsep) if part]
