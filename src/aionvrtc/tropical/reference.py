"""A NumPy implementation of the tropical products, for tests and as a CPU fallback.

Same semantics as the GPU kernels: integer infinities are the type's extremes and arithmetic
saturates; a float product that is NaN (-inf + inf) counts as the semiring's zero; the argmax
is the smallest k attaining the result, or -1 when the result is the semiring's zero (K = 0, or
no k contributes). Works in chunks of rows so memory stays bounded. ``einsum`` generalises the
product to any contraction of tensors over the same semirings; with ``count=True`` it also
counts the assignments attaining each value, with ``top=k`` it keeps the k best values with
their counts, and ``configurations`` lists every assignment attaining a scalar contraction's
value, ``samples`` draws from them uniformly without listing them, ``top_configurations``
lists those of the k best values. ``polynomial`` and
``partition_function`` sum over every valid assignment of a scalar
network instead: how many have each size (exactly), and the log of the sum of exp(beta * size).
"""

from __future__ import annotations

from .networks._reference import configurations, einsum, samples, top_configurations
from .networks._sums import MAX_SPAN, partition_function, polynomial
from .products._reference import MAX_BYTES, matmul

__all__ = [
    "MAX_BYTES",
    "MAX_SPAN",
    "configurations",
    "einsum",
    "matmul",
    "partition_function",
    "polynomial",
    "samples",
    "top_configurations",
]
