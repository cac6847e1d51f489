"""Compile and serve CUDA kernels through aionvrtc's cache.

Run twice: the first run compiles with NVRTC, the second is served from the disk cache.
On a machine with no GPU it compiles for ``--arch`` (default sm_90) and says what it would run.
"""

from __future__ import annotations

import argparse
import time

import aionvrtc
from aionvrtc import KernelCache, KernelSpec, NoDeviceError, Target

SOURCE = r"""
template <typename T>
__global__ void axpy(T a, const T* x, T* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""
EXPRESSIONS = ("axpy<float>", "axpy<double>")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arch", help="target such as sm_90 (default: this GPU's, else sm_90)")
    args = parser.parse_args()
    try:
        gpu: Target | None = Target.current()
    except NoDeviceError:
        gpu = None
    target = Target(args.arch) if args.arch else (gpu or Target("sm_90"))
    if gpu is None:
        print(f"no usable GPU here: compiling for {target} only")

    spec = KernelSpec(SOURCE, name_expressions=EXPRESSIONS, options=("-std=c++17",), name="axpy.cu")
    cache = KernelCache(target)
    started = time.perf_counter()
    artifact = cache.get_or_compile(spec)
    elapsed = time.perf_counter() - started
    stats = cache.stats()
    source = "NVRTC" if stats.compiles else "the disk cache"
    print(
        f"aionvrtc {aionvrtc.__version__}: {artifact.kind} for {artifact.arch}, "
        f"{len(artifact.image)} bytes from {source} in {elapsed * 1e3:.1f} ms"
    )
    print(f"cache: {cache.disk.dir if cache.disk else 'memory only'}  key {artifact.key[:16]}...")
    for expression, lowered in artifact.lowered_names.items():
        print(f"  {expression:14} -> {lowered}")
    if gpu != target:
        print("would run: axpy<float> and axpy<double> on 2**20 elements, checked against NumPy")
        return
    run_on_gpu(artifact)


def run_on_gpu(artifact: aionvrtc.Artifact) -> None:
    import cupy
    from cupy.cuda.function import Module

    module = Module()
    module.load(artifact.image)
    n = 1 << 20
    for expression, dtype in zip(EXPRESSIONS, (cupy.float32, cupy.float64), strict=True):
        x = cupy.random.random(n).astype(dtype)
        y = cupy.random.random(n).astype(dtype)
        want = 2 * x + y
        kernel = module.get_function(artifact.lowered_names[expression])
        kernel(((n + 255) // 256,), (256,), (dtype(2), x, y, cupy.int32(n)))
        error = float(cupy.abs(y - want).max())
        print(f"  ran {expression} on {n} elements: max error {error:.2e}")
        assert error < 1e-5


if __name__ == "__main__":
    main()
