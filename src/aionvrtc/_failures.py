"""Remembered compile failures: a known-bad spec fails fast instead of compiling again.

Bounded in count and bytes, least recently used dropped first (a dropped failure only costs a
recompile that fails again), and what is kept holds no traceback: a traceback's frames would
keep the failed spec's source, the worker's locals and NVRTC's program alive for as long as the
failure is remembered.
"""

from __future__ import annotations

import copy
from collections import OrderedDict

from ._exceptions import CompileError

__all__ = ["MAX_FAILURES", "MAX_FAILURE_BYTES", "Failures"]

MAX_FAILURES = 1024  # remembered failures per Compiler
MAX_FAILURE_BYTES = 16 << 20  # bytes of their logs, messages and options (16 MiB)
_OVERHEAD = 512  # bytes charged per failure for the objects around its text


def _size(error: CompileError) -> int:
    text = len(error.log) + len(str(error.args[0]) if error.args else "")
    return text + sum(len(option) for option in error.options) + len(error.program) + _OVERHEAD


def _detached(error: CompileError) -> CompileError:
    """A copy of ``error`` without tracebacks (its own and its cause's) or context."""
    clone = copy.copy(error)
    clone.__traceback__ = None
    clone.__context__ = None
    cause = error.__cause__
    if cause is not None:
        cause = copy.copy(cause)
        cause.__traceback__ = None
        cause.__context__ = cause.__cause__ = None
    clone.__cause__ = cause
    return clone


class Failures:
    """Compile errors by key, bounded by ``limit`` entries and ``byte_limit`` bytes."""

    def __init__(self, limit: int = MAX_FAILURES, byte_limit: int = MAX_FAILURE_BYTES) -> None:
        self.limit = limit
        self.byte_limit = byte_limit
        self.bytes = 0
        self.dropped = 0  # failures forgotten to stay within the bounds
        self._errors: OrderedDict[str, tuple[CompileError, int]] = OrderedDict()

    def __contains__(self, key: str) -> bool:
        return key in self._errors

    def __len__(self) -> int:
        return len(self._errors)

    def get(self, key: str) -> CompileError | None:
        found = self._errors.get(key)
        if found is None:
            return None
        self._errors.move_to_end(key)
        return found[0]

    def remember(self, key: str, error: CompileError) -> None:
        size = _size(error)
        self.pop(key)
        if size > self.byte_limit:
            self.dropped += 1
            return  # larger than the whole memory: not worth evicting everything for
        self._errors[key] = (_detached(error), size)
        self.bytes += size
        while len(self._errors) > self.limit or self.bytes > self.byte_limit:
            _, (_, dropped) = self._errors.popitem(last=False)
            self.bytes -= dropped
            self.dropped += 1

    def pop(self, key: str) -> None:
        found = self._errors.pop(key, None)
        if found is not None:
            self.bytes -= found[1]

    def clear(self) -> None:
        self._errors.clear()
        self.bytes = 0
