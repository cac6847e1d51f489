"""KernelSpecs for tests: tiny distinct kernels, slow ones, and where a cache dir keeps entries."""

from __future__ import annotations

import itertools
import os

from aionvrtc import FORMAT_VERSION, KernelSpec

# The folder of a cache dir that holds this format's entries.
ENTRIES = f"v{FORMAT_VERSION}"


_serial = itertools.count()


# A process-unique salt: NVRTC 13 keeps a cross-process cache of compiled programs
# (~/.nv/ComputeCache), and tests that count compiles or need a slow compile must never see
# another run's kernel.
_SALT = f"{os.getpid()}_{id(_serial)}"


TEMPLATE = """
template <typename T>
__global__ void scale_{tag}(T* x, T factor, int n) {{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= factor;
}}
"""


def make_spec(tag: str | None = None, **kwargs: object) -> KernelSpec:
    """A tiny templated kernel, distinct per call unless ``tag`` is given."""
    tag = tag or f"k{_SALT}_{next(_serial)}"
    kwargs.setdefault("name_expressions", (f"scale_{tag}<float>",))
    return KernelSpec(TEMPLATE.format(tag=tag), **kwargs)  # type: ignore[arg-type]


SLOW_TEMPLATE = """
__global__ void slow_{salt}_{tag}(float* x) {{
    float a = x[threadIdx.x];
    #pragma unroll
    for (int i = 0; i < {depth}; ++i) a = sinf(a) * 1.0001f + (float)(i ^ {tag});
    x[threadIdx.x] = a;
}}
"""


def make_slow_spec(depth: int = 30) -> KernelSpec:
    """A kernel that takes NVRTC a few hundred milliseconds, for overlap and race tests."""
    # Salted per process: NVRTC 13's cross-process cache of compiled programs (~/.nv) would
    # make a kernel compiled by an earlier run fast.
    return KernelSpec(SLOW_TEMPLATE.format(tag=next(_serial), depth=depth, salt=_SALT))
