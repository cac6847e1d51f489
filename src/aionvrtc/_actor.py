"""Compiler: the async compilation service.

One actor task per Compiler owns the queues, the in-flight map and the remembered failures. A
miss joins the in-flight job for its key or starts one, which goes through three lanes:

- the I/O lane (up to IO_LANE worker threads, batches of up to IO_BATCH keys a hop): disk and
  remote lookups, so a hit is served whatever NVRTC is doing;
- the compile lane (``concurrency`` slots, default 1): the key's locks taken without waiting,
  the disk checked again, NVRTC, the writes, all in one worker-thread hop;
- the wait lane (no slot): a job whose key another process or host is compiling waits there for
  its lock, then reads what it stored, or compiles with the locks as the next job of the lane.

Live requests overtake warm-up (prefetch) work in the I/O and compile lanes. Requests never
block the event loop: a memory hit returns without suspending.
"""

from __future__ import annotations

import asyncio
import copy
import enum
import functools
import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self, TypeVar

import anyio
import anyio.abc
import anyio.from_thread
import anyio.to_thread

from . import _config, _cuda
from ._artifact import Artifact
from ._cache import DEFAULT_MEMORY_LIMIT, ArchStats, Claim, KernelCache, Origin
from ._config import ENV_MANIFEST
from ._cuda import Module
from ._cuda_errors import IMAGE_REFUSED
from ._exceptions import AionvrtcError, CompileError, CompilerClosed, ModuleLoadError
from ._failures import Failures
from ._manifest import Manifest
from ._spec import KernelSpec
from ._store import DiskStats
from ._store.memory import Entry, MemoryStats
from ._store.remote import RedisTier, RemoteStats
from ._store.tier import LayerStats
from ._target import Target, TargetLike, device_target

__all__ = ["Compiler", "CompilerStats"]

_T = TypeVar("_T")

logger = logging.getLogger("aionvrtc")

# Lower runs first: live requests overtake warm-up work queued before them, and a job holding
# its key's locks (others wait on them) runs before both.
CLAIMED = -1
LIVE = 0
PREFETCH = 1
# Worker threads for the I/O lane: each holds one for reads and verifications of well under a
# millisecond each, so a few serve many requests.
IO_LANE = 2
# Keys looked up per thread hop: a hop costs about as much as a disk hit, so a burst of misses
# is read in batches; a lone request is a batch of one.
IO_BATCH = 32
# Worker threads waiting on other processes' key locks (each blocks until its lock is free).
WAIT_LANE = 64
# An image the driver refuses as invalid is dropped and compiled again once per key in this
# window; a refusal of the replacement within it raises instead. NVRTC and the driver, all a
# recompile depends on beside the key, do not change under a running process, so a second
# refusal would repeat at every try, each costing seconds of NVRTC (a compile slot that, at
# the default concurrency of 1, every other key waits for). An hour caps that at one compile
# per key per hour, a fraction of a percent of one CPU even for a 10 s program, while a
# long-running server still tries again now and then (another host may have replaced the
# remote tier's entry meanwhile); forget() lets it try at once.
REFUSAL_WINDOW = 3600.0  # seconds


class _State(enum.Enum):
    NEW = "new"
    STARTING = "starting"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class CompilerStats:
    """A snapshot of a Compiler's counters since it opened, with each tier's own."""

    requests: int  # compile() and get() calls
    joined: int  # requests that shared another request's in-flight job
    errors: int  # requests that raised (fast failures of known-bad specs included)
    compiles: int  # successful NVRTC compiles
    compile_seconds: float  # total NVRTC time
    queued: int  # jobs looking up or queued for a compile slot
    in_flight: int  # jobs holding a compile slot
    waiting: int  # jobs waiting for another process's or host's lock (holding no slot)
    prefetched: int  # jobs queued by prefetch()
    memory: MemoryStats
    disk: DiskStats  # all zero for a Compiler without a disk tier
    remote: RemoteStats  # all zero for a Compiler without a remote tier
    layers: tuple[LayerStats, ...]  # each read-only layer's, in the order they are read
    archs: dict[str, ArchStats]  # by arch: the memory tier's entries, compiles, their time


