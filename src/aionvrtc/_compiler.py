"""Compiler: the async compilation service, the object users hold.

It owns its lifecycle (its own task, outside the opener's), the request API (``compile``,
``get``, ``prefetch`` and their blocking forms), management and stats. A memory hit is served in
the caller's task without suspending; a miss is the Scheduler's (``_scheduler``: the lanes and
jobs), a loaded module the Modules registry's (``_modules``: per device).
"""

from __future__ import annotations

import enum
import functools
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self

import anyio
import anyio.abc
import anyio.from_thread
import anyio.to_thread

from . import _config, _cuda
from ._artifact import Artifact
from ._cache import DEFAULT_MEMORY_LIMIT, ArchStats, KernelCache
from ._config import ENV_MANIFEST
from ._cuda import Module
from ._cuda_errors import IMAGE_REFUSED
from ._exceptions import (
    CompileError,
    CompileOnHotPath,
    CompilerClosed,
    ModuleLoadError,
    QueueFull,
    first_error,
)
from ._explain import Explanation, explain
from ._manifest import Manifest
from ._modules import Modules
from ._scheduler import LIVE, PREFETCH, Job, Scheduler, fresh
from ._spec import KernelSpec
from ._store import DiskStats
from ._store.memory import Entry, MemoryStats
from ._store.remote import RedisTier, RemoteStats
from ._store.tier import LayerStats
from ._target import Target, TargetLike

if TYPE_CHECKING:
    import asyncio

__all__ = ["Compiler", "CompilerStats"]

logger = logging.getLogger("aionvrtc")


class _State(enum.Enum):
    NEW = "new"
    STARTING = "starting"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class CompilerStats:
    """A snapshot of a Compiler's counters since it opened, with each tier's own.

    ``Compiler.stats()`` returns one; the counters cover every target the Compiler served.

    Attributes:
        requests: ``compile()`` and ``get()`` calls, their blocking forms included, each counted
            once: the memory tier's hits and the requests it did not serve. A request refused
            with ``QueueFull`` is counted in ``rejected`` alone.
        joined: Requests that shared another request's in-flight job.
        errors: Requests whose job failed: a CompileError (fast failures of known-bad specs
            included), an NvrtcError, or CompilerClosed for a job the closing stopped. Bad
            arguments, a missing target and failures to load a module are not counted.
        compiles: Successful NVRTC compiles.
        compile_seconds: Total NVRTC time of those compiles, in seconds.
        queued: Jobs looking up or queued for a compile slot, now.
        in_flight: Jobs holding a compile slot, now.
        waiting: Jobs waiting for another process's or host's lock (holding no slot), now.
        prefetched: Specs queued by ``prefetch()`` (the sum of what its calls returned).
        rejected: Requests refused with ``QueueFull`` because ``max_queued`` kernels were
            waiting.
        memory: The memory tier's ``MemoryStats``.
        disk: The disk tier's ``DiskStats``; all zero for a Compiler without a disk tier.
        remote: The remote tier's ``RemoteStats``; all zero for a Compiler without a remote
            tier.
        layers: Each read-only layer's ``LayerStats``, in the order they are read.
        archs: ``ArchStats`` by arch (``"sm_90"``): the memory tier's entries for it, its
            compiles and their time.
        hot_compiles: Kernels that a live request waited for NVRTC to compile while the
            Compiler was serving (``start_serving``): each logged with its ``explain``, and
            refused with ``CompileOnHotPath`` in the ``"error"`` mode. Prefetches and
            warm-ups are not counted.
    """

    requests: int
    joined: int
    errors: int
    compiles: int
    compile_seconds: float
    queued: int
    in_flight: int
    waiting: int
    prefetched: int
    rejected: int
    memory: MemoryStats
    disk: DiskStats
    remote: RemoteStats
    layers: tuple[LayerStats, ...]
    archs: dict[str, ArchStats]
    hot_compiles: int = 0


def _specs_of(specs: Iterable[KernelSpec], method: str) -> list[KernelSpec]:
    """``specs`` as a list, every item checked first: a bad item after good ones must leave
    none of them half-queued (marked as deriving, and then never derived)."""
    if isinstance(specs, KernelSpec) or not isinstance(specs, Iterable):
        raise TypeError(
            f"{method} takes an iterable of KernelSpecs (a list, even of one), not "
            f"{type(specs).__name__}"
        )
    specs = list(specs)
    wrong = next((s for s in specs if not isinstance(s, KernelSpec)), None)
    if wrong is not None:
        raise TypeError(f"{method} takes KernelSpecs, not {type(wrong).__name__}")
    return specs


def _label(spec: KernelSpec) -> str:
    """A kernel as a log line names it: its program and first name expression."""
    if spec.name_expressions:
        return f"{spec.name_expressions[0]} ({spec.name})"
    return spec.name


# Seconds before a kernel whose loading ahead failed for a passing reason (a full GPU) is tried
# again by prefetch(device=).
LOAD_RETRY_SECONDS = 60.0

# Refusals, counted apart from errors (rejected, hot_compiles).
_REFUSED = (QueueFull, CompileOnHotPath)

# The tasks _spawn started, referenced until done (asyncio keeps only weak references).
_spawned: set[asyncio.Task[None]] = set()


