"""``tropical.cluster``: a sliced contraction's slices as Ray tasks (``einsum``), or held by Ray
actors across calls (``Contraction``); tropical/cluster.py says how they are used. The tasks'
and actors' bodies: a share of the slices on a GPU (_sliced) or with the NumPy reference, and
the winning slice's assignment."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..products import Semiring, cupy_module
from ..products import semiring as lookup
from ._plan import EinsumPlan
from ._planner import einsum_plan
from ._runs import check_scalar
from ._slicing import best_slice, sum_into
from ._subscripts import check_dtypes, check_semiring

__all__ = ["Contraction", "einsum"]

_BACKENDS = ("cupy", "numpy")
# Seconds a Contraction waits for its GPUs (or CPUs) to be free before it refuses.
ACTORS_WAIT = 10.0


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

    ring, planned, arrays, shares = _planned(
        subscripts, operands, semiring=semiring, argmax=argmax, optimize=optimize,
        memory_limit=memory_limit, workers=tasks, backend=backend, name="tasks",
        caller="tropical.cluster.einsum",
    )  # fmt: skip
    options = {"num_gpus": 1} if backend == "cupy" else {"num_cpus": 1}
    task = ray.remote(_contract).options(**options)
    stored = [ray.put(x) for x in arrays]
    plan = ray.put(planned)
    done = ray.get([
        task.remote(plan, ring.name, backend, share, argmax, *stored) for share in shares
    ])  # fmt: skip
    total, best = _summed(ring, done, argmax=argmax)
    if best is None:
        return total
    found = ray.get(
        ray.remote(_assignment).options(num_gpus=1).remote(plan, ring.name, best, *stored)
    )
    return total, found


def _planned(
    subscripts: str,
    operands: Sequence[Any],
    *,
    semiring: str,
    argmax: bool,
    optimize: Any,
    memory_limit: int | None,
    workers: int | None,
    backend: str,
    name: str,
    caller: str,
) -> tuple[Semiring, EinsumPlan, list[Any], list[tuple[int, int]]]:
    """What ``einsum`` and ``Contraction`` check first, and plan: the semiring, the plan, the
    operands as NumPy arrays, and the shares of consecutive slices, at most ``workers`` (the
    argument ``name``; default: the cluster's GPUs, or CPUs for ``backend="numpy"``; for
    actors, those free now), as even as they come."""
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
        check_scalar(planned, caller)
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
            f"the Ray cluster has no GPU, so no {name[:-1]} of backend='cupy' could ever run; "
            "start workers with GPUs, or pass backend='numpy' for CPU workers"
        )
    if workers is not None and (
        isinstance(workers, bool) or not isinstance(workers, int | np.integer) or workers < 1
    ):
        raise ValueError(f"{name} must be an int >= 1, got {workers!r}")
    if name == "actors":  # an actor holds its GPU (or CPU) for life: those free
        free = _free(resource, int(workers or 1), ACTORS_WAIT)
        wanted = min(int(workers if workers is not None else max(1, free)), count)
        if wanted > free:
            raise ValueError(
                f"actors: {wanted} wanted, but {free} of the cluster's {available} {resource}s "
                "are free now (an actor holds one for its life, so one more would wait "
                "forever): pass fewer, or close() the Contractions holding them"
            )
        workers = wanted
    elif workers is None:
        workers = max(1, available)
    cuts = np.linspace(0, count, min(int(workers), count) + 1).round().astype(int)
    return ring, planned, arrays, [(int(a), int(b)) for a, b in itertools.pairwise(cuts)]


def _free(resource: str, wanted: int, wait: float) -> int:
    """How many of the cluster's ``resource`` are free, waiting up to ``wait`` seconds for
    ``wanted`` (actors just ended give theirs back a moment after)."""
    import ray

    deadline = time.monotonic() + wait
    while True:
        free = int(ray.available_resources().get(resource, 0))  # type: ignore[no-untyped-call]
        if free >= wanted or time.monotonic() > deadline:
            return free
        time.sleep(0.05)


def _summed(ring: Semiring, done: Sequence[tuple[Any, Any]], *, argmax: bool) -> tuple[Any, Any]:
    """The shares' sums summed (``done``: each share's sum and its slices' values, in slice
    order), and with ``argmax`` the number of the first slice that attains the total."""
    total = np.array(done[0][0])  # (Ray's results are read-only views of its store)
    for part, _ in done[1:]:
        sum_into(ring.add, np, total, part)
    if not argmax:
        return total, None
    return total, best_slice(ring.add, np.concatenate([scores for _, scores in done]))


def _contract(
    planned: EinsumPlan,
    semiring: str,
    backend: str,
    numbers: tuple[int, int],
    scored: bool,
    *arrays: Any,
) -> tuple[Any, Any]:
    """In a Ray task or a Contraction's actor: the sum of the slices ``range(*numbers)`` of
    ``planned`` and each one's value (scalar contractions; else None)."""
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
    """In a Ray task or a Contraction's actor, on a GPU: the assignment of slice ``best`` (or
    of the whole contraction)."""
    from ._sliced import assignment_sync

    return assignment_sync(planned, semiring, arrays, best)


