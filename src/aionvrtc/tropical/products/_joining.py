"""Requests that concurrent tasks make within a moment, joined into groups that one launch
serves: what ``Batcher`` (products) and ``ProgramBatcher`` (compiled contractions) share.

The first request of a key (a layout and a stream) opens a group and lets the event loop run
the other ready tasks, whose requests of that key join it, up to ``max_batch``; then (and after
``max_delay`` seconds more, where given) it launches the group, shielded: the others wait for
it. A task that is alone (no other task asked since its last request) is told so, and runs at
once. Past ``max_queue`` waiting requests, a request is refused at once with ``QueueFull``.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import weakref
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

import anyio
import anyio.lowlevel

from ..._exceptions import AionvrtcError, QueueFull

__all__ = ["Group", "Joiner", "Member", "check_bounds"]


class Member:
    """One request in a group: what it asked (``asked``), then its result or error."""

    __slots__ = ("asked", "error", "result")

    def __init__(self, asked: Any) -> None:
        self.asked = asked
        self.result: Any = None
        self.error: BaseException | None = None


T = TypeVar("T")


class Group(Generic[T]):
    """The requests of one key joined so far, and what their launch needs (``about``)."""

    __slots__ = ("about", "done", "full", "members")

    def __init__(self, about: T) -> None:
        self.about = about
        self.members: list[Member] = []
        self.done = anyio.Event()  # set when every member has its result or error
        self.full: anyio.Event | None = None  # set when max_batch have joined, if awaited


def current_task() -> Callable[[], object]:
    """A weak reference to the current task (a joiner must not keep a finished one alive, nor
    take a new task for a finished one whose id it was given). asyncio's and trio's current
    task are C calls; anyio's builds an object per call."""
    asyncio = sys.modules.get("asyncio")
    task: object = None
    if asyncio is not None:
        with contextlib.suppress(RuntimeError):  # (no asyncio loop runs: trio)
            task = asyncio.current_task()
    if task is None:
        trio = sys.modules.get("trio")
        task = trio.lowlevel.current_task() if trio is not None else anyio.get_current_task().id
    try:
        return weakref.ref(task)
    except TypeError:  # (an id: an int, held as it is)
        return functools.partial(_same, task)


def _same(task: object) -> object:
    return task


def check_bounds(max_batch: Any, max_delay: Any, max_queue: Any) -> None:
    """Refuse bounds that are not what a joiner takes, naming the one that is wrong."""
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"max_batch must be a positive int, got {max_batch!r}")
    if max_queue is not None and (
        isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 1
    ):
        raise ValueError(f"max_queue must be a positive int or None, got {max_queue!r}")
    if not isinstance(max_delay, int | float) or not 0 <= max_delay < math.inf:
        raise ValueError(f"max_delay must be a finite number of seconds >= 0, got {max_delay!r}")


def _nobody() -> object:
    return None


class Joiner:
    """The open groups by key, the bounds, and the counts of what waits and what was refused
    (see the module's docstring). ``who`` names the owner in ``QueueFull``'s message;
    ``interrupted`` is each member's error where the launch's leading task is cancelled."""

    def __init__(
        self,
        who: str,
        max_batch: int,
        max_delay: float,
        max_queue: int | None,
        *,
        interrupted: str,
    ) -> None:
        check_bounds(max_batch, max_delay, max_queue)
        self.who, self.interrupted = who, interrupted
        self.max_batch, self.max_delay, self.max_queue = max_batch, float(max_delay), max_queue
        self.waiting = 0  # requests in the owner now: what max_queue bounds
        self.rejected = 0
        self._open: dict[Hashable, Group[Any]] = {}
        self._latest: Callable[[], object] = _nobody  # the task of the latest request

    def admit(self) -> None:
        """Count a request in, or refuse it at once past ``max_queue`` (counted)."""
        if self.max_queue is not None and self.waiting >= self.max_queue:
            self.rejected += 1
            raise QueueFull(
                f"{self.waiting} requests are waiting in this {self.who} (max_queue="
                f"{self.max_queue}): this one was refused without queueing. Ask again later, "
                "raise max_queue=, or lower max_delay= so that groups launch sooner"
            )
        self.waiting += 1

    def alone(self, key: Hashable) -> bool:
        """Whether this request is alone: no group of ``key`` open and no other task asked
        since this task's last request (then it runs at once, joining nothing)."""
        previous, self._latest = self._latest(), current_task()
        return previous is not None and previous is self._latest() and key not in self._open

    async def join(
        self,
        key: Hashable,
        member: Member,
        about: Callable[[], T],
        launch: Callable[[Group[T]], Awaitable[None]],
    ) -> None:
        """Join ``member`` to the open group of ``key``, or open one (``about()`` what its
        launch needs) and lead it: then ``launch`` it, which gives each member its result; an
        error of the launch is each member's. Returns once the group's launch is done."""
        group = self._open.get(key)
        if group is not None:
            group.members.append(member)
            if len(group.members) >= self.max_batch:
                del self._open[key]  # full: the next request opens another
                if group.full is not None:
                    group.full.set()
            await group.done.wait()
            return
        group = self._open[key] = Group(about())
        group.members.append(member)
        try:
            # The tasks ready now ask in the next pass of the event loop (asyncio runs them in
            # the order they woke; trio shuffles each batch, so a second pass where some came).
            for _ in range(2):
                joined = len(group.members)
                await anyio.lowlevel.checkpoint()
                if len(group.members) in (joined, self.max_batch):
                    break
            if self.max_delay and len(group.members) < self.max_batch:
                group.full = anyio.Event()
                with anyio.move_on_after(self.max_delay):
                    await group.full.wait()
        finally:
            if self._open.get(key) is group:
                del self._open[key]
            with anyio.CancelScope(shield=True):
                try:
                    await launch(group)
                except Exception as exc:  # each member raises it: the launch was theirs
                    for each in group.members:
                        each.error = exc
                except BaseException:
                    # The leading task was cancelled where a shield does not reach (asyncio's
                    # own task.cancel() while a kernel was fetched): its own, not the others'.
                    for each in group.members:
                        each.error = AionvrtcError(self.interrupted)
                    raise
                finally:
                    group.done.set()
