"""The drivers of the tropical API's sync/async twins (tropical/_twins.py), on the CPU: a body's
requests are answered, an answer's error is thrown into the body (its handlers and ``finally``
run, its own error reaches the caller with the cause), offloaded work runs in a worker thread
only for the async caller, and a cancelled caller closes the body at its next request. Fetch
and the async Wait need a GPU: the tropical GPU tests drive them."""

from __future__ import annotations

import threading
from collections.abc import Generator
from typing import Any

import anyio
import pytest

from aionvrtc.tropical.products._twins import Offload, Wait, Work, run_async, run_sync

pytestmark = pytest.mark.anyio


def adding(log: list[str], fail: bool) -> Work[int]:
    """Asks for 41 (or a division by zero), answers one more; says what it saw in ``log``."""
    try:
        answer = yield Offload(lambda: 1 // 0 if fail else 41)
        return int(answer) + 1
    except ZeroDivisionError as exc:
        log.append(type(exc).__name__)
        raise ValueError("the body's own error") from exc
    finally:
        log.append("finally")


def thread_of_offload() -> Work[int]:
    return int((yield Offload(threading.get_ident)))


def test_run_sync_answers_and_throws_errors_into_the_body() -> None:
    log: list[str] = []
    assert run_sync(adding(log, fail=False)) == 42
    assert log == ["finally"]
    log.clear()
    with pytest.raises(ValueError, match="the body's own error") as raised:
        run_sync(adding(log, fail=True))
    assert isinstance(raised.value.__cause__, ZeroDivisionError)
    assert log == ["ZeroDivisionError", "finally"]
    assert run_sync(thread_of_offload()) == threading.get_ident()  # here, in this thread


async def test_run_async_offloads_to_a_worker_thread_and_throws_errors_in() -> None:
    log: list[str] = []
    assert await run_async(adding(log, fail=False)) == 42
    assert log == ["finally"]
    log.clear()
    with pytest.raises(ValueError, match="the body's own error") as raised:
        await run_async(adding(log, fail=True))
    assert isinstance(raised.value.__cause__, ZeroDivisionError)
    assert log == ["ZeroDivisionError", "finally"]
    assert await run_async(thread_of_offload()) != threading.get_ident()  # a worker thread


async def test_a_cancelled_caller_closes_the_body() -> None:
    log: list[str] = []
    done = threading.Event()

    def slow() -> int:
        done.wait(10)
        return 1

    def body() -> Generator[Any, Any, int]:
        try:
            yield Offload(slow)  # Python in a thread cannot be stopped: it runs to its end
            log.append("first answered")
            yield Offload(lambda: 2)  # the next request finds the caller gone
            log.append("second answered")
            return 1
        finally:
            log.append("finally")

    threading.Timer(0.3, done.set).start()  # the offload ends after the cancellation
    with anyio.move_on_after(0.1) as scope:
        await run_async(body())
    assert scope.cancelled_caught
    assert log == ["first answered", "finally"]


def test_run_sync_waits_on_the_stream_it_is_given() -> None:
    class Stream:
        synchronized = 0

        def synchronize(self) -> None:
            self.synchronized += 1

    stream = Stream()

    def body() -> Work[str]:
        yield Wait(stream)
        return "copied"

    assert run_sync(body()) == "copied"
    assert stream.synchronized == 1
