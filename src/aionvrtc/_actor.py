"""Compiler: the async compilation service.

One actor task per Compiler owns the queue, the in-flight map and the remembered failures; it
takes jobs from a priority queue and runs each whole job (disk read, file lock, NVRTC, disk write)
in one worker-thread hop. Requests never block the event loop: a memory hit returns without
suspending, a miss joins the in-flight job for its key or queues a new one.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import heapq
import itertools
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Self

import anyio
import anyio.abc
import anyio.from_thread
import anyio.to_thread

from . import _cuda, _spec
from ._artifact import Artifact
from ._cache import DEFAULT_MEMORY_LIMIT, CacheStats, KernelCache
from ._cuda import Module
from ._exceptions import AionvrtcError, CompileError, CompilerClosed
from ._failures import Failures
from ._spec import KernelSpec
from ._store.memory import _Entry
from ._store.remote import RedisTier
from ._target import Target, TargetLike

__all__ = ["Compiler", "CompilerStats"]

logger = logging.getLogger("aionvrtc")

# Lower runs first: live requests overtake warm-up work queued before them.
LIVE = 0
PREFETCH = 1
# Worker threads for the I/O lane (disk and remote lookups of live requests): each holds one
# for a read and verification of well under a millisecond, so a few serve many requests.
IO_LANE = 8


class _State(enum.Enum):
    NEW = "new"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class CompilerStats:
    """A snapshot of a Compiler's counters since it opened."""

    requests: int  # compile() and get() calls
    memory_hits: int
    disk_hits: int
    compiles: int  # successful NVRTC compiles
    joined: int  # requests that shared another request's in-flight job
    errors: int  # requests that raised (fast failures of known-bad specs included)
    compile_seconds: float  # total NVRTC time
    queued: int  # jobs waiting for a worker
    in_flight: int  # jobs running in a worker thread
    prefetched: int  # jobs queued by prefetch()
    corrupt_dropped: int  # disk entries that failed verification and were deleted
    memory_evictions: int
    disk_evictions: int
    write_failures: int
    memory_entries: int
    memory_bytes: int
    disk_writable: bool
    disk_trusted: bool  # False: the cache dir failed the ownership checks and is not used
    # The remote tier (zero without one): entries read, not there, refused (unsigned, badly
    # signed, corrupt or too large), failed calls, compiles that waited for another host's, and
    # compile locks ignored as not another aionvrtc host's (see RedisTier.claim).
    remote_hits: int = 0
    remote_misses: int = 0
    remote_rejected: int = 0
    remote_errors: int = 0
    remote_lock_waits: int = 0
    remote_foreign_locks: int = 0


_FROM_CACHE = tuple(
    f.name
    for f in dataclasses.fields(CompilerStats)
    if f.name in {c.name for c in dataclasses.fields(CacheStats)}
    and f.name not in {"requests", "joined"}
)


class _Job:
    """One key's work, shared by every request for that key while it runs."""

    __slots__ = (
        "done", "error", "key", "looked_up", "looking", "priority", "result", "spec", "started"
    )  # fmt: skip

    def __init__(self, key: str, spec: KernelSpec, priority: int) -> None:
        self.key = key
        self.spec = spec
        self.priority = priority
        self.started = False  # taken by the compile lane
        self.looking = False  # in the I/O lane
        self.looked_up = False  # the I/O lane found it on no tier
        self.done = anyio.Event()
        self.result: Artifact | None = None
        self.error: BaseException | None = None


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


