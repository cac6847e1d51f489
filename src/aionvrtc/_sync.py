"""The blocking facade: one process-wide Compiler on a background event-loop thread."""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, TypeVar

import anyio.from_thread

from ._compiler import Compiler

if TYPE_CHECKING:
    from ._artifact import Artifact
    from ._cuda import Module
    from ._spec import KernelSpec
    from ._target import TargetLike

__all__ = ["compile_sync", "default_compiler", "get_sync", "on_default"]

T = TypeVar("T")


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
    first use. A Compiler that fails to start raises here, and the next call tries again.

    Returns:
        The open default Compiler: the same one until it closes (``close_default_compiler``,
        or exit), after which the next call starts another.

    Raises:
        NvrtcError: CuPy or NVRTC cannot be used, or this NVRTC cannot compile for
            ``$AIONVRTC_ARCH``.
        ValueError: A setting it reads is malformed (``$AIONVRTC_ARCH``,
            ``$AIONVRTC_DISK_LIMIT``, ``$AIONVRTC_SHARED_CACHE``, ``$AIONVRTC_REMOTE_URL``, or
            a remote tier with neither ``$AIONVRTC_REMOTE_SECRET`` nor
            ``$AIONVRTC_REMOTE_ALLOW_UNSIGNED``); the message names the variable.
        ImportError: ``$AIONVRTC_REMOTE_URL`` is set and the redis package is not installed.
    """
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


def on_default(make: Callable[[Compiler], Awaitable[T]]) -> T:
    """``await make(default_compiler())`` on the default Compiler's own event loop, from blocking
    code (a worker thread: ``anyio.to_thread.run_sync(on_default, make)``). Its async methods
    run only there: awaited from another event loop, they would wait on a loop that never
    hears of them.

    Args:
        make: Called with the default Compiler; returns what to await.

    Returns:
        What the awaited call returned.
    """
    compiler = default_compiler()
    running = _Default.running
    assert running is not None  # started by default_compiler()
    return running[0].call(make, compiler)


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
    """``await compile(spec, arch=arch)`` on the default Compiler, from blocking code.

    From any thread; a memory hit is served in the calling thread. The default Compiler is
    started on first use (``default_compiler``).

    Args:
        spec: The program to compile.
        arch: The target (``"sm_90"`` or a ``Target``); default: ``$AIONVRTC_ARCH``, else the
            current GPU's.

    Returns:
        The ``Artifact``, as ``Compiler.compile`` returns it.

    Raises:
        TypeError: ``spec`` is not a ``KernelSpec``, or ``arch`` is neither a str nor a
            ``Target``.
        ValueError: ``arch`` is not an arch such as ``"sm_90"``, a setting is malformed (see
            ``default_compiler``), or the spec's include directories cannot be covered by its
            key.
        NoDeviceError: ``arch`` is None, ``$AIONVRTC_ARCH`` is unset and no GPU is usable.
        NvrtcError: CuPy or NVRTC cannot be used, or as ``Compiler.compile`` raises it.
        CompileError: NVRTC rejected the program.
        ImportError: ``$AIONVRTC_REMOTE_URL`` is set and the redis package is not installed.
        CompilerClosed: The default Compiler is closing (``close_default_compiler``, or exit).
    """
    return default_compiler().compile_sync(spec, arch=arch)


def get_sync(spec: KernelSpec, *, device: int | None = None) -> Module:
    """``await get(spec)`` on the default Compiler, from blocking code.

    From any thread; a module loaded already is served in the calling thread. The default
    Compiler is started on first use (``default_compiler``).

    Args:
        spec: The program to compile and load.
        device: The CUDA device index; default: CuPy's current device in the calling thread.

    Returns:
        The ``Module`` loaded on ``device``, as ``Compiler.get`` returns it.

    Raises:
        TypeError: ``spec`` is not a ``KernelSpec``, or ``device`` is not an int.
        ValueError: There is no device ``device`` on this host, a setting is malformed (see
            ``default_compiler``), or the spec's include directories cannot be covered by its
            key.
        NoDeviceError: No CUDA GPU is usable here, or the device's CUDA context cannot be
            created.
        NvrtcError: CuPy or NVRTC cannot be used, or as ``Compiler.get`` raises it.
        CompileError: NVRTC rejected the program.
        GPUOutOfMemoryError: The GPU has no memory left for the module; the cached kernel is
            kept.
        ModuleLoadError: The module cannot be loaded (see ``Compiler.get``).
        ImportError: ``$AIONVRTC_REMOTE_URL`` is set and the redis package is not installed.
        CompilerClosed: The default Compiler is closing (``close_default_compiler``, or exit).
    """
    return default_compiler().get_sync(spec, device=device)
