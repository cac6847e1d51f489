"""tropical.cluster on a real local Ray cluster of CPU workers: a sliced contraction's slices as
Ray tasks running the NumPy reference (backend="numpy"), summed on the caller, against the
unsliced reference for every semiring; shares of slices, an unsliced contraction, and what is
refused. Seeded: the networks are the same every run."""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from aionvrtc import tropical
from aionvrtc.tropical import reference

from .support import ROOT
from .support.einsum import in_eighths, network_values, random_network

ray = pytest.importorskip("ray", reason="tropical.cluster needs Ray: pip install 'aionvrtc[ray]'")

from aionvrtc.tropical import cluster  # noqa: E402  (after ray, which it needs)
from aionvrtc.tropical.networks import _cluster  # noqa: E402


@pytest.fixture(scope="module")
def local_cluster() -> Iterator[None]:
    ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, logging_level="ERROR")
    try:
        yield
    finally:
        ray.shutdown()


def network(seed: int, ring: str, dtype: str) -> tuple[str, list[Any]]:
    rng = np.random.default_rng(seed)
    subscripts, shapes = random_network(rng, 10, 9)
    operands = network_values(rng, ring, dtype, shapes)
    if ring == "andor":
        operands = [x > 0 for x in operands]
    elif ring == "maxmul":
        operands = [np.abs(x) for x in operands]
    return subscripts, operands


@pytest.mark.parametrize(
    ("ring", "dtype"),
    [("maxplus", "float64"), ("minplus", "int32"), ("maxmul", "int64"), ("andor", "bool")],
)
def test_slices_as_ray_tasks_sum_to_the_whole_contraction(
    local_cluster: None, ring: str, dtype: str
) -> None:
    subscripts, operands = network(17, ring, dtype)
    budget, plan, want = in_eighths(subscripts, operands, ring)
    for tasks in (None, 1, 3, plan.slicing.count + 5):  # more tasks than slices: one each
        got = cluster.einsum(
            subscripts, *operands, semiring=ring, optimize=plan, tasks=tasks, backend="numpy"
        )
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype
    got = cluster.einsum(subscripts, *operands, semiring=ring, memory_limit=budget, backend="numpy")
    np.testing.assert_array_equal(got, want)


def test_an_unsliced_contraction_with_an_output_is_one_task(local_cluster: None) -> None:
    rng = np.random.default_rng(5)
    a, b = rng.integers(-9, 10, (6, 7)), rng.integers(-9, 10, (7, 5))
    got = cluster.einsum("ij,jk->ik", a, b, semiring="minplus", backend="numpy")
    np.testing.assert_array_equal(got, reference.matmul(a, b, "minplus"))


def test_what_is_refused(local_cluster: None) -> None:
    subscripts, operands = network(3, "maxplus", "float32")
    with pytest.raises(ValueError, match="backend must be one of cupy, numpy, got 'jax'"):
        cluster.einsum(subscripts, *operands, backend="jax")
    with pytest.raises(ValueError, match="argmax=True finds the assignment on a GPU"):
        cluster.einsum(subscripts, *operands, argmax=True, backend="numpy")
    tasks: Any
    for tasks in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="tasks must be an int >= 1"):
            cluster.einsum(subscripts, *operands, tasks=tasks, backend="numpy")
    with pytest.raises(ValueError, match="the smallest that does is"):
        cluster.einsum(subscripts, *operands, memory_limit=1, backend="numpy")
    with pytest.raises(RuntimeError, match="the Ray cluster has no GPU, so no task of"):
        cluster.einsum(subscripts, *operands)  # backend="cupy" on CPU workers: never runs
    want = reference.einsum(subscripts, *operands)
    tasks = np.int64(2)  # a NumPy integer as well
    got = cluster.einsum(subscripts, *operands, tasks=tasks, backend="numpy")
    np.testing.assert_array_equal(got, want)