class Contraction:
    """A contraction that lives on a Ray cluster, contracted again with each call.

    Made once: the plan is made here, the operands are put once in Ray's object store, and
    one Ray actor per share of the slices (one GPU each, or one CPU with
    ``backend="numpy"``) holds the plan, its copy of the operands (on its GPU), and what it
    prepared and compiled for its slices (the plans of one slice, the prepared steps, the
    programs: ``tropical.einsum``'s caches, in the actor's process) across calls. A call
    (``contraction()``, or ``await contraction.run()``) sends each actor only the references
    of the operands; an operand given anew to a call is put again only where it differs
    from the one held, and each actor fetches only the operands it has not seen. The
    actors' sums are summed here; with ``argmax=True`` the actor holding the winning slice
    finds its assignment.

    Scheduling, object transfer and retries stay Ray's: an actor whose worker dies is
    started again (``retries`` times) and the call it was running is retried there, the
    operands fetched again from the store, so a call gives the right value or raises
    ``ray.exceptions.RayActorError``, never a wrong value. ``close()`` (or ``with``) ends
    the actors.

    Args:
        subscripts: NumPy's einsum grammar, as ``tropical.einsum`` takes it.
        *operands: The tensors: NumPy arrays (or what ``numpy.asarray`` takes) of one dtype
            that ``semiring`` takes.
        semiring: ``"maxplus"``, ``"minplus"``, ``"maxmul"`` or ``"andor"``.
        argmax: Also find an assignment that attains the result (scalar contractions,
            ``backend="cupy"``).
        optimize: The order, as ``einsum_plan`` takes it (a plan from ``einsum_plan``, with
            its slicing, to plan once).
        memory_limit: Bytes: slice the contraction so that no intermediate of a slice holds
            more.
        actors: How many actors share the slices (default: the cluster's GPUs free now, or
            its CPUs with ``backend="numpy"``); never more than the slices. Each holds its GPU
            (or CPU) until ``close()``.
        backend: ``"cupy"`` (each actor on a GPU, ``tropical.einsum``'s sliced run) or
            ``"numpy"`` (the NumPy reference on a CPU worker, for tests and machines without
            GPUs).
        retries: How many times an actor is started again after its worker died, and a call
            it was running retried (Ray's ``max_restarts`` and ``max_task_retries``).

    Attributes:
        plan: The ``EinsumPlan`` the actors run.
        shares: Each actor's slices, as (first, past the last) slice numbers.
        actors: The Ray actors, one per share, in order (``[]`` once closed).
        puts: How many operands were put in the object store so far (once each when made,
            then one per operand that a call changed).

    Raises:
        ImportError: Ray is not installed (``pip install 'aionvrtc[ray]'``).
        TypeError: The operands' dtypes differ, or ``semiring`` does not take theirs.
        ValueError: What ``tropical.cluster.einsum`` refuses; ``actors`` is not an int >= 1,
            or more than the cluster's GPUs (CPUs for ``backend="numpy"``) free within
            ``ACTORS_WAIT`` seconds; ``retries`` is not an int >= 0.
        RuntimeError: As ``tropical.cluster.einsum``: no Ray cluster, or one without a GPU
            for ``backend="cupy"``.
    """

    def __init__(
        self,
        subscripts: str,
        *operands: Any,
        semiring: str = "maxplus",
        argmax: bool = False,
        optimize: Any = "auto",
        memory_limit: int | None = None,
        actors: int | None = None,
        backend: str = "cupy",
        retries: int = 3,
    ) -> None:
        import ray

        if isinstance(retries, bool) or not isinstance(retries, int | np.integer) or retries < 0:
            raise ValueError(f"retries must be an int >= 0, got {retries!r}")
        self._ring, self.plan, arrays, self.shares = _planned(
            subscripts, operands, semiring=semiring, argmax=argmax, optimize=optimize,
            memory_limit=memory_limit, workers=actors, backend=backend, name="actors",
            caller="tropical.cluster.Contraction",
        )  # fmt: skip
        check_dtypes(self._ring, arrays)  # (before any actor: each call would fail)
        self._argmax = argmax
        self._layouts = [(x.shape, x.dtype) for x in arrays]
        self._lock = threading.Lock()
        self._refs = [ray.put(x) for x in arrays]
        # What each reference holds, to compare an operand given anew with (views of the
        # object store's copies on this node: no copy of ours).
        self._stored = [ray.get(ref) for ref in self._refs]
        self.puts = len(self._refs)
        resources = {"num_gpus": 1} if backend == "cupy" else {"num_cpus": 1}
        holder = ray.remote(_Holder).options(
            max_restarts=int(retries), max_task_retries=int(retries), **resources
        )
        # The plan's reference is held as long as the actors are: an actor started again
        # after its worker died is made from it again.
        self._plan: Any = ray.put(self.plan)
        self.actors: list[Any] = [
            holder.remote(self._plan, self._ring.name, backend, share, argmax)
            for share in self.shares
        ]

    def __call__(self, *operands: Any) -> Any:
        """Contract again: with the operands held, or with ``operands`` (every one, in order;
        those that differ from the held ones are put and sent).

        Args:
            *operands: None, or every operand anew: NumPy arrays of the shapes and dtype the
                contraction was made with.

        Returns:
            As ``tropical.cluster.einsum``: the result, a NumPy array; with ``argmax=True``
            the pair (value, assignment).

        Raises:
            ValueError: Operands of another number, shape or dtype; the contraction is closed.
            ray.exceptions.RayActorError: An actor's worker died more than ``retries`` times.
        """
        import ray

        calls, refs = self._submit(operands)
        total, best = _summed(self._ring, ray.get(calls), argmax=self._argmax)
        if best is None:
            return total
        return total, ray.get(self._holder_of(best).assignment.remote(best, refs))

    async def run(self, *operands: Any) -> Any:
        """``contraction(*operands)`` for an event loop: the actors' results awaited, the
        loop never blocked.

        Args:
            *operands: As ``__call__``.

        Returns:
            As ``__call__``.

        Raises:
            ValueError: As ``__call__``.
            ray.exceptions.RayActorError: As ``__call__``.
        """
        import anyio.to_thread

        # (the operands compared and put in a worker thread: O(their bytes))
        calls, refs = await anyio.to_thread.run_sync(self._submit, operands)
        done = [await call for call in calls]
        total, best = _summed(self._ring, done, argmax=self._argmax)
        if best is None:
            return total
        return total, await self._holder_of(best).assignment.remote(best, refs)

    def fetched(self) -> list[int]:
        """How many operands each actor has fetched from the object store so far (each once,
        then those that calls changed; all again after a restart).

        Returns:
            One count per actor, in the order of ``shares``.

        Raises:
            ValueError: The contraction is closed.
        """
        import ray

        return list(ray.get([actor.fetched.remote() for actor in self._live()]))

    def close(self) -> None:
        """End the actors (their GPUs' memory let go) and let go of the operands in the object
        store. Calls after raise a ValueError."""
        import ray

        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
        self._stored = []  # (the operands' objects let go with their references)
        self._refs = []
        self._plan = None

    def __enter__(self) -> Contraction:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _live(self) -> list[Any]:
        if not self.actors:
            raise ValueError("this Contraction is closed: make a new one")
        return self.actors

    def _submit(self, operands: Sequence[Any]) -> tuple[list[Any], list[Any]]:
        """The operands given anew (every one checked first, then the changed ones put),
        then each actor's call: the calls, and the references they were sent (the
        assignment's call is sent the same)."""
        import ray

        actors = self._live()
        given = [np.asarray(x) for x in operands]
        if given and len(given) != len(self._refs):
            raise ValueError(
                f"pass every operand anew ({len(self._refs)}), or none to contract the ones "
                f"held; got {len(given)}"
            )
        for i, new in enumerate(given):
            shape, dtype = self._layouts[i]
            if (new.shape, new.dtype) != (shape, dtype):
                raise ValueError(
                    f"operand {i} must be of shape {shape} and dtype {dtype}, as the "
                    f"contraction was made with; got {new.shape} and {new.dtype}"
                )
        with self._lock:  # (calls from several threads: each sends one call's operands)
            for i, new in enumerate(given):
                if not np.array_equal(new, self._stored[i], equal_nan=new.dtype.kind == "f"):
                    self._refs[i] = ray.put(new)
                    self._stored[i] = ray.get(self._refs[i])
                    self.puts += 1
            refs = list(self._refs)
            # The references nested in a list: Ray leaves them unresolved, and each actor
            # fetches only those it has not seen.
            return [actor.contract.remote(refs) for actor in actors], refs

    def _holder_of(self, number: int) -> Any:
        """The actor whose share holds slice ``number``."""
        for actor, (first, last) in zip(self._live(), self.shares, strict=True):
            if first <= number < last:
                return actor
        raise AssertionError(f"no share holds slice {number}")


