"""The Compiler's lanes: the jobs of keys that memory did not hold, from their submission to
their result. One Scheduler per Compiler, driven from its event loop; all it owns (the
in-flight map, the queues, the remembered failures) is touched from that loop only.

A miss joins the in-flight job for its key or starts one, which goes through three lanes:

- the I/O lane (batches of up to IO_BATCH keys a hop): disk and layer lookups in one worker
  thread, remote lookups in up to IO_LANE, so a hit is served whatever NVRTC is doing;
- the compile lane (``concurrency`` slots, default 1): the key's locks taken without waiting,
  the disk checked again, NVRTC, the writes, all in one worker-thread hop. Prefetched jobs take
  only slots that no live job is using, and a live job never waits for a prefetched one to
  finish (NVRTC cannot be interrupted): it takes a slot of its own, so while prefetched
  compiles run, up to twice ``concurrency`` compiles may run at once;
- the wait lane (no slot): a job whose key another process or host is compiling waits there for
  its lock, then reads what it stored, or compiles with the locks as the next job of the lane.

Live requests overtake warm-up (prefetch) work in the I/O and compile lanes.
"""

from __future__ import annotations

import copy
import enum
import functools
import heapq
import itertools
import logging
import threading
from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.abc
import anyio.to_thread

from ._artifact import Artifact
from ._cache import Claim, KernelCache
from ._exceptions import AionvrtcError, CompileError, CompilerClosed, QueueFull
from ._failures import Failures
from ._spec import KernelSpec
from ._store.tier import Origin

__all__ = ["CLAIMED", "LIVE", "PREFETCH", "Job", "Scheduler", "fresh"]

_T = TypeVar("_T")

logger = logging.getLogger("aionvrtc")

# Lower runs first: live requests overtake warm-up work queued before them, and a job holding
# its key's locks (others wait on them) runs before both.
CLAIMED = -1
LIVE = 0
PREFETCH = 1
# Tasks of the I/O lane, and its worker threads for the remote tier (a round trip waits on the
# network, and the other task's local reads go on meanwhile). Local reads take one thread: a
# verified read holds the GIL for most of its 70 us, and two threads reading at once each wait
# for the other's GIL at every system call: 1,000 disk-warm keys at once took 190-340 us of
# thread time each with two, 63-90 us with one (2 vCPUs).
IO_LANE = 2
# Keys looked up per thread hop: a hop costs about as much as a disk hit, so a burst of misses
# is read in batches; a lone request is a batch of one.
IO_BATCH = 32
# Worker threads waiting on other processes' key locks (each blocks until its lock is free).
WAIT_LANE = 64


class Stage(enum.Enum):
    """Where a job is: each stage has one owner, which moves it on."""

    LOOKUP = "queued for the I/O lane"
    READING = "read by the I/O lane"
    QUEUED = "queued for the compile lane"
    RUNNING = "in the compile lane"
    WAITING = "waiting for another process's or host's lock"
    DONE = "done"


# Where a job holds no compile slot yet: what max_queued bounds.
_UNSTARTED = frozenset({Stage.LOOKUP, Stage.READING, Stage.QUEUED})
# Where a job has missed every tier: a request that joins it waits for NVRTC.
_COMPILING = frozenset({Stage.QUEUED, Stage.RUNNING, Stage.WAITING})


def _queued_live(job: Job) -> bool:
    """Whether ``job`` counts against max_queued: a live request's, holding no slot yet."""
    return job.priority == LIVE and job.stage in _UNSTARTED


class Job:
    """One key's work, shared by every request for that key while it runs."""

    __slots__ = (
        "cache", "claim", "done", "error", "hot", "key", "priority", "result", "scope", "spec",
        "stage", "waiters",
    )  # fmt: skip

    def __init__(self, key: str, spec: KernelSpec, priority: int, cache: KernelCache) -> None:
        self.key = key
        self.spec = spec
        self.cache = cache  # the cache's view for the job's target
        self.priority = priority
        self.stage = Stage.LOOKUP
        self.claim: Claim | None = None  # the locks it holds, or waits for
        self.scope: anyio.CancelScope | None = None  # of its wait: closing cancels it
        self.done = anyio.Event()
        self.result: Artifact | None = None
        self.error: BaseException | None = None
        self.waiters = 0  # requests awaiting it now: its error is raised to each of them
        self.hot = False  # a live request waited for its compile (told to on_hot once)


