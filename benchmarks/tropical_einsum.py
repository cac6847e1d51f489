"""Where a tensor network's contraction spends its GPU time: the product kernels alone (each
timed over CUDA-graph replays) against the whole ``einsum_sync`` call (wall time to the result,
median), for the networks of examples/tensor_network.py. The rest is copies, allocation and the
host's planning and launching of each step.

    python benchmarks/tropical_einsum.py [--out DIR] [--regular 100 150] [--kings 10 15 20]
        [--spin-glass 100 150] [--repeats 7]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aionvrtc import tropical
from aionvrtc.tropical.tuning import einsum_products, launch, timed
from benchmarks._results import RESULTS, gpu_facts, write

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "tensor_network.py"


def example() -> Any:
    spec = importlib.util.spec_from_file_location("tensor_network", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tensor_network"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def measure(net: Any, repeats: int) -> dict[str, Any]:
    import cupy

    plan = tropical.einsum_plan(net.subscripts, *net.operands, optimize=net.optimize)
    arrays = [cupy.asarray(x) for x in net.operands]
    stream = cupy.cuda.get_current_stream()

    def whole() -> float:
        began = time.perf_counter()
        tropical.einsum_sync(net.subscripts, *arrays, semiring=net.semiring, optimize=plan)
        stream.synchronize()
        return time.perf_counter() - began

    whole()  # compiles and loads every kernel
    seconds = statistics.median(whole() for _ in range(repeats))
    _, products = einsum_products(net.subscripts, *arrays, semiring=net.semiring, optimize=plan)
    kernels = sum(timed(lambda p=p, m=m: launch(p, m, None), repeats) for p, m in products)
    return {
        "network": net.name,
        "steps": len(plan.steps),
        "largest_intermediate": plan.largest_intermediate,
        "products": plan.products,
        "copies": plan.copies,
        "copied_elements": plan.copied_elements,
        "whole_s": seconds,
        "product_kernels_s": kernels,
        "product_share": kernels / seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--regular", type=int, nargs="*", default=[100, 150])
    parser.add_argument("--kings", type=int, nargs="*", default=[10, 15, 20])
    parser.add_argument("--spin-glass", type=int, nargs="*", default=[100, 150])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    module = example()
    nets = module.networks(
        argparse.Namespace(
            regular=args.regular, kings=args.kings, spin_glass=args.spin_glass, trials=64,
            seed=2026,
        )
    )  # fmt: skip
    facts = gpu_facts()
    rows = [measure(net, args.repeats) for net in nets]
    lines = [
        f"# Tropical einsum: product kernels against the whole contraction, {facts['gpu']}",
        "",
        f"Driver {facts['driver']}, CuPy {facts['cupy']}, NVRTC {facts['nvrtc']}, "
        f"{facts['date']}. The networks of examples/tensor_network.py (seed 2026, random-greedy "
        "64 trials; king's graphs row by row). Whole: `einsum_sync` to the synchronised result, "
        "median; product kernels: each step's product alone over CUDA-graph replays, summed.",
        "",
        "| network | steps | largest | copies (elements) | whole ms | product kernels ms | share |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['network']} | {r['steps']} | {r['largest_intermediate']:,} | "
            f"{r['copies']} ({r['copied_elements']:,}) | {r['whole_s'] * 1e3:.1f} | "
            f"{r['product_kernels_s'] * 1e3:.1f} | {r['product_share'] * 100:.0f}% |"
        )
    slug = facts["gpu"].replace("NVIDIA ", "")
    write(
        args.out, "tropical_einsum", label=slug, facts=facts, results=rows,
        table="\n".join(lines) + "\n",
    )  # fmt: skip


if __name__ == "__main__":
    main()
