"""Batched programs and joined calls on the GPU: a batched program's replay (stacked operands,
and each query's own through ``run_members`` and ``run_addresses``) against each query run
alone on the program of one, for every semiring and dtype, with the assignments; and
``ProgramBatcher`` under bursts of concurrent tasks on asyncio and trio, warmed and cold, a
call's operands one array each or stacked, against each call's own answer."""

from __future__ import annotations

import re
from typing import Any

import anyio
import numpy as np
import pytest

from aionvrtc import Compiler, QueueFull, tropical

from .support.einsum import (
    ARGMAX_CASES,
    CASES,
    IDS,
    assert_same,
    check_assignment,
    check_assignments,
    kings_graph,
    network_values,
    random_network,
    tensors,
    with_output,
)
from .support.tropical_data import gpu, host

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _fresh_programs() -> Any:
    tropical.clear_programs()
    yield
    tropical.clear_programs()


def weighted_kings(
    rng: np.random.Generator, side: int, ring: str, dtype: str, queries: int
) -> tuple[str, list[tuple[int, ...]], list[Any], list[int], list[list[Any]]]:
    """A side x side king's graph's network, its path, the vertices' positions, and
    ``queries`` sets of operands: each query's own vertex tensors, the edges' shared (the
    same CuPy arrays in every query)."""
    subscripts, shapes, path = kings_graph(side)
    vertices = [i for i, shape in enumerate(shapes) if len(shape) == 1]
    shared = [gpu(x) for x in network_values(rng, ring, dtype, shapes)]
    made = []
    for _ in range(queries):
        own = network_values(rng, ring, dtype, shapes)
        made.append([gpu(own[i]) if i in vertices else shared[i] for i in range(len(shapes))])
    return subscripts, shapes, path, vertices, made


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
def test_a_batched_program_gives_each_query_its_own_answer(
    ring: str, dtype: Any, rng: np.random.Generator
) -> None:
    for _ in range(2):
        subscripts, shapes = random_network(rng, int(rng.integers(6, 10)), int(rng.integers(5, 8)))
        subscripts = with_output(rng, subscripts, most=1)
        size = int(rng.integers(2, 7))
        chosen = rng.choice(len(shapes), size=int(rng.integers(1, 3)), replace=False)
        varying = sorted(int(v) for v in chosen)
        one = tropical.einsum_program_sync(subscripts, *shapes, dtype=dtype, semiring=ring)
        batched = tropical.einsum_program_sync(
            subscripts, *shapes, dtype=dtype, semiring=ring, batch=size, batched=varying,
            optimize=one.plan,
        )  # fmt: skip
        assert (batched.batch, batched.batched) == (size, tuple(varying))
        assert [x.shape for x in batched.inputs] == [
            (size, *s) if i in varying else s for i, s in enumerate(shapes)
        ]
        shared = tensors(rng, ring, dtype, shapes)
        queries = [
            [x if i not in varying else y for i, (x, y) in
             enumerate(zip(shared, tensors(rng, ring, dtype, shapes), strict=True))]
            for _ in range(size)
        ]  # fmt: skip
        stacked = [
            gpu(np.stack([q[i] for q in queries])) if i in varying else gpu(shared[i])
            for i in range(len(shapes))
        ]
        got = batched.run_sync(*stacked)
        assert got.shape == (size, *one.shape)
        for number, query in enumerate(queries):
            what = f"{ring} {dtype} {subscripts} query {number}"
            assert_same(got[number], host(one.run_sync(*map(gpu, query))), what)
        # Each query's own arrays, gathered one by one: the same.
        members = [[gpu(x) for x in q] for q in queries]
        again = anyio.run(batched.run_members, members[:-1])  # a short batch: the last padded
        for number in range(size - 1):
            assert_same(again[number], host(got[number]), f"{ring} {dtype} run_members")


@pytest.mark.parametrize(("ring", "dtype"), ARGMAX_CASES)
def test_a_batched_program_finds_each_query_s_assignment(
    ring: str, dtype: str, rng: np.random.Generator
) -> None:
    subscripts, shapes, path, vertices, queries = weighted_kings(rng, 5, ring, dtype, 6)
    batched = tropical.einsum_program_sync(
        subscripts, *shapes, dtype=dtype, semiring=ring, argmax=True, batch=8, batched=vertices,
        optimize=path,
    )  # fmt: skip
    value, found = anyio.run(batched.run_members, queries)
    assert value.shape == (8,)
    assert sorted(found) == sorted(set(subscripts.partition("->")[0]) - {","})
    for number, query in enumerate(queries):
        want = tropical.reference.einsum(subscripts, *map(host, query), semiring=ring, path=path)
        assert host(value[number]) == want
        own = {name: int(at[number]) for name, at in found.items()}
        check_assignment(subscripts, [host(x) for x in query], ring, want, own)


