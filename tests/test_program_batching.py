"""Batched programs and joined calls, without a GPU: a query's network over a batch (planned and
run in NumPy step by step, its assignments walked back on the host) against each query alone,
and the grouping of concurrent requests (``Joiner``) on asyncio and trio. The GPU half is
tests/test_program_batching_gpu.py."""

from __future__ import annotations

import re
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest

from aionvrtc import QueueFull
from aionvrtc.tropical import SEMIRINGS, einsum_plan, reference
from aionvrtc.tropical.networks._backtrace import (
    assignment_of,
    backtrace_code,
    follow,
    output_digits,
    output_values,
)
from aionvrtc.tropical.networks._batched import batched_network, check_batch
from aionvrtc.tropical.products import Group, Joiner, Member

from .support.einsum import (
    ARGMAX_CASES,
    Trace,
    check_assignment,
    kings_graph,
    network_values,
    run_plan,
)


def test_a_batched_network_leads_the_varying_operands_and_the_result_with_the_batch() -> None:
    plan = einsum_plan("ij,jk,k->i", (3, 4), (4, 5), (5,))
    subscripts, shapes, symbol = batched_network(plan, [(3, 4), (4, 5), (5,)], 8, (0, 2))
    assert symbol not in "ijk"
    assert subscripts == f"{symbol}ij,jk,{symbol}k->{symbol}i"
    assert shapes == [(8, 3, 4), (4, 5), (8, 5)]
    # The first symbol that no input uses.
    used = einsum_plan("ab,bc->", (2, 2), (2, 2))
    assert batched_network(used, [(2, 2), (2, 2)], 2, (1,))[2] == "d"


@pytest.mark.parametrize(
    ("batch", "batched", "error", "message"),
    [
        (0, None, ValueError, "batch must be a positive int (the queries in one replay), got 0"),
        (
            True,
            None,
            ValueError,
            "batch must be a positive int (the queries in one replay), got True",
        ),
        (
            4,
            1,
            TypeError,
            "batched must be the positions of the operands that vary (such as [0, 2]), not int",
        ),
        (4, [0, 3], ValueError, "batched names operand 3, and there are 3 (0 to 2)"),
        (
            4,
            [0, 0],
            ValueError,
            "batched must name each varying operand once, and at least one; got [0, 0]",
        ),
        (
            4,
            [],
            ValueError,
            "batched must name each varying operand once, and at least one; got []",
        ),
        (4, ["0"], TypeError, "batched holds operand positions (ints), not '0'"),
    ],
)
def test_bad_batches_are_refused_naming_what_is_wrong(
    batch: Any, batched: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match="^" + re.escape(message) + "$"):
        check_batch(batch, batched, 3)
    assert check_batch(4, None, 3) == (4, (0, 1, 2))
    assert check_batch(4, (2, 0), 3) == (4, (0, 2))


@pytest.mark.parametrize(("ring", "dtype"), ARGMAX_CASES)
def test_a_batch_of_weighted_queries_is_each_query_contracted_alone(ring: str, dtype: str) -> None:
    # A 4 x 4 king's graph, each query with its own vertex weights (the vertices' tensors vary,
    # the edges' are shared): the batched plan along the query's order, run in NumPy as the GPU
    # runs it, gives each query's value, and each element's walk back its own assignment.
    rng = np.random.default_rng(list(SEMIRINGS).index(ring) * 10 + len(dtype) + 900)
    subscripts, shapes, path = kings_graph(4)
    query = einsum_plan(subscripts, *shapes, optimize=path)
    vertices = [i for i, shape in enumerate(shapes) if len(shape) == 1]
    size = 5
    made, made_shapes, symbol = batched_network(query, shapes, size, vertices)
    plan = einsum_plan(made, *made_shapes, optimize=list(query.path))
    assert plan.path == query.path
    # The steps among shared operands alone (edges joined to edges) do not carry the batch.
    assert any(symbol not in step.result for step in plan.steps)
    queries = [network_values(rng, ring, dtype, shapes) for _ in range(size)]
    stacked = [
        np.stack([q[i] for q in queries]) if i in vertices else queries[0][i]
        for i in range(len(shapes))
    ]
    for q in queries:  # the shared operands are the first query's: make them every query's
        for i in range(len(shapes)):
            if i not in vertices:
                q[i] = queries[0][i]
    trace: Trace = []
    values = run_plan(plan, ring, stacked, trace)
    assert values.shape == (size,)
    code, digits = backtrace_code(plan, range(len(trace))), output_digits(plan)
    for number, operands in enumerate(queries):
        want = reference.einsum(subscripts, *operands, semiring=ring)
        assert values[number] == want
        walked = follow(
            code, len(trace), len(plan.sizes),
            lambda where, at: int(trace[where][1].reshape(-1)[at]),
            start=output_values(digits, number),
        )  # fmt: skip
        found = assignment_of(plan, walked)
        assert found.pop(symbol) == number
        check_assignment(subscripts, operands, ring, values[number], found)


# -- joining concurrent requests ----------------------------------------------------------------


