"""How an asyncio service tests its own code that uses aionvrtc, under pytest-asyncio (the plugin
most asyncio projects test with; the rest of this suite runs under anyio's).

Two ways to hold a Compiler, both shown here: one per test, in a function-scoped fixture (each
test starts cold, with its own cache dir), or one for the whole session, opened in a
session-scoped event loop and shared by every test that runs in that loop (kernels compiled by
one test are memory hits in the next; the Compiler closes when the session ends). A Compiler's
tasks live in the loop that opened it: tests that share a session Compiler must run in the
session's loop too (``@pytest.mark.asyncio(loop_scope="session")``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from aionvrtc import Compiler, KernelSpec

# The service's own code under test: a handler that asks the Compiler for a kernel and answers
# with what a caller needs of it.
SCALE = KernelSpec(
    "template <typename T> __global__ void scale(T* x, T a) { x[threadIdx.x] *= a; }",
    name_expressions=("scale<float>", "scale<double>"),
    name="scale.cu",
)


async def lowered_names(compiler: Compiler, spec: KernelSpec) -> dict[str, str]:
    """What the service answers: the kernel's mangled names by name expression."""
    artifact = await compiler.compile(spec)
    return dict(artifact.lowered_names)


# -- a Compiler per test ---------------------------------------------------------------------


@pytest_asyncio.fixture
async def compiler(tmp_path: Path) -> AsyncIterator[Compiler]:
    async with Compiler(arch="sm_90", cache_dir=tmp_path) as compiler:
        yield compiler
    assert compiler.closed  # left open, its task would outlive the test's loop


@pytest.mark.asyncio
async def test_a_handler_with_a_compiler_of_its_own(compiler: Compiler) -> None:
    names = await lowered_names(compiler, SCALE)
    assert sorted(names) == ["scale<double>", "scale<float>"]
    assert names["scale<float>"].startswith("_Z5scaleIfEvPT_S0_")
    again = await lowered_names(compiler, SCALE)  # a memory hit: nothing compiled again
    assert again == names
    stats = compiler.stats()
    assert (stats.requests, stats.compiles, stats.memory.hits) == (2, 1, 1)


@pytest.mark.asyncio
async def test_concurrent_requests_in_one_test_compile_once(compiler: Compiler) -> None:
    answers = await asyncio.gather(*(lowered_names(compiler, SCALE) for _ in range(8)))
    assert all(answer == answers[0] for answer in answers)
    stats = compiler.stats()
    assert (stats.requests, stats.compiles, stats.joined) == (8, 1, 7)


# -- one Compiler for the session -----------------------------------------------------------

SESSION_LOOPS: list[asyncio.AbstractEventLoop] = []
SERVED: list[str] = []  # what the session Compiler has served, in order


@pytest_asyncio.fixture(loop_scope="session", scope="session")
async def shared_compiler(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Compiler]:
    cache_dir = tmp_path_factory.mktemp("shared-compiler")
    async with Compiler(arch="sm_90", cache_dir=cache_dir) as compiler:
        SESSION_LOOPS.append(asyncio.get_running_loop())
        yield compiler
    assert compiler.closed  # at the end of the session; what it compiled stays on disk


@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize("request_number", range(3))
async def test_tests_share_one_session_compiler(
    shared_compiler: Compiler, request_number: int
) -> None:
    # Whichever of these tests runs first compiles the kernel; the others are memory hits.
    assert [asyncio.get_running_loop()] == SESSION_LOOPS  # the loop that opened the Compiler
    before = shared_compiler.stats()
    names = await lowered_names(shared_compiler, SCALE)
    after = shared_compiler.stats()
    assert sorted(names) == ["scale<double>", "scale<float>"]
    first = "scale" not in SERVED
    SERVED.append("scale")
    assert after.compiles - before.compiles == (1 if first else 0)
    assert after.memory.hits - before.memory.hits == (0 if first else 1)


@pytest.mark.asyncio(loop_scope="session")
async def test_a_prefetch_in_one_test_is_a_hit_in_another(shared_compiler: Compiler) -> None:
    warm = KernelSpec(
        "__global__ void warm_later(float* x) { x[threadIdx.x] = 1.0f; }", name="warm.cu"
    )
    held = shared_compiler.stats().memory.entries
    assert shared_compiler.prefetch([warm]) == 1
    async with asyncio.timeout(60):  # the warm-up runs in the background: wait until it is in
        while shared_compiler.stats().memory.entries == held:
            await asyncio.sleep(0.01)
    before = shared_compiler.stats()
    artifact = await shared_compiler.compile(warm)
    after = shared_compiler.stats()
    assert artifact.image.startswith(b"\x7fELF")
    assert after.memory.hits == before.memory.hits + 1  # prefetched: served from memory
    assert after.compiles == before.compiles