async def _burst(batcher: tropical.ProgramBatcher, queries: list[list[Any]]) -> list[Any]:
    answers: list[Any] = [None] * len(queries)

    async def ask(number: int) -> None:
        answers[number] = await batcher.run(*queries[number])

    async with anyio.create_task_group() as tasks:
        for number in range(len(queries)):
            tasks.start_soon(ask, number)
    return answers


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.parametrize(("ring", "dtype"), [("maxplus", "float32"), ("minplus", "int64")])
async def test_concurrent_calls_are_joined_into_batched_replays(
    ring: str, dtype: str, rng: np.random.Generator
) -> None:
    subscripts, shapes, path, vertices, queries = weighted_kings(rng, 6, ring, dtype, 40)
    program = await tropical.einsum_program(
        subscripts, *shapes, dtype=dtype, semiring=ring, argmax=True, optimize=path
    )
    # The edges' tensors given once: each call passes its vertices' tensors alone.
    edges = {i: x for i, x in enumerate(queries[0]) if i not in vertices}
    batcher = tropical.ProgramBatcher(program, max_batch=16, shared=edges)
    assert batcher.sizes == (1, 2, 4, 8, 16)
    assert batcher.shared == tuple(sorted(edges))
    assert await batcher.warm() == 4  # (the operands that vary: all but the shared)
    answers = await _burst(batcher, [[q[i] for i in vertices] for q in queries])
    stats = batcher.stats()
    assert stats.requests == 40
    assert stats.standins == 0
    assert stats.replays < 40 // 2  # joined: groups of up to 16
    for query, (value, assignment) in zip(queries, answers, strict=True):
        want = tropical.reference.einsum(subscripts, *map(host, query), semiring=ring, path=path)
        assert host(value) == want
        check_assignment(subscripts, [host(x) for x in query], ring, want, assignment)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_cold_batch_runs_one_by_one_while_its_program_is_made(
    rng: np.random.Generator,
) -> None:
    subscripts, shapes, path, vertices, queries = weighted_kings(rng, 4, "maxplus", "float32", 12)
    async with Compiler() as compiler:
        program = await tropical.einsum_program(
            subscripts, *shapes, dtype="float32", optimize=path, compiler=compiler
        )
        compiler.start_serving("error")  # the batched program's kernels: never a hot compile
        batcher = tropical.ProgramBatcher(program, compiler=compiler, max_batch=16)
        first = await _burst(batcher, queries)
        assert batcher.stats().standins == 12  # one by one: the program of 16 is not made
        for _ in range(600):  # made in the background, meanwhile
            if _made(batcher, 16):
                break
            await anyio.sleep(0.05)
        again = await _burst(batcher, queries)
        stats = batcher.stats()
        assert stats.standins == 12  # the second burst: one replay of the batched program
        assert stats.replays == 12 + 1
        assert stats.padded == 4
        assert compiler.stats().hot_compiles == 0
        ((varying, size),) = batcher.programs
        assert (varying, size) == (tuple(vertices), 16)
    for query, a, b in zip(queries, first, again, strict=True):
        want = tropical.reference.einsum(subscripts, *map(host, query), path=path)
        assert host(a) == want
        assert host(b) == want


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.parametrize(("ring", "dtype"), [("maxplus", "float32"), ("minplus", "int64")])
async def test_stacked_calls_pass_one_array_and_get_each_their_own_answer(
    ring: str, dtype: str, rng: np.random.Generator
) -> None:
    import cupy

    subscripts, shapes, path, vertices, queries = weighted_kings(rng, 5, ring, dtype, 24)
    program = await tropical.einsum_program(
        subscripts, *shapes, dtype=dtype, semiring=ring, argmax=True, optimize=path
    )
    edges = {i: x for i, x in enumerate(queries[0]) if i not in vertices}
    on_host = dtype == "int64"  # (answers on the host, or on the GPU)
    batcher = tropical.ProgramBatcher(
        program, max_batch=8, shared=edges, stacked=True, host=on_host
    )
    assert batcher.stacked
    assert batcher.host == on_host
    assert await batcher.warm() == 3
    stacks = [cupy.stack([q[i] for i in vertices]) for q in queries]
    # One laid out otherwise (copied first: its rows are read at fixed offsets).
    stacks[5] = cupy.asfortranarray(stacks[5])
    assert not stacks[5].flags.c_contiguous
    answers = await _burst(batcher, [[x] for x in stacks])
    # This task's first call: a group of one; its second (no other task asked): alone.
    one = [await batcher.run(stacks[number]) for number in (0, 1)]
    stats = batcher.stats()
    assert stats.requests == 26
    assert stats.alone == 1
    assert stats.standins == 0
    assert stats.replays <= 2 + 24 // 2
    for query, (value, assignment) in zip(queries + queries[:2], answers + one, strict=True):
        want = tropical.reference.einsum(subscripts, *map(host, query), semiring=ring, path=path)
        assert isinstance(value, np.ndarray if on_host else cupy.ndarray)
        assert value.shape == ()
        assert host(value) == want
        check_assignment(subscripts, [host(x) for x in query], ring, want, assignment)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_run_addresses_replays_the_queries_at_those_addresses(
    rng: np.random.Generator,
) -> None:
    subscripts, shapes, path, vertices, queries = weighted_kings(rng, 4, "maxplus", "float32", 5)
    batched = await tropical.einsum_program(
        subscripts, *shapes, dtype="float32", batch=8, batched=vertices, optimize=path
    )
    addresses = [
        [q[i].data.ptr for q in queries] if i in vertices else [queries[0][i].data.ptr]
        for i in range(len(shapes))
    ]
    got = host(await batched.run_addresses(addresses, len(queries)))
    assert_same(got, host(await batched.run_members(queries)), "run_addresses")
    for number, query in enumerate(queries):
        want = tropical.reference.einsum(subscripts, *map(host, query), path=path)
        assert got[number] == want
    assert got[len(queries)] == got[len(queries) - 1]  # (a padded row: the last query again)
    message = (
        f"run_addresses takes, for each of the {len(shapes)} inputs, 4 addresses (the inputs "
        f"{vertices}) or one (the others); got 5 for input {min(vertices)}"
    )
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        await batched.run_addresses(addresses, 4)
    with pytest.raises(ValueError, match=re.escape(f"got {len(shapes) - 1} inputs' addresses")):
        await batched.run_addresses(addresses[:-1], 5)
    with pytest.raises(ValueError, match=re.escape("run_addresses takes 1 to 8 queries, got 9")):
        await batched.run_addresses(addresses, 9)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_bad_stacked_calls_are_refused_naming_the_stack_s_shape() -> None:
    import cupy

    program = await tropical.einsum_program("i,j,ij->", (3,), (3,), (3, 3), dtype="float32")
    edge = {2: cupy.zeros((3, 3), cupy.float32)}
    message = (
        "stacked=True passes a call's own operands as one array, so they must share a shape, "
        "and this program's have 2: [(3,), (3, 3)]; pass the others as shared=, or call with "
        "one array per operand (stacked=False)"
    )
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        tropical.ProgramBatcher(program, stacked=True)
    batcher = tropical.ProgramBatcher(program, shared=edge, stacked=True)
    message = (
        "this ProgramBatcher (stacked=True) takes one array per call, its 2 own operands "
        "stacked (shape (2, 3)), got 2 operands"
    )
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        await batcher.run(cupy.ones(3, cupy.float32), cupy.ones(3, cupy.float32))
    message = (
        "ProgramBatcher.run (stacked=True) takes float32 of shape (2, 3) (the 2 own operands "
        "stacked) on device 0, got float32 of shape (3, 2) on device 0"
    )
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        await batcher.run(cupy.ones((3, 2), cupy.float32))
    with pytest.raises(TypeError, match=re.escape("takes a cupy.ndarray, not numpy.ndarray")):
        await batcher.run(np.ones((2, 3), np.float32))
    assert batcher.stats().requests == 0
    stack = cupy.asarray([[0, 1, 2], [5, 0, 0]], cupy.float32)
    assert float(await batcher.run(stack)) == 7.0  # (max over i, j of x_i + y_j + 0)
    # On the host: a burst's values, each its own.
    hosted = tropical.ProgramBatcher(program, max_batch=8, shared=edge, stacked=True, host=True)
    await hosted.warm()
    stacks = [[stack + k] for k in range(5)]
    values = await _burst(hosted, stacks)
    assert [type(v) for v in values] == [np.ndarray] * 5
    assert [float(v) for v in values] == [7.0 + 2 * k for k in range(5)]
    assert hosted.stats().replays == 1


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_results_with_indices_come_back_to_the_host_each_call_its_own(
    rng: np.random.Generator,
) -> None:
    import cupy

    subscripts = "ij,jk->i"
    program = await tropical.einsum_program(
        subscripts, (3, 4), (4, 5), dtype="float32", argmax=True
    )
    batcher = tropical.ProgramBatcher(program, max_batch=4, host=True)
    await batcher.warm()
    queries = [
        [
            cupy.asarray(rng.integers(-9, 10, size=shape).astype(np.float32))
            for shape in ((3, 4), (4, 5))
        ]
        for _ in range(7)
    ]
    answers = await _burst(batcher, queries)
    assert batcher.stats().standins == 0
    assert batcher.stats().replays <= 3  # (groups of up to 4)
    for query, (value, assignment) in zip(queries, answers, strict=True):
        operands = [host(x) for x in query]
        want = tropical.reference.einsum(subscripts, *operands)
        assert isinstance(value, np.ndarray)
        np.testing.assert_array_equal(value, want)
        assert check_assignments(subscripts, operands, "maxplus", value, assignment) == 3


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_cold_stacked_batch_runs_one_by_one_and_warm_makes_only_its_own(
    rng: np.random.Generator,
) -> None:
    import cupy

    subscripts, shapes, path, vertices, queries = weighted_kings(rng, 3, "maxplus", "float32", 6)
    program = await tropical.einsum_program(subscripts, *shapes, dtype="float32", optimize=path)
    edges = {i: x for i, x in enumerate(queries[0]) if i not in vertices}
    batcher = tropical.ProgramBatcher(program, max_batch=8, shared=edges, stacked=True, host=True)
    message = (
        f"a stacked ProgramBatcher's batches vary in the calls' own operands {vertices} alone "
        f"(each call's stack), so warm makes those: pass no batched= (got {vertices[:2]})"
    )
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        await batcher.warm(batched=vertices[:2])
    stacks = [[cupy.stack([q[i] for i in vertices])] for q in queries]
    answers = await _burst(batcher, stacks)
    assert batcher.stats().standins == 6  # one by one: the batched program is not made
    for query, value in zip(queries, answers, strict=True):
        want = tropical.reference.einsum(subscripts, *map(host, query), path=path)
        assert isinstance(value, np.ndarray)
        assert value == want