class _Stage(enum.Enum):
    """Where a job is: each stage has one owner, which moves it on."""

    LOOKUP = "queued for the I/O lane"
    READING = "read by the I/O lane"
    QUEUED = "queued for the compile lane"
    RUNNING = "in the compile lane"
    WAITING = "waiting for another process's or host's lock"
    DONE = "done"


class _Replacement:
    """A key whose image the driver refused as invalid: when, which image, and the one that
    replaced it (None until compiled, or if compiling it failed)."""

    __slots__ = ("at", "done", "fresh", "refused")

    def __init__(self, refused: Artifact, at: float) -> None:
        self.refused = refused
        self.at = at  # time.monotonic()
        self.fresh: Artifact | None = None
        self.done = anyio.Event()  # set once the replacement is compiled, or failed


class _Job:
    """One key's work, shared by every request for that key while it runs."""

    __slots__ = (
        "cache", "claim", "done", "error", "key", "priority", "result", "scope", "spec", "stage",
        "waiters",
    )  # fmt: skip

    def __init__(self, key: str, spec: KernelSpec, priority: int, cache: KernelCache) -> None:
        self.key = key
        self.spec = spec
        self.cache = cache  # the cache's view for the job's target
        self.priority = priority
        self.stage = _Stage.LOOKUP
        self.claim: Claim | None = None  # the locks it holds, or waits for
        self.scope: anyio.CancelScope | None = None  # of its wait: closing cancels it
        self.done = anyio.Event()
        self.result: Artifact | None = None
        self.error: BaseException | None = None
        self.waiters = 0  # requests awaiting it now: its error is raised to each of them


# The tasks _spawn started, referenced until done (asyncio keeps only weak references).
_spawned: set[asyncio.Task[None]] = set()


