"""Tropical GEMM throughput against the register peak probe, measured side by side in one run,
with CuPy and PyTorch broadcast-and-reduce for comparison. Correctness is checked first.

    python benchmarks/tropical_gemm.py [--out DIR] [--quick]

Throughput is quoted as the anchors do, in tropical ops/s = 2 * M * N * K / time (an add and a
max per (m, n, k)); ratios compare pairs/s = M * N * K / time with the probe's add+max pairs/s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aionvrtc import tropical
from aionvrtc.tropical import reference
from benchmarks import peak_probe
from benchmarks._results import RESULTS, gpu_facts, write

PROBE_FOR = {"float32": "f32", "float64": "f64", "int32": "i32_dpx", "int64": "i32"}


def random(shape: tuple[int, ...], dtype: Any, ring: str) -> Any:
    import cupy

    if np.dtype(dtype).kind == "f":
        x = cupy.random.standard_normal(shape, dtype=np.float32).astype(dtype)
    else:
        x = cupy.random.randint(-1000, 1000, size=shape).astype(dtype)
    return cupy.abs(x) if ring == "maxmul" else x


def timed(call: Any, repeats: int) -> float:
    """Median seconds of ``call`` (GPU work on the current stream), timed with CUDA events."""
    import cupy

    call()
    samples = []
    for _ in range(repeats):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        call()
        stop.record()
        stop.synchronize()
        samples.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    return float(statistics.median(samples))


def check_small(ring: str, dtype: Any, argmax: bool) -> None:
    """Whole result against the reference on fresh random inputs, odd sizes."""
    import cupy

    a, b = random((301, 257), dtype, ring), random((257, 199), dtype, ring)
    got = tropical.matmul_sync(a, b, ring, argmax=argmax)
    want = reference.matmul(cupy.asnumpy(a), cupy.asnumpy(b), ring, argmax=argmax)
    if argmax:
        assert np.array_equal(cupy.asnumpy(got[0]), want[0]), (ring, dtype)
        assert np.array_equal(cupy.asnumpy(got[1]), want[1]), (ring, dtype)
    else:
        assert np.array_equal(cupy.asnumpy(got), want), (ring, dtype)


def check_sampled(ring: str, a: Any, b: Any, c: Any, samples: int = 64) -> None:
    """Entries of a large result against the reference computed for those entries alone."""
    import cupy

    rng = np.random.default_rng()
    rows = rng.integers(0, a.shape[0], samples)
    cols = rng.integers(0, b.shape[1], samples)
    a_rows = cupy.asnumpy(a[cupy.asarray(rows)])
    b_cols = cupy.asnumpy(b[:, cupy.asarray(cols)])
    want = reference.matmul(a_rows, b_cols, ring)
    got = cupy.asnumpy(c)[rows, cols]
    assert np.array_equal(got, want[np.arange(samples), np.arange(samples)]), ring


def gemm(ring: str, dtype: Any, size: int, repeats: int, argmax: bool = False) -> dict[str, Any]:
    import cupy

    a, b = random((size, size), dtype, ring), random((size, size), dtype, ring)
    out = cupy.empty((size, size), dtype)
    index = cupy.empty((size, size), cupy.int32) if argmax else None
    target = (out, index) if argmax else out
    seconds = timed(lambda: tropical.matmul_sync(a, b, ring, argmax=argmax, out=target), repeats)
    check_sampled(ring, a, b, out)
    return {
        "seconds": seconds,
        "pairs_per_s": size**3 / seconds,
        "ops_per_s": 2 * size**3 / seconds,
    }


def batched(repeats: int) -> dict[str, Any]:
    import cupy

    a = random((1024, 64, 64), np.float32, "maxplus")
    b = random((1024, 64, 64), np.float32, "maxplus")
    out = cupy.empty((1024, 64, 64), np.float32)
    seconds = timed(lambda: tropical.matmul_sync(a, b, "maxplus", out=out), repeats)
    want = reference.matmul(cupy.asnumpy(a[:3]), cupy.asnumpy(b[:3]), "maxplus")
    assert np.array_equal(cupy.asnumpy(out[:3]), want)
    pairs = 1024 * 64**3
    return {"seconds": seconds, "pairs_per_s": pairs / seconds, "ops_per_s": 2 * pairs / seconds}


def skinny(repeats: int) -> dict[str, Any]:
    """M = 2**20 with N = K in 4..64, against a device-to-device copy's bandwidth."""
    import cupy

    m = 1 << 20
    src = cupy.empty(1 << 28, dtype=cupy.uint8)
    dst = cupy.empty_like(src)
    copy_s = timed(lambda: dst.__setitem__(Ellipsis, src), repeats)
    bandwidth = 2 * src.nbytes / copy_s  # bytes read + written per second
    rows: dict[str, Any] = {"copy_bytes_per_s": bandwidth}
    for nk in (4, 16, 32, 64):
        a, b = random((m, nk), np.float32, "maxplus"), random((nk, nk), np.float32, "maxplus")
        out = cupy.empty((m, nk), np.float32)
        seconds = timed(lambda a=a, b=b, out=out: tropical.matmul_sync(a, b, out=out), repeats)
        check_sampled("maxplus", a, b, out)
        moved = (a.nbytes + b.nbytes + out.nbytes) / seconds
        rows[f"n=k={nk}"] = {"seconds": seconds, "bytes_per_s": moved, "ratio": moved / bandwidth}
    return rows


