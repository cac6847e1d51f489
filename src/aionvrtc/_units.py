"""Sizes and ages as people write them: "500M", "2GiB", "30d" (the CLI, environment variables;
switches are _config's)."""

from __future__ import annotations

import re

__all__ = ["format_size", "parse_age", "parse_size"]

# Binary multiples, as `du -h` and `ls -h` print them: K, KB and KiB all mean 1024.
_SIZE = re.compile(r"\s*(?P<number>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[kmgt]?)(?:i?b)?\s*", re.I)
_AGE = re.compile(r"\s*(?P<number>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[smhdw]?)\s*", re.I)
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
