"""One body for each sync/async pair of the API (``matmul``/``matmul_sync``, ``einsum``/
``einsum_sync``...): the body is a generator that yields what it needs done, and each of the
pair drives it its own way. The async driver fetches modules concurrently from the Compiler,
runs slow Python (planning, preparing launches) in a worker thread and waits for the GPU
without blocking the event loop; the sync driver does the same in the caller's thread.

A body that needs nothing (a hot call: its modules loaded, its plan known) yields nothing, and
costs a generator's creation over calling it directly.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.to_thread

from ..._cuda import synchronize
from ..._spec import KernelSpec
from ..._sync import on_default
from ._launching import first_error, loaded, module, module_sync

if TYPE_CHECKING:
    from ..._compiler import Compiler
    from ..._cuda import Module

__all__ = ["Fetch", "Offload", "Wait", "Work", "run_async", "run_sync"]

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Fetch:
    """The modules of ``specs`` on ``device`` from ``compiler`` (None: the process-wide one),
    as a list: loaded ones at once, the others compiled where new."""

    specs: Sequence[KernelSpec]
    device: int
    compiler: Compiler | None


@dataclass(frozen=True, slots=True)
class Offload:
    """``call()``'s result: Python that takes milliseconds (planning), in a worker thread when
    the caller is async."""

    call: Callable[[], Any]


@dataclass(frozen=True, slots=True)
class Wait:
    """Wait until the work enqueued on ``stream`` is done (a copy back to the host). The async
    wait is shielded: what the copy writes must land before its buffers are freed."""

    stream: Any


Request = Fetch | Offload | Wait
Work = Generator[Request, Any, _T]


async def run_async(work: Work[_T], *, ahead: bool = False) -> _T:
    """Drive ``work`` from a task: fetches are concurrent, offloads run in worker threads.
    ``ahead``: the work is a warm-up, its kernels fetched by ``Compiler.warm`` (never a hot
    compile: see ``Compiler.start_serving``)."""
    try:
        request = next(work)
        while True:
            try:
                if isinstance(request, Fetch):
                    if ahead:
                        await warm_modules(request.specs, request.device, request.compiler)
                    answer: Any = await fetch_modules(
                        request.specs, request.device, request.compiler
                    )
                elif isinstance(request, Offload):
                    answer = await anyio.to_thread.run_sync(request.call)
                else:
                    with anyio.CancelScope(shield=True):
                        await synchronize(request.stream)
                    answer = None
            except BaseException as exc:
                request = work.throw(exc)
            else:
                request = work.send(answer)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def run_sync(work: Work[_T]) -> _T:
    """Drive ``work`` in this thread: modules fetched one at a time, the Python run here."""
    try:
        request = next(work)
        while True:
            try:
                if isinstance(request, Fetch):
                    answer: Any = fetch_modules_sync(
                        request.specs, request.device, request.compiler
                    )
                elif isinstance(request, Offload):
                    answer = request.call()
                else:
                    request.stream.synchronize()
                    answer = None
            except BaseException as exc:
                request = work.throw(exc)
            else:
                request = work.send(answer)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def fetch_modules(
    specs: Sequence[KernelSpec], device: int, compiler: Compiler | None
) -> list[Module]:
    """The modules of ``specs`` on ``device``, from ``compiler`` (default: the process-wide
    one): loaded ones at once, the others fetched concurrently (compiled where new)."""
    found: list[Module | None] = [loaded(spec, device, compiler) for spec in specs]
    missing = [at for at, got in enumerate(found) if got is None]
    if not missing:
        return found  # type: ignore[return-value]
    if len(missing) == 1:  # awaited here: its error raised as it is (a task group wraps it)
        found[missing[0]] = await module(specs[missing[0]], device, compiler)
        return found  # type: ignore[return-value]

    async def fetch(at: int) -> None:
        found[at] = await module(specs[at], device, compiler)

    try:
        async with anyio.create_task_group() as tg:
            for at in missing:
                tg.start_soon(fetch, at)
    except ExceptionGroup as group:
        raise first_error(group) from None
    return found  # type: ignore[return-value]


async def warm_modules(specs: Sequence[KernelSpec], device: int, compiler: Compiler | None) -> int:
    """Compile and load ``specs`` on ``device`` as a warm-up (``Compiler.warm``), through
    ``compiler`` or on the process-wide one's own loop; how many are loaded."""
    if compiler is not None:
        return await compiler.warm(specs, device=device)

    def warm(default: Compiler) -> Awaitable[int]:
        return default.warm(specs, device=device)

    return await anyio.to_thread.run_sync(on_default, warm)


def fetch_modules_sync(
    specs: Sequence[KernelSpec], device: int, compiler: Compiler | None
) -> list[Module]:
    """``fetch_modules`` for code that is not async (one at a time)."""
    return [module_sync(spec, device, compiler) for spec in specs]