class Compiler:
    """The async, actor-style compilation service.

    ``async with Compiler(arch="sm_90") as compiler: artifact = await compiler.compile(spec)``.
    ``arch`` defaults to the current GPU's; ``concurrency`` (default 1: one NVRTC job at a time)
    is how many compiles may run at once in worker threads. ``shared_cache`` (default
    ``$AIONVRTC_SHARED_CACHE``, else False) trusts a cache dir that a group shares; by default
    the disk cache is used only when nobody but this user (or root) can write to it.
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
    ) -> None:
        if concurrency is None:
            concurrency = 1
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be a positive int, got {concurrency!r}")
        self.concurrency = concurrency
        self._cache = KernelCache(
            arch,
            cache_dir=cache_dir,
            memory_limit=memory_limit,
            disk_limit=disk_limit,
            disk=disk,
            shared_cache=shared_cache,
        )
        self.target: Target = self._cache.target
        # The fleet's shared tier: ``remote``, else one from $AIONVRTC_REMOTE_URL if set.
        self.remote = remote if remote is not None else RedisTier.from_environment()
        self._cache.remote = self.remote
        self._memory = self._cache.memory
        self._entries, self._clock = self._memory.entries, self._memory.clock
        from . import _nvrtc

        # The memo key KernelSpec.key uses, built once so the hot path does one dict lookup.
        self._key_id = _spec.memo_id(self.target.arch, _nvrtc.build())
        self._state = _State.NEW
        self._inflight: dict[str, _Job] = {}
        self._failures = Failures()
        self._queue: list[tuple[int, int, _Job]] = []
        self._seq = itertools.count()
        self._wakeup: anyio.Event | None = None
        self._task_group: anyio.abc.TaskGroup | None = None
        self._opener = 0  # the id of the task that opened the Compiler (owns _task_group)
        self._stopped: anyio.Event | None = None
        self._portal: anyio.from_thread.BlockingPortal | None = None
        self._open = False  # mirrors _state is OPEN
        self._hot: dict[str, _Entry] = {}  # see compile()
        # Loaded modules by device and key, for the Compiler's life (or until forget/clear):
        # a module is small, and reloading one that is in use would waste a load.
        self._modules: dict[int, dict[str, Module]] = {}
        self._hot_modules: dict[str, Module] = {}  # see get()
        self._running = 0
        self._misses = 0
        self._joined = 0
        self._errors = 0
        self._prefetched = 0

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._state is not _State.NEW:
            raise RuntimeError(f"a Compiler can be opened once; this one is {self._state.value}")
        if self.remote is not None:
            self.remote.check_backend()
        self._limiter = anyio.CapacityLimiter(self.concurrency)
        self._io = anyio.CapacityLimiter(IO_LANE)
        self._slots = anyio.Semaphore(self.concurrency)
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        self._opener = anyio.get_current_task().id
        self._stopped = anyio.Event()  # set by the actor once its last job has finished
        if self.remote is not None:
            self.remote.bind(task_group)  # lock renewals run beside the actor
        # Open before the actor runs: it stops as soon as it sees a state other than OPEN.
        self._state, self._open, self._hot = _State.OPEN, True, self._entries
        try:
            await task_group.start(self._actor)
        except BaseException as exc:
            self._state, self._open, self._hot = _State.CLOSED, False, {}
            self._task_group = None  # left here: aclose() has nothing more to leave
            self._stopped.set()
            await task_group.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close: queued jobs fail with CompilerClosed, running compiles finish and are cached,
        and no task or thread is left behind. Any task may call it (a server's shutdown handler,
        say); it returns once the running compiles are done. The task group the Compiler runs in
        belongs to the task that opened it, which leaves it on its own ``async with`` exit."""
        if self._state is _State.NEW:
            self._state = _State.CLOSED
            return
        if self._state is _State.OPEN:
            self._begin_close()
        if self._task_group is None or anyio.get_current_task().id != self._opener:
            assert self._stopped is not None
            await self._stopped.wait()
            return
        task_group, self._task_group = self._task_group, None
        # Shield the task group's own scope (a new scope around its exit would break anyio's
        # nesting): running compiles finish even if the closing task is being cancelled.
        task_group.cancel_scope.shield = True
        await task_group.__aexit__(None, None, None)
        if self.remote is not None:
            with anyio.CancelScope(shield=True):
                await self.remote.aclose()

    def _begin_close(self) -> None:
        self._state, self._open, self._hot = _State.CLOSING, False, {}
        self._modules, self._hot_modules = {}, {}
        closed = CompilerClosed("the Compiler closed before this job started")
        for _, _, job in self._queue:
            if not job.started and not job.done.is_set():
                self._finish(job, error=closed)
        self._queue.clear()
        self._wake()

    @property
    def closed(self) -> bool:
        return self._state is _State.CLOSED

    def _not_open(self) -> Exception:
        if self._state is _State.NEW:
            return RuntimeError("the Compiler is not open: use 'async with Compiler(...) as c'")
        return CompilerClosed(f"the Compiler is {self._state.value}")

    # -- requests ----------------------------------------------------------------------------

    # The hot paths of compile() and get() (a memory hit) are written out by hand: they run on
    # every request and are measured against awaiting a trivial coroutine (benchmarks/). They
    # read ``_hot``, the memory tier's map while the Compiler is open and an empty map
    # otherwise, so a request to a Compiler that is not open takes the slow path, which raises.

    async def compile(self, spec: KernelSpec) -> Artifact:
        """The compiled artifact for ``spec``: memory, else disk, else NVRTC. Needs no GPU."""
        try:
            entry = self._hot[spec._keys[self._key_id]]
        except (KeyError, AttributeError):
            return await self._compile(spec)
        entry.used = next(self._clock)  # recency for LRU eviction, and the hit count
        return entry.artifact

    async def _compile(self, spec: KernelSpec) -> Artifact:
        if not self._open:
            raise self._not_open()
        if not isinstance(spec, KernelSpec):
            raise TypeError(f"spec must be a KernelSpec, not {type(spec).__name__}")
        key = await self._key(spec)
        entry = self._entries.get(key)
        if entry is not None:
            entry.used = next(self._clock)
            return entry.artifact
        self._misses += 1
        job = self._submit(spec, key, LIVE)
        if not job.done.is_set():
            # A waiter's cancellation ends only this wait: the job runs on in the actor's task
            # group and is cached for the next request.
            await job.done.wait()
        if job.error is None:
            assert job.result is not None
            return job.result
        self._errors += 1
        raise _fresh(job.error)

    async def _key(self, spec: KernelSpec) -> str:
        key = spec._keys.get(self._key_id)
        if key is not None:
            return key
        if spec.reads_host_files:
            # Its first key digests the include directories' files: tens of milliseconds for a
            # library such as CCCL, which must not stall the event loop.
            return await anyio.to_thread.run_sync(spec.key, self.target)
        return spec.key(self.target)

    async def get(self, spec: KernelSpec, *, device: int | None = None) -> Module:
        """``spec`` compiled and loaded for ``device`` (default: CuPy's current device).

        A second ``get`` on the same device returns the same Module and loads nothing. An
        image the driver refuses is dropped from the tiers and recompiled once.
        """
        try:
            if device is None:
                # The only GPU's modules when the process sees one GPU, else empty (the slow
                # path asks CUDA for the current device).
                module = self._hot_modules[spec._keys[self._key_id]]
            else:
                module = self._modules[device][spec._keys[self._key_id]]
        except (KeyError, AttributeError):
            return await self._get(spec, device)
        next(self._clock)  # counts the memory hit
        return module

    async def _get(self, spec: KernelSpec, device: int | None) -> Module:
        if not self._open:
            raise self._not_open()
        if device is None:
            device = _cuda.current_device()
        _cuda.check_device(device)
        if not _cuda.device_ready(device):
            await anyio.to_thread.run_sync(_cuda.init_device, device)
        modules = self._modules.setdefault(device, {})
        if _cuda.device_count() == 1:
            self._hot_modules = modules
        artifact = await self.compile(spec)
        # Requests that were waiting for the same compile load the module once.
        module = modules.get(artifact.key)
        if module is not None:
            return module
        try:
            module = _cuda.load(artifact, device)
        except _cuda.ModuleLoadError as exc:
            if _cuda.runnable(artifact, _cuda.check_device(device)) is not None:
                raise  # another architecture: compiling again would not help
            logger.warning("%s; dropping it and compiling again", exc)
            await self.forget(spec)
            artifact = await self.compile(spec)
            module = _cuda.load(artifact, device)
        if self._open:
            modules[artifact.key] = module
        return module

    def prefetch(self, specs: Iterable[KernelSpec]) -> int:
        """Queue low-priority background compiles (warm-up); returns how many were queued.

        Live requests overtake them; a live request for a prefetched key promotes its job.
        Failures are logged and remembered, never raised here.
        """
        if self._state is not _State.OPEN:
            raise self._not_open()
        queued = 0
        for spec in specs:
            if not isinstance(spec, KernelSpec):
                raise TypeError(f"prefetch takes KernelSpecs, not {type(spec).__name__}")
            if spec.reads_host_files and self._key_id not in spec._keys:
                # Its key digests files: derived in a worker thread, then queued (counted now).
                assert self._task_group is not None
                self._task_group.start_soon(self._prefetch_later, spec)
                queued += 1
            elif self._prefetch_one(spec, spec.key(self.target)):
                queued += 1
        self._prefetched += queued
        return queued

    def _prefetch_one(self, spec: KernelSpec, key: str) -> bool:
        if key in self._memory or key in self._inflight or key in self._failures:
            return False
        self._submit(spec, key, PREFETCH)
        return True

    async def _prefetch_later(self, spec: KernelSpec) -> None:
        try:
            key = await self._key(spec)
        except ValueError as exc:  # an include directory the key cannot cover
            logger.warning("not prefetching %s: %s", spec.name, exc)
            return
        if self._state is _State.OPEN:
            self._prefetch_one(spec, key)

    def _submit(self, spec: KernelSpec, key: str, priority: int) -> _Job:
        failure = self._failures.get(key)
        if failure is not None:
            job = _Job(key, spec, priority)
            job.error = failure
            job.done.set()
            return job
        shared = self._inflight.get(key)
        if shared is not None:
            self._joined += 1
            if priority < shared.priority and not shared.started:
                shared.priority = priority  # the stale heap entry is skipped when popped
                self._push(shared)
                self._look_up(shared)
            return shared
        job = self._inflight[key] = _Job(key, spec, priority)
        if priority == LIVE:
            self._look_up(job)  # a hit is served now; a miss joins the compile queue
        else:
            self._push(job)  # warm-up: looked up in the compile lane, after live requests
        return job

    def _look_up(self, job: _Job) -> None:
        if not (job.looking or job.looked_up or job.started):
            assert self._task_group is not None
            job.looking = True
            self._task_group.start_soon(self._run_lookup, job)

    async def _run_lookup(self, job: _Job) -> None:
        """The I/O lane: disk and remote reads, not limited by ``concurrency``, so a hit never
        waits behind a compile of another key."""
        try:
            found = await anyio.to_thread.run_sync(self._cache.lookup, job.key, limiter=self._io)
        except Exception:
            logger.exception("looking up %s failed; compiling it", job.key[:16])
            found = None
        except BaseException:
            if not (job.started or job.done.is_set()):
                self._finish(job, error=CompilerClosed("the Compiler was cancelled"))
            raise
        finally:
            job.looking = False
        if job.started or job.done.is_set():
            return  # the compile lane took it meanwhile (a promoted warm-up job)
        if found is not None:
            self._finish(job, result=found[0])
        elif self._state is _State.OPEN:
            job.looked_up = True
            self._push(job)
        else:
            self._finish(job, error=CompilerClosed("the Compiler closed before this job started"))

    def _finish(
        self, job: _Job, *, result: Artifact | None = None, error: BaseException | None = None
    ) -> None:
        job.result, job.error = result, error
        self._inflight.pop(job.key, None)
        job.done.set()

    def _push(self, job: _Job) -> None:
        heapq.heappush(self._queue, (job.priority, next(self._seq), job))
        self._wake()

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    # -- the actor -------------------------------------------------------------------------

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
                    job.started = True
                    self._running += 1
                    workers.start_soon(self._run_job, job)
                # Leaving the task group waits for the running jobs: they finish and are cached.
        finally:
            self._state, self._open, self._hot = _State.CLOSED, False, {}
            assert self._stopped is not None
            self._stopped.set()

    async def _next_job(self) -> _Job | None:
        while True:
            while self._queue:
                priority, _, job = heapq.heappop(self._queue)
                if not job.started and not job.done.is_set() and priority == job.priority:
                    return job
            if self._state is not _State.OPEN:
                return None
            self._wakeup = anyio.Event()
            await self._wakeup.wait()
            self._wakeup = None

    async def _run_job(self, job: _Job) -> None:
        try:
            job.result, _ = await anyio.to_thread.run_sync(
                functools.partial(self._cache.resolve, job.spec, job.key, looked_up=job.looked_up),
                limiter=self._limiter,
            )
        except Exception as exc:
            job.error = exc
            if isinstance(exc, CompileError):
                self._failures.remember(job.key, exc)  # fail fast until forget() or clear()
            elif isinstance(exc, AionvrtcError):  # says what is wrong: no traceback needed
                logger.warning("job for %s failed: %s", job.key[:16], exc)
            else:
                logger.exception("job for %s failed", job.key[:16])
        except BaseException:
            job.error = CompilerClosed("the Compiler was cancelled while compiling")
            raise
        finally:
            self._running -= 1
            self._inflight.pop(job.key, None)
            job.done.set()
            self._slots.release()

    # -- management --------------------------------------------------------------------------

    async def forget(self, spec: KernelSpec) -> None:
        """Drop ``spec`` from memory and disk and forget a remembered failure: the next request
        compiles it again, reading its include directories' files anew."""
        key = await self._key(spec)
        self._failures.pop(key)
        for modules in self._modules.values():
            modules.pop(key, None)
        await anyio.to_thread.run_sync(self._cache.forget, spec)

    async def load_record(self, name: str) -> bytes | None:
        """Data stored with ``save_record`` under ``name`` for this Compiler's target (in this
        or an earlier process sharing the cache dir), or None."""
        return await anyio.to_thread.run_sync(self._cache.record, name)

    async def save_record(self, name: str, data: bytes) -> bool:
        """Keep ``data`` (such as tuning results) under ``name`` in the disk cache, beside the
        kernels; False if there is no writable disk cache."""
        return await anyio.to_thread.run_sync(self._cache.put_record, name, data)

    async def clear(self) -> None:
        """Empty the memory tier, the remembered failures and this format's disk entries."""
        self._failures.clear()
        for modules in self._modules.values():
            modules.clear()
        await anyio.to_thread.run_sync(self._cache.clear)

    def stats(self) -> CompilerStats:
        cache = self._cache.stats()
        # The tiers' counters carry over by name; the rest are the actor's own.
        shared = {name: getattr(cache, name) for name in _FROM_CACHE}
        remote = self.remote
        return CompilerStats(
            **shared,
            requests=cache.memory_hits + self._misses,
            joined=self._joined,
            errors=self._errors,
            queued=len(self._inflight) - self._running,
            in_flight=self._running,
            prefetched=self._prefetched,
            remote_hits=remote.hits if remote else 0,
            remote_misses=remote.misses if remote else 0,
            remote_rejected=remote.rejected if remote else 0,
            remote_errors=remote.errors if remote else 0,
            remote_lock_waits=remote.lock_waits if remote else 0,
            remote_foreign_locks=remote.foreign_locks if remote else 0,
        )

    # -- blocking facade ---------------------------------------------------------------------

    def compile_sync(self, spec: KernelSpec) -> Artifact:
        """``compile`` for code that is not async: from any thread when this Compiler runs in
        a portal (``default_compiler()``), else from a worker thread of its event loop."""
        if self._state is not _State.OPEN:
            raise self._not_open()  # the portal itself may be gone
        # A memory hit is served in the caller's thread, as compile() serves it on the loop:
        # the memory tier's readers take no lock, and a hop to the loop costs about 150 us.
        try:
            entry = self._hot[spec._keys[self._key_id]]
        except (KeyError, AttributeError):
            pass
        else:
            entry.used = next(self._clock)
            return entry.artifact
        if self._portal is not None:
            return self._portal.call(self.compile, spec)
        return anyio.from_thread.run(self.compile, spec)

    def get_sync(self, spec: KernelSpec, *, device: int | None = None) -> Module:
        """``get`` for code that is not async; see ``compile_sync``."""
        if not self._open:
            raise self._not_open()
        if device is None:
            device = _cuda.current_device()  # the caller's thread's current device
        try:  # a module already loaded: served here, without a hop (see compile_sync)
            module = self._modules[device][spec._keys[self._key_id]]
        except (KeyError, AttributeError):
            pass
        else:
            next(self._clock)  # counts the memory hit
            return module
        get = functools.partial(self.get, spec, device=device)
        if self._portal is not None:
            return self._portal.call(get)
        return anyio.from_thread.run(get)