def fresh(error: BaseException) -> BaseException:
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
    lookups: list[tuple[KernelCache, str]], *, local: bool, remote: bool
) -> list[tuple[Artifact, Origin] | Exception | None]:
    """Each (cache view, key)'s ``lookup``, in one call (one thread hop for a batch, whatever
    targets it mixes); a lookup that raised has its exception in its place, and the others are
    looked up all the same."""
    found: list[tuple[Artifact, Origin] | Exception | None] = []
    for cache, key in lookups:
        try:
            found.append(cache.lookup(key, local=local, remote=remote))
        except Exception as exc:
            found.append(exc)
    return found


class Scheduler:
    """The jobs and the lanes of one Compiler over ``cache`` (its views, one per target, are
    the jobs'). ``concurrency`` compile slots; ``on_result(job)`` is told of each job that
    succeeded (the Compiler's manifest). ``start`` runs it in a task group; ``close`` fails
    what no lane has taken and lets the running compiles finish. ``on_hot(job, first)`` is
    told of each live request about to wait for a job's compile (NVRTC on a request's path, as
    opposed to a prefetch's), ``first`` for the job's first; where it returns an error, the
    request raises it at once and the compile goes on as a prefetch."""

    def __init__(
        self,
        cache: KernelCache,
        concurrency: int,
        on_result: Callable[[Job], None],
        max_queued: int | None = None,
        on_hot: Callable[[Job, bool], BaseException | None] | None = None,
    ) -> None:
        self._cache = cache
        self._on_hot = on_hot
        self.max_queued = max_queued
        self.rejected = 0  # submissions refused by max_queued
        self._remote = any(not tier.local for tier in cache.tiers)  # a tier off this host
        self._on_result = on_result
        self.concurrency = concurrency
        self.open = False
        self.inflight: dict[str, Job] = {}
        self.failures = Failures()
        self._queue: list[tuple[int, int, Job]] = []  # the compile lane's
        self._lookups: list[tuple[int, int, Job]] = []  # the I/O lane's
        self._seq = itertools.count()
        self._wakeup: anyio.Event | None = None
        self._task_group: anyio.abc.TaskGroup | None = None
        self._lookers = 0  # I/O lane tasks running
        self.running = 0  # jobs holding a compile slot
        self._live = 0  # of them, those live (or holding their locks) when they started
        # Jobs in flight that _queued_live counts, kept as they enter and leave it (submit, a
        # promotion, the compile lane taking one, _finish): max_queued is checked per submit.
        self._live_queued = 0
        self.joined = 0  # submissions that joined a job in flight

    # -- lifecycle ---------------------------------------------------------------------------

    def attach(self, task_group: anyio.abc.TaskGroup) -> None:
        """Take jobs from now on, running the lanes in ``task_group``: before anyone can submit
        (the Compiler opens after this), so a job never finds no task group to run in."""
        self._task_group = task_group
        # The dispatcher keeps to ``concurrency`` slots for each kind of job (see _next_job).
        self._limiter = anyio.CapacityLimiter(2 * self.concurrency)
        self._io = anyio.CapacityLimiter(1)  # local reads (see IO_LANE)
        self._remote_io = anyio.CapacityLimiter(IO_LANE)
        self._waits = anyio.CapacityLimiter(WAIT_LANE)
        self.open = True

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        """The compile lane's dispatcher (in the task group ``attach`` named), until ``close``
        and the running compiles have finished."""
        try:
            async with anyio.create_task_group() as workers:
                task_status.started()
                while (job := await self._next_job()) is not None:
                    live = job.priority < PREFETCH
                    self._live_queued -= _queued_live(job)
                    job.stage = Stage.RUNNING
                    self.running += 1
                    self._live += live
                    workers.start_soon(self._run_job, job, live)
                # Leaving the task group waits for the running jobs: they finish and are cached.
        finally:
            self.open = False

    def close(self) -> None:
        """Fail the jobs no lane has taken yet (letting go of locks they hold), cancel the
        waits for other processes' locks, and wake the dispatcher, which stops once the
        running compiles have finished. Lookups being read finish on their own."""
        self.open = False
        closed = CompilerClosed("the Compiler closed before this job started")
        for job in list(self.inflight.values()):
            if job.stage in (Stage.LOOKUP, Stage.QUEUED):
                self._finish(job, error=closed)
                if job.claim is not None:
                    self._release_soon(job.claim)
            elif job.stage is Stage.WAITING and job.scope is not None:
                job.scope.cancel()
        self._lookups.clear()
        self._queue.clear()
        self._wake()

    def detach(self) -> None:
        """The task group is gone (the Compiler's host left it): locks are let go at once from
        now on (see ``_release_soon``)."""
        self._task_group = None

    def counts(self) -> tuple[int, int, int]:
        """Jobs (queued or looking up, holding a compile slot, waiting for another's lock)."""
        waiting = sum(job.stage is Stage.WAITING for job in self.inflight.values())
        return len(self.inflight) - self.running - waiting, self.running, waiting

    def live_queued(self) -> int:
        """Jobs of live requests that wait to be looked up or compiled (holding no slot)."""
        return self._live_queued

    # -- submitting --------------------------------------------------------------------------

    def submit(self, spec: KernelSpec, key: str, priority: int, cache: KernelCache) -> Job:
        """The job for ``key``: a remembered failure's (done), the one in flight (promoted to
        ``priority`` if that is higher), or a new one, looked up first."""
        failure = self.failures.get(key)
        if failure is not None:
            job = Job(key, spec, priority, cache)
            job.error = failure
            job.stage = Stage.DONE
            job.done.set()
            return job
        shared = self.inflight.get(key)
        if shared is not None:
            if priority == LIVE and shared.stage in _COMPILING:
                refused = self._hot(shared)
                if refused is not None:
                    return refused
            self.joined += 1
            if priority < shared.priority:
                # Promoted: its old heap item is skipped when popped. A job being read keeps
                # the new priority for the compile lane.
                counted = _queued_live(shared)
                shared.priority = priority
                self._live_queued += _queued_live(shared) - counted
                if shared.stage is Stage.LOOKUP:
                    self._look_up(shared)
                elif shared.stage is Stage.QUEUED:
                    self._push(shared)
            return shared
        # Only live requests are bounded, and only live jobs count: a prefetch (a warm-up of a
        # whole manifest, say) is neither refused nor in the way of the requests it serves.
        if (
            priority == LIVE
            and self.max_queued is not None
            and self._live_queued >= self.max_queued
        ):
            return self._refused(Job(key, spec, priority, cache))
        job = self.inflight[key] = Job(key, spec, priority, cache)
        self._live_queued += _queued_live(job)
        self._look_up(job)  # a hit is served from the I/O lane; a miss goes on to compile
        return job

    def _hot(self, job: Job) -> Job | None:
        """A live request is about to wait for ``job``'s compile: ``on_hot`` is told, and
        whether it is the job's first. Where it answers with an error, a job done with it, for
        the request to raise; ``job`` itself goes on at its own priority."""
        if self._on_hot is None:
            return None
        first, job.hot = not job.hot, True
        error = self._on_hot(job, first)
        if error is None:
            return None
        refused = Job(job.key, job.spec, LIVE, job.cache)
        refused.error, refused.stage, refused.hot = error, Stage.DONE, True
        refused.done.set()
        return refused

    def _refused(self, job: Job) -> Job:
        """``job`` done with QueueFull: max_queued live jobs hold no compile slot yet. Not kept
        in flight nor remembered: the next request for its key is served once there is room."""
        self.rejected += 1
        job.error = QueueFull(
            f"{self.max_queued} kernels are waiting to be looked up or compiled "
            f"(max_queued={self.max_queued}, {self.concurrency} compile slot(s)): this request "
            "for another was refused without queueing. Compile the kernels a service uses "
            "ahead (Compiler.prefetch, aionvrtc warm), raise max_queued=, or add slots "
            "(concurrency=)"
        )
        job.stage = Stage.DONE
        job.done.set()
        return job

    def _finish(
        self, job: Job, *, result: Artifact | None = None, error: BaseException | None = None
    ) -> None:
        if self.inflight.get(job.key) is job:
            del self.inflight[job.key]
            self._live_queued -= _queued_live(job)
        job.result, job.error, job.stage = result, error, Stage.DONE
        if result is not None:
            self._on_result(job)
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
                result.release()
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

    def _look_up(self, job: Job) -> None:
        job.stage = Stage.LOOKUP
        heapq.heappush(self._lookups, (job.priority, next(self._seq), job))
        if self._lookers < IO_LANE:
            assert self._task_group is not None
            self._lookers += 1
            self._task_group.start_soon(self._io_lane)

    def _take_lookups(self) -> list[Job]:
        batch: list[Job] = []
        while self._lookups and len(batch) < IO_BATCH:
            priority, _, job = heapq.heappop(self._lookups)
            if priority == job.priority and job.stage is Stage.LOOKUP:
                job.stage = Stage.READING
                batch.append(job)
        return batch

    async def _io_lane(self) -> None:
        """Disk and remote reads in batches, not limited by ``concurrency``: a hit never
        waits behind a compile of another key."""
        try:
            while batch := self._take_lookups():
                # The local tiers first, for the whole batch, then the remote tier for its
                # misses only: a disk hit never waits behind Redis round trips.
                misses = await self._read(batch, remote=False)
                if misses and self._remote:
                    await self._read(misses, local=False)
        finally:
            self._lookers -= 1

    async def _read(
        self, batch: list[Job], *, local: bool = True, remote: bool = True
    ) -> list[Job]:
        """Look ``batch`` up in one hop; finish the hits (and, reading the last tier, the
        misses, which go on to compile). Returns the misses."""
        read = functools.partial(
            _lookup_many, [(job.cache, job.key) for job in batch], local=local, remote=remote
        )
        try:
            found = await self._hop(read, self._io if local else self._remote_io)
        except BaseException:
            error = CompilerClosed("the Compiler was cancelled")
            for job in batch:
                self._finish(job, error=error)
            raise
        misses = []
        last = remote or not self._remote
        for job, outcome in zip(batch, found, strict=True):
            if outcome is None and not last:
                misses.append(job)
            else:
                self._looked_up(job, outcome)
        return misses

    def _looked_up(self, job: Job, outcome: tuple[Artifact, str] | Exception | None) -> None:
        if isinstance(outcome, Exception):
            logger.error("looking up %s failed; compiling it", job.key[:16], exc_info=outcome)
            outcome = None
        if outcome is not None:
            self._finish(job, result=outcome[0])
        elif self.open:
            refused = self._hot(job) if job.priority == LIVE else None
            if refused is not None:
                # Its requests raise at once; the compile goes on as a warm-up's, for the next
                # request to find.
                self._finish(job, error=refused.error)
                job = self.inflight[job.key] = Job(job.key, job.spec, PREFETCH, job.cache)
                job.hot = True
            self._push(job)
        else:
            self._finish(job, error=CompilerClosed("the Compiler closed before this job started"))

    # -- the compile lane ------------------------------------------------------------------

    def _push(self, job: Job) -> None:
        job.stage = Stage.QUEUED
        heapq.heappush(self._queue, (job.priority, next(self._seq), job))
        self._wake()

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    async def _next_job(self) -> Job | None:
        """The first queued job that a slot is free for: a live one (or one holding its
        locks) while fewer than ``concurrency`` live jobs run, a prefetched one while fewer
        than ``concurrency`` jobs run in all. None once closed."""
        queue = self._queue
        while True:
            while queue:
                priority, _, job = queue[0]
                if job.stage is not Stage.QUEUED or priority != job.priority:
                    heapq.heappop(queue)  # promoted since, or taken by close()
                    continue
                taken = self._live if priority < PREFETCH else self.running
                if taken >= self.concurrency:
                    break  # live jobs come first in the heap: nothing behind it can run
                heapq.heappop(queue)
                return job
            if not self.open:
                return None  # closing: nothing enters the queue any more
            self._wakeup = anyio.Event()
            await self._wakeup.wait()
            self._wakeup = None

    async def _run_job(self, job: Job, live: bool) -> None:
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
                job.claim, job.stage = outcome, Stage.WAITING
                assert self._task_group is not None
                self._task_group.start_soon(self._wait, job)
        finally:
            self.running -= 1
            self._live -= live
            self._wake()

    def _failed(self, job: Job, exc: Exception) -> None:
        if isinstance(exc, CompileError):
            self.failures.remember(job.key, exc)  # fail fast until forget() or clear()
        elif not job.waiters:
            # Logged only when no request receives it (a prefetch's): a request raises it, and
            # logged as well it would be said twice.
            if isinstance(exc, AionvrtcError):  # says what is wrong: no traceback needed
                logger.warning("job for %s failed: %s", job.key[:16], exc)
            else:
                logger.exception("job for %s failed", job.key[:16])
        self._finish(job, error=exc)

    # -- the wait lane -----------------------------------------------------------------------

    async def _wait(self, job: Job) -> None:
        """Wait, holding no compile slot, for the lock that another process or host holds on
        the job's key; then serve what it stored, or compile, holding the locks, as the next
        job of the compile lane. Closing cancels the wait."""
        claim = job.claim
        assert claim is not None
        cancel = threading.Event()  # ends a wait for a lock promptly (see DiskTier, RedisTier)
        wait = functools.partial(job.cache.claim, job.key, cancel=cancel, claim=claim)
        with anyio.CancelScope() as job.scope:
            if self.open:
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
        elif claim.ready and self.open:
            job.claim, job.priority = claim, CLAIMED
            self._push(job)
        else:
            self._finish(job, error=CompilerClosed("the Compiler closed while this job waited"))
            await self._release(claim)

    async def _release(self, claim: Claim) -> None:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(claim.release)

    def _release_soon(self, claim: Claim) -> None:
        """Let go of ``claim`` from the event loop: in a task of the Compiler's while it has
        one, else its file lock at once (a fleet lock then lapses by its expiry)."""
        if self._task_group is not None:
            self._task_group.start_soon(self._release, claim)
        else:
            claim.release(local_only=True)
