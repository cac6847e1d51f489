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