def test_without_a_cluster_it_says_to_start_one() -> None:
    code = (
        "import numpy as np\n"
        "from aionvrtc.tropical import cluster\n"
        "try:\n"
        "    cluster.einsum('ij,jk->', np.ones((2, 2)), np.ones((2, 2)), backend='numpy')\n"
        "except RuntimeError as error:\n"
        "    print(error)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
        check=True,
    )  # fmt: skip
    assert done.stdout.strip() == (
        "no Ray cluster: call ray.init(address=...) (or ray.init() for one on this machine) first"
    )


# -- a contraction that lives on the cluster -----------------------------------------------------


def test_a_contraction_on_the_cluster_is_contracted_again_with_each_call(
    local_cluster: None,
) -> None:
    subscripts, operands = network(19, "maxplus", "int64")
    _, plan, want = in_eighths(subscripts, operands, "maxplus")
    with cluster.Contraction(subscripts, *operands, optimize=plan, backend="numpy") as held:
        assert len(held.shares) == 2  # (the cluster's two CPUs)
        assert held.shares[0][0] == 0
        assert held.shares[-1][1] == plan.slicing.count
        for _ in range(3):
            np.testing.assert_array_equal(held(), want)
        assert held.puts == len(operands)
        assert held.fetched() == [len(operands)] * 2  # each operand fetched once by each actor
        # The same operands again (equal copies): nothing is put or fetched again.
        np.testing.assert_array_equal(held(*[x.copy() for x in operands]), want)
        assert held.puts == len(operands)
        # One operand changed: it alone is put, and fetched once by each actor.
        changed = list(operands)
        changed[3] = changed[3] + 1
        np.testing.assert_array_equal(
            held(*changed), reference.einsum(subscripts, *changed, path=plan.path)
        )
        assert held.puts == len(operands) + 1
        assert held.fetched() == [len(operands) + 1] * 2
        np.testing.assert_array_equal(
            held(), reference.einsum(subscripts, *changed, path=plan.path)
        )  # (what a call changed is held)


def test_a_contraction_awaited_from_an_event_loop(local_cluster: None) -> None:
    import anyio

    subscripts, operands = network(23, "minplus", "float64")
    _, plan, want = in_eighths(subscripts, operands, "minplus")
    held = cluster.Contraction(
        subscripts, *operands, semiring="minplus", optimize=plan, actors=1, backend="numpy"
    )
    try:

        async def twice() -> list[Any]:
            return [await held.run(), await held.run(*operands)]

        for got in anyio.run(twice):
            np.testing.assert_array_equal(got, want)
        # Calls side by side with other operands: each gets its own operands' value.
        other = [x + 1 if i % 2 else x for i, x in enumerate(operands)]
        other_want = reference.einsum(subscripts, *other, semiring="minplus", path=plan.path)

        async def side_by_side() -> list[Any]:
            found: list[Any] = [None] * 6

            async def call(n: int) -> None:
                found[n] = await held.run(*(operands if n % 2 else other))

            async with anyio.create_task_group() as group:
                for n in range(6):
                    group.start_soon(call, n)
            return found

        for n, got in enumerate(anyio.run(side_by_side)):
            np.testing.assert_array_equal(got, want if n % 2 else other_want)
    finally:
        held.close()
    with pytest.raises(ValueError, match="this Contraction is closed: make a new one"):
        held()


def test_a_contractions_killed_worker_is_started_again_with_the_right_value(
    local_cluster: None,
) -> None:
    """An actor killed between calls, and one killed while a call runs: Ray starts it again
    and retries the call there, the operands fetched again; never a wrong value. Without
    retries, a killed actor's call raises Ray's error."""
    subscripts, operands = network(29, "maxplus", "int32")
    _, plan, want = in_eighths(subscripts, operands, "maxplus")
    with cluster.Contraction(subscripts, *operands, optimize=plan, backend="numpy") as held:
        np.testing.assert_array_equal(held(), want)
        ray.kill(held.actors[0], no_restart=False)
        np.testing.assert_array_equal(held(), want)
        assert held.fetched()[0] == len(operands)  # (all again, on the restarted actor)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            running = pool.submit(held)  # a call in flight, its first actor killed under it
            ray.kill(held.actors[0], no_restart=False)
            np.testing.assert_array_equal(running.result(timeout=120), want)
    with cluster.Contraction(
        subscripts, *operands, optimize=plan, backend="numpy", retries=0
    ) as fragile:
        np.testing.assert_array_equal(fragile(), want)
        ray.kill(fragile.actors[0])
        with pytest.raises(ray.exceptions.RayActorError):
            fragile()


