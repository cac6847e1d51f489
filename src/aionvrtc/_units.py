"""Sizes and ages as people write them: "500M", "2GiB", "30d" (the CLI, environment variables;
switches are _config's)."""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["MAX_SIZE", "format_size", "parse_age", "parse_size", "quoted"]

# The most bytes a file system counts (off_t, st_size): a limit beyond it limits nothing.
MAX_SIZE = (1 << 63) - 1
# Characters of a value that a message quotes: a setting's value can be any length.
_QUOTED = 40

# Binary multiples, as `du -h` and `ls -h` print them: K, KB and KiB all mean 1024.
_SIZE = re.compile(r"\s*(?P<number>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[kmgt]?)(?:i?b)?\s*", re.I)
_AGE = re.compile(r"\s*(?P<number>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[smhdw]?)\s*", re.I)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_AGE_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def quoted(text: str) -> str:
    """``text`` as a message quotes it: repr'd, its first characters only when it is long."""
    if len(text) <= _QUOTED:
        return repr(text)
    return f"{text[:_QUOTED]!r}... ({len(text)} characters)"


def parse_size(text: str) -> int:
    """Bytes in ``text``: a number with an optional K, M, G or T (powers of 1024; "B" and "iB"
    may follow), at most MAX_SIZE. Raises ValueError naming the text."""
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"not a size: {quoted(text)} (examples: 1048576, 500M, 2GiB)")
    # Exact (a float is not past 2^53, and infinity past 1.8e308). A long whole part is refused
    # before it is converted, and digits of a byte's 10^-30th are dropped, so the conversion
    # costs nothing whatever the length.
    whole, _, fraction = match["number"].partition(".")
    whole = whole.lstrip("0") or "0"
    if len(whole) <= len(str(MAX_SIZE)):
        size = int(Fraction(f"{whole}.{fraction[:30]}") * _SIZE_UNITS[match["unit"].lower()])
        if size <= MAX_SIZE:
            return size
    raise ValueError(
        f"too large a size: {quoted(text)} (at most {MAX_SIZE} bytes, 8 EiB, the most a file "
        "system counts; examples: 1048576, 500M, 2GiB)"
    )


def parse_age(text: str) -> float:
    """Seconds in ``text``: a number with an optional s, m, h, d or w."""
    match = _AGE.fullmatch(text)
    if match is None:
        raise ValueError(f"not an age: {quoted(text)} (examples: 90s, 30m, 12h, 7d, 2w)")
    return float(match["number"]) * _AGE_UNITS[match["unit"].lower()]


def format_size(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
