"""Sizes, ages and switches as people write them: "500M", "2GiB", "30d", "1"/"off" (the CLI,
environment variables)."""

from __future__ import annotations

import os
import re

__all__ = ["env_flag", "format_size", "parse_age", "parse_size"]

# Binary multiples, as `du -h` and `ls -h` print them: K, KB and KiB all mean 1024.
_SIZE = re.compile(r"\s*(?P<number>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[kmgt]?)(?:i?b)?\s*", re.I)
_AGE = re.compile(r"\s*(?P<number>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[smhdw]?)\s*", re.I)
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_AGE_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_size(text: str) -> int:
    """Bytes in ``text``: a number with an optional K, M, G or T (powers of 1024; "B" and "iB"
    may follow). Raises ValueError naming the text."""
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"not a size: {text!r} (examples: 1048576, 500M, 2GiB)")
    return int(float(match["number"]) * _SIZE_UNITS[match["unit"].lower()])


def parse_age(text: str) -> float:
    """Seconds in ``text``: a number with an optional s, m, h, d or w."""
    match = _AGE.fullmatch(text)
    if match is None:
        raise ValueError(f"not an age: {text!r} (examples: 90s, 30m, 12h, 7d, 2w)")
    return float(match["number"]) * _AGE_UNITS[match["unit"].lower()]


def format_size(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def env_flag(name: str) -> bool:
    """The switch in environment variable ``name`` (1/0, true/false, yes/no, on/off; unset or
    empty: off). Raises ValueError naming the variable for anything else."""
    value = os.environ.get(name, "").strip().lower()
    if value not in _TRUE | _FALSE:
        raise ValueError(f"${name} must be 1 or 0 (true/false, yes/no, on/off), got {value!r}")
    return value in _TRUE
