"""The blocking facade: one process-wide Compiler on a background event-loop thread."""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING

import anyio.from_thread

from ._compiler import Compiler

if TYPE_CHECKING:
    from ._artifact import Artifact
    from ._cuda import Module
    from ._spec import KernelSpec
    from ._target import TargetLike

__all__ = ["compile_sync", "default_compiler", "get_sync"]


class _Default:
    lock = threading.Lock()
    compiler: Compiler | None = None
    # The portal into the event loop that runs ``compiler``, and that loop's thread.
    running: tuple[anyio.from_thread.BlockingPortal, threading.Thread] | None = None
    at_exit = False  # close_default_compiler registered with atexit


def _forget_in_child() -> None:
    """After fork(): the child has the parent's memory but none of its threads, so the
    parent's Compiler (whose event loop runs in a thread of the parent) can neither serve nor be
    closed here. Forget it, and the lock that a parent's thread may have held: the child's
    first use starts a Compiler of its own, and its exit closes only that one. (Nothing
    dropped here runs code when collected: no generator waits for the parent's thread.)"""
    _Default.lock = threading.Lock()
    _Default.compiler = None
    _Default.running = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _serve(compiler: Compiler) -> tuple[anyio.from_thread.BlockingPortal, threading.Thread]:
    """Open ``compiler`` in an event loop of a thread of its own, until its portal stops.

    A daemon thread: the interpreter does not wait for it before running atexit, where
    close_default_compiler stops it (closing the Compiler, which finishes running compiles).
    """
    opened: Future[anyio.from_thread.BlockingPortal] = Future()

    async def serve() -> None:
        async with anyio.from_thread.BlockingPortal() as portal, compiler:
            compiler.use_portal(portal)
            opened.set_result(portal)
            await portal.sleep_until_stopped()

    def run() -> None:
        try:
            anyio.run(serve)
        except BaseException as exc:  # opening failed: the caller raises it
            if not opened.done():
                opened.set_exception(exc)
            else:
                raise

    thread = threading.Thread(target=run, name="aionvrtc default compiler", daemon=True)
    thread.start()
    return opened.result(), thread


def default_compiler() -> Compiler:
    """The process-wide Compiler, started on first use in a background event-loop thread
    (reached through an anyio blocking portal) and closed at exit. Its target is
    ``$AIONVRTC_ARCH`` if set, else the current GPU's (without either, ``compile_sync`` needs
    an ``arch``); its cache dir ``$AIONVRTC_CACHE_DIR`` or the user cache dir. Usable from any
    thread through ``compile_sync``/``get_sync``; after fork(), the child starts its own on
    first use."""
    compiler = _Default.compiler  # the hot path of every tropical call: no lock once started
    if compiler is not None and not compiler.closed:
        return compiler
    with _Default.lock:
        if _Default.compiler is not None and not _Default.compiler.closed:
            return _Default.compiler
        compiler = Compiler()  # its target: resolve_target()
        _Default.running = _serve(compiler)
        if not _Default.at_exit:
            _Default.at_exit = True
            atexit.register(close_default_compiler)
        _Default.compiler = compiler
        return compiler


def close_default_compiler() -> None:
    """Close the process-wide Compiler (waiting for running compiles) and its thread."""
    with _Default.lock:
        running, _Default.running = _Default.running, None
    if running is not None:
        portal, thread = running
        with contextlib.suppress(RuntimeError):  # its loop has stopped already
            portal.call(portal.stop)
        thread.join()


def compile_sync(spec: KernelSpec, *, arch: TargetLike | None = None) -> Artifact:
    """``await compile(spec, arch=arch)`` on the default Compiler, from blocking code."""
    return default_compiler().compile_sync(spec, arch=arch)


def get_sync(spec: KernelSpec, *, device: int | None = None) -> Module:
    """``await get(spec)`` on the default Compiler, from blocking code."""
    return default_compiler().get_sync(spec, device=device)