class _Holder:
    """A Ray actor's state: the plan, its share of the slices, and the operands it fetched
    (by the references it was sent; on its GPU for ``backend="cupy"``)."""

    def __init__(
        self, planned: EinsumPlan, semiring: str, backend: str, share: tuple[int, int], scored: bool
    ) -> None:
        self._planned, self._semiring, self._backend = planned, semiring, backend
        self._share, self._scored = share, scored
        self._held: list[tuple[Any, Any]] = []  # (reference, array) per operand
        self._fetched = 0

    def contract(self, refs: Sequence[Any]) -> tuple[Any, Any]:
        """The sum of this share's slices and each one's value, over the operands ``refs``."""
        return _contract(self._planned, self._semiring, self._backend, self._share,
                         self._scored, *self._arrays(refs))  # fmt: skip

    def assignment(self, best: int, refs: Sequence[Any]) -> dict[str, int]:
        """The assignment of slice ``best`` (this share's), on this actor's GPU."""
        return _assignment(self._planned, self._semiring, best, *self._arrays(refs))

    def fetched(self) -> int:
        return self._fetched

    def _arrays(self, refs: Sequence[Any]) -> list[Any]:
        """The operands of ``refs``: those held, the others fetched (and on a GPU, copied
        there once)."""
        import ray

        if len(self._held) != len(refs):
            self._held = [(None, None)] * len(refs)
        for i, ref in enumerate(refs):
            if self._held[i][0] != ref:
                array = ray.get(ref)
                if self._backend == "cupy":
                    array = cupy_module().asarray(array)
                self._held[i] = (ref, array)
                self._fetched += 1
        return [array for _, array in self._held]
