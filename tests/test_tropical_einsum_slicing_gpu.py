"""tropical.einsum in slices (memory_limit=) on the GPU: against the NumPy reference along the
same path and against the unsliced run, for every semiring and type, with an output, out= and
views; the argmax's assignment (the winning slice's, its sliced indices included) checked on the
host; a budget as a fraction of free memory; a sliced plan passed as optimize=.

Each test draws fresh operands from a seed it prints; ``TROPICAL_TEST_SEED=<seed>`` repeats it.
"""

from __future__ import annotations

import re
import string
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from aionvrtc import tropical
from aionvrtc.tropical import SEMIRINGS, reference

from .support.einsum import (
    ARGMAX_CASES,
    CASES,
    IDS,
    PETERSEN,
    assert_same,
    check_assignment,
    independent_sets,
    kings_graph,
    network_values,
    random_network,
    tensors,
)
from .support.tropical_data import gpu, host

pytestmark = pytest.mark.gpu


def quarter(plan: Any, itemsize: int) -> int:
    """A budget of a quarter of the plan's largest intermediate (at least one element): one
    that makes it sliced, unless its largest holds fewer than two."""
    return max(1, round(2 ** float(plan.space_complexity)) // 4) * itemsize


def sliced_network(rng: np.random.Generator) -> tuple[str, list[tuple[int, ...]]]:
    """A random scalar network whose largest intermediate holds four elements or more."""
    while True:
        subscripts, shapes = random_network(rng, int(rng.integers(8, 12)), int(rng.integers(7, 10)))
        if tropical.einsum_plan(subscripts, *shapes).space_complexity >= 2:
            return subscripts, shapes


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_slices_summed_on_the_gpu_are_the_whole_contraction(
    ring: str, dtype: Any, rng: np.random.Generator
) -> None:
    for _ in range(3):
        subscripts, shapes = sliced_network(rng)
        operands = tensors(rng, ring, dtype, shapes)
        arrays = [gpu(x) for x in operands]
        whole = tropical.einsum_plan(subscripts, *arrays)
        budget = quarter(whole, np.dtype(dtype).itemsize)
        plan = tropical.einsum_plan(subscripts, *arrays, memory_limit=budget)
        assert plan.slicing is not None
        assert plan.slicing.count > 1
        got = await tropical.einsum(subscripts, *arrays, semiring=ring, memory_limit=budget)
        want = reference.einsum(subscripts, *operands, semiring=ring, path=plan.path)
        assert_same(got, want, f"{ring} {subscripts}\n{plan}")
        unsliced = await tropical.einsum(subscripts, *arrays, semiring=ring)
        assert_same(unsliced, want, f"unsliced {ring} {subscripts}")


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
def test_an_output_and_out_in_slices(ring: str, dtype: Any, rng: np.random.Generator) -> None:
    import cupy

    subscripts = "ab,bcd,cde->ae"
    operands = tensors(rng, ring, dtype, [(40, 50), (50, 30, 20), (30, 20, 60)])
    # Views: the first operand transposed in memory, the second every other row of a larger one.
    first = gpu(np.ascontiguousarray(operands[0].T)).T
    second = gpu(np.repeat(operands[1], 2, axis=0))[::2]
    arrays = [first, second, gpu(operands[2])]
    budget = 40 * 60 * np.dtype(dtype).itemsize  # the output itself: every index b, c, d sliced
    plan = tropical.einsum_plan(subscripts, *arrays, memory_limit=budget)
    assert plan.slicing is not None
    assert set(plan.slicing.indices) <= {"b", "c", "d"}
    want = reference.einsum(subscripts, *operands, semiring=ring, path=plan.path)
    got = tropical.einsum_sync(subscripts, *arrays, semiring=ring, memory_limit=budget)
    assert_same(got, want, f"{ring}\n{plan}")
    out = cupy.empty((60, 40), dtype).T  # not contiguous
    result = tropical.einsum_sync(subscripts, *arrays, semiring=ring, memory_limit=budget, out=out)
    assert result is out
    assert_same(out, want, f"out= {ring}")


@pytest.mark.parametrize(("ring", "dtype"), ARGMAX_CASES)
def test_argmax_in_slices_is_the_winning_slices_assignment(
    ring: str, dtype: str, rng: np.random.Generator
) -> None:
    attained = 0
    for _ in range(6):
        subscripts, shapes = sliced_network(rng)
        operands = network_values(rng, ring, dtype, shapes)
        arrays = [gpu(x) for x in operands]
        plan = tropical.einsum_plan(subscripts, *arrays)
        budget = quarter(plan, np.dtype(dtype).itemsize)
        value, assignment = tropical.einsum_sync(
            subscripts, *arrays, semiring=ring, argmax=True, memory_limit=budget
        )
        want = reference.einsum(subscripts, *operands, semiring=ring)
        assert_same(value, want, f"{ring} {subscripts}")
        check_assignment(subscripts, operands, ring, host(value), assignment)
        attained += int(host(value) != SEMIRINGS[ring].zero(np.dtype(dtype)))
    assert attained > 0


@pytest.mark.parametrize("ring", ["maxplus", "minplus"])
def test_a_maximum_independent_set_in_slices(ring: str) -> None:
    subscripts, operands = independent_sets(10, PETERSEN, ring, "float32")
    arrays = [gpu(x) for x in operands]
    plan = tropical.einsum_plan(subscripts, *arrays, memory_limit=8)  # 2 float32s a slice
    assert plan.slicing is not None
    value, assignment = tropical.einsum_sync(
        subscripts, *arrays, semiring=ring, argmax=True, optimize=plan
    )
    assert host(value).item() == (4 if ring == "maxplus" else -4)
    chosen = {v for v in range(10) if assignment[string.ascii_lowercase[v]] == 1}
    assert len(chosen) == 4
    assert not any(u in chosen and v in chosen for u, v in PETERSEN)


def test_a_fraction_of_free_memory_and_bad_budgets() -> None:
    subscripts, operands = independent_sets(10, PETERSEN, "maxplus", "float32")
    arrays = [gpu(x) for x in operands]
    value = tropical.einsum_sync(subscripts, *arrays, memory_limit=0.5)  # fits: not sliced
    assert host(value).item() == 4
    bad: Any
    for bad in (0, -1, 0.0, 1.5, "1G", True):
        with pytest.raises(ValueError, match="memory_limit must be"):
            tropical.einsum_sync(subscripts, *arrays, memory_limit=bad)
    with pytest.raises(ValueError, match="the smallest that does is 4 bytes"):
        tropical.einsum_sync(subscripts, *arrays, memory_limit=2)
    # A fraction is of the free memory: 2 bytes' worth of it is under one float32, refused as 2
    # bytes are; 12 bytes' worth slices down to what fits.
    import cupy

    free, _ = cupy.cuda.Device().mem_info
    with pytest.raises(ValueError, match="the smallest that does is 4 bytes"):
        tropical.einsum_sync(subscripts, *arrays, memory_limit=2.5 / free)
    assert host(tropical.einsum_sync(subscripts, *arrays, memory_limit=12.5 / free)).item() == 4


def test_a_program_of_a_sliced_plan_is_refused() -> None:
    subscripts, operands = independent_sets(10, PETERSEN, "maxplus", "float32")
    arrays = [gpu(x) for x in operands]
    plan = tropical.einsum_plan(subscripts, *arrays, memory_limit=8)
    assert plan.slicing is not None
    with pytest.raises(
        ValueError,
        match=rf"the plan is sliced \({plan.slicing.count} slices over .* pass the plan to einsum",
    ):
        tropical.einsum_program_sync(subscripts, *arrays, optimize=plan)


# -- the slices over several GPUs --------------------------------------------------------------


def device_count() -> int:
    import cupy

    return int(cupy.cuda.runtime.getDeviceCount())


@pytest.fixture
def two_gpus() -> None:
    if device_count() < 2:
        pytest.skip("needs two GPUs: run it on a machine with two")


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
def test_slices_over_two_devices_are_the_whole_contraction(
    ring: str, dtype: Any, rng: np.random.Generator, two_gpus: None
) -> None:
    import cupy

    for home in (0, 1):
        subscripts, shapes = sliced_network(rng)
        operands = tensors(rng, ring, dtype, shapes)
        with cupy.cuda.Device(home):
            arrays = [gpu(x) for x in operands]
        budget = quarter(tropical.einsum_plan(subscripts, *arrays), np.dtype(dtype).itemsize)
        plan = tropical.einsum_plan(subscripts, *arrays, memory_limit=budget)
        assert plan.slicing is not None
        got = tropical.einsum_sync(
            subscripts, *arrays, semiring=ring, memory_limit=budget, devices=[0, 1]
        )
        assert got.device.id == home  # summed where the operands are
        want = reference.einsum(subscripts, *operands, semiring=ring, path=plan.path)
        assert_same(got, want, f"{ring} {subscripts} from device {home}\n{plan}")
    # The operands' device need not run a slice: the result still lands there.
    got = tropical.einsum_sync(subscripts, *arrays, semiring=ring, memory_limit=budget, devices=[0])
    assert got.device.id == 1
    assert_same(got, want, f"{ring} {subscripts} on device 0 alone")


@pytest.mark.parametrize(("ring", "dtype"), ARGMAX_CASES)
def test_argmax_over_two_devices(
    ring: str, dtype: str, rng: np.random.Generator, two_gpus: None
) -> None:
    for _ in range(4):
        subscripts, shapes = sliced_network(rng)
        operands = network_values(rng, ring, dtype, shapes)
        arrays = [gpu(x) for x in operands]
        budget = quarter(tropical.einsum_plan(subscripts, *arrays), np.dtype(dtype).itemsize)
        value, assignment = tropical.einsum_sync(
            subscripts, *arrays, semiring=ring, argmax=True, memory_limit=budget,
            devices=[0, 1],
        )  # fmt: skip
        want = reference.einsum(subscripts, *operands, semiring=ring)
        assert_same(value, want, f"{ring} {subscripts}")
        check_assignment(subscripts, operands, ring, host(value), assignment)


def test_devices_must_be_distinct_devices_of_the_host() -> None:
    subscripts, operands = independent_sets(10, PETERSEN, "maxplus", "float32")
    arrays = [gpu(x) for x in operands]
    count = device_count()
    assert host(tropical.einsum_sync(subscripts, *arrays, devices=[0])).item() == 4
    assert host(tropical.einsum_sync(subscripts, *arrays, memory_limit=8, devices=[0])) == 4
    bad: Any
    for bad in ([0, 0], [count], [-1], []):
        with pytest.raises(ValueError, match=f"distinct devices of the {count} this process"):
            tropical.einsum_sync(subscripts, *arrays, memory_limit=8, devices=bad)
    for bad in (0, "0", [0.0], [True]):
        with pytest.raises(ValueError, match="a list of device numbers such as"):
            tropical.einsum_sync(subscripts, *arrays, memory_limit=8, devices=bad)


@pytest.mark.parametrize("ring", ["maxplus", "andor"])
def test_without_a_program_the_slices_launch_their_steps(
    ring: str, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A program holds every intermediate at once; where it cannot be allocated the slices run
    # their prepared steps instead. (The allocation failure is injected: a real one needs a
    # network that fills the device.)
    import cupy

    from aionvrtc.tropical.networks import _sliced

    def out_of_memory(*args: Any, **kwargs: Any) -> Any:
        raise cupy.cuda.memory.OutOfMemoryError(1 << 40, 0, 0)
        yield  # (a generator, as the real one)

    monkeypatch.setattr(_sliced, "make_program", out_of_memory)
    dtype = "bool" if ring == "andor" else "float32"
    subscripts, shapes = sliced_network(rng)
    operands = tensors(rng, ring, dtype, shapes)
    arrays = [gpu(x) for x in operands]
    budget = quarter(tropical.einsum_plan(subscripts, *arrays), np.dtype(dtype).itemsize)
    plan = tropical.einsum_plan(subscripts, *arrays, memory_limit=budget)
    got = tropical.einsum_sync(subscripts, *arrays, semiring=ring, memory_limit=budget)
    want = reference.einsum(subscripts, *operands, semiring=ring, path=plan.path)
    assert_same(got, want, f"{ring} {subscripts}\n{plan}")


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every EinsumProgram made while the test runs, in order."""
    from aionvrtc.tropical.networks import _programs

    found: list[Any] = []

    class Counted(_programs.EinsumProgram):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            found.append(self)

    monkeypatch.setattr(_programs, "EinsumProgram", Counted)
    return found


def first_program(made: list[Any], subscripts: str, arrays: Any, plan: Any, want: Any) -> Any:
    """The sliced einsum along ``plan``, checked against ``want``, again until a program is
    made (its kernels load in the background, where the first call found them missing; until
    then the slices launch their steps): the program."""
    for _ in range(1200):
        assert_same(tropical.einsum_sync(subscripts, *arrays, optimize=plan), want, str(plan))
        if made:
            return made[0]
        time.sleep(0.1)
    raise AssertionError("no program was made")


def test_slices_replay_a_program_only_where_the_cache_keeps_it(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, made: list[Any]
) -> None:
    # A slice's program is kept (and replayed by the next call) within MAX_PROGRAM_BYTES; past
    # it none is made, where one made again for every call would cost its capture each time:
    # the slices launch their prepared steps.
    from aionvrtc.tropical.networks import _programs

    subscripts, shapes = sliced_network(rng)
    operands = tensors(rng, "maxplus", "float32", shapes)
    arrays = [gpu(x) for x in operands]
    budget = quarter(tropical.einsum_plan(subscripts, *arrays), 4)
    plan = tropical.einsum_plan(subscripts, *arrays, memory_limit=budget)
    assert plan.slicing is not None
    want = reference.einsum(subscripts, *operands, path=plan.path)
    tropical.clear_programs()
    kept = first_program(made, subscripts, arrays, plan, want)
    assert made == [kept]  # made once
    assert list(_programs._programs.values()) == [kept]
    assert kept.plan.subscripts == plan.slicing.subscripts
    assert_same(tropical.einsum_sync(subscripts, *arrays, optimize=plan), want, str(plan))
    assert made == [kept]  # replayed, not made again
    tropical.clear_programs()
    monkeypatch.setattr(_programs, "MAX_PROGRAM_BYTES", kept.nbytes - 1)
    prepared: list[Any] = []
    steps = _programs._steps

    def counted(*args: Any) -> Any:
        prepared.append(args)
        return steps(*args)

    monkeypatch.setattr(_programs, "_steps", counted)
    for _ in range(2):  # none made, nor its steps prepared: its size is known
        assert_same(tropical.einsum_sync(subscripts, *arrays, optimize=plan), want, str(plan))
    assert made == [kept]
    assert not prepared
    assert not _programs._programs


def test_a_slice_program_kept_only_because_its_buffers_share_bytes(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, made: list[Any]
) -> None:
    # A program's buffers are placed by their lifetimes: the arena of a slice of the 5 x 5
    # king's graph (along its row-by-row path) holds far less than its intermediates at once.
    # With MAX_PROGRAM_BYTES between the two, the program is kept and the slices replay it.
    from aionvrtc.tropical.networks import _programs

    subscripts, shapes, path = kings_graph(5)
    operands = tensors(rng, "maxplus", "float32", shapes)
    arrays = [gpu(x) for x in operands]
    whole = tropical.einsum_plan(subscripts, *arrays, optimize=path)
    budget = quarter(whole, 4) * 2
    plan = tropical.einsum_plan(subscripts, *arrays, optimize=path, memory_limit=budget)
    assert plan.slicing is not None
    want = reference.einsum(subscripts, *operands, path=plan.path)

    def run() -> Any:
        tropical.clear_programs()
        made.clear()
        return first_program(made, subscripts, arrays, plan, want)

    kept = run()
    every = kept._steps.nbytes  # the steps' blocks side by side, as the steps placed them
    print(f"arena {kept.arena_bytes:,} bytes of {every:,}; live {kept.plan.live_elements * 4:,}")
    assert kept.arena_bytes * 2 < every
    # Kept within the program's own bytes, which with every block apart it would pass.
    monkeypatch.setattr(_programs, "MAX_PROGRAM_BYTES", kept.nbytes)
    again = run()
    assert list(_programs._programs.values()) == [again]
    for _ in range(2):  # replayed, not made again
        assert_same(tropical.einsum_sync(subscripts, *arrays, optimize=plan), want, str(plan))
    assert made == [again]


@pytest.mark.parametrize(("ring", "dtype"), ARGMAX_CASES)
def test_a_cluster_workers_shares_of_the_slices(
    ring: str, dtype: str, rng: np.random.Generator
) -> None:
    # What each Ray task of tropical.cluster runs on its GPU (Ray itself is tested with CPU
    # workers): shares of the slices summed, their values, and the winning slice's assignment.
    from aionvrtc.tropical.networks._sliced import assignment_sync, partial_sync
    from aionvrtc.tropical.networks._slicing import best_slice, sum_into

    subscripts, shapes = sliced_network(rng)
    operands = network_values(rng, ring, dtype, shapes)
    whole = tropical.einsum_plan(subscripts, *operands)
    budget = max(1, round(2**whole.space_complexity) // 8) * np.dtype(dtype).itemsize
    plan = tropical.einsum_plan(subscripts, *operands, memory_limit=budget)
    assert plan.slicing is not None
    count = plan.slicing.count
    shares = [range(0, count // 3), range(count // 3, count)]
    done = [partial_sync(plan, ring, operands, share, scored=True) for share in shares]
    total = np.array(done[0][0])
    for part, _ in done[1:]:
        sum_into(SEMIRINGS[ring].add, np, total, part)
    want = reference.einsum(subscripts, *operands, semiring=ring)
    np.testing.assert_array_equal(total, want)
    values = np.concatenate([scores for _, scores in done])
    assert len(values) == count
    best = best_slice(SEMIRINGS[ring].add, values)
    assert values[best] == want
    found = assignment_sync(plan, ring, operands, best)
    check_assignment(subscripts, operands, ring, want, found)
    unsliced = tropical.einsum_plan(subscripts, *operands)
    value, scores = partial_sync(unsliced, ring, operands, range(1), scored=True)
    np.testing.assert_array_equal(value, want)
    np.testing.assert_array_equal(scores, [want])
    check_assignment(subscripts, operands, ring, want, assignment_sync(unsliced, ring, operands, 0))


@pytest.mark.parametrize("program", [True, False], ids=["program", "steps"])
def test_a_sliced_index_repeated_in_an_operand(
    program: bool, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # i twice in the first operand (its diagonal), j and i sliced: each slice's part of the
    # first operand is one element of the diagonal's rows.
    import cupy

    from aionvrtc.tropical.networks import _sliced

    if not program:

        def out_of_memory(*args: Any, **kwargs: Any) -> Any:
            raise cupy.cuda.memory.OutOfMemoryError(1 << 40, 0, 0)
            yield

        monkeypatch.setattr(_sliced, "make_program", out_of_memory)
    subscripts = "iij,jk,ki->"
    operands = tensors(rng, "maxplus", "float64", [(6, 6, 5), (5, 7), (7, 6)])
    arrays = [gpu(x) for x in operands]
    plan = tropical.einsum_plan(subscripts, *arrays, memory_limit=7 * 8)
    assert plan.slicing is not None
    assert "i" in plan.slicing.indices
    got = tropical.einsum_sync(subscripts, *arrays, optimize=plan)
    want = reference.einsum(subscripts, *operands, path=plan.path)
    assert_same(got, want, f"{subscripts}\n{plan}")


def test_out_of_the_wrong_kind_is_refused_in_slices() -> None:
    import cupy

    subscripts = "ab,bcd,cde->ae"
    arrays = [cupy.ones(s, cupy.float32) for s in [(4, 5), (5, 3, 2), (3, 2, 6)]]
    budget = 4 * 6 * 4
    for out, what in [
        (cupy.empty((4, 6), cupy.float64), "float64"),
        (cupy.empty((1, 4, 6), cupy.float32), "(1, 4, 6)"),
    ]:
        wanted = r"out must be float32 of shape \(4, 6\) on device 0, got .*" + re.escape(what)
        with pytest.raises(ValueError, match=wanted):
            tropical.einsum_sync(subscripts, *arrays, memory_limit=budget, out=out)


def test_calls_queued_back_to_back_on_two_devices_keep_their_results(
    rng: np.random.Generator, two_gpus: None
) -> None:
    # Programs are shared: a call from device 1 replays device 1's program while the call
    # before (from device 0, over both devices) may still be summing its slices there.
    import cupy

    subscripts, shapes = sliced_network(rng)
    first = tensors(rng, "maxplus", "float32", shapes)
    second = tensors(rng, "maxplus", "float32", shapes)
    on_0 = [gpu(x) for x in first]
    with cupy.cuda.Device(1):
        on_1 = [gpu(x) for x in second]
    budget = quarter(tropical.einsum_plan(subscripts, *on_0), 4)
    results = []
    for _ in range(3):
        a = tropical.einsum_sync(subscripts, *on_0, memory_limit=budget, devices=[0, 1])
        with cupy.cuda.Device(1):
            b = tropical.einsum_sync(subscripts, *on_1, memory_limit=budget, devices=[1])
        results.append((a, b))
    plan = tropical.einsum_plan(subscripts, *on_0, memory_limit=budget)
    want_a = reference.einsum(subscripts, *first, path=plan.path)
    want_b = reference.einsum(subscripts, *second, path=plan.path)
    for a, b in results:
        assert_same(a, want_a, "the call over both devices")
        assert_same(b, want_b, "the call on device 1")


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_sliced_run_waits_for_no_kernel_of_its_program(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    """Serving in "error" mode (a compile in front of a call raises), with a slice's step
    kernels loaded but not its program's: the slices launch their steps at once while the
    program's kernels load in the background; a later call replays the program. Values as the
    reference's every time, and no compile in front of any call."""
    from aionvrtc import Compiler
    from aionvrtc.tropical.networks import _programs

    subscripts, shapes = sliced_network(rng)
    operands = tensors(rng, "maxplus", "float32", shapes)
    arrays = [gpu(x) for x in operands]
    budget = quarter(tropical.einsum_plan(subscripts, *arrays), 4)
    plan = tropical.einsum_plan(subscripts, *arrays, memory_limit=budget)
    assert plan.slicing is not None
    want = reference.einsum(subscripts, *operands, path=plan.path)
    async with Compiler(cache_dir=tmp_path) as compiler:
        # One slice contracted eagerly: its steps' kernels loaded, not the program's gather.
        views = plan.slicing.views(plan.inputs, arrays, 0)
        await tropical.einsum(plan.slicing.subscripts, *views, optimize=list(plan.path),
                              compiler=compiler)  # fmt: skip
        compiles = compiler.stats().compiles
        compiler.start_serving("error")
        tropical.clear_programs()
        got = await tropical.einsum(subscripts, *arrays, optimize=plan, compiler=compiler)
        assert_same(got, want, f"on the steps\n{plan}")
        assert not _programs._programs
        with anyio.fail_after(120):  # the program's kernels compile in the background
            while not _programs._programs:
                await anyio.sleep(0.05)
                got = await tropical.einsum(subscripts, *arrays, optimize=plan, compiler=compiler)
                assert_same(got, want, f"replayed\n{plan}")
        stats = compiler.stats()
        assert stats.hot_compiles == 0
        assert stats.compiles > compiles  # the program's, in the background
