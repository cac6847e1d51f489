"""Every candidate tile of every shape class and variant, timed on this GPU: the autotuner
(tropical.autotune, retuning) run in full, with each candidate's time written out.

    python benchmarks/tile_sweep.py [--out DIR] [--kinds large small ...] [--dtypes float32 ...]
        [--argmax-only | --no-argmax] [--extra 128,64,16,8,4,3 ...]

--extra adds candidate tiles (BM,BN,BK,TM,TN,blocks per SM) to each named class for this run.

The winners are the defaults in tropical.TILES (aionvrtc/tropical/_specs.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aionvrtc import Compiler, tropical
from aionvrtc.tropical.tuning import CANDIDATES
from benchmarks._results import RESULTS, gpu_facts, write


async def sweep(
    kinds: list[str], dtypes: list[str], argmax: tuple[bool, ...]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    async with Compiler(concurrency=os.cpu_count() or 1) as compiler:
        table = await tropical.autotune(
            dtypes, compiler=compiler, kinds=kinds, argmax=argmax, retune=True,
            report=rows.append,
        )  # fmt: skip
    return rows, table


def markdown(facts: dict[str, Any], rows: list[dict[str, Any]], table: dict[str, Any]) -> str:
    lines = [
        f"# Tile sweep on {facts['gpu']}",
        "",
        f"Driver {facts['driver']}, CuPy {facts['cupy']}, NVRTC {facts['nvrtc']}, {facts['date']}. "
        "Max-plus, median of 5 (CUDA events), each candidate's result checked against the "
        "generic kernel's first. Tile = BM, BN, BK, TM, TN, blocks per SM.",
        "",
        "| class | variant | winner | T pairs/s | runner-up | T pairs/s |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for kind, variants in table.items():
        for variant, tile in variants.items():
            timed = sorted(
                (r for r in rows if r["class"] == kind and r["variant"] == variant),
                key=lambda r: -r["pairs_per_s"],
            )
            if not timed:
                continue
            second = timed[1] if len(timed) > 1 else None
            lines.append(
                f"| {kind} | {variant} | {tuple(tile)} | {timed[0]['pairs_per_s'] / 1e12:.2f} | "
                + (
                    f"{tuple(second['tile'])} | {second['pairs_per_s'] / 1e12:.2f} |"
                    if second
                    else "- | - |"
                )
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--kinds", nargs="+", default=list(tropical.TILES), help="shape classes")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64", "int32", "int64"])
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--argmax-only", action="store_true")
    only.add_argument("--no-argmax", action="store_true")
    parser.add_argument("--extra", nargs="+", default=[], help="more candidate tiles")
    args = parser.parse_args()
    extra = [tuple(int(x) for x in text.split(",")) for text in args.extra]
    if any(len(tile) != 6 for tile in extra):
        parser.error("--extra takes tiles of six numbers: BM,BN,BK,TM,TN,blocks per SM")
    for kind in args.kinds:
        CANDIDATES[kind] = tuple(dict.fromkeys((*CANDIDATES[kind], *extra)))  # type: ignore[arg-type]
    argmax = (True,) if args.argmax_only else (False,) if args.no_argmax else (False, True)
    rows, table = anyio.run(sweep, args.kinds, args.dtypes, argmax)
    facts = gpu_facts()
    write(
        args.out,
        "tile_sweep",
        label=facts["gpu"],
        facts=facts,
        results={"candidates": rows, "winners": table},
        table=markdown(facts, rows, table),
    )


if __name__ == "__main__":
    main()
