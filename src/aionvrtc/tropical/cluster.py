"""A sliced tropical einsum on a Ray cluster: the slices of a plan as Ray tasks, one GPU each,
their sums gathered and summed on the caller's machine::

    import ray
    from aionvrtc import tropical
    from aionvrtc.tropical import cluster

    ray.init(address="auto")  # an existing cluster (or ray.init() for one on this machine)
    plan = tropical.einsum_plan(subscripts, *operands, memory_limit=8 << 30)
    value = cluster.einsum(subscripts, *operands, optimize=plan)

The operands are NumPy arrays, put once in Ray's object store; each task gets a share of the
slice numbers (as many tasks as the cluster has GPUs, by default), contracts them with
``tropical.einsum``'s sliced run on its GPU (``backend="cupy"``) or with the NumPy reference
(``backend="numpy"``: CPU workers, for tests and machines without GPUs), and returns its sum and
each of its slices' value. Scheduling, retries of a task whose worker died, and moving the
arrays are Ray's. With ``argmax=True`` (GPUs only) one more task contracts the winning slice
with its argmax. Needs ``pip install 'aionvrtc[ray]'``.

A network contracted again and again lives on the cluster as a ``Contraction``: its operands
put once, Ray actors (one a GPU) holding the plan, the operands on their GPUs and what they
prepared and compiled across calls, a call sending only the operands that changed::

    with cluster.Contraction(subscripts, *operands, optimize=plan) as contraction:
        value = contraction()            # the operands held
        value = contraction(*changed)    # those that differ put again, the rest reused
"""

from .networks._cluster import Contraction, einsum

__all__ = ["Contraction", "einsum"]
