"""Tropical GEMM throughput against the register peak probe, measured side by side in one run,
with CuPy and PyTorch broadcast-and-reduce for comparison. Correctness is checked first.

    python benchmarks/tropical_gemm.py [--out DIR] [--quick]

Throughput is quoted as the peer implementations do, in tropical ops/s = 2 * M * N * K / time
(an add and a max per (m, n, k)); ratios compare pairs/s = M * N * K / time with the probe's
add+max pairs/s.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import anyio
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aionvrtc import tropical
from aionvrtc.tropical import reference
from aionvrtc.tropical.tuning import random_operands as random
from aionvrtc.tropical.tuning import timed
from benchmarks import peak_probe
from benchmarks._results import RESULTS, gpu_facts, write

PROBE_FOR = {"float32": "f32", "float64": "f64", "int32": "i32_dpx", "int64": "i32"}


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


def check_sampled(
    ring: str, a: Any, b: Any, c: Any, index: Any = None, *, samples: int = 64
) -> None:
    """Entries of a large result (and its argmax) against the reference computed for those
    entries alone."""
    import cupy

    rng = np.random.default_rng()
    rows = rng.integers(0, a.shape[0], samples)
    cols = rng.integers(0, b.shape[1], samples)
    a_rows = cupy.asnumpy(a[cupy.asarray(rows)])
    b_cols = cupy.asnumpy(b[:, cupy.asarray(cols)])
    diagonal = (np.arange(samples), np.arange(samples))
    if index is None:
        want = reference.matmul(a_rows, b_cols, ring)
    else:
        want, want_index = reference.matmul(a_rows, b_cols, ring, argmax=True)
        assert np.array_equal(cupy.asnumpy(index)[rows, cols], want_index[diagonal]), ring
    assert np.array_equal(cupy.asnumpy(c)[rows, cols], want[diagonal]), ring


def gemm(ring: str, dtype: Any, size: int, repeats: int, argmax: bool = False) -> dict[str, Any]:
    import cupy

    a, b = random((size, size), dtype, ring), random((size, size), dtype, ring)
    out = cupy.empty((size, size), dtype)
    index = cupy.empty((size, size), cupy.int32) if argmax else None
    target = (out, index) if argmax else out
    seconds = timed(lambda: tropical.matmul_sync(a, b, ring, argmax=argmax, out=target), repeats)
    check_sampled(ring, a, b, out, index)
    return {
        "seconds": seconds,
        "pairs_per_s": size**3 / seconds,
        "ops_per_s": 2 * size**3 / seconds,
    }


def batched(repeats: int) -> dict[str, Any]:
    """1024 products of 64^3 in one launch: the kernel alone (CUDA graph), and a whole
    matmul_sync call with its host-side work (validation, planning, launch)."""
    import time

    import cupy

    a = random((1024, 64, 64), np.float32, "maxplus")
    b = random((1024, 64, 64), np.float32, "maxplus")
    out = cupy.empty((1024, 64, 64), np.float32)
    seconds = timed(lambda: tropical.matmul_sync(a, b, "maxplus", out=out), repeats)
    want = reference.matmul(cupy.asnumpy(a[:3]), cupy.asnumpy(b[:3]), "maxplus")
    assert np.array_equal(cupy.asnumpy(out[:3]), want)
    calls = []
    for _ in range(max(repeats, 20)):
        began = time.perf_counter()
        tropical.matmul_sync(a, b, "maxplus", out=out)
        cupy.cuda.get_current_stream().synchronize()
        calls.append(time.perf_counter() - began)
    pairs = 1024 * 64**3
    return {
        "seconds": seconds,
        "pairs_per_s": pairs / seconds,
        "ops_per_s": 2 * pairs / seconds,
        "matmul_sync_call_seconds": float(np.median(calls)),
    }


def skinny(repeats: int, probe: float) -> dict[str, Any]:
    """M = 2**20 with N = K in 4..64 (tall), and its transpose N = 2**20 with M = K (wide),
    f32 max-plus, against a device-to-device copy's bandwidth and against the roofline: the
    longer of moving the bytes at the copy's rate and doing the pairs at the probe's. Each shape
    runs through matmul (the skinny kernel) and, side by side, through the tiles of its class."""
    import cupy

    from aionvrtc import get_sync
    from aionvrtc.tropical.tuning import launch

    big = 1 << 20
    src = cupy.empty(1 << 28, dtype=cupy.uint8)
    dst = cupy.empty_like(src)
    copy_s = timed(lambda: dst.__setitem__(Ellipsis, src), repeats)
    bandwidth = 2 * src.nbytes / copy_s  # bytes read + written per second
    rows: dict[str, Any] = {"copy_bytes_per_s": bandwidth}
    for nk in (4, 8, 16, 32, 64):
        for name, (m, n) in (("tall", (big, nk)), ("wide", (nk, big))):
            a = random((m, nk), np.float32, "maxplus")
            b = random((nk, n), np.float32, "maxplus")
            out = cupy.empty((m, n), np.float32)
            kind = f"{name}{max(16, nk)}"
            plan = tropical.tuning.plan(
                a, b, "maxplus", argmax=False, out=out, accumulate=False,
                tile=tropical.TILES[kind]["f4"],
            )  # fmt: skip
            module = get_sync(plan.spec, device=plan.device)
            moved = a.nbytes + b.nbytes + out.nbytes
            bound = max(moved / bandwidth, m * n * nk / probe)
            label = f"{name} n=k={nk}" if name == "tall" else f"{name} m=k={nk}"
            for how, call in (
                ("", lambda a=a, b=b, out=out: tropical.matmul_sync(a, b, out=out)),
                (" (tiles)", lambda plan=plan, module=module: launch(plan, module, None)),
            ):
                seconds = timed(call, repeats)
                check_sampled("maxplus", a, b, out)
                rows[label + how] = {
                    "seconds": seconds,
                    "bytes_per_s": moved / seconds,
                    "ratio": moved / seconds / bandwidth,
                    "ratio_to_roofline": bound / seconds,
                }
    return rows


def curve(repeats: int) -> dict[str, Any]:
    """Throughput against size (square, f32 max-plus): ours with and without argmax, and the
    broadcast-and-reduce baselines where their M*K*N intermediate fits (up to 1024)."""
    import cupy

    rows: dict[str, Any] = {"aionvrtc": {}, "aionvrtc argmax": {}, "cupy": {}, "torch": {}}
    try:
        import torch
    except ImportError:
        torch = None
    for size in (256, 512, 1024, 2048, 4096, 8192):
        a = random((size, size), np.float32, "maxplus")
        b = random((size, size), np.float32, "maxplus")
        out = cupy.empty((size, size), np.float32)
        index = cupy.empty((size, size), np.int32)
        ops = 2 * size**3
        rows["aionvrtc"][size] = ops / timed(
            lambda a=a, b=b, out=out: tropical.matmul_sync(a, b, out=out), repeats
        )
        rows["aionvrtc argmax"][size] = ops / timed(
            lambda a=a, b=b, out=out, index=index: tropical.matmul_sync(
                a, b, argmax=True, out=(out, index)
            ),
            repeats,
        )
        if size <= 1024:
            rows["cupy"][size] = ops / timed(
                lambda a=a, b=b: (a[:, :, None] + b[None, :, :]).max(axis=1), repeats, graph=False
            )
            if torch is not None:
                ta, tb = torch.from_dlpack(a), torch.from_dlpack(b)
                rows["torch"][size] = ops / timed(
                    lambda ta=ta, tb=tb: torch.amax(ta[:, :, None] + tb[None, :, :], dim=1),
                    repeats,
                    graph=False,
                )
    return rows


def baselines(repeats: int) -> dict[str, Any]:
    """One shape for every method: M = N = 2048, K = 256, max-plus f32."""
    import cupy

    m, k, n = 2048, 256, 2048
    a, b = random((m, k), np.float32, "maxplus"), random((k, n), np.float32, "maxplus")
    ops = 2 * m * n * k
    out = cupy.empty((m, n), np.float32)
    ours = timed(lambda: tropical.matmul_sync(a, b, out=out), repeats)
    cupy_s = timed(lambda: (a[:, :, None] + b[None, :, :]).max(axis=1), repeats, graph=False)
    result: dict[str, Any] = {
        "shape": [m, k, n],
        "aionvrtc": ops / ours,
        "cupy_broadcast_reduce": ops / cupy_s,
    }
    try:
        import torch

        ta, tb = torch.from_dlpack(a), torch.from_dlpack(b)
        torch_s = timed(
            lambda: torch.amax(ta[:, :, None] + tb[None, :, :], dim=1), repeats, graph=False
        )
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
    parser.add_argument(
        "--autotune", action="store_true", help="use the autotuner's tiles (its stored record)"
    )
    args = parser.parse_args()
    if args.autotune:
        anyio.run(lambda: tropical.autotune(kinds=["large", "small"]))
    repeats = 3 if args.quick else 7
    sizes = (4096,) if args.quick else (4096, 8192)
    for ring, dtype in CONFIGS:
        for argmax in (False, True):
            check_small(ring, dtype, argmax)
    probe = peak_probe.run_all()
    results: dict[str, Any] = {"probe_pairs_per_s": probe, "gemm": {}}
    for ring, dtype in CONFIGS:
        for size in sizes:
            for argmax in (False, True) if ring == "maxplus" else (False,):
                row = gemm(ring, dtype, size, repeats, argmax=argmax)
                row["ratio_to_probe"] = row["pairs_per_s"] / probe[PROBE_FOR[dtype]]
                results["gemm"][f"{ring} {dtype} {size}{' argmax' if argmax else ''}"] = row
    row = batched(repeats)
    row["ratio_to_probe"] = row["pairs_per_s"] / probe["f32"]
    results["batched 1024 x 64^3"] = row
    results["skinny"] = skinny(repeats, probe["f32"])
    results["baselines"] = baselines(repeats)
    results["curve"] = curve(repeats)
    f = gpu_facts()
    write(
        args.out, "tropical_gemm", label=f["gpu"], facts=f, results=results, table=table(f, results)
    )
    plot(f, results, args.out)


def plot(f: dict[str, Any], r: dict[str, Any], out: Path) -> None:
    """Throughput against size (square f32 max-plus, T ops/s), with the probe as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, by_size in r["curve"].items():
        points = sorted((int(size), rate) for size, rate in by_size.items())  # JSON keys: str
        if points:
            ax.plot(*zip(*((s, v / 1e12) for s, v in points), strict=True), marker="o", label=name)
    ax.axhline(2 * r["probe_pairs_per_s"]["f32"] / 1e12, color="gray", ls="--", label="f32 probe")
    ax.set(xscale="log", yscale="log", xlabel="M = N = K", ylabel="tropical T ops/s")
    ax.set_xticks([256, 512, 1024, 2048, 4096, 8192], ["256", "512", "1k", "2k", "4k", "8k"])
    ax.minorticks_off()
    ax.set_title(f"Max-plus f32 on {f['gpu']} ({f['date']})")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    slug = f["gpu"].lower().replace(" ", "-")
    fig.savefig(out / f"tropical_gemm-{slug}.png", dpi=120, bbox_inches="tight")


def table(f: dict[str, Any], r: dict[str, Any]) -> str:
    probe = r["probe_pairs_per_s"]
    lines = [
        f"# Tropical GEMM on {f['gpu']}",
        "",
        f"Driver {f['driver']}, CuPy {f['cupy']}, NVRTC {f['nvrtc']}, {f['date']}. "
        "Tropical ops/s = 2*M*N*K / median time (CUDA events), as the peer implementations count "
        "them; the ratio compares pairs/s = M*N*K / time with the probe's add+max pairs/s. "
        "Checked against the reference first.",
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
    lines += [
        "",
        f"Skinny products, 2^20 rows or columns (copy bandwidth "
        f"{sk['copy_bytes_per_s'] / 1e12:.2f} TB/s; the roofline is the longer of moving the "
        "bytes at that rate and doing the pairs at the f32 probe's):",
        "",
        "| product | TB/s | of the copy | of the roofline |",
        "| --- | --- | --- | --- |",
    ]
    for key, row in sk.items():
        if key != "copy_bytes_per_s":
            lines.append(
                f"| {key} | {row['bytes_per_s'] / 1e12:.2f} | {row['ratio'] * 100:.0f}% | "
                f"{row['ratio_to_roofline'] * 100:.0f}% |"
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
