"""Tiers whose state a forked child must reset: locks a thread of the parent may have held, and
threads the child does not have. Each registers itself once; one fork handler serves them all."""

from __future__ import annotations

import os
import weakref
from typing import Protocol

__all__ = ["reset_in_forked_child"]


class _Resets(Protocol):
    def _after_fork_in_child(self) -> None: ...


_LIVE: weakref.WeakSet[_Resets] = weakref.WeakSet()


def reset_in_forked_child(tier: _Resets) -> None:
    """Call ``tier._after_fork_in_child()`` in every child forked while ``tier`` lives."""
    _LIVE.add(tier)


def _after_fork_in_child() -> None:
    for tier in list(_LIVE):
        tier._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
