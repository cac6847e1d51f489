"""The blocking facade: one process-wide Compiler on a background event-loop thread."""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
from typing import TYPE_CHECKING

import anyio.from_thread

from ._actor import Compiler

if TYPE_CHECKING:
    from ._artifact import Artifact
    from ._cuda import Module
    from ._spec import KernelSpec

__all__ = ["compile_sync", "default_compiler", "get_sync"]

ENV_ARCH = "AIONVRTC_ARCH"


class _Default:
    lock = threading.Lock()
    compiler: Compiler | None = None
    stack: contextlib.ExitStack | None = None


def default_compiler() -> Compiler:
    """The process-wide Compiler, started on first use in a background event-loop thread
    (anyio's blocking portal) and closed at exit. Its target is ``$AIONVRTC_ARCH`` if set,
    else the current GPU's; its cache dir ``$AIONVRTC_CACHE_DIR`` or the user cache dir.
    Usable from any thread through ``compile_sync``/``get_sync``."""
    with _Default.lock:
        if _Default.compiler is not None and not _Default.compiler.closed:
            return _Default.compiler
        compiler = Compiler(arch=os.environ.get(ENV_ARCH) or None)
        with contextlib.ExitStack() as stack:
            portal = stack.enter_context(anyio.from_thread.start_blocking_portal())
            stack.enter_context(portal.wrap_async_context_manager(compiler))
            compiler._portal = portal
            _Default.stack = stack.pop_all()
        if _Default.compiler is None:
            atexit.register(close_default_compiler)
        _Default.compiler = compiler
        return compiler


def close_default_compiler() -> None:
    """Close the process-wide Compiler (waiting for running compiles) and its thread."""
    with _Default.lock:
        stack, _Default.stack = _Default.stack, None
    if stack is not None:
        stack.close()


def compile_sync(spec: KernelSpec) -> Artifact:
    """``await compile(spec)`` on the default Compiler, from blocking code."""
    return default_compiler().compile_sync(spec)


def get_sync(spec: KernelSpec, *, device: int | None = None) -> Module:
    """``await get(spec)`` on the default Compiler, from blocking code."""
    return default_compiler().get_sync(spec, device=device)
