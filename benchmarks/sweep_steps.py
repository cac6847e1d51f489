"""The steps of a lattice's row sweep, side by side in one run: tall products with K = N = 2
read in place through strided views (a 32 x 32 spin glass's sweep makes 900 of them at
2 x 2^30 x 2 x 2), through ``matmul`` (the skinny kernel), through the generic kernel (which
served them before the skinny kernel took any strides), and as the broadcast-and-reduce a
CuPy or PyTorch user would write, against a device-to-device copy's bandwidth.

    python benchmarks/sweep_steps.py [--out DIR] [--log2-m 28] [--repeats 5]

Bytes moved = A + B + C once each; min-plus, float32 (the spin glass's). Each result is checked
against the NumPy reference on sampled rows, and the alternatives against ours whole.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aionvrtc import get_sync, tropical
from aionvrtc.tropical import reference
from aionvrtc.tropical.tuning import launch, timed
from benchmarks._results import RESULTS, gpu_facts, write

RING = "minplus"


def layouts(m: int, seed: int) -> Iterator[tuple[str, Any, Any]]:
    """The products (name, a, b) of each layout, batch 2, K = N = 2 (M = 2 for the wide one),
    made one at a time on the device (small integers: exact sums, many ties)."""
    import cupy

    draws = cupy.random.RandomState(seed)

    def draw(*shape: int) -> Any:
        return draws.randint(-8, 9, size=shape).astype(np.float32)

    # A as the sweep reads it: (batch, m, k) with m's stride 1 and k's the rest.
    a, b = draw(2, 2, m).transpose(1, 2, 0), draw(2, 2, 2).transpose(1, 0, 2)
    yield "tall, A strided (sweep)", a, b
    # B as the sweep reads it in its wide steps: (batch, k, n), batch's stride 1, n's 2.
    a, b = draw(2, 2, 2).transpose(1, 2, 0), draw(2, m, 2).transpose(2, 0, 1)
    yield "wide, B strided (sweep)", a, b
    yield "tall, row-major", draw(2, m, 2), draw(2, 2, 2)


def copy_bandwidth(repeats: int) -> float:
    """Bytes read and written per second by a device-to-device copy of 1 GiB."""
    import cupy

    src = cupy.empty(1 << 30, dtype=cupy.uint8)
    dst = cupy.empty_like(src)
    return float(2 * src.nbytes / timed(lambda: dst.__setitem__(Ellipsis, src), repeats))


def check_rows(a: Any, b: Any, c: Any, rng: Any, samples: int = 256) -> None:
    """Sampled rows (tall) or columns (wide) of ``c`` against the NumPy reference."""
    import cupy

    tall = a.shape[1] >= b.shape[2]
    picks = cupy.asarray(rng.integers(0, c.shape[1 if tall else 2], samples))
    if tall:
        want = reference.matmul(cupy.asnumpy(a[:, picks]), cupy.asnumpy(b), RING)
        got = cupy.asnumpy(c[:, picks])
    else:
        want = reference.matmul(cupy.asnumpy(a), cupy.asnumpy(b[:, :, picks]), RING)
        got = cupy.asnumpy(c[:, :, picks])
    np.testing.assert_array_equal(got, want)


def measure(
    name: str, a: Any, b: Any, *, repeats: int, bandwidth: float, rng: Any
) -> dict[str, Any]:
    import cupy
    import torch

    out = cupy.empty((a.shape[0], a.shape[1], b.shape[2]), np.float32)
    moved = a.nbytes + b.nbytes + out.nbytes
    generic = tropical.tuning.plan(a, b, RING, argmax=False, out=out, accumulate=False, tile=None)
    module = get_sync(generic.spec, device=generic.device)
    ours = tropical.tuning.plan(a, b, RING, argmax=False, out=out, accumulate=False)
    ta, tb = torch.from_dlpack(a), torch.from_dlpack(b)
    calls: dict[str, tuple[Callable[[], Any], bool]] = {
        "aionvrtc matmul": (lambda: tropical.matmul_sync(a, b, RING, out=out), True),
        "generic kernel": (lambda: launch(generic, module, None), True),
        "CuPy broadcast-reduce": (lambda: (a[:, :, :, None] + b[:, None]).min(axis=2), False),
        "PyTorch broadcast-reduce": (lambda: (ta[:, :, :, None] + tb[:, None]).amin(dim=2), False),
    }
    row: dict[str, Any] = {
        "shape": [a.shape[0], a.shape[1], a.shape[2], b.shape[2]],
        "a_strides": [s // 4 for s in a.strides],
        "b_strides": [s // 4 for s in b.strides],
        "kernel": ours.spec.name_expressions[0],
        "bytes": moved,
    }
    for how, (call, graph) in calls.items():
        seconds = timed(call, repeats, graph=graph)
        result = call()
        cupy.cuda.Device().synchronize()
        if how == "aionvrtc matmul":
            check_rows(a, b, out, rng)
            mine = out.copy()
        elif how == "generic kernel":
            check_rows(a, b, out, rng)
            np.testing.assert_array_equal(cupy.asnumpy(out), cupy.asnumpy(mine))
        else:
            np.testing.assert_array_equal(cupy.asnumpy(cupy.asarray(result)), cupy.asnumpy(mine))
        del result
        row[how] = {
            "seconds": seconds,
            "bytes_per_s": moved / seconds,
            "of_copy": moved / seconds / bandwidth,
        }
        cupy.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()
        print(name, how, f"{seconds * 1e3:.2f} ms", flush=True)
    return row


def table(facts: dict[str, Any], results: dict[str, Any]) -> str:
    ways = (
        "aionvrtc matmul",
        "generic kernel",
        "CuPy broadcast-reduce",
        "PyTorch broadcast-reduce",
    )
    lines = [
        f"# A row sweep's steps on {facts['gpu']}",
        "",
        f"aionvrtc {facts['aionvrtc']}, CuPy {facts['cupy']}, PyTorch {facts['torch']}, "
        f"{facts['date']}. Min-plus float32, batch 2, K = N = 2 (M = 2 wide), "
        f"2^{facts['log2_m']} rows; medians of {facts['repeats']} (CUDA events). TB/s = "
        "(A + B + C bytes) / time; a device-to-device copy moved "
        f"{results['copy_bytes_per_s'] / 1e12:.2f} TB/s (read + written). Checked against the "
        "NumPy reference on sampled rows, the alternatives against ours whole.",
        "",
        "| step | " + " | ".join(ways) + " |",
        "| --- |" + " ---: |" * len(ways),
    ]
    for name, row in results["steps"].items():
        cells = [f"{row[w]['seconds'] * 1e3:.2f} ms ({row[w]['of_copy']:.0%})" for w in ways]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Percentages: of the copy's bandwidth. Kernels: "
        + "; ".join(f"{n}: `{r['kernel']}`" for n, r in results["steps"].items())
        + ".",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--log2-m", type=int, default=28)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    import cupy
    import torch

    rng = np.random.default_rng(args.seed)
    bandwidth = copy_bandwidth(args.repeats)
    results: dict[str, Any] = {"copy_bytes_per_s": bandwidth, "steps": {}}
    for name, a, b in layouts(1 << args.log2_m, args.seed):
        results["steps"][name] = measure(
            name, a, b, repeats=args.repeats, bandwidth=bandwidth, rng=rng
        )
        del a, b
        cupy.get_default_memory_pool().free_all_blocks()
    facts = {
        **gpu_facts(),
        "torch": torch.__version__,
        "log2_m": args.log2_m,
        "repeats": args.repeats,
        "seed": args.seed,
    }
    write(args.out, "sweep_steps", label=facts["gpu"], facts=facts, results=results,
          table=table(facts, results))  # fmt: skip


if __name__ == "__main__":
    main()
