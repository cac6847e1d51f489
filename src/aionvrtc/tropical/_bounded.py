"""Caches of a bounded count, kept without a lock: the oldest entry goes first."""

from __future__ import annotations

from typing import Any

__all__ = ["keep"]


def keep(table: dict[Any, Any], key: Any, value: Any, limit: int) -> None:
    """``table[key] = value``, dropping the oldest entries past ``limit``. Threads may insert at
    once: one that finds an entry gone (another took it first) stops dropping; the bound then
    holds within the number of threads."""
    while len(table) >= limit:
        try:
            del table[next(iter(table))]
        except (KeyError, RuntimeError, StopIteration):  # another thread took it first
            break
    table[key] = value
