"""Compile and serve CUDA kernels with aionvrtc's async compile service.

100 concurrent requests for a templated kernel share one compile; the result lands in memory and
on disk, so a second run is served from the disk cache. On a GPU the kernels run and are checked
against NumPy; on a machine without one, they are compiled for ``--arch`` (default
``$AIONVRTC_ARCH``, else sm_90) and the example says what it would run.

    python examples/quickstart.py [--arch sm_90]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import anyio
import numpy as np

import aionvrtc
from aionvrtc import Compiler, KernelSpec, ModuleLoadError, NoDeviceError, resolve_target

SOURCE = r"""
template <typename T>
__global__ void axpy(T a, const T* x, T* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""
SPEC = KernelSpec(
    SOURCE,
    name_expressions=("axpy<float>", "axpy<double>"),
    options=("-std=c++17",),
    name="axpy.cu",
)


async def main(arch: str | None) -> None:
    # --arch, else $AIONVRTC_ARCH, else this GPU's; sm_90 on a machine without one.
    target = resolve_target(arch, default="sm_90")
    async with Compiler(arch=target) as compiler:
        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(100):  # e.g. 100 requests arriving at a cold server at once
                tg.start_soon(compiler.compile, SPEC)
        elapsed = time.perf_counter() - started
        artifact = await compiler.compile(SPEC)
        stats = compiler.stats()
        source = "NVRTC" if stats.compiles else "the disk cache"
        print(
            f"aionvrtc {aionvrtc.__version__}: 100 requests, {stats.compiles} compile(s), "
            f"{stats.joined} joined, {stats.disk.hits} disk hit(s): a {artifact.kind} for "
            f"{artifact.arch} ({len(artifact.image)} bytes) from {source} in {elapsed * 1e3:.1f} ms"
        )
        for expression, lowered in sorted(artifact.lowered_names.items()):
            print(f"  {expression:14} -> {lowered}")
        try:
            module = await compiler.get(SPEC)
        except (NoDeviceError, ModuleLoadError) as exc:  # no GPU here, or a driver too old
            print(
                f"no usable GPU for {target} here ({type(exc).__name__}): would run: axpy<float> "
                "and axpy<double> on 2**20 elements, checked against NumPy"
            )
            return
        for expression, dtype in (("axpy<float>", np.float32), ("axpy<double>", np.float64)):
            error = await run(module, expression, dtype)
            print(f"  ran {expression} on 2**20 elements: max error against NumPy {error:.1e}")
            assert error < 1e-5


async def run(module: aionvrtc.Module, expression: str, dtype: Any) -> float:
    import cupy

    n = 1 << 20
    rng = np.random.default_rng()
    x, y = rng.random(n).astype(dtype), rng.random(n).astype(dtype)
    x_gpu, y_gpu = cupy.asarray(x), cupy.asarray(y)
    kernel = module.get_function(expression)
    kernel(((n + 255) // 256,), (256,), (dtype(2), x_gpu, y_gpu, np.int32(n)))
    await aionvrtc.synchronize()  # the event loop keeps serving while the GPU works
    return float(np.abs(cupy.asnumpy(y_gpu) - (2 * x + y)).max())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--arch", help="target such as sm_90 (default: $AIONVRTC_ARCH, this GPU's, else sm_90)"
    )
    anyio.run(main, parser.parse_args().arch)
