"""tropical.cluster on a real local Ray cluster with this machine's GPUs (backend="cupy"): a
sliced contraction's slices as Ray tasks, one GPU each, summed on the caller, and the winning
slice's assignment, against the NumPy reference. Seeded networks, printed."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from .support.einsum import check_assignment, in_eighths, network_values, random_network

pytestmark = pytest.mark.gpu

ray = pytest.importorskip("ray", reason="tropical.cluster needs Ray: pip install 'aionvrtc[ray]'")

from aionvrtc.tropical import cluster  # noqa: E402  (after ray, which it needs)


@pytest.fixture(scope="module")
def gpu_cluster() -> Iterator[int]:
    import cupy

    gpus = cupy.cuda.runtime.getDeviceCount()
    ray.init(num_cpus=2, num_gpus=gpus, include_dashboard=False, logging_level="ERROR")
    try:
        yield gpus
    finally:
        ray.shutdown()


@pytest.mark.parametrize(("ring", "dtype"), [("maxplus", "float32"), ("minplus", "int64")])
def test_slices_as_ray_tasks_on_gpus(gpu_cluster: int, ring: str, dtype: str) -> None:
    seed = 41 if ring == "maxplus" else 43
    print(f"seed {seed}, {gpu_cluster} GPU(s)")
    rng = np.random.default_rng(seed)
    subscripts, shapes = random_network(rng, 10, 9)
    operands = network_values(rng, ring, dtype, shapes)
    _, plan, want = in_eighths(subscripts, operands, ring)
    for tasks in (None, 3):
        got = cluster.einsum(subscripts, *operands, semiring=ring, optimize=plan, tasks=tasks)
        np.testing.assert_array_equal(got, want)
    value, assignment = cluster.einsum(
        subscripts, *operands, semiring=ring, optimize=plan, argmax=True
    )
    np.testing.assert_array_equal(value, want)
    check_assignment(subscripts, operands, ring, want, assignment)


@pytest.mark.parametrize(("ring", "dtype"), [("maxplus", "float32"), ("minplus", "int64")])
def test_a_contraction_on_gpu_actors_is_contracted_again(
    gpu_cluster: int, ring: str, dtype: str
) -> None:
    """Actors holding the plan, the operands on their GPUs and the programs: repeated calls,
    an operand changed (it alone put and fetched), the assignment from the winning slice's
    actor, and an actor killed between calls, started again."""
    seed = 47 if ring == "maxplus" else 53
    print(f"seed {seed}, {gpu_cluster} GPU(s)")
    rng = np.random.default_rng(seed)
    subscripts, shapes = random_network(rng, 10, 9)
    operands = network_values(rng, ring, dtype, shapes)
    _, plan, want = in_eighths(subscripts, operands, ring)
    with cluster.Contraction(subscripts, *operands, semiring=ring, optimize=plan,
                             argmax=True) as held:  # fmt: skip
        assert len(held.actors) == gpu_cluster
        for _ in range(3):
            value, assignment = held()
            np.testing.assert_array_equal(value, want)
            check_assignment(subscripts, operands, ring, want, assignment)
        changed = list(operands)
        changed[2] = network_values(rng, ring, dtype, [operands[2].shape])[0]  # (fresh values)
        from aionvrtc.tropical import reference

        again = reference.einsum(subscripts, *changed, semiring=ring, path=plan.path)
        value, assignment = held(*changed)
        np.testing.assert_array_equal(value, again)
        check_assignment(subscripts, changed, ring, again, assignment)
        assert held.puts == len(operands) + 1
        ray.kill(held.actors[0], no_restart=False)
        np.testing.assert_array_equal(held()[0], again)