def baselines(repeats: int) -> dict[str, Any]:
    """One shape for every method: M = N = 2048, K = 256, max-plus f32."""

    m, k, n = 2048, 256, 2048
    a, b = random((m, k), np.float32, "maxplus"), random((k, n), np.float32, "maxplus")
    ops = 2 * m * n * k
    ours = timed(lambda: tropical.matmul_sync(a, b), repeats)
    cupy_s = timed(lambda: (a[:, :, None] + b[None, :, :]).max(axis=1), repeats)
    result: dict[str, Any] = {
        "shape": [m, k, n],
        "aionvrtc": ops / ours,
        "cupy_broadcast_reduce": ops / cupy_s,
    }
    try:
        import torch

        ta, tb = torch.from_dlpack(a), torch.from_dlpack(b)
        torch_s = timed(lambda: torch.amax(ta[:, :, None] + tb[None, :, :], dim=1), repeats)
        result["torch_broadcast_reduce"] = ops / torch_s
    except ImportError:
        result["torch_broadcast_reduce"] = None
    return result


CONFIGS = [
    ("maxplus", "float32"),
    ("minplus", "float32"),
    ("maxmul", "float32"),
    ("maxplus", "int32"),
    ("minplus", "int32"),
    ("maxplus", "float64"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--quick", action="store_true", help="4096 only, fewer repeats")
    args = parser.parse_args()
    repeats = 3 if args.quick else 7
    sizes = (4096,) if args.quick else (4096, 8192)
    for ring, dtype in CONFIGS:
        for argmax in (False, True):
            check_small(ring, dtype, argmax)
    probe = peak_probe.run_all()
    results: dict[str, Any] = {"probe_pairs_per_s": probe, "gemm": {}}
    for ring, dtype in CONFIGS:
        for size in sizes:
            row = gemm(ring, dtype, size, repeats)
            row["ratio_to_probe"] = row["pairs_per_s"] / probe[PROBE_FOR[dtype]]
            results["gemm"][f"{ring} {dtype} {size}"] = row
    row = gemm("maxplus", "float32", 4096, repeats, argmax=True)
    row["ratio_to_probe"] = row["pairs_per_s"] / probe["f32"]
    results["gemm"]["maxplus float32 4096 argmax"] = row
    row = batched(repeats)
    row["ratio_to_probe"] = row["pairs_per_s"] / probe["f32"]
    results["batched 1024 x 64^3"] = row
    results["skinny"] = skinny(repeats)
    results["baselines"] = baselines(repeats)
    f = gpu_facts()
    write(
        args.out, "tropical_gemm", label=f["gpu"], facts=f, results=results, table=table(f, results)
    )


def table(f: dict[str, Any], r: dict[str, Any]) -> str:
    probe = r["probe_pairs_per_s"]
    lines = [
        f"# Tropical GEMM on {f['gpu']}",
        "",
        f"Driver {f['driver']}, CuPy {f['cupy']}, NVRTC {f['nvrtc']}, {f['date']}. "
        "Tropical ops/s = 2*M*N*K / median time (CUDA events), as the anchors count; the ratio "
        "compares pairs/s = M*N*K / time with the probe's add+max pairs/s. Checked against the "
        "reference first.",
        "",
        "Peak probe (add+max pairs/s): "
        + ", ".join(f"{k} {v / 1e12:.2f} T" for k, v in probe.items()),
        "",
        "| product | T ops/s | T pairs/s | of its probe |",
        "| --- | --- | --- | --- |",
    ]
    rows = {**r["gemm"], "batched 1024 x 64^3 f32": r["batched 1024 x 64^3"]}
    for name, row in rows.items():
        lines.append(
            f"| {name} | {row['ops_per_s'] / 1e12:.2f} | {row['pairs_per_s'] / 1e12:.2f} | "
            f"{row['ratio_to_probe'] * 100:.0f}% |"
        )
    sk = r["skinny"]
    lines += ["", f"Skinny M = 2^20 (copy bandwidth {sk['copy_bytes_per_s'] / 1e12:.2f} TB/s):", ""]
    for key, row in sk.items():
        if key != "copy_bytes_per_s":
            lines.append(
                f"- {key}: {row['bytes_per_s'] / 1e12:.2f} TB/s, "
                f"{row['ratio'] * 100:.0f}% of the copy"
            )
    base = r["baselines"]
    torch_rate = base["torch_broadcast_reduce"]
    lines += [
        "",
        f"Side by side at M, K, N = {base['shape']} (f32 max-plus, T ops/s): aionvrtc "
        f"{base['aionvrtc'] / 1e12:.2f} T, CuPy broadcast-reduce "
        f"{base['cupy_broadcast_reduce'] / 1e12:.3f} T, PyTorch broadcast-reduce "
        + (f"{torch_rate / 1e12:.3f} T" if torch_rate else "n/a"),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
