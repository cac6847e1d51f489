"""Counted tropical products against the value-only product of the same shape and against the
add+max probe, side by side in one run. Correctness is checked first, against the reference.

    python benchmarks/counted_products.py [--out DIR] [--quick]

Each shape is timed (median, CUDA events) as a value-only ``matmul``, then counted three ways:
each entry counting once (``counts=True``: no count arrays read), with given int64 counts, and
with counts modulo a prime below 2^31 (one pass of the Chinese remainder theorem's several).
Operands are drawn two ways: random normal floats (or integers in +-1000), where ties are rare,
and integers 0 to 3, where most products tie the best and every one of them adds to a count.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aionvrtc import tropical
from aionvrtc.tropical import reference
from aionvrtc.tropical.tuning import timed
from benchmarks import peak_probe
from benchmarks._results import RESULTS, gpu_facts, write

PROBE_FOR = {"float32": "f32", "float64": "f64", "int32": "i32_dpx", "int64": "i32"}
PRIME = 2_147_483_647
# (name, semiring, dtype, batch, M, K, N)
SHAPES = [
    ("square 4096", "maxplus", "float32", 1, 4096, 4096, 4096),
    ("square 4096", "maxplus", "int32", 1, 4096, 4096, 4096),
    ("square 4096", "minplus", "float64", 1, 4096, 4096, 4096),
    ("2048 x 256 x 2048", "maxplus", "float32", 1, 2048, 256, 2048),
    ("batched 1024 x 64^3", "maxplus", "float32", 1024, 64, 64, 64),
    ("tall 2^20 x 16 x 4", "maxplus", "float32", 1, 1 << 20, 16, 4),
    ("wide 4 x 16 x 2^20", "maxplus", "float32", 1, 4, 16, 1 << 20),
    ("few 4 x 2^16 x 4", "maxplus", "float32", 1, 4, 1 << 16, 4),
]
WAYS = ("value", "ones", "exact", "modular", "one_pass")


def draw(
    rng: np.random.Generator, ring: str, dtype: str, shape: tuple[int, ...], ties: bool
) -> Any:
    """Operands on the GPU: normal floats or integers in +-1000, or with ``ties`` 0 to 3."""
    import cupy

    x: np.ndarray[Any, Any]
    if ties:
        x = rng.integers(0, 4, shape)
    elif np.dtype(dtype).kind == "f":
        x = rng.standard_normal(shape) * 10
    else:
        x = rng.integers(-1000, 1000, shape)
    return cupy.asarray(x.astype(dtype))


def call(way: str, ring: str, a: Any, b: Any, *, counts: Any, out: Any) -> Any:
    """The product ``way`` computes, into ``out``. ``one_pass``: ``counts=True`` joined into
    ``out`` (accumulate), which the one-pass kernel computes: what counted tiles ran before
    the count pass. (Each repeat joins equal values, so its counts grow: timed, not read.)"""
    if way == "value":
        return lambda: tropical.matmul_sync(a, b, ring, out=out[0])
    if way == "one_pass":
        return lambda: tropical.matmul_sync(a, b, ring, counts=True, out=out, accumulate=True)
    given = True if way == "ones" else counts
    modulus = PRIME if way == "modular" else None
    return lambda: tropical.matmul_sync(a, b, ring, counts=given, modulus=modulus, out=out)


def check(rng: np.random.Generator) -> None:
    """Every way against the reference on small odd shapes of both forms, both draws."""
    import cupy

    for ring, dtype in (("maxplus", "float32"), ("minplus", "int64"), ("maxmul", "float64")):
        for m, k, n in ((301, 57, 199), (3000, 9, 3)):
            for ties in (False, True):
                a = draw(rng, ring, dtype, (m, k), ties)
                b = draw(rng, ring, dtype, (k, n), ties)
                if ring == "maxmul":
                    a, b = abs(a), abs(b)
                na, nb = rng.integers(0, 1 << 20, (m, k)), rng.integers(0, 1 << 20, (k, n))
                host = (cupy.asnumpy(a), cupy.asnumpy(b))
                for way in WAYS[1:-1]:
                    given = True if way == "ones" else (cupy.asarray(na), cupy.asarray(nb))
                    modulus = PRIME if way == "modular" else None
                    got = tropical.matmul_sync(a, b, ring, counts=given, modulus=modulus)
                    want = reference.matmul(*host, ring, modulus=modulus,
                                            counts=True if way == "ones" else (na, nb))  # fmt: skip
                    assert np.array_equal(cupy.asnumpy(got[0]), want[0]), (ring, dtype, way)
                    assert np.array_equal(cupy.asnumpy(got[1]), want[1]), (ring, dtype, way)


def measure(rng: np.random.Generator, probe: dict[str, float], repeats: int) -> dict[str, Any]:
    import cupy

    rows: dict[str, Any] = {}
    for name, ring, dtype, batch, m, k, n in SHAPES:
        lead = (batch,) if batch > 1 else ()
        pairs = batch * m * n * k
        for ties in (False, True):
            a = draw(rng, ring, dtype, (*lead, m, k), ties)
            b = draw(rng, ring, dtype, (*lead, k, n), ties)
            counts = (
                cupy.asarray(rng.integers(1, 4, a.shape)),
                cupy.asarray(rng.integers(1, 4, b.shape)),
            )
            out = (cupy.empty((*lead, m, n), dtype), cupy.empty((*lead, m, n), np.int64))
            row: dict[str, Any] = {"pairs": pairs}
            for way in WAYS:
                seconds = timed(call(way, ring, a, b, counts=counts, out=out), repeats)
                row[way] = {
                    "seconds": seconds,
                    "pairs_per_s": pairs / seconds,
                    "of_probe": pairs / seconds / probe[PROBE_FOR[dtype]],
                }
            for way in WAYS[1:]:
                row[way]["of_value"] = row["value"]["seconds"] / row[way]["seconds"]
            rows[f"{name} {ring} {dtype}{' ties' if ties else ''}"] = row
            print(name, ring, dtype, "ties" if ties else "", {w: row[w]["seconds"] for w in WAYS})
    return rows


def table(f: dict[str, Any], probe: dict[str, float], rows: dict[str, Any]) -> str:
    lines = [
        f"# Counted tropical products on {f['gpu']}",
        "",
        f"Driver {f['driver']}, CuPy {f['cupy']}, NVRTC {f['nvrtc']}, {f['date']}. Median "
        "times (CUDA events); each counted product beside the value-only product of the same "
        "operands (its speed as a share of the value's) and the add+max probe of its type "
        "(pairs/s). Counted three ways: each entry once (`counts=True`), given int64 counts, "
        "and modulo a prime below 2^31; products in tiles count in two passes (the value, then "
        "the count of the pairs attaining it), and the last column is `counts=True` in one pass "
        "(joined into `out` with `accumulate`), as they ran before. Random operands tie rarely; "
        "`ties` draws 0 to 3, where most products tie and each adds to a count. Checked against "
        "the reference first.",
        "",
        "Peak probe (add+max pairs/s): "
        + ", ".join(f"{k} {v / 1e12:.2f} T" for k, v in probe.items()),
        "",
        "| product | value | counts=True | int64 counts | modulo a prime | counts=True, one pass |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in rows.items():
        value = row["value"]
        cells = [f"{value['seconds'] * 1e3:.3f} ms ({value['of_probe'] * 100:.0f}% of probe)"]
        cells += [
            f"{row[w]['seconds'] * 1e3:.3f} ms ({row[w]['of_value'] * 100:.0f}% of value)"
            for w in WAYS[1:]
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args()
    seed = 20261207
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    check(rng)
    probe = peak_probe.run_all()
    rows = measure(rng, probe, 3 if args.quick else 7)
    f = gpu_facts()
    results = {"seed": seed, "probe_pairs_per_s": probe, "products": rows}
    write(args.out, "counted_products", label=f["gpu"], facts=f, results=results,
          table=table(f, probe, rows))  # fmt: skip


if __name__ == "__main__":
    main()
