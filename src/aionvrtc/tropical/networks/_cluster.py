"""``tropical.cluster.einsum``: a sliced contraction's slices as Ray tasks (tropical/cluster.py
says how it is used), and the tasks' bodies: a share of the slices on a GPU (_sliced) or with
the NumPy reference, and the winning slice's assignment."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..products import semiring as lookup
from ._plan import EinsumPlan
from ._planner import einsum_plan
from ._runs import check_scalar
from ._slicing import best_slice, sum_into
from ._subscripts import check_semiring

__all__ = ["einsum"]

_BACKENDS = ("cupy", "numpy")


def einsum(
    subscripts: str,
    *operands: Any,
    semiring: str = "maxplus",
    argmax: bool = False,
    optimize: Any = "auto",
    memory_limit: int | None = None,
    tasks: int | None = None,
    backend: str = "cupy",
) -> Any:
    """The tropical einsum of NumPy arrays in slices, as Ray tasks on a Ray cluster.

    The cluster is the one that ``ray.init`` connected this process to; the semantics and
    arguments are ``tropical.einsum``'s (``optimize``, ``memory_limit`` in bytes). The plan is
    made here (``einsum_plan``), the operands are put once in Ray's object store, each task
    contracts a share of consecutive slices on one GPU (or CPU, with ``backend="numpy"``), and
    the tasks' sums are summed here. A contraction that is not sliced is one task. Refused
    before any task: a cluster without GPUs for ``backend="cupy"`` (its tasks would wait
    forever).

    Args:
        subscripts: NumPy's einsum grammar, as ``tropical.einsum`` takes it.
        *operands: The tensors, one per operand of ``subscripts``: NumPy arrays (or what
            ``numpy.asarray`` takes) of one dtype that ``semiring`` takes.
        semiring: ``"maxplus"``, ``"minplus"``, ``"maxmul"`` or ``"andor"``.
        argmax: Also find an assignment that attains the result, for a scalar contraction
            (an output of no indices) with ``backend="cupy"``: one more task contracts the
            winning slice with its argmax.
        optimize: The order, as ``einsum_plan`` takes it; pass a plan from ``einsum_plan``
            (``memory_limit=`` there) to plan once.
        memory_limit: Bytes: slice the contraction so that no intermediate of a slice holds
            more (as ``einsum_plan`` takes it: no fraction of a device's memory here).
        tasks: How many tasks to split the slices into, as even as they come (default: the
            cluster's GPUs, or its CPUs with ``backend="numpy"``); never more than the slices.
        backend: ``"cupy"``: each task contracts its slices with ``tropical.einsum``'s sliced
            run on its GPU. ``"numpy"``: with the NumPy reference on a CPU worker, for tests
            and machines without GPUs.

    Returns:
        The result, a NumPy array; with ``argmax=True`` the pair (value, assignment), the
        assignment a dict giving every index of ``subscripts`` a value at which the product
        of the operands' entries attains the value.

    Raises:
        ImportError: Ray is not installed (``pip install 'aionvrtc[ray]'``).
        TypeError: ``subscripts`` is not a str.
        ValueError: ``backend`` is neither ``"cupy"`` nor ``"numpy"``; ``argmax=True`` with
            ``backend="numpy"``; ``semiring`` is not one of ``SEMIRINGS``; ``argmax=True`` for
            an output with indices; ``tasks`` is not an int >= 1; what ``einsum_plan`` refuses
            (the subscripts, the operands' shapes, ``optimize``, ``memory_limit``).
        RuntimeError: ``ray.init`` was not called, or the cluster has no GPU for
            ``backend="cupy"``.
        ray.exceptions.RayTaskError: A task failed, such as on a dtype that the semiring does
            not take (the tasks check the dtypes); Ray raises it as an instance of the task's
            error's class too.
    """
    import ray

    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(_BACKENDS)}, got {backend!r}")
    if argmax and backend != "cupy":
        raise ValueError(
            "argmax=True finds the assignment on a GPU: use backend='cupy' (the NumPy reference "
            "has no argmax)"
        )
    ring = lookup(semiring)
    check_semiring(subscripts, semiring)
    arrays = [np.asarray(x) for x in operands]
    planned = einsum_plan(subscripts, *arrays, optimize=optimize, memory_limit=memory_limit)
    if argmax:
        check_scalar(planned, "tropical.cluster.einsum")
    count = planned.slicing.count if planned.slicing is not None else 1
    if not ray.is_initialized():
        raise RuntimeError(
            "no Ray cluster: call ray.init(address=...) (or ray.init() for one on this machine) "
            "first"
        )
    resource = "GPU" if backend == "cupy" else "CPU"
    available = int(ray.cluster_resources().get(resource, 0))  # type: ignore[no-untyped-call]
    if backend == "cupy" and available < 1:
        raise RuntimeError(
            "the Ray cluster has no GPU, so no task of backend='cupy' could ever run; start "
            "workers with GPUs, or pass backend='numpy' for CPU workers"
        )
    if tasks is None:
        tasks = max(1, available)
    if isinstance(tasks, bool) or not isinstance(tasks, int | np.integer) or tasks < 1:
        raise ValueError(f"tasks must be an int >= 1, got {tasks!r}")
    options = {"num_gpus": 1} if backend == "cupy" else {"num_cpus": 1}
    task = ray.remote(_contract).options(**options)
    stored = [ray.put(x) for x in arrays]
    plan = ray.put(planned)
    # At most ``tasks`` shares of consecutive slices, as even as they come.
    cuts = np.linspace(0, count, min(int(tasks), count) + 1).round().astype(int)
    done = ray.get([
        task.remote(plan, ring.name, backend, (int(a), int(b)), argmax, *stored)
        for a, b in itertools.pairwise(cuts)
    ])  # fmt: skip
    total = np.array(done[0][0])  # (Ray's results are read-only views of its store)
    for part, _ in done[1:]:
        sum_into(ring.add, np, total, part)
    if not argmax:
        return total
    values = np.concatenate([scores for _, scores in done])
    best = best_slice(ring.add, values)
    found = ray.get(
        ray.remote(_assignment).options(num_gpus=1).remote(plan, ring.name, best, *stored)
    )
    return total, found


def _contract(
    planned: EinsumPlan,
    semiring: str,
    backend: str,
    numbers: tuple[int, int],
    scored: bool,
    *arrays: Any,
) -> tuple[Any, Any]:
    """In a Ray task: the sum of the slices ``range(*numbers)`` of ``planned`` and each one's
    value (scalar contractions; else None)."""
    if backend == "numpy":
        return _on_cpu(planned, semiring, range(*numbers), arrays, scored)
    from ._sliced import partial_sync

    return partial_sync(planned, semiring, arrays, range(*numbers), scored=scored)


def _on_cpu(
    planned: EinsumPlan, semiring: str, numbers: range, arrays: Sequence[Any], scored: bool
) -> tuple[Any, Any]:
    from ._reference import einsum as numpy_einsum

    ring = lookup(semiring)
    slicing = planned.slicing
    if slicing is None:
        value = numpy_einsum(planned.subscripts, *arrays, semiring=semiring, path=planned.path)
        return value, (np.array([value]) if scored else None)
    total, scores = None, []
    for number in numbers:
        views = slicing.views(planned.inputs, arrays, number)
        part = numpy_einsum(slicing.subscripts, *views, semiring=semiring, path=planned.path)
        scores.append(part)
        if total is None:
            total = np.array(part)
        else:
            sum_into(ring.add, np, total, part)
    return total, (np.array(scores) if scored else None)


def _assignment(planned: EinsumPlan, semiring: str, best: int, *arrays: Any) -> dict[str, int]:
    """In a Ray task on a GPU: the assignment of slice ``best`` (or of the whole contraction)."""
    from ._sliced import assignment_sync

    return assignment_sync(planned, semiring, arrays, best)