def _spawn(run: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Start ``run()`` as a task of its own, outside the caller's task tree and cancel scopes:
    a system task under trio, a plain task under asyncio. It must handle its own errors."""
    # asyncio is looked up, not imported (25 ms at the first Compiler): a running asyncio loop
    # has imported it, and without one this runs under trio.
    asyncio = sys.modules.get("asyncio")
    try:
        loop = asyncio.get_running_loop() if asyncio is not None else None
    except RuntimeError:
        loop = None
    if loop is None:  # not asyncio: trio
        import trio

        trio.lowlevel.spawn_system_task(run)
    else:
        task = loop.create_task(run())
        _spawned.add(task)
        task.add_done_callback(_spawned.discard)


class Compiler:
    """The async, actor-style compilation service.

    ``async with Compiler(arch="sm_90") as compiler: artifact = await compiler.compile(spec)``.
    A Compiler is opened once (opening it again raises RuntimeError) and runs in a task of its
    own, so any task may make requests and close it. ``get()`` compiles for the device it
    loads on (``target_for``), so one Compiler serves every GPU of the host. Live compiles run
    in worker threads; prefetched ones take only the slots live ones leave free, and a live one
    does not wait for a prefetched one to finish (so, while prefetches run, up to twice
    ``concurrency`` run). A disk or remote hit never waits for them.

    Args:
        arch: The target of ``compile()`` when it names none (``"sm_90"`` or a ``Target``); it
            defaults to ``$AIONVRTC_ARCH``, else the current GPU's (``resolve_target``);
            without either, only a ``compile()`` that names none raises (NoDeviceError).
        cache_dir: The disk cache's folder; default: ``$AIONVRTC_CACHE_DIR``, else the user
            cache dir (``default_cache_dir``).
        concurrency: How many live compiles may run at once in worker threads (default 1).
        memory_limit: Bytes the memory tier holds (default 256 MiB); past it, entries not hit
            lately are evicted.
        disk_limit: Bytes the disk cache holds; default: ``$AIONVRTC_DISK_LIMIT``, else 1 GiB.
            Past it, the least recently used entries are evicted in the background.
        disk: False for no disk cache: kernels are kept in memory only, and records
            (``save_record``) are not kept.
        remote: A ``RedisTier`` that a fleet of hosts shares, read after the layers and
            written after each compile; default: one from ``$AIONVRTC_REMOTE_URL`` if set,
            else none. The Compiler closes it when it closes.
        shared_cache: True trusts a cache dir that a group shares; default:
            ``$AIONVRTC_SHARED_CACHE``, else False: the disk cache is used only when nobody
            but this user (or root) can write to it.
        layers: Read-only cache dirs and bundle files, read after the disk cache, before the
            remote tier (see ``KernelCache``); default: ``$AIONVRTC_CACHE_LAYERS``.
        manifest: A file to which every distinct spec requested or prefetched is appended once
            per process, when its first job (a miss of the memory tier) succeeds, for
            ``aionvrtc warm manifest`` to compile for any arch; default:
            ``$AIONVRTC_MANIFEST``; False: none. A manifest that cannot be written is warned
            about once and never fails a request.
        max_queued: The most kernels that requests may wait for to be looked up (on disk,
            in a layer, in Redis) or compiled, holding no compile slot; a request for one more
            is refused at once with ``QueueFull``, as Triton's ``max_queue_size`` rejects past
            it, instead of waiting behind them. Memory hits and requests joining a kernel
            already waiting are never refused; prefetches are neither refused nor counted.
            Default None: no bound.

    Raises:
        ValueError: ``concurrency`` or ``max_queued`` is not a positive int; ``memory_limit``
            or ``disk_limit`` is negative; ``arch`` is not an arch such as ``"sm_90"``;
            ``manifest`` is ``""``; or a setting read from the environment is malformed
            (``$AIONVRTC_ARCH``, ``$AIONVRTC_DISK_LIMIT``, ``$AIONVRTC_SHARED_CACHE``,
            ``$AIONVRTC_REMOTE_URL``, or a remote tier with neither ``$AIONVRTC_REMOTE_SECRET`` nor
            ``$AIONVRTC_REMOTE_ALLOW_UNSIGNED``); the message names the variable.
        TypeError: ``arch`` is neither a str nor a ``Target``, ``layers`` is one path rather
            than a list of them, or ``manifest`` is neither a path nor False.
        NvrtcError: CuPy or NVRTC cannot be used, or this NVRTC cannot compile for ``arch``
            (the message names the archs it supports).
        ImportError: ``$AIONVRTC_REMOTE_URL`` is set and the redis package is not installed.
    """

    def __init__(
        self,
        *,
        arch: TargetLike | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        concurrency: int | None = None,
        memory_limit: int = DEFAULT_MEMORY_LIMIT,
        disk_limit: int | None = None,
        disk: bool = True,
        remote: RedisTier | None = None,
        shared_cache: bool | None = None,
        layers: Iterable[str | os.PathLike[str]] | None = None,
        manifest: str | os.PathLike[str] | Literal[False] | None = None,
        max_queued: int | None = None,
    ) -> None:
        if concurrency is None:
            concurrency = 1
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be a positive int, got {concurrency!r}")
        if max_queued is not None and (
            isinstance(max_queued, bool) or not isinstance(max_queued, int) or max_queued < 1
        ):
            raise ValueError(f"max_queued must be a positive int or None, got {max_queued!r}")
        self.concurrency = concurrency
        # The fleet's shared tier: ``remote``, else one from $AIONVRTC_REMOTE_URL if set.
        self.remote = remote if remote is not None else RedisTier.from_environment()
        if manifest is None:
            manifest = _config.text(ENV_MANIFEST) or False
        if manifest is not False and not isinstance(manifest, str | os.PathLike):
            raise TypeError(f"manifest must be a path or False, not {type(manifest).__name__}")
        self.manifest = Manifest(manifest) if manifest is not False else None
        self._cache = KernelCache(
            arch,
            cache_dir=cache_dir,
            memory_limit=memory_limit,
            disk_limit=disk_limit,
            disk=disk,
            shared_cache=shared_cache,
            remote=self.remote,
            layers=layers,
            # Without a GPU and with no arch named, requests that name an arch are served all
            # the same; only those that name none raise (saying to name one).
            target_required=False,
        )
        # compile()'s target when it names no arch; None: none named and no GPU to tell it.
        self._target: Target | None = self._cache.target if self._cache.no_target is None else None
        self._memory = self._cache.memory
        self._entries, self._clock = self._memory.entries, self._memory.clock
        # The memo key under which specs keep their key for this target and NVRTC build (the
        # cache's), held here so the hot path does one dict lookup; without a target, one that
        # no spec holds, so that a request naming no arch takes the slow path, which raises.
        self._key_id = self._cache.memo if self._target is not None else ""
        # The same for compile(arch=...): by the arch as given (a str or a Target).
        self._arch_memos: dict[object, str] = {}
        # Loaded modules per device, and each device's target (see target_for and get()).
        self._loaded = Modules(self._cache, self._target, self._key_id)
        self._scheduler = Scheduler(
            self._cache, concurrency, self._succeeded, max_queued, self._compiled_while_serving
        )
        self._state = _State.NEW
        self._hot: dict[str, Entry] = {}  # see _enter() and compile()
        self._task_group: anyio.abc.TaskGroup | None = None
        self._stopped: anyio.Event | None = None
        self._started: anyio.Event | None = None  # set once opening succeeded or failed
        self._portal: anyio.from_thread.BlockingPortal | None = None
        # Prefetched specs whose keys are being derived, with the memo key of their target.
        self._deriving: set[tuple[KernelSpec, str]] = set()
        self._errors = 0
        self._prefetched = 0
        # start_serving's mode (None: not serving), and the compiles it saw.
        self._serving: Literal["warn", "error"] | None = None
        self._hot_compiles = 0
        # (spec, device) pairs being loaded ahead (prefetch with a device), and those whose
        # loading failed: not tried again until forget() or clear().
        self._loading: set[tuple[KernelSpec, int]] = set()
        self._load_failed: dict[tuple[KernelSpec, int], float] = {}  # until (monotonic)
        self._thread = -1  # the ident of the thread the Compiler's event loop runs in

    # -- lifecycle ---------------------------------------------------------------------------

    def _enter(self, state: _State) -> None:
        """The one place the lifecycle state changes. ``_hot``, the map the hot paths read,
        follows it: the memory tier's entries while open, an empty map otherwise (so a request
        to a Compiler that is not open takes the slow path, which raises)."""
        self._state = state
        self._hot = self._entries if state is _State.OPEN else {}
        if state is not _State.OPEN:
            self._loaded.close()

    async def __aenter__(self) -> Self:
        if self._state is not _State.NEW:
            raise RuntimeError(f"a Compiler can be opened once; this one is {self._state.value}")
        self._stopped = anyio.Event()  # set once the actor and its lanes have stopped
        opened: list[BaseException | None] = []
        started = self._started = anyio.Event()
        self._enter(_State.STARTING)
        _spawn(functools.partial(self._host, opened, started))
        try:
            await started.wait()
        except BaseException:  # the opener was cancelled: nobody would close it
            with anyio.CancelScope(shield=True):
                await started.wait()
                await self.aclose()
            raise
        if opened[0] is not None:
            raise opened[0]
        return self

    async def _host(self, opened: list[BaseException | None], started: anyio.Event) -> None:
        """The Compiler's own task, outside the opener's task tree: it holds the task group
        that the actor and the lanes run in. So aclose() never
        has to leave a task group, and works from any task under any cancel scope."""
        assert self._stopped is not None
        try:
            async with anyio.create_task_group() as task_group:
                self._task_group = task_group
                self._thread = threading.get_ident()
                if self.manifest is not None:
                    self.manifest.bind(task_group)
                # The scheduler takes jobs from attach() on, before anyone can submit one, and
                # its dispatcher stops once closed. (aclose() while starting waits for this.)
                self._scheduler.attach(task_group)
                self._enter(_State.OPEN)
                await task_group.start(self._actor)
                opened.append(None)
                started.set()
        except Exception as exc:
            if not opened:  # the opener raises it
                opened.append(exc)
            else:
                logger.exception("the Compiler stopped on an error")
        finally:
            self._task_group = None
            self._scheduler.detach()
            self._enter(_State.CLOSED)
            if self.manifest is not None:
                # Before aclose() returns: the lines of every request made while open are in
                # the file (the task group waited for the flushes it ran; this writes those
                # that a cancelled closing stopped before they started).
                with anyio.CancelScope(shield=True):
                    await self.manifest.aclose()
            self._cache.close()  # its layers' files: not held until the garbage collector runs
            self._stopped.set()
            started.set()
            if self.remote is not None:
                self.remote.close()  # closes sockets: no wait

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close: queued jobs fail with CompilerClosed, running compiles finish and are cached,
        and it returns once they have.

        Any task may call it, under any cancel scope (a server's shutdown handler, say). If it
        is cancelled (a deadline), it cancels what is left and ends at once: a compile still
        running then finishes in its worker thread and is stored on disk, with nothing waiting
        for it.

        Raises:
            asyncio.CancelledError: Only the cancellation of the caller's own scope, passed on
                once what was left is cancelled (``trio.Cancelled`` under trio); closing itself
                never fails.
        """
        if self._state is _State.NEW:
            self._enter(_State.CLOSED)
            return
        if self._state is _State.CLOSED and self._stopped is None:
            return  # closed before it was ever opened: nothing ran
        if self._state is _State.STARTING:
            assert self._started is not None
            await self._started.wait()
        if self._state is _State.OPEN:
            self._begin_close()
        assert self._stopped is not None
        try:
            await self._stopped.wait()
        except BaseException:
            if self._task_group is not None:
                self._task_group.cancel_scope.cancel()
            raise

    def _begin_close(self) -> None:
        """Closing: the scheduler fails what no lane has taken and stops once the running
        compiles have finished."""
        self._enter(_State.CLOSING)
        self._scheduler.close()

    @property
    def closed(self) -> bool:
        """Whether the Compiler has closed: False while it is new, open or still closing."""
        return self._state is _State.CLOSED

    def _not_open(self) -> Exception:
        if self._state in (_State.NEW, _State.STARTING):
            return RuntimeError("the Compiler is not open: use 'async with Compiler(...) as c'")
        return CompilerClosed(f"the Compiler is {self._state.value}")

    # -- requests ----------------------------------------------------------------------------

    # The hot paths of compile() and get() (a memory hit) are written out by hand: they run on
    # every request and are measured against awaiting a trivial coroutine (benchmarks/). They
    # read ``_hot``, the memory tier's map while the Compiler is open and an empty map
    # otherwise, so a request to a Compiler that is not open takes the slow path, which raises.

    async def compile(self, spec: KernelSpec, *, arch: TargetLike | None = None) -> Artifact:
        """The compiled artifact for ``spec`` and target ``arch``: memory, else disk, else NVRTC.

        Needs no GPU. A memory hit is served in the caller's task without suspending. Requests
        for one key at once share one job; a request that is cancelled ends only its own wait,
        and the job runs on and is cached for the next request. A spec that NVRTC rejected is
        remembered: asking again raises the same CompileError at once, until ``forget`` or
        ``clear``.

        Args:
            spec: The program to compile.
            arch: The target (``"sm_90"`` or a ``Target``); default: the Compiler's ``arch``
                (its ``target``).

        Returns:
            The ``Artifact``: the image (a cubin, or PTX for a GPU newer than this NVRTC), its
            lowered names and NVRTC's log.

        Raises:
            TypeError: ``spec`` is not a ``KernelSpec``, or ``arch`` is neither a str nor a
                ``Target``.
            ValueError: ``arch`` is not an arch such as ``"sm_90"``, or the spec's include
                directories cannot be covered by its key (one past the size bounds, or an
                include that reaches a file outside every include directory).
            NoDeviceError: ``arch`` is None and the Compiler has no target (no ``arch=``, no
                ``$AIONVRTC_ARCH``, no GPU).
            NvrtcError: This NVRTC cannot compile for ``arch`` (the message names the archs it
                supports); the temporary folder cannot be used safely (``TMPDIR``); or the files
                of the spec's include directories changed since its key was derived.
            CompileError: NVRTC rejected the program; its log is in ``log`` and the message.
            QueueFull: ``max_queued`` kernels are waiting for requests (see Compiler);
                ask again once the queue drains.
            CompilerClosed: The Compiler is closed or closing, or closed before this request's
                job ran.
            RuntimeError: The Compiler has not been opened (``async with``).
        """
        try:
            entry = self._hot[spec._keys[self._key_id if arch is None else self._arch_memos[arch]]]
        except (KeyError, AttributeError, TypeError):
            return await self._compile(spec, arch)
        entry.used = next(self._clock)  # the hit count and its recency (see MemoryTier)
        return entry.artifact

    async def _compile(
        self, spec: KernelSpec, arch: TargetLike | None, priority: int = LIVE
    ) -> Artifact:
        """A memory miss of ``compile``, or a warm-up's (``priority`` PREFETCH: not counted
        as a request, overtaken by live ones, never a hot compile)."""
        if self._state is not _State.OPEN:
            raise self._not_open()
        if not isinstance(spec, KernelSpec):
            raise TypeError(f"spec must be a KernelSpec, not {type(spec).__name__}")
        cache = self._for_arch(arch)
        key = await self._key(spec, cache)
        artifact = self._memory.read(key)
        if artifact is not None:
            return artifact
        if self._state is not _State.OPEN:  # closed while the key was derived in a thread
            raise self._not_open()
        job = self._scheduler.submit(spec, key, priority, cache)
        live = priority == LIVE
        if live and not isinstance(job.error, QueueFull):  # (counted as rejected alone)
            cache.missed()
        if not job.done.is_set():
            # A waiter's cancellation ends only this wait: the job runs on in the Compiler's
            # task group and is cached for the next request. (Written out here, not a method
            # of the job: a coroutine per waiter cost 10,000 waiters 0.8 us each.)
            job.waiters += 1
            try:
                await job.done.wait()
            finally:
                job.waiters -= 1
        if job.error is None:
            assert job.result is not None
            return job.result
        if not live and isinstance(job.error, CompileOnHotPath):
            # A live request's refusal ended the job this warm-up joined; the compile goes on
            # as a prefetch job of its own, which this waits for.
            return await self._compile(spec, arch, priority)
        if live and not isinstance(job.error, _REFUSED):
            self._errors += 1
        raise fresh(job.error)

    def key(self, spec: KernelSpec, *, arch: TargetLike | None = None) -> str:
        """``spec``'s cache key for target ``arch`` (see ``kernel_key``).

        Blocking the first time for a spec with include directories, whose files it digests.
        Works whether or not the Compiler is open.

        Args:
            spec: The program.
            arch: The target (``"sm_90"`` or a ``Target``); default: the Compiler's.

        Returns:
            The key (hex SHA-256, 64 characters) that the tiers store its image under.

        Raises:
            TypeError: ``arch`` is neither a str nor a ``Target``.
            ValueError: ``arch`` is not an arch such as ``"sm_90"``, or the spec's include
                directories cannot be covered by its key (as ``compile`` raises it).
            NoDeviceError: ``arch`` is None and the Compiler has no target.
            NvrtcError: This NVRTC cannot compile for ``arch``.
        """
        return self._for_arch(arch).key(spec)

    @property
    def target(self) -> Target:
        """The target of ``compile()`` when it names none: the Compiler's ``arch``, else
        ``$AIONVRTC_ARCH``, else the current GPU's. NoDeviceError where there is none of them
        (requests that name an arch are served all the same)."""
        return self._for_arch(None).target

    def _for_arch(self, arch: TargetLike | None) -> KernelCache:
        """The cache's view for ``arch`` (None: the Compiler's target), its memo key noted for
        compile()'s hot path. NvrtcError for an arch this NVRTC cannot compile for."""
        if arch is None:
            if self._cache.no_target is not None:
                raise fresh(self._cache.no_target)
            return self._cache
        cache = self._cache.for_arch(arch)
        if isinstance(arch, str | Target):
            self._arch_memos[arch] = cache.memo
        return cache

    async def _key(self, spec: KernelSpec, cache: KernelCache) -> str:
        key = cache.known_key(spec)
        if key is not None:
            return key
        if spec.reads_host_files:
            # Its first key digests the include directories' files: tens of milliseconds for a
            # library such as CCCL, which must not stall the event loop.
            return await anyio.to_thread.run_sync(cache.key, spec)
        return cache.key(spec)

    def target_for(self, device: int) -> Target:
        """The target ``get()`` compiles for on ``device``.

        Args:
            device: The CUDA device index.

        Returns:
            The GPU's own architecture (``sm_90`` for compute capability 9.0), or the
            Compiler's ``arch`` when that names the same GPU with a feature suffix (``sm_90a``)
            or a family that covers it (``sm_100f`` for a 10.3 GPU).

        Raises:
            TypeError: ``device`` is not an int.
            ValueError: There is no device ``device`` on this host.
            NoDeviceError: No CUDA GPU is usable here.
            NvrtcError: This NVRTC cannot compile for that GPU's architecture (the message names
                the archs it supports).
        """
        return self._loaded.cache_for(device).target

    async def get(self, spec: KernelSpec, *, device: int | None = None) -> Module:
        """``spec`` compiled for ``device`` and loaded there.

        Compiled for that GPU's architecture (``target_for``), so one Compiler serves GPUs of
        several architectures, with one compile per kernel and architecture.

        A second ``get`` on the same device returns the same Module and loads nothing. An
        image the driver refuses as invalid (CUDA_ERROR_INVALID_IMAGE, _NO_BINARY_FOR_GPU or
        _INVALID_PTX) is dropped from the tiers and compiled again, once per key an hour
        (REFUSAL_WINDOW). Any other load failure raises and leaves the cache as it was: a full
        GPU raises GPUOutOfMemoryError, and asking again once memory is free loads the cached
        kernel without compiling it.

        Args:
            spec: The program to compile and load.
            device: The CUDA device index; default: CuPy's current device in the calling
                thread.

        Returns:
            The ``Module`` loaded on ``device``: the same object for every ``get`` of the spec
            there.

        Raises:
            TypeError: ``spec`` is not a ``KernelSpec``, or ``device`` is not an int.
            ValueError: There is no device ``device`` on this host, or the spec's include
                directories cannot be covered by its key (as ``compile`` raises it).
            NoDeviceError: No CUDA GPU is usable here, or the device's CUDA context cannot be
                created.
            NvrtcError: This NVRTC cannot compile for the device's architecture, or as
                ``compile`` raises it.
            CompileError: NVRTC rejected the program.
            GPUOutOfMemoryError: The GPU has no memory left for the module; the cached kernel
                is kept.
            ModuleLoadError: The module cannot be loaded: the image cannot run on this GPU or
                driver, the device cannot take it now (a CUDA context broken by an earlier
                fault), or the driver refused its replacement as well within the hour
                (``status`` names the driver's error).
            QueueFull: ``max_queued`` kernels are waiting for requests (see Compiler);
                ask again once the queue drains.
            CompilerClosed: The Compiler is closed or closing.
            RuntimeError: The Compiler has not been opened (``async with``).
        """
        try:
            loaded = self._loaded
            if device is None:
                # The only GPU's modules when the process sees one GPU, else empty (the slow
                # path asks CUDA for the current device).
                module = loaded.hot[spec._keys[loaded.hot_memo]]
            else:
                module = loaded.by_device[device][spec._keys[loaded.memos[device]]]
        except (KeyError, AttributeError, TypeError):
            return await self._get(spec, device)
        next(self._clock)  # counts the memory hit
        return module

    async def _get(self, spec: KernelSpec, device: int | None, priority: int = LIVE) -> Module:
        if self._state is not _State.OPEN:
            raise self._not_open()
        if device is None:
            device = _cuda.current_device()
        cache = self._loaded.cache_for(device)
        if not _cuda.device_ready(device):
            await anyio.to_thread.run_sync(_cuda.init_device, device)
        modules = self._loaded.of(device, cache.memo)
        artifact = await self._compile(spec, cache.target, priority)
        # Requests that were waiting for the same compile load the module once.
        module = modules.get(artifact.key)
        if module is not None:
            return module
        try:
            module = _cuda.load(artifact, device)
        except ModuleLoadError as exc:
            if exc.status not in IMAGE_REFUSED:
                raise  # not the image's fault (a full GPU, another arch...): the entry stays
            recompile = functools.partial(self.compile, spec, arch=cache.target)
            module = await self._loaded.replace(artifact, exc, device, self._drop, recompile)
        if self._state is _State.OPEN:
            modules[artifact.key] = module
        return module

    def prefetch(
        self,
        specs: Iterable[KernelSpec],
        *,
        arch: TargetLike | None = None,
        device: int | None = None,
    ) -> int:
        """Queue low-priority background compiles (warm-up) for target ``arch``, or compiles
        for ``device``'s target that are then loaded there.

        Live requests overtake them; a live request for a prefetched key promotes its job.
        Failures are logged and remembered, never raised here. Keys not derived yet are
        derived in a worker thread (a spec among them counts as queued). A spec already in
        memory, compiling or remembered as failed is not queued; with ``device``, one loaded
        there already, being loaded, or whose loading there failed (until ``forget`` or
        ``clear``). A prefetch is never a hot compile (``start_serving``).

        With ``device`` it may be called from any thread (it hands over to the Compiler's event
        loop, through its portal or as a worker thread of that loop), so that a hot path which
        finds a kernel missing can have it loaded for its next call without waiting for it.

        Args:
            specs: The programs to compile.
            arch: The target (``"sm_90"`` or a ``Target``); default: the Compiler's.
            device: The CUDA device to load them on once compiled (for its target, as
                ``get`` compiles); not with ``arch``.

        Returns:
            How many were queued; with ``device`` from a thread that reaches the Compiler
            through its portal, how many were handed over (queued unless loaded already).

        Raises:
            TypeError: An item of ``specs`` is not a ``KernelSpec``, ``arch`` is neither a
                str nor a ``Target``, or ``device`` is not an int.
            ValueError: ``arch`` is not an arch such as ``"sm_90"``; both ``arch`` and
                ``device`` are given; there is no device ``device`` on this host.
            NoDeviceError: ``arch`` is None and the Compiler has no target; or ``device`` is
                given and no CUDA GPU is usable here.
            NvrtcError: This NVRTC cannot compile for ``arch`` (or ``device``'s target).
            CompilerClosed: The Compiler is closed or closing.
            RuntimeError: The Compiler has not been opened (``async with``); or, with
                ``device``, this thread is neither the Compiler's event loop's nor one that
                can reach it (no portal, not a worker thread of that loop).
        """
        if self._state is not _State.OPEN:
            raise self._not_open()
        specs = _specs_of(specs, "prefetch")
        if device is not None:
            if arch is not None:
                raise ValueError(
                    "prefetch takes arch= or device=, not both: a device's kernels are "
                    "compiled for its own target"
                )
            self._loaded.cache_for(device)  # the device checked here, not in the background
            load = functools.partial(self._load_ahead, specs, device)
            if threading.get_ident() == self._thread:
                return load()
            if self._portal is not None:  # (not waited for: the caller may be a hot path)
                self._portal.start_task_soon(self._load_ahead_soon, specs, device)
                return len(specs)
            return anyio.from_thread.run_sync(load)
        cache = self._for_arch(arch)
        queued = 0
        later: list[KernelSpec] = []
        for spec in specs:
            key = cache.known_key(spec)
            if key is None:
                if (spec, cache.memo) not in self._deriving:  # deriving here would stall
                    self._deriving.add((spec, cache.memo))
                    later.append(spec)
            elif self._prefetch_one(spec, key, cache):
                queued += 1
        if later:
            assert self._task_group is not None
            self._task_group.start_soon(self._prefetch_later, later, cache)
        queued += len(later)
        self._prefetched += queued
        return queued

    async def _load_ahead_soon(self, specs: list[KernelSpec], device: int) -> None:
        if self._state is _State.OPEN:
            self._load_ahead(specs, device)

    def _load_ahead(self, specs: list[KernelSpec], device: int) -> int:
        """prefetch(device=) on the Compiler's event loop: a task per spec not loaded there."""
        if self._state is not _State.OPEN or self._task_group is None:
            raise self._not_open()
        queued = 0
        now = time.monotonic()
        for spec in specs:
            pair = (spec, device)
            if pair in self._loading or self._load_failed.get(pair, 0.0) > now:
                continue
            if self._holds(spec, device):
                continue
            self._loading.add(pair)
            self._task_group.start_soon(self._load_one, spec, device)
            queued += 1
        self._prefetched += queued
        return queued

    async def _load_one(self, spec: KernelSpec, device: int) -> None:
        try:
            await self._get(spec, device, PREFETCH)
        except Exception as exc:
            if self._state is _State.OPEN:  # (closing fails what is queued: not worth a line)
                # A program NVRTC refused stays refused (until forget() or clear()); anything
                # else (a full GPU) is tried again after a while.
                lasting = isinstance(exc, CompileError)
                until = math.inf if lasting else time.monotonic() + LOAD_RETRY_SECONDS
                self._load_failed[(spec, device)] = until
                when = "until forget() or clear()" if lasting else f"for {LOAD_RETRY_SECONDS} s"
                logger.warning(
                    "loading %s ahead on device %d failed; not tried again %s: %s",
                    _label(spec), device, when, exc,
                )  # fmt: skip
        finally:
            self._loading.discard((spec, device))

    def _holds(self, spec: KernelSpec, device: int) -> bool:
        """Whether ``spec`` is loaded on ``device`` (``loaded`` without counting a hit)."""
        try:
            loaded = self._loaded
            return spec._keys[loaded.memos[device]] in loaded.by_device[device]
        except (KeyError, AttributeError, TypeError):
            return False

    async def warm(
        self,
        specs: Iterable[KernelSpec],
        *,
        arch: TargetLike | None = None,
        device: int | None = None,
    ) -> int:
        """Compile ``specs`` for ``device`` and load them there, or with ``arch`` compile them
        for that target only (no GPU needed), ahead of serving: the ``get`` (``compile``) of
        each at a warm-up's priority (live requests overtake it), never a hot compile
        (``start_serving``), awaited together.

        Args:
            specs: The programs to compile and load.
            arch: The target to compile for, loading nothing (``"sm_90"`` or a ``Target``);
                not with ``device``.
            device: The CUDA device index; default: CuPy's current device in the calling
                thread (where no ``arch`` is named).

        Returns:
            How many kernels are loaded on ``device`` (compiled for ``arch``), each spec once.

        Raises:
            TypeError: An item of ``specs`` is not a ``KernelSpec``, ``arch`` is neither a
                str nor a ``Target``, or ``device`` is not an int.
            ValueError: Both ``arch`` and ``device`` are given; or as ``get`` raises it.
            NoDeviceError, NvrtcError, CompileError, ModuleLoadError: As ``get`` (or
                ``compile``) raises them, for the first spec that failed (the others are
                stopped; what was compiled is kept).
            CompilerClosed: The Compiler is closed or closing.
            RuntimeError: The Compiler has not been opened (``async with``).
        """
        if self._state is not _State.OPEN:
            raise self._not_open()
        unique = list(dict.fromkeys(_specs_of(specs, "warm")))
        if arch is not None and device is not None:
            raise ValueError(
                "warm takes arch= or device=, not both: a device's kernels are compiled for "
                "its own target"
            )
        if arch is not None:
            target = self._for_arch(arch).target  # checked before anything is compiled
        elif device is None:
            device = _cuda.current_device()

        async def one(spec: KernelSpec) -> None:
            if arch is not None:
                await self._compile(spec, target, PREFETCH)
            else:
                await self._get(spec, device, PREFETCH)

        try:
            async with anyio.create_task_group() as group:
                for spec in unique:
                    group.start_soon(one, spec)
        except ExceptionGroup as failed:
            raise first_error(failed) from None
        return len(unique)

    def start_serving(self, mode: Literal["warn", "error"] | None = "warn") -> None:
        """Say that the service serves now: from here on, a compile that a live request waits
        for (a kernel missing from every tier, or compiling for a prefetch when asked for) is a
        hot compile: counted in ``stats().hot_compiles`` and logged on logger ``aionvrtc``
        with its ``explain``, which says why the lookup missed. With ``"error"``, such a
        request also raises ``CompileOnHotPath`` at once, and the kernel compiles in the
        background for the next request. Prefetches and warm-ups (``prefetch``, ``warm``) are
        never hot compiles. vLLM's ``--jit-monitor-mode warn|error`` is the same guard;
        NVIDIA Triton marks a model ready only after its warm-up, the step before this.

        Args:
            mode: ``"warn"`` (count and log), ``"error"`` (count, log and refuse), or None
                (not serving: compiles are not watched). Kept as ``serving``.

        Raises:
            ValueError: ``mode`` is none of the three.
        """
        if mode not in ("warn", "error", None):
            raise ValueError(f"start_serving takes 'warn', 'error' or None, not {mode!r}")
        self._serving = mode

    @property
    def serving(self) -> Literal["warn", "error"] | None:
        """``start_serving``'s mode: ``"warn"``, ``"error"``, or None while not serving."""
        return self._serving

    def _compiled_while_serving(self, job: Job, first: bool) -> BaseException | None:
        """The Scheduler's ``on_hot``: a live request would wait for ``job``'s compile (the
        job's ``first``, counted and logged once)."""
        mode = self._serving
        if mode is None:
            return None
        target = job.cache.target
        if first:
            self._hot_compiles += 1
            if self._task_group is not None:
                self._task_group.start_soon(self._report_hot, job.spec, target, mode)
        if mode == "warn":
            return None
        return CompileOnHotPath(
            f"{_label(job.spec)} is not compiled for {target.arch}, and this Compiler serves "
            "with start_serving('error'): the request does not wait for NVRTC. The kernel "
            "compiles in the background for the next request; compile what a service uses "
            "ahead (Compiler.warm, tropical.Batcher.warm, aionvrtc warm manifest), or serve "
            "with start_serving('warn')"
        )

    async def _report_hot(self, spec: KernelSpec, target: Target, mode: str) -> None:
        try:
            explanation = await self.explain(spec, arch=target)
            # (Read while NVRTC runs: one that finished first has stored it by now.)
            why = str(explanation) if explanation.held_in is None else "Compiled by now."
        except Exception as exc:  # (a closing Compiler, a cache dir gone): the line still says
            why = f"(not explained: {exc})"
        logger.warning(
            "compiled while serving (start_serving(%r)): a request waited for NVRTC to "
            "compile %s for %s. %s", mode, _label(spec), target.arch, why,
        )  # fmt: skip

    def _prefetch_one(self, spec: KernelSpec, key: str, cache: KernelCache) -> bool:
        scheduler = self._scheduler
        if key in self._memory or key in scheduler.inflight or key in scheduler.failures:
            return False
        scheduler.submit(spec, key, PREFETCH, cache)
        return True

    async def _prefetch_later(self, specs: list[KernelSpec], cache: KernelCache) -> None:
        def derive() -> list[tuple[KernelSpec, str]]:
            derived = []
            for spec in specs:
                try:
                    derived.append((spec, cache.key(spec)))
                except ValueError as exc:  # an include directory the key cannot cover
                    logger.warning("not prefetching %s: %s", spec.name, exc)
            return derived

        try:
            derived = await anyio.to_thread.run_sync(derive)
        finally:
            self._deriving.difference_update((spec, cache.memo) for spec in specs)
        for spec, key in derived:
            if self._state is not _State.OPEN:
                return
            self._prefetch_one(spec, key, cache)

    def _succeeded(self, job: Job) -> None:
        """A job's artifact is in: its spec goes to the manifest. Every job is a miss of the
        memory tier, live or prefetched (whose requests will be hits, which never record); one
        that failed is not worth replaying."""
        if self.manifest is not None:
            self.manifest.record(job.spec)

    async def _actor(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        assert self._task_group is not None
        try:
            await self._scheduler.run(task_status=task_status)
        finally:
            # Closed (or cancelled): requests raise from now on; the host's task group waits
            # for the lanes to finish before aclose() returns.
            self._enter(_State.CLOSED)

    # -- management --------------------------------------------------------------------------

    async def forget(self, spec: KernelSpec) -> None:
        """Drop ``spec`` from memory and disk and forget a remembered failure, for every arch
        this Compiler has served (entries of other archs, made by other processes, stay): the
        next request compiles it again, reading its include directories' files anew.

        Its loaded modules are let go too, and its entries in the read-only layers and the
        remote tier are not served again by this Compiler (the next compile replaces the remote
        one).

        Args:
            spec: The program to drop.

        Raises:
            ValueError: The spec's include directories cannot be covered by its key (as
                ``compile`` raises it), for a spec whose keys were never derived.
        """
        keys = await anyio.to_thread.run_sync(self._cache.forget, spec)
        for pair in [pair for pair in self._load_failed if pair[0] == spec]:
            del self._load_failed[pair]
        for key in keys:
            self._scheduler.failures.pop(key)
            self._loaded.drop(key)

    async def _drop(self, key: str) -> None:
        """Drop one key's entry from memory and disk, and its loaded modules."""
        for modules in self._loaded.by_device.values():
            modules.pop(key, None)
        await anyio.to_thread.run_sync(self._cache.drop, key)

    async def explain(self, spec: KernelSpec, *, arch: TargetLike | None = None) -> Explanation:
        """Why a lookup of ``spec`` for ``arch`` hits or misses: the tier that holds its key, or
        which parts of the key (format, name, source, headers, options, name expressions,
        include files, arch, NVRTC build) differ from the nearest entry of the same name
        expressions that the memory, the disk or a cache-dir layer holds; or that none holds
        one. ``str()`` of the result says it in words, naming the options, name expressions,
        headers and include folders added, removed, changed or reordered. Reads the entries'
        headers in a worker thread (one walk of each dir, about a second at 50,000 entries;
        the disk's index is rebuilt first where it is stale, as a lookup would): a tool for
        when a kernel compiles where it was expected to hit, not for a hot path. A debug line
        on logger ``aionvrtc.misses`` per compile says the same parts of each key that missed.

        Args:
            spec: The program looked up.
            arch: The target (``"sm_90"`` or a ``Target``); default: the Compiler's.

        Returns:
            An ``Explanation``.

        Raises:
            TypeError: ``spec`` is not a ``KernelSpec``.
            ValueError: The spec's include directories cannot be covered by its key.
            NoDeviceError: ``arch`` is None and the Compiler has no target.
            NvrtcError: NVRTC cannot be loaded (its build is a part of the key), or cannot
                compile for ``arch``.
            RuntimeError: The Compiler is not open.
        """
        if self._state is not _State.OPEN:
            raise self._not_open()
        if not isinstance(spec, KernelSpec):
            raise TypeError(f"spec must be a KernelSpec, not {type(spec).__name__}")
        return await anyio.to_thread.run_sync(explain, self._for_arch(arch), spec)

    async def load_record(self, name: str, *, arch: TargetLike | None = None) -> bytes | None:
        """Data stored with ``save_record`` under ``name`` for target ``arch``, in this or an
        earlier process sharing the cache dir.

        Args:
            name: The record's name.
            arch: The target it was stored for (``"sm_90"`` or a ``Target``); default: the
                Compiler's.

        Returns:
            The data, or None: nothing stored under ``name`` for that target, no disk cache,
            or an entry that failed verification (and was dropped).

        Raises:
            TypeError: ``arch`` is neither a str nor a ``Target``.
            ValueError: ``arch`` is not an arch such as ``"sm_90"``.
            NoDeviceError: ``arch`` is None and the Compiler has no target.
            NvrtcError: This NVRTC cannot compile for ``arch``.
        """
        return await anyio.to_thread.run_sync(self._for_arch(arch).record, name)

    async def save_record(self, name: str, data: bytes, *, arch: TargetLike | None = None) -> bool:
        """Keep ``data`` (such as tuning results) under ``name`` for target ``arch`` in the disk
        cache, beside the kernels: written atomically, verified on read, evicted with them.

        Args:
            name: The record's name; a record saved under it before for the same target is
                replaced.
            data: The bytes to keep.
            arch: The target to keep it for (``"sm_90"`` or a ``Target``); default: the
                Compiler's.

        Returns:
            True once it is stored; False if there is no writable disk cache (none, not
            trusted, read-only or full) or the data is over its limit.

        Raises:
            TypeError: ``data`` is not bytes-like (``bytes(data)`` fails: a str, say), with a
                disk cache; or ``arch`` is neither a str nor a ``Target``.
            ValueError: ``arch`` is not an arch such as ``"sm_90"``.
            NoDeviceError: ``arch`` is None and the Compiler has no target.
            NvrtcError: This NVRTC cannot compile for ``arch``.
        """
        return await anyio.to_thread.run_sync(self._for_arch(arch).put_record, name, data)

    async def clear(self) -> None:
        """Empty the memory tier, the remembered failures and this format's disk entries."""
        self._scheduler.failures.clear()
        self._load_failed.clear()
        self._loaded.clear()
        await anyio.to_thread.run_sync(self._cache.clear)

    def stats(self) -> CompilerStats:
        """A snapshot of the Compiler's counters, every target's, with each tier's own.

        Reads no file and makes no network call: cheap enough for every scrape of a metrics
        endpoint (see ``aionvrtc.metrics``).

        Returns:
            The ``CompilerStats`` as they are now.
        """
        cache = self._cache.stats()
        queued, in_flight, waiting = self._scheduler.counts()
        return CompilerStats(
            requests=cache.requests,
            joined=self._scheduler.joined,
            errors=self._errors,
            compiles=cache.compiles,
            compile_seconds=cache.compile_seconds,
            queued=queued,
            in_flight=in_flight,
            waiting=waiting,
            prefetched=self._prefetched,
            rejected=self._scheduler.rejected,
            hot_compiles=self._hot_compiles,
            memory=cache.memory,
            disk=cache.disk,
            remote=self.remote.stats() if self.remote is not None else RemoteStats(),
            archs=cache.archs,
            layers=cache.layers,
        )

    # -- blocking facade ---------------------------------------------------------------------

    def use_portal(self, portal: anyio.from_thread.BlockingPortal) -> None:
        """Serve ``compile_sync`` and ``get_sync`` from any thread through ``portal``.

        Args:
            portal: A portal into the event loop this Compiler runs in (as
                ``default_compiler()`` makes one).

        Raises:
            Nothing: the portal is kept, not checked; one that has stopped makes
                ``compile_sync`` and ``get_sync`` raise RuntimeError.
        """
        self._portal = portal

    def compile_sync(self, spec: KernelSpec, *, arch: TargetLike | None = None) -> Artifact:
        """``compile`` for code that is not async: from any thread when this Compiler runs in
        a portal (``default_compiler()``), else from a worker thread of its event loop.

        A memory hit is served in the calling thread, without a hop to the event loop.

        Args:
            spec: The program to compile.
            arch: The target (``"sm_90"`` or a ``Target``); default: the Compiler's ``arch``.

        Returns:
            The ``Artifact``, as ``compile`` returns it.

        Raises:
            TypeError: ``spec`` is not a ``KernelSpec``, or ``arch`` is neither a str nor a
                ``Target``.
            ValueError: ``arch`` is not an arch such as ``"sm_90"``, or the spec's include
                directories cannot be covered by its key.
            NoDeviceError: ``arch`` is None and the Compiler has no target.
            NvrtcError: As ``compile`` raises it.
            CompileError: NVRTC rejected the program.
            QueueFull: ``max_queued`` kernels are waiting for requests (see Compiler);
                ask again once the queue drains.
            CompilerClosed: The Compiler is closed or closing.
            RuntimeError: The Compiler has not been opened; or, without a portal, this is not
                a worker thread of the Compiler's event loop (the event loop's own thread
                included); or the portal has stopped.
        """
        if self._state is not _State.OPEN:
            raise self._not_open()  # the portal itself may be gone
        # A memory hit is served in the caller's thread, as compile() serves it on the loop:
        # the memory tier's readers take no lock, and a hop to the loop costs about 150 us.
        try:
            entry = self._hot[spec._keys[self._key_id if arch is None else self._arch_memos[arch]]]
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            entry.used = next(self._clock)
            return entry.artifact
        compile = functools.partial(self.compile, spec, arch=arch)
        if self._portal is not None:
            return self._portal.call(compile)
        return anyio.from_thread.run(compile)

    def loaded(self, spec: KernelSpec, *, device: int) -> Module | None:
        """The Module ``get(spec, device=device)`` would return if it is loaded already (counted
        as a request served from memory, as get() counts it), else None: never loading,
        compiling or raising, whatever ``spec`` is. Non-blocking and safe from any thread: the
        dict lookups of get()'s hot path, for callers that would otherwise hop to the
        Compiler's event loop (or a worker thread) only to find it.

        Args:
            spec: The program.
            device: The CUDA device index.

        Returns:
            The loaded ``Module``, or None when ``get`` has not loaded ``spec`` on ``device``
            (or the Compiler is not open).

        Raises:
            Nothing: whatever ``spec`` and ``device`` are, it answers None rather than raise.
        """
        try:
            loaded = self._loaded
            module = loaded.by_device[device][spec._keys[loaded.memos[device]]]
        except (KeyError, AttributeError, TypeError):
            return None
        next(self._clock)  # the hit count
        return module

    def get_sync(self, spec: KernelSpec, *, device: int | None = None) -> Module:
        """``get`` for code that is not async; see ``compile_sync``.

        A module loaded already is served in the calling thread (``loaded``), without a hop to
        the event loop.

        Args:
            spec: The program to compile and load.
            device: The CUDA device index; default: CuPy's current device in the calling
                thread.

        Returns:
            The ``Module`` loaded on ``device``, as ``get`` returns it.

        Raises:
            TypeError: ``spec`` is not a ``KernelSpec``, or ``device`` is not an int.
            ValueError: There is no device ``device`` on this host, or the spec's include
                directories cannot be covered by its key.
            NoDeviceError: No CUDA GPU is usable here, or the device's CUDA context cannot be
                created.
            NvrtcError: As ``get`` raises it.
            CompileError: NVRTC rejected the program.
            GPUOutOfMemoryError: The GPU has no memory left for the module; the cached kernel
                is kept.
            ModuleLoadError: The module cannot be loaded (see ``get``).
            QueueFull: ``max_queued`` kernels are waiting for requests (see Compiler);
                ask again once the queue drains.
            CompilerClosed: The Compiler is closed or closing.
            RuntimeError: As ``compile_sync`` raises it.
        """
        if self._state is not _State.OPEN:
            raise self._not_open()
        if device is None:
            device = _cuda.current_device()  # the caller's thread's current device
        module = self.loaded(spec, device=device)  # served here, without a hop (compile_sync)
        if module is not None:
            return module
        get = functools.partial(self.get, spec, device=device)
        if self._portal is not None:
            return self._portal.call(get)
        return anyio.from_thread.run(get)