def test_a_semiring_object_is_taken_as_its_name(local_cluster: None) -> None:
    subscripts, operands = network(37, "minplus", "int32")
    want = reference.einsum(subscripts, *operands, semiring="minplus")
    ring = tropical.SEMIRINGS["minplus"]
    got = cluster.einsum(subscripts, *operands, semiring=ring, backend="numpy")  # type: ignore[arg-type]
    np.testing.assert_array_equal(got, want)
    with cluster.Contraction(subscripts, *operands, semiring=ring, backend="numpy") as held:  # type: ignore[arg-type]
        np.testing.assert_array_equal(held(), want)
    with pytest.raises(ValueError, match="semiring"):
        cluster.einsum(subscripts, *operands, semiring="bogus", backend="numpy")


def test_what_a_contraction_refuses(local_cluster: None, monkeypatch: pytest.MonkeyPatch) -> None:
    subscripts, operands = network(31, "maxplus", "float32")
    with pytest.raises(ValueError, match="actors must be an int >= 1, got 0"):
        cluster.Contraction(subscripts, *operands, actors=0, backend="numpy")
    _, plan, _ = in_eighths(subscripts, operands, "maxplus")
    with pytest.raises(ValueError, match=r"^actors: 3 wanted, but 2 of the cluster's 2 CPUs"):
        cluster.Contraction(subscripts, *operands, optimize=plan, actors=3, backend="numpy")
    # (unsliced, one actor is all a contraction takes)
    with cluster.Contraction(subscripts, *operands, actors=3, backend="numpy") as one:
        assert one.shares == [(0, 1)]
    with pytest.raises(TypeError, match="einsum operands must have one dtype"):
        cluster.Contraction(subscripts, operands[0].astype(np.float64), *operands[1:],
                            backend="numpy")  # fmt: skip
    with pytest.raises(ValueError, match="retries must be an int >= 0, got -1"):
        cluster.Contraction(subscripts, *operands, retries=-1, backend="numpy")
    with pytest.raises(RuntimeError, match="the Ray cluster has no GPU, so no actor of"):
        cluster.Contraction(subscripts, *operands)
    with cluster.Contraction(subscripts, *operands, optimize=plan, backend="numpy") as held:
        with pytest.raises(ValueError, match=r"pass every operand anew \(\d+\), or none"):
            held(operands[0])
        wrong = [x.astype(np.float64) for x in operands]
        with pytest.raises(ValueError, match=r"operand 0 must be of shape .* and dtype float32"):
            held(*wrong)
        # A refused call changes nothing held: the operands before the wrong one neither.
        want = reference.einsum(subscripts, *operands)
        late = [x + 1 for x in operands[:-1]] + [operands[-1].astype(np.float64)]
        with pytest.raises(ValueError, match=rf"operand {len(operands) - 1} must be of shape"):
            held(*late)
        assert held.puts == len(operands)
        np.testing.assert_array_equal(held(), want)
        # Both CPUs are held by this contraction's actors: another is refused, not left
        # waiting forever.
        monkeypatch.setattr(_cluster, "ACTORS_WAIT", 0.5)  # (it waits for none to end)
        with pytest.raises(ValueError, match="but 0 of the cluster's 2 CPUs are free now"):
            cluster.Contraction(subscripts, *operands, backend="numpy")