def _spawn(run: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Start ``run()`` as a task of its own, outside the caller's task tree and cancel scopes:
    a system task under trio, a plain task under asyncio. It must handle its own errors."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not asyncio: trio
        import trio

        trio.lowlevel.spawn_system_task(run)
    else:
        task = loop.create_task(run())
        _spawned.add(task)
        task.add_done_callback(_spawned.discard)


def _fresh(error: BaseException) -> BaseException:
    """A copy of a shared error for one waiter: raising one instance in many tasks would chain
    every waiter's traceback onto it."""
    try:
        clone = copy.copy(error)
    except Exception:
        return error
    clone.__cause__ = error.__cause__
    clone.__traceback__ = None
    return clone


def _lookup_many(
    lookups: list[tuple[KernelCache, str]], *, disk: bool, remote: bool
) -> list[tuple[Artifact, Origin] | Exception | None]:
    """Each (cache view, key)'s ``lookup``, in one call (one thread hop for a batch, whatever
    targets it mixes); a lookup that raised has its exception in its place, and the others are
    looked up all the same."""
    found: list[tuple[Artifact, Origin] | Exception | None] = []
    for cache, key in lookups:
        try:
            found.append(cache.lookup(key, disk=disk, remote=remote))
        except Exception as exc:
            found.append(exc)
    return found


class Compiler:
    """The async, actor-style compilation service.

    ``async with Compiler(arch="sm_90") as compiler: artifact = await compiler.compile(spec)``.
    ``arch`` is the target of ``compile()`` when it names none; it defaults to
    ``$AIONVRTC_ARCH``, else the current GPU's (``resolve_target``); without either, only a
    ``compile()`` that names none raises (NoDeviceError). An ``arch`` this NVRTC cannot compile
    for raises NvrtcError here, naming the archs it supports. ``get()`` compiles for the
    device it loads on (``target_for``), so one Compiler serves every GPU of the host;
    ``concurrency`` (default 1: one NVRTC job at a time) is how many compiles may run at once
    in worker threads. A disk or remote hit never waits for them. ``shared_cache`` (default
    ``$AIONVRTC_SHARED_CACHE``, else False) trusts a cache dir that a group shares; by default
    the disk cache is used only when nobody but this user (or root) can write to it.
    ``layers`` (default ``$AIONVRTC_CACHE_LAYERS``) are read-only cache dirs and bundle files
    read after the disk cache, before the remote tier (see ``KernelCache``).
    ``manifest`` (default ``$AIONVRTC_MANIFEST``; False: none) is a file to which every
    distinct spec requested or prefetched is appended once per process, when its first job (a
    miss of the memory tier) succeeds, for ``aionvrtc warm manifest`` to compile for any arch;
    a manifest that cannot be written is warned about once and never fails a request.
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
    ) -> None:
        if concurrency is None:
            concurrency = 1
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be a positive int, got {concurrency!r}")
        self.concurrency = concurrency
        # The fleet's shared tier: ``remote``, else one from $AIONVRTC_REMOTE_URL if set.
        self.remote = remote if remote is not None else RedisTier.from_environment()
        if manifest is None:
            manifest = _config.text(ENV_MANIFEST) or False
        if manifest is not False and not isinstance(manifest, str | os.PathLike):
            raise TypeError(f"manifest must be a path or False, not {type(manifest).__name__}")
        if manifest is not False and not os.fspath(manifest):
            raise ValueError("manifest must be a file's path, not ''; pass False for none")
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
        # Each device's target (see target_for) and memo key, once get() has served it.
        self._device_caches: dict[int, KernelCache] = {}
        self._device_memos: dict[int, str] = {}
        self._hot_memo = self._key_id  # the only GPU's memo key (see get())
        self._state = _State.NEW
        self._hot: dict[str, Entry] = {}  # see _enter() and compile()
        self._inflight: dict[str, _Job] = {}
        self._failures = Failures()
        # Keys whose image get() dropped and compiled again in the last _refusal_window seconds.
        self._replacements: dict[str, _Replacement] = {}
        self._refusal_window = REFUSAL_WINDOW
        self._queue: list[tuple[int, int, _Job]] = []  # the compile lane's
        self._lookups: list[tuple[int, int, _Job]] = []  # the I/O lane's
        self._seq = itertools.count()
        self._wakeup: anyio.Event | None = None
        self._task_group: anyio.abc.TaskGroup | None = None
        self._stopped: anyio.Event | None = None
        self._started: anyio.Event | None = None  # set once opening succeeded or failed
        self._portal: anyio.from_thread.BlockingPortal | None = None
        # Loaded modules by device and key, for the Compiler's life (or until forget/clear):
        # a module is small, and reloading one that is in use would waste a load.
        self._modules: dict[int, dict[str, Module]] = {}
        self._hot_modules: dict[str, Module] = {}  # see get()
        # Prefetched specs whose keys are being derived, with the memo key of their target.
        self._deriving: set[tuple[KernelSpec, str]] = set()
        self._lookers = 0  # I/O lane tasks running
        self._running = 0
        self._misses = 0
        self._joined = 0
        self._errors = 0
        self._prefetched = 0

    # -- lifecycle ---------------------------------------------------------------------------

    def _enter(self, state: _State) -> None:
        """The one place the lifecycle state changes. ``_hot``, the map the hot paths read,
        follows it: the memory tier's entries while open, an empty map otherwise (so a request
        to a Compiler that is not open takes the slow path, which raises)."""
        self._state = state
        self._hot = self._entries if state is _State.OPEN else {}
        if state is not _State.OPEN:
            self._modules, self._hot_modules = {}, {}

    async def __aenter__(self) -> Self:
        if self._state is not _State.NEW:
            raise RuntimeError(f"a Compiler can be opened once; this one is {self._state.value}")
        self._limiter = anyio.CapacityLimiter(self.concurrency)
        self._io = anyio.CapacityLimiter(IO_LANE)
        self._waits = anyio.CapacityLimiter(WAIT_LANE)
        self._slots = anyio.Semaphore(self.concurrency)
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
                if self.manifest is not None:
                    self.manifest.bind(task_group)
                # Open before the actor runs: it stops as soon as it sees a state other than
                # OPEN. (aclose() while starting waits for this, then closes.)
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
        and it returns once they have. Any task may call it, under any cancel scope (a server's
        shutdown handler, say). If it is cancelled (a deadline), it cancels what is left and
        returns at once: a compile still running then finishes in its worker thread and is
        stored on disk, with nothing waiting for it."""
        if self._state is _State.NEW:
            self._enter(_State.CLOSED)
            return
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
        """Fail the jobs no lane has taken yet (letting go of locks they hold), cancel the
        waits for other processes' locks, and wake the actor, which stops once the running
        compiles have finished. Lookups being read finish on their own."""
        self._enter(_State.CLOSING)
        closed = CompilerClosed("the Compiler closed before this job started")
        assert self._task_group is not None
        for job in list(self._inflight.values()):
            if job.stage in (_Stage.LOOKUP, _Stage.QUEUED):
                self._finish(job, error=closed)
                if job.claim is not None:
                    self._task_group.start_soon(self._release, job.claim)
            elif job.stage is _Stage.WAITING and job.scope is not None:
                job.scope.cancel()
        self._lookups.clear()
        self._queue.clear()
        self._wake()

    @property
    def closed(self) -> bool:
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
        """The compiled artifact for ``spec`` and target ``arch`` (default: the Compiler's
        ``arch``): memory, else disk, else NVRTC. Needs no GPU."""
        try:
            entry = self._hot[spec._keys[self._key_id if arch is None else self._arch_memos[arch]]]
        except (KeyError, AttributeError, TypeError):
            return await self._compile(spec, arch)
        entry.used = next(self._clock)  # the hit count and its recency (see MemoryTier)
        return entry.artifact

    async def _compile(self, spec: KernelSpec, arch: TargetLike | None) -> Artifact:
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
        self._misses += 1
        job = self._submit(spec, key, LIVE, cache)
        if not job.done.is_set():
            # A waiter's cancellation ends only this wait: the job runs on in the actor's task
            # group and is cached for the next request.
            job.waiters += 1
            try:
                await job.done.wait()
            finally:
                job.waiters -= 1
        if job.error is None:
            assert job.result is not None
            return job.result
        self._errors += 1
        raise _fresh(job.error)

    def key(self, spec: KernelSpec, *, arch: TargetLike | None = None) -> str:
        """``spec``'s cache key for target ``arch`` (default: the Compiler's; see
        ``kernel_key``). Blocking the first time for a spec with include directories, whose
        files it digests."""
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
                raise _fresh(self._cache.no_target)
            return self._cache
        cache = self._cache.for_arch(arch)
        if isinstance(arch, str | Target):
            self._arch_memos[arch] = cache.memo
        return cache

    async def _key(self, spec: KernelSpec, cache: KernelCache) -> str:
        key = spec._keys.get(cache.memo)
        if key is not None:
            return key
        if spec.reads_host_files:
            # Its first key digests the include directories' files: tens of milliseconds for a
            # library such as CCCL, which must not stall the event loop.
            return await anyio.to_thread.run_sync(cache.key, spec)
        return cache.key(spec)

    def target_for(self, device: int) -> Target:
        """The target ``get()`` compiles for on ``device``: the GPU's own architecture
        (``sm_90`` for compute capability 9.0), or the Compiler's ``arch`` when that names the
        same GPU with a feature suffix (``sm_90a``) or a family that covers it (``sm_100f`` for
        a 10.3 GPU). NoDeviceError without a GPU; ValueError for a device that is not there."""
        return self._device_cache(device).target

    def _device_cache(self, device: int) -> KernelCache:
        capability = _cuda.check_device(device)  # validates it (cached: a dict lookup)
        cache = self._device_caches.get(device)
        if cache is None:
            target = device_target(capability, self._target)
            cache = self._device_caches[device] = self._cache.for_arch(target)
        return cache

    async def get(self, spec: KernelSpec, *, device: int | None = None) -> Module:
        """``spec`` compiled for ``device`` (default: CuPy's current device) and loaded there:
        compiled for that GPU's architecture (``target_for``), so one Compiler serves GPUs of
        several architectures, with one compile per kernel and architecture.

        A second ``get`` on the same device returns the same Module and loads nothing. An
        image the driver refuses as invalid (CUDA_ERROR_INVALID_IMAGE, _NO_BINARY_FOR_GPU or
        _INVALID_PTX) is dropped from the tiers and compiled again, once per key an hour
        (REFUSAL_WINDOW). Any other load failure raises and leaves the cache as it was: a full
        GPU raises GPUOutOfMemoryError, and asking again once memory is free loads the cached
        kernel without compiling it.
        """
        try:
            if device is None:
                # The only GPU's modules when the process sees one GPU, else empty (the slow
                # path asks CUDA for the current device).
                module = self._hot_modules[spec._keys[self._hot_memo]]
            else:
                module = self._modules[device][spec._keys[self._device_memos[device]]]
        except (KeyError, AttributeError, TypeError):
            return await self._get(spec, device)
        next(self._clock)  # counts the memory hit
        return module

    async def _get(self, spec: KernelSpec, device: int | None) -> Module:
        if self._state is not _State.OPEN:
            raise self._not_open()
        if device is None:
            device = _cuda.current_device()
        cache = self._device_cache(device)
        if not _cuda.device_ready(device):
            await anyio.to_thread.run_sync(_cuda.init_device, device)
        modules = self._modules.setdefault(device, {})
        self._device_memos[device] = cache.memo
        if _cuda.device_count() == 1:
            self._hot_modules, self._hot_memo = modules, cache.memo
        artifact = await self.compile(spec, arch=cache.target)
        # Requests that were waiting for the same compile load the module once.
        module = modules.get(artifact.key)
        if module is not None:
            return module
        try:
            module = _cuda.load(artifact, device)
        except ModuleLoadError as exc:
            if exc.status not in IMAGE_REFUSED:
                raise  # not the image's fault (a full GPU, another arch...): the entry stays
            module = await self._replace(spec, cache.target, device, artifact, exc)
        if self._state is _State.OPEN:
            modules[artifact.key] = module
        return module

    async def _replace(
        self, spec: KernelSpec, target: Target, device: int, refused: Artifact, exc: ModuleLoadError
    ) -> Module:
        """Drop ``refused``, an image the driver refused as invalid, compile it again and load
        the new image: once per key in ``_refusal_window`` seconds. Within the window, a
        refusal of any image but the one replaced raises, keeping what is cached: compiling
        again would make the same image (see REFUSAL_WINDOW)."""
        key = refused.key
        now = time.monotonic()
        for old in [k for k, r in self._replacements.items() if self._expired(r, now)]:
            del self._replacements[old]
        replacement = self._replacements.get(key)
        if replacement is None:
            replacement = self._replacements[key] = _Replacement(refused, now)
            logger.warning("%s; dropping it and compiling again", exc)
            try:
                await self._drop(key)  # this image only: other archs' stay
                replacement.fresh = await self.compile(spec, arch=target)
            finally:
                replacement.done.set()
                # Not replaced (the compile failed or was cancelled): nothing to guard, unless
                # forget() or clear() let go of it meanwhile.
                if replacement.fresh is None and self._replacements.get(key) is replacement:
                    del self._replacements[key]
            fresh = replacement.fresh
        else:
            await replacement.done.wait()
            if refused is not replacement.refused:
                raise self._refused_again(exc, replacement) from exc.__cause__
            # Loaded before another request replaced it: that request's image, or its error.
            fresh = replacement.fresh or await self.compile(spec, arch=target)
        try:
            return _cuda.load(fresh, device)
        except ModuleLoadError as again:
            if again.status not in IMAGE_REFUSED:
                raise
            # From the driver's error, as every load error is: the message holds the rest.
            raise self._refused_again(again, replacement) from again.__cause__

    def _expired(self, replacement: _Replacement, now: float) -> bool:
        return replacement.done.is_set() and now - replacement.at >= self._refusal_window

    def _refused_again(self, exc: ModuleLoadError, replacement: _Replacement) -> ModuleLoadError:
        ago = time.monotonic() - replacement.at
        return ModuleLoadError(
            f"{exc}; it was dropped and replaced {ago:.0f} s ago after the same refusal, so it "
            f"is kept now and not replaced again for {max(0.0, self._refusal_window - ago):.0f} s "
            "(compiling it again would make the same image; `await compiler.forget(spec)` "
            "retries at once)",
            status=exc.status,
        )

    def prefetch(self, specs: Iterable[KernelSpec], *, arch: TargetLike | None = None) -> int:
        """Queue low-priority background compiles (warm-up) for target ``arch`` (default: the
        Compiler's); returns how many were queued.

        Live requests overtake them; a live request for a prefetched key promotes its job.
        Failures are logged and remembered, never raised here. Keys not derived yet are
        derived in a worker thread (a spec among them counts as queued).
        """
        if self._state is not _State.OPEN:
            raise self._not_open()
        cache = self._for_arch(arch)
        queued = 0
        later: list[KernelSpec] = []
        for spec in specs:
            if not isinstance(spec, KernelSpec):
                raise TypeError(f"prefetch takes KernelSpecs, not {type(spec).__name__}")
            key = spec._keys.get(cache.memo)
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

    def _prefetch_one(self, spec: KernelSpec, key: str, cache: KernelCache) -> bool:
        if key in self._memory or key in self._inflight or key in self._failures:
            return False
        self._submit(spec, key, PREFETCH, cache)
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

    def _submit(self, spec: KernelSpec, key: str, priority: int, cache: KernelCache) -> _Job:
        failure = self._failures.get(key)
        if failure is not None:
            job = _Job(key, spec, priority, cache)
            job.error = failure
            job.stage = _Stage.DONE
            job.done.set()
            return job
        shared = self._inflight.get(key)
        if shared is not None:
            self._joined += 1
            if priority < shared.priority:
                # Promoted: its old heap item is skipped when popped. A job being read keeps
                # the new priority for the compile lane.
                shared.priority = priority
                if shared.stage is _Stage.LOOKUP:
                    self._look_up(shared)
                elif shared.stage is _Stage.QUEUED:
                    self._push(shared)
            return shared
        job = self._inflight[key] = _Job(key, spec, priority, cache)
        self._look_up(job)  # a hit is served from the I/O lane; a miss goes on to compile
        return job

    def _finish(
        self, job: _Job, *, result: Artifact | None = None, error: BaseException | None = None
    ) -> None:
        job.result, job.error, job.stage = result, error, _Stage.DONE
        if self._inflight.get(job.key) is job:
            del self._inflight[job.key]
        if result is not None and self.manifest is not None:
            # Every job is a miss of the memory tier, live or prefetched (whose requests will
            # be hits, which never record); one that failed is not worth replaying.
            self.manifest.record(job.spec)
        job.done.set()

    async def _hop(self, call: Callable[[], _T], limiter: anyio.CapacityLimiter) -> _T:
        """``call()`` in a worker thread. If the waiting task is cancelled, it returns at once
        and the thread runs on alone (NVRTC cannot be interrupted; what it compiles is still
        stored), and locks the call returns are let go, as nobody will use them."""
        guard = threading.Lock()
        # The thread's result, or the waiter's leaving: whichever side comes second lets go of
        # a Claim (a cancellation can land after the thread returned, before the task resumes).
        handoff: list[object] = []

        def run() -> _T:
            result = call()
            with guard:
                left = bool(handoff)
                handoff.append(result)
            if left and isinstance(result, Claim):
                self._cache.release(result)
            return result

        try:
            return await anyio.to_thread.run_sync(run, limiter=limiter, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            with guard:
                done = handoff[0] if handoff else None
                handoff.append(None)
            if isinstance(done, Claim):
                self._release_soon(done)
            raise

    # -- the I/O lane ------------------------------------------------------------------------

    def _look_up(self, job: _Job) -> None:
        job.stage = _Stage.LOOKUP
        heapq.heappush(self._lookups, (job.priority, next(self._seq), job))
        if self._lookers < IO_LANE:
            assert self._task_group is not None
            self._lookers += 1
            self._task_group.start_soon(self._io_lane)

    def _take_lookups(self) -> list[_Job]:
        batch: list[_Job] = []
        while self._lookups and len(batch) < IO_BATCH:
            priority, _, job = heapq.heappop(self._lookups)
            if priority == job.priority and job.stage is _Stage.LOOKUP:
                job.stage = _Stage.READING
                batch.append(job)
        return batch

    async def _io_lane(self) -> None:
        """Disk and remote reads in batches, not limited by ``concurrency``: a hit never
        waits behind a compile of another key."""
        try:
            while batch := self._take_lookups():
                # The disk first, for the whole batch, then the remote tier for its misses
                # only: a disk hit never waits behind Redis round trips.
                misses = await self._read(batch, remote=False)
                if misses and self.remote is not None:
                    await self._read(misses, disk=False)
        finally:
            self._lookers -= 1

    async def _read(
        self, batch: list[_Job], *, disk: bool = True, remote: bool = True
    ) -> list[_Job]:
        """Look ``batch`` up in one hop; finish the hits (and, reading the last tier, the
        misses, which go on to compile). Returns the misses."""
        read = functools.partial(
            _lookup_many, [(job.cache, job.key) for job in batch], disk=disk, remote=remote
        )
        try:
            found = await self._hop(read, self._io)
        except BaseException:
            error = CompilerClosed("the Compiler was cancelled")
            for job in batch:
                self._finish(job, error=error)
            raise
        misses = []
        last = remote or self.remote is None
        for job, outcome in zip(batch, found, strict=True):
            if outcome is None and not last:
                misses.append(job)
            else:
                self._looked_up(job, outcome)
        return misses

    def _looked_up(self, job: _Job, outcome: tuple[Artifact, str] | Exception | None) -> None:
        if isinstance(outcome, Exception):
            logger.error("looking up %s failed; compiling it", job.key[:16], exc_info=outcome)
            outcome = None
        if outcome is not None:
            self._finish(job, result=outcome[0])
        elif self._state is _State.OPEN:
            self._push(job)
        else:
            self._finish(job, error=CompilerClosed("the Compiler closed before this job started"))

    # -- the compile lane ------------------------------------------------------------------

    def _push(self, job: _Job) -> None:
        job.stage = _Stage.QUEUED
        heapq.heappush(self._queue, (job.priority, next(self._seq), job))
        self._wake()

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    async def _actor(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        try:
            async with anyio.create_task_group() as workers:
                task_status.started()
                while True:
                    await self._slots.acquire()
                    job = await self._next_job()
                    if job is None:
                        self._slots.release()
                        break
                    job.stage = _Stage.RUNNING
                    self._running += 1
                    workers.start_soon(self._run_job, job)
                # Leaving the task group waits for the running jobs: they finish and are cached.
        finally:
            # Closed (or cancelled): requests raise from now on; the host's task group waits
            # for the lanes to finish before aclose() returns.
            self._enter(_State.CLOSED)

    async def _next_job(self) -> _Job | None:
        while True:
            while self._queue:
                priority, _, job = heapq.heappop(self._queue)
                if job.stage is _Stage.QUEUED and priority == job.priority:
                    return job
            if self._state is not _State.OPEN:
                return None  # closing: nothing enters the queue any more
            self._wakeup = anyio.Event()
            await self._wakeup.wait()
            self._wakeup = None

    async def _run_job(self, job: _Job) -> None:
        """A compile slot's work: take the key's locks without waiting (or use those the job
        holds), check the disk again, compile and store. A key that another process or host is
        compiling leaves the slot for the wait lane."""
        resolve = functools.partial(job.cache.try_resolve, job.spec, job.key, job.claim)
        try:
            outcome = await self._hop(resolve, self._limiter)
        except Exception as exc:
            self._failed(job, exc)
        except BaseException:
            self._finish(job, error=CompilerClosed("the Compiler was cancelled while compiling"))
            raise
        else:
            if not isinstance(outcome, Claim):
                self._finish(job, result=outcome[0])
            else:
                job.claim, job.stage = outcome, _Stage.WAITING
                assert self._task_group is not None
                self._task_group.start_soon(self._wait, job)
        finally:
            self._running -= 1
            self._slots.release()

    def _failed(self, job: _Job, exc: Exception) -> None:
        if isinstance(exc, CompileError):
            self._failures.remember(job.key, exc)  # fail fast until forget() or clear()
        elif not job.waiters:
            # Logged only when no request receives it (a prefetch's): a request raises it, and
            # logged as well it would be said twice.
            if isinstance(exc, AionvrtcError):  # says what is wrong: no traceback needed
                logger.warning("job for %s failed: %s", job.key[:16], exc)
            else:
                logger.exception("job for %s failed", job.key[:16])
        self._finish(job, error=exc)

    # -- the wait lane -----------------------------------------------------------------------

    async def _wait(self, job: _Job) -> None:
        """Wait, holding no compile slot, for the lock that another process or host holds on
        the job's key; then serve what it stored, or compile, holding the locks, as the next
        job of the compile lane. Closing cancels the wait."""
        claim = job.claim
        assert claim is not None
        cancel = threading.Event()  # ends a wait for a file lock promptly (see DiskTier)
        wait = functools.partial(job.cache.claim, job.key, cancel=cancel, claim=claim)
        with anyio.CancelScope() as job.scope:
            if self._state is _State.OPEN:
                try:
                    claim = await self._hop(wait, self._waits)
                except Exception as exc:
                    self._failed(job, exc)
                    return
                finally:
                    cancel.set()
        job.scope = None
        if claim.found is not None:
            self._finish(job, result=claim.found[0])
        elif claim.ready and self._state is _State.OPEN:
            job.claim, job.priority = claim, CLAIMED
            self._push(job)
        else:
            self._finish(job, error=CompilerClosed("the Compiler closed while this job waited"))
            await self._release(claim)

    async def _release(self, claim: Claim) -> None:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._cache.release, claim)

    def _release_soon(self, claim: Claim) -> None:
        """Let go of ``claim`` from the event loop: in a task of the Compiler's while it has
        one, else its file lock at once (a fleet lock then lapses by its expiry)."""
        if self._task_group is not None:
            self._task_group.start_soon(self._release, claim)
        elif claim.lock is not None:
            claim.lock.release()

    # -- management --------------------------------------------------------------------------

    async def forget(self, spec: KernelSpec) -> None:
        """Drop ``spec`` from memory and disk and forget a remembered failure, for every arch
        this Compiler has served (entries of other archs, made by other processes, stay): the
        next request compiles it again, reading its include directories' files anew."""
        keys = await anyio.to_thread.run_sync(self._cache.forget, spec)
        for key in keys:
            self._failures.pop(key)
            self._replacements.pop(key, None)  # a refused image may be replaced at once
            for modules in self._modules.values():
                modules.pop(key, None)

    async def _drop(self, key: str) -> None:
        """Drop one key's entry from memory and disk, and its loaded modules."""
        for modules in self._modules.values():
            modules.pop(key, None)
        await anyio.to_thread.run_sync(self._cache.drop, key)

    async def load_record(self, name: str, *, arch: TargetLike | None = None) -> bytes | None:
        """Data stored with ``save_record`` under ``name`` for target ``arch`` (default: the
        Compiler's), in this or an earlier process sharing the cache dir, or None."""
        return await anyio.to_thread.run_sync(self._for_arch(arch).record, name)

    async def save_record(self, name: str, data: bytes, *, arch: TargetLike | None = None) -> bool:
        """Keep ``data`` (such as tuning results) under ``name`` for target ``arch`` (default:
        the Compiler's) in the disk cache, beside the kernels; False if there is no writable
        disk cache."""
        return await anyio.to_thread.run_sync(self._for_arch(arch).put_record, name, data)

    async def clear(self) -> None:
        """Empty the memory tier, the remembered failures and this format's disk entries."""
        self._failures.clear()
        self._replacements.clear()
        for modules in self._modules.values():
            modules.clear()
        await anyio.to_thread.run_sync(self._cache.clear)

    def stats(self) -> CompilerStats:
        cache = self._cache.stats()
        waiting = sum(job.stage is _Stage.WAITING for job in self._inflight.values())
        return CompilerStats(
            requests=cache.memory.hits + self._misses,
            joined=self._joined,
            errors=self._errors,
            compiles=cache.compiles,
            compile_seconds=cache.compile_seconds,
            queued=len(self._inflight) - self._running - waiting,
            in_flight=self._running,
            waiting=waiting,
            prefetched=self._prefetched,
            memory=cache.memory,
            disk=cache.disk,
            remote=self.remote.stats() if self.remote is not None else RemoteStats(),
            archs=cache.archs,
            layers=cache.layers,
        )

    # -- blocking facade ---------------------------------------------------------------------

    def compile_sync(self, spec: KernelSpec, *, arch: TargetLike | None = None) -> Artifact:
        """``compile`` for code that is not async: from any thread when this Compiler runs in
        a portal (``default_compiler()``), else from a worker thread of its event loop."""
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
        Compiler's event loop (or a worker thread) only to find it."""
        try:
            module = self._modules[device][spec._keys[self._device_memos[device]]]
        except (KeyError, AttributeError, TypeError):
            return None
        next(self._clock)  # the hit count
        return module

    def get_sync(self, spec: KernelSpec, *, device: int | None = None) -> Module:
        """``get`` for code that is not async; see ``compile_sync``."""
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