def _made(batcher: tropical.ProgramBatcher, size: int) -> bool:
    """Whether the batched program of ``size`` is made (for any varying operands)."""
    return any(made == size for _, made in batcher.programs)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_bad_calls_are_refused_in_their_own_task(rng: np.random.Generator) -> None:
    import cupy

    program = await tropical.einsum_program("ij,jk->", (4, 5), (5, 6), dtype="float32")
    batcher = tropical.ProgramBatcher(program, max_queue=1)
    with pytest.raises(ValueError, match=re.escape("this einsum program takes 2 operands")):
        await batcher.run(cupy.ones((4, 5), cupy.float32))
    message = (
        "einsum program operand 1 must be float32 of shape (5, 6) on device 0 (as the program "
        "was made), got float64 of shape (5, 6) on device 0; make a program for these with "
        "einsum_program"
    )
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        await batcher.run(cupy.ones((4, 5), cupy.float32), cupy.ones((5, 6), cupy.float64))
    with pytest.raises(TypeError, match="ProgramBatcher takes an EinsumProgram"):
        tropical.ProgramBatcher("ij,jk->")  # type: ignore[arg-type]
    batched = await tropical.einsum_program("ij,jk->", (4, 5), (5, 6), dtype="float32", batch=2)
    with pytest.raises(ValueError, match=re.escape("this one is batched (batch=2)")):
        tropical.ProgramBatcher(batched)
    with pytest.raises(ValueError, match=re.escape("shared names operand 2, and the program ")):
        tropical.ProgramBatcher(program, shared={2: cupy.ones((5, 6), cupy.float32)})
    with pytest.raises(ValueError, match=re.escape("einsum program operand 1 must be float32")):
        tropical.ProgramBatcher(program, shared={1: cupy.ones((6, 5), cupy.float32)})
    one = tropical.ProgramBatcher(program, shared={1: cupy.ones((5, 6), cupy.float32)})
    message = (
        "this ProgramBatcher's calls pass 1 operands (the program's 2 less the 1 shared), got 2"
    )
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        await one.run(cupy.ones((4, 5), cupy.float32), cupy.ones((5, 6), cupy.float32))
    message = (  # (a call's own operands checked, named by their places in the program)
        "einsum program operand 0 must be float32 of shape (4, 5) on device 0 (as the program "
        "was made), got float32 of shape (5, 4) on device 0; make a program for these with "
        "einsum_program"
    )
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        await one.run(cupy.ones((5, 4), cupy.float32))
    message = "the operands at positions [0] of this einsum program (ij,jk->) are 1, got 2"
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        program.check([cupy.ones((4, 5), cupy.float32)] * 2, positions=[0])
    message = "positions must be the program's inputs' (0 to 1: ij,jk->), got [0, 2]"
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        program.check([cupy.ones((4, 5), cupy.float32)] * 2, positions=[0, 2])
    assert float(await one.run(cupy.full((4, 5), 2, cupy.float32))) == 3.0
    refused = 0

    async def ask() -> None:
        nonlocal refused
        try:
            await batcher.run(cupy.ones((4, 5), cupy.float32), cupy.ones((5, 6), cupy.float32))
        except QueueFull:
            refused += 1

    async with anyio.create_task_group() as tasks:
        for _ in range(4):
            tasks.start_soon(ask)
    assert refused == 3
    assert batcher.stats().rejected == 3