async def _serve(joiner: Joiner, asked: list[int], launches: list[list[int]]) -> list[Any]:
    """Each of ``asked`` from its own task: a request of key 0 that the joiner groups, each
    group launched as one (recorded in ``launches``); the results in order."""

    async def launch(group: Group[str]) -> None:
        launches.append([m.asked for m in group.members])
        await anyio.lowlevel.checkpoint()  # (a launch may switch tasks)
        for member in group.members:
            member.result = (group.about, member.asked * 10)

    results: list[Any] = [None] * len(asked)

    async def ask(n: int) -> None:
        joiner.admit()
        try:
            if joiner.alone(0):
                results[n] = ("alone", asked[n] * 10)
                return
            member = Member(asked[n])
            await joiner.join(0, member, lambda: "group", launch)
            results[n] = member.result
        finally:
            joiner.waiting -= 1

    async with anyio.create_task_group() as tasks:
        for n in range(len(asked)):
            tasks.start_soon(ask, n)
    return results


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_requests_of_one_moment_join_up_to_max_batch() -> None:
    joiner = Joiner("Test", max_batch=8, max_delay=0.0, max_queue=None, interrupted="interrupted")
    launches: list[list[int]] = []
    results = await _serve(joiner, list(range(20)), launches)
    # Each task asks once, after another task asked: none is alone; groups of at most 8.
    grouped = [r for r in results if r[0] == "group"]
    assert [r[1] for r in results] == [10 * n for n in range(20)]
    assert len(grouped) >= 16
    assert all(1 <= len(g) <= 8 for g in launches)
    assert sorted(n for g in launches for n in g) == sorted(
        n for n, r in enumerate(results) if r[0] == "group"
    )
    assert len(launches) <= 4
    assert joiner.waiting == 0


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_past_max_queue_a_request_is_refused_at_once_and_counted() -> None:
    joiner = Joiner("Test", max_batch=64, max_delay=0.05, max_queue=4, interrupted="interrupted")
    refused: list[str] = []

    async def ask(n: int) -> None:
        try:
            joiner.admit()
        except QueueFull as exc:
            refused.append(str(exc))
            return
        try:
            member = Member(n)

            async def launch(group: Group[None]) -> None:
                for m in group.members:
                    m.result = m.asked

            await joiner.join(0, member, lambda: None, launch)
            assert member.result == n
        finally:
            joiner.waiting -= 1

    async with anyio.create_task_group() as tasks:
        for n in range(10):
            tasks.start_soon(ask, n)
    assert len(refused) == 6
    assert joiner.rejected == 6
    assert refused[0] == (
        "4 requests are waiting in this Test (max_queue=4): this one was refused without "
        "queueing. Ask again later, raise max_queue=, or lower max_delay= so that groups "
        "launch sooner"
    )


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_cancelled_leader_still_launches_its_group() -> None:
    joiner = Joiner("Test", max_batch=8, max_delay=60.0, max_queue=None, interrupted="interrupted")
    launched: list[list[int]] = []
    got: dict[int, Any] = {}

    async def launch(group: Group[None]) -> None:
        launched.append([m.asked for m in group.members])
        for m in group.members:
            m.result = m.asked

    scopes: dict[int, anyio.CancelScope] = {}

    async def ask(n: int) -> None:
        member = Member(n)
        with anyio.CancelScope() as scopes[n]:
            await joiner.join(0, member, lambda: None, launch)
        got[n] = member.result

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(ask, 0)
        await anyio.wait_all_tasks_blocked()  # the leader has opened the group and waits max_delay
        for n in (1, 2):
            tasks.start_soon(ask, n)
        await anyio.wait_all_tasks_blocked()  # they joined
        scopes[0].cancel()
    assert [sorted(g) for g in launched] == [[0, 1, 2]]  # (trio wakes tasks in any order)
    assert got == {0: 0, 1: 1, 2: 2}


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_task_asking_again_is_alone_and_a_new_burst_s_first_task_is_not() -> None:
    # Alone: no other task asked since this task's last request. A task of a new burst may be
    # given a finished task's id: it is not the same task, so it is not alone.
    joiner = Joiner("Test", max_batch=8, max_delay=0.0, max_queue=None, interrupted="interrupted")

    async def launch(group: Group[None]) -> None:
        for m in group.members:
            m.result = m.asked

    alone = [joiner.alone(0) for _ in range(5)]
    assert alone == [False, True, True, True, True]
    judged: list[bool] = []

    async def ask(n: int) -> None:
        judged.append(joiner.alone(0))
        if not judged[-1]:
            await joiner.join(0, Member(n), lambda: None, launch)

    for _ in range(20):
        async with anyio.create_task_group() as tasks:
            for n in range(12):
                tasks.start_soon(ask, n)
    assert judged.count(True) == 0
    assert len(judged) == 240


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_an_error_of_a_launch_reaches_each_member_of_its_group() -> None:
    joiner = Joiner("Test", max_batch=8, max_delay=0.0, max_queue=None, interrupted="cut")
    members = [Member(n) for n in range(5)]
    failure = ValueError("out of memory, say")

    async def launch(group: Group[None]) -> None:
        raise failure

    async with anyio.create_task_group() as tasks:
        for member in members:
            tasks.start_soon(joiner.join, 0, member, lambda: None, launch)
    assert [m.error for m in members] == [failure] * 5
    assert [m.result for m in members] == [None] * 5
