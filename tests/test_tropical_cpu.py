"""Tropical products on the CPU: the NumPy reference against brute force, and every kernel
spec compiled for sm_90 through the service (real NVRTC)."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from aionvrtc import Compiler, KernelSpec, kernel_key, tropical
from aionvrtc.tropical import reference
from aionvrtc.tropical.products import _reference as numpy_product
from aionvrtc.tropical.tuning import ROWS_KMAX

from .support.tropical_data import brute_force, compile_each_for_sm_90, operands

CASES = [(s, d) for s, ring in tropical.SEMIRINGS.items() for d in ring.dtypes]


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=[f"{s}-{d}" for s, d in CASES])
@pytest.mark.parametrize(("m", "k", "n"), [(1, 1, 1), (3, 5, 4), (6, 1, 7), (5, 9, 1)])
def test_reference_matches_brute_force(ring: str, dtype: Any, m: int, k: int, n: int) -> None:
    rng = np.random.default_rng(m * 100 + k * 10 + n)
    for ties in (False, True):
        a, b = operands(rng, ring, dtype, (m, k), (k, n), ties=ties)
        value, index = reference.matmul(a, b, ring, argmax=True)
        want_value, want_index = brute_force(a, b, ring)
        np.testing.assert_array_equal(value, want_value)
        np.testing.assert_array_equal(index, want_index)
        assert value.dtype == a.dtype
        assert index.dtype == np.int32


def test_reference_saturates_and_keeps_infinities() -> None:
    lo, hi = np.iinfo(np.int32).min, np.iinfo(np.int32).max
    a = np.array([[lo, hi - 5, -hi, 7]], dtype=np.int32).T  # (4, 1)
    b = np.array([[10]], dtype=np.int32)
    assert reference.matmul(a, b, "maxplus")[:, 0].tolist() == [lo, hi, -hi + 10, 17]
    assert reference.matmul(a, b, "minplus")[:, 0].tolist() == [lo + 10, hi - 1, -hi + 10, 17]
    c = np.array([[hi, lo]], dtype=np.int32).T
    assert reference.matmul(c, b, "minplus")[:, 0].tolist() == [hi, lo + 10]
    assert (
        reference.matmul(np.array([[-hi]], np.int32), np.array([[-10]], np.int32), "maxplus")[0, 0]
        == lo + 1
    )  # a finite sum that underflows stays finite
    big = np.array([[1 << 40]], dtype=np.int64)
    assert reference.matmul(big, big, "maxmul")[0, 0] == np.iinfo(np.int64).max
    inf = np.float32(np.inf)
    fa = np.array([[-inf, 1.0]], np.float32)
    fb = np.array([[inf], [2.0]], np.float32)
    value, index = reference.matmul(fa, fb, "maxplus", argmax=True)
    assert (value[0, 0], index[0, 0]) == (3.0, 1)  # -inf + inf counts as the zero


def test_empty_sums_batches_and_chunking(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(7)
    value, index = reference.matmul(
        np.zeros((3, 0), np.float32), np.zeros((0, 2), np.float32), "minplus", argmax=True
    )
    assert value.tolist() == [[np.inf] * 2] * 3
    assert index.tolist() == [[-1] * 2] * 3
    assert reference.matmul(np.zeros((0, 4), np.int64), np.zeros((4, 5), np.int64)).shape == (0, 5)
    a, b = operands(rng, "maxplus", np.float64, (1, 6, 5), (4, 5, 3))
    value, index = reference.matmul(a, b, "maxplus", argmax=True)
    assert value.shape == index.shape == (4, 6, 3)
    for i in range(4):
        want_value, want_index = brute_force(a[0], b[i], "maxplus")
        np.testing.assert_array_equal(value[i], want_value)
        np.testing.assert_array_equal(index[i], want_index)
    monkeypatch.setattr(numpy_product, "CHUNK_ELEMENTS", 7)  # many tiny chunks, same answer
    np.testing.assert_array_equal(reference.matmul(a, b, "maxplus"), value)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda: reference.matmul(np.ones((2, 3)), np.ones((4, 2))),
            ValueError,
            r"a's columns must match b's rows, got shapes \(2, 3\) and \(4, 2\)",
        ),
        (
            lambda: reference.matmul(np.ones((2, 3)), np.ones((3, 2), np.float32)),
            TypeError,
            "a and b must have one dtype, got float64 and float32",
        ),
        (
            lambda: reference.matmul(np.ones((2, 2), np.float16), np.ones((2, 2), np.float16)),
            TypeError,
            "a has dtype float16; maxplus takes float32, float64, int32, int64",
        ),
        (
            lambda: reference.matmul(np.ones((2, 2), bool), np.ones((2, 2), bool), "maxplus"),
            TypeError,
            "a has dtype bool; maxplus takes",
        ),
        (
            lambda: reference.matmul(np.ones((2, 2)), np.ones((2, 2)), "andor"),
            TypeError,
            "a has dtype float64; andor takes bool",
        ),
        (
            lambda: reference.matmul(np.ones((2, 2)), np.ones((2, 2)), "plusmax"),
            ValueError,
            "semiring must be one of maxplus, minplus, maxmul, andor, got 'plusmax'",
        ),
        (
            lambda: reference.matmul(np.ones((2, 2, 2)), np.ones((3, 2, 2))),
            ValueError,
            "batch sizes must match or be 1",
        ),
    ],
)
def test_reference_errors(call: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        call()


def test_reference_matmul_refuses_an_output_past_max_bytes_before_allocating(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (2^17 x 1) @ (1 x 2^17) float32: 64 GiB of values and as much of argmax, asked of NumPy
    # at once before the bound. Refused before anything is allocated: by construction here.
    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an output was allocated that the bound should have refused")

    monkeypatch.setattr(np, "empty", never)
    a, b = np.zeros((1 << 17, 1), np.float32), np.zeros((1, 1 << 17), np.float32)
    with pytest.raises(ValueError, match="^" + re.escape(
        "matmul output (1 x 131,072 x 131,072 float32, with its int32 argmax) would hold "
        "17,179,869,184 elements (137,438,953,472 bytes at 8 each), more than "
        "max_bytes=1,073,741,824 (raise it where the machine has the memory); compute it in "
        "blocks of rows (a[i:j]), or on the GPU (tropical.matmul)"
    ) + "$"):  # fmt: skip
        reference.matmul(a, b)
    monkeypatch.undo()
    # The bound is inclusive and counts every batch: 2 x 4 x 4 float64 and int32 = 384 bytes.
    a3, b3 = np.arange(32.0).reshape(2, 4, 4), np.ones((4, 4))
    value = reference.matmul(a3, b3, max_bytes=384)
    np.testing.assert_array_equal(value, a3.max(axis=2, keepdims=True) + np.ones((1, 1, 4)))
    with pytest.raises(
        ValueError, match=re.escape("(384 bytes at 12 each), more than max_bytes=383")
    ):
        reference.matmul(a3, b3, max_bytes=383)
    with pytest.raises(TypeError, match="max_bytes must be an int"):
        reference.matmul(a3, b3, max_bytes=1e9)  # type: ignore[arg-type]  # the point


def test_numpy_input_where_cupy_is_needed_is_named() -> None:
    with pytest.raises(TypeError, match=r"a must be a cupy.ndarray, not numpy.ndarray: move it"):
        tropical.matmul_sync(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32))


def _representatives(specs: list[KernelSpec]) -> list[KernelSpec]:
    """The first spec of each kernel class: each template with and without argmax and with
    each element type it is built for, and each semiring."""
    chosen: dict[tuple[str, ...], KernelSpec] = {}
    for spec in specs:
        template, _, args = spec.name_expressions[0].partition("<")
        # <element, semiring, argmax, ...>; the backward kernels: <element, accumulate>.
        element, *rest = (a.strip() for a in args.rstrip(">").split(","))
        semiring = rest[0].removeprefix("Fast") if len(rest) > 1 else ""
        chosen.setdefault((template, rest[1] if len(rest) > 1 else rest[0]), spec)
        chosen.setdefault((template, element), spec)
        chosen.setdefault((semiring,), spec)
    return list(dict.fromkeys(chosen.values()))


def test_a_spec_of_each_kernel_class_compiles_for_sm_90_through_the_service(
    tmp_path: Path,
) -> None:
    # The default run's share of the exhaustive test below (which CI runs as a step of its
    # own): every template, with and without argmax, for every element type; every semiring.
    # (The counted and k-best kernels' share is test_tropical_counted's.)
    counted = ("tropical_counted.cu", "tropical_top.cu")
    specs = _representatives([s for s in tropical.all_specs() if s.name not in counted])
    templates = {s.name_expressions[0].partition("<")[0] for s in specs}
    assert templates == {"tropical_gemm", "tropical_gemm_tiled", "tropical_gemm_rows",
                         "tropical_backward"}  # fmt: skip
    assert len(specs) < 25

    async def main() -> Any:
        async with Compiler(arch="sm_90", cache_dir=tmp_path, concurrency=2) as compiler:
            async with anyio.create_task_group() as tg:
                for spec in specs:
                    tg.start_soon(compiler.compile, spec)
            return compiler.stats()

    assert anyio.run(main).compiles == len(specs)


@pytest.mark.exhaustive
def test_every_kernel_spec_compiles_for_sm_90_through_the_service(tmp_path: Path) -> None:
    specs = tropical.all_specs()
    # 3 semirings x 4 types + and-or on bool, x argmax x accumulate x 2 layouts; the backward
    # kernels of float32/float64 for the plus semirings and max-times; the tuned kernels of the
    # 3 numeric semirings x accumulate: each distinct tile of a type's element size, with and
    # without argmax, and the skinny kernel for each K class (no argmax); the counted kernels
    # of every semiring and type, 3 countings in 4 forms, and the k-best ones of 3 bounds on k,
    # a thread or a warp per list.
    tiles = {v: len({t[v] for t in tropical.TILES.values()}) for v in tropical.VARIANTS}
    skinny = len(ROWS_KMAX)
    tuned = 3 * 2 * (sum(tiles.values()) + 4 * skinny)
    assert len(specs) == 13 * 2 * 2 * 2 + 4 + tuned + 13 * 3 * 4 + 13 * 3 * 2
    expressions = [s.name_expressions[0] for s in specs]
    assert len(set(expressions)) == len(specs)

    compile_each_for_sm_90(specs, tmp_path)

    # warm() fills the disk cache through a parallel Compiler; a second warm compiles nothing.
    count = anyio.run(lambda: tropical.warm(["maxplus"], ["float32"], arch="sm_90"))
    assert count == 2 * 2 * 2 + 1 + 2 * (tiles["f4"] + tiles["f4-argmax"] + skinny) + 3 * 4 + 3 * 2

    async def again() -> int:
        async with Compiler(arch="sm_90", cache_dir=tmp_path) as compiler:
            await tropical.warm(["maxplus"], ["float32"], compiler=compiler)
            return compiler.stats().compiles

    assert anyio.run(again) == 0


@pytest.mark.parametrize(
    ("m", "n", "k", "argmax", "kind"),
    [
        (4096, 8, 8, False, "rows8"),
        (1 << 20, 16, 16, False, "rows16"),
        (4096, 33, 4, False, "rows4"),
        (4096, 64, 5, False, "rows8"),
        (16, 1 << 20, 16, False, "cols16"),
        (17, 4096, 9, False, "cols16"),
        (64, 5000, 3, False, "cols4"),
        # No skinny kernel for argmax or K past 16: tiles as wide as N (or as tall as M).
        (1 << 20, 16, 16, True, "tall16"),
        (1 << 20, 16, 64, False, "tall16"),
        (1 << 20, 17, 17, False, "tall32"),
        (4096, 64, 1000, False, "tall64"),
        (17, 4096, 8, True, "wide32"),
        (17, 4096, 33, False, "wide32"),
        (64, 5000, 65, False, "wide64"),
        (4096, 65, 8, False, "small"),  # 32 tiles of 128 x 128: too few to fill the GPU
        (65, 4096, 64, False, "small"),
        (1024, 1024, 1024, False, "small"),
        (2048, 2048, 8, False, "large"),
        (1024, 64, 64, False, "small"),
        (4095, 4095, 4095, True, "large"),
    ],
)
def test_shape_classes(m: int, n: int, k: int, argmax: bool, kind: str) -> None:
    assert tropical.shape_class(m, n, k, argmax=argmax) == kind


def test_batches_count_towards_filling_the_gpu() -> None:
    assert tropical.shape_class(512, 512, 512, batch=15) == "small"  # 240 tiles
    assert tropical.shape_class(512, 512, 512, batch=16) == "large"  # 256
    assert tropical.shape_class(64, 64, 64, batch=1 << 20) == "small"  # M, N <= 64


def test_every_default_tile_fits_its_variant() -> None:
    from aionvrtc.tropical.tuning import CANDIDATES, SHAPES, tile_fits

    assert set(tropical.TILES) == set(CANDIDATES) == set(SHAPES)
    for kind, variants in tropical.TILES.items():
        assert tuple(variants) == tropical.VARIANTS
        for variant, tile in variants.items():
            argmax = variant.endswith("-argmax")
            assert tile_fits(tile, int(variant[1]), argmax=argmax), (kind, variant, tile)
    assert not tile_fits((128, 128, 16, 8, 8, 1), 8)  # 64 KiB of shared memory
    # The argmax's 2 bytes per output: 16 KiB of tiles and 32 KiB of indices fit, no more.
    assert tile_fits((128, 128, 8, 8, 8, 1), 4, argmax=True)
    assert not tile_fits((128, 128, 16, 8, 8, 1), 4, argmax=True)
    assert not tile_fits((256, 16, 8, 8, 2, 1), 4)  # B's 8 x 16 tile, 256 threads


def test_spec_builders_validate() -> None:
    with pytest.raises(TypeError, match="gradients need float32 or float64"):
        tropical.backward_spec("maxplus", np.dtype(np.int32))
    with pytest.raises(TypeError, match="gradients need"):
        tropical.backward_spec("andor", np.dtype(np.bool_))
    layout: Any = "diagonal"
    with pytest.raises(ValueError, match="layout must be one of"):
        tropical.gemm_spec(
            "maxplus", np.dtype(np.float32), argmax=False, accumulate=False, layout=layout
        )
    spec = tropical.gemm_spec(
        "minplus", np.dtype(np.int64), argmax=True, accumulate=False, layout="strided"
    )
    assert spec.name_expressions == ("tropical_gemm<long long, MinPlus, true, false, false>",)
    assert list(tropical.SEMIRINGS) == ["maxplus", "minplus", "maxmul", "andor"]


def test_kernel_spec_names_the_kernel_of_each_shape_class() -> None:
    def name(*args: Any, **kwargs: Any) -> str:
        return tropical.kernel_spec(*args, **kwargs).name_expressions[0]

    assert name(4096, 4096, 4096).startswith("tropical_gemm_tiled<float, FastMaxPlus, false")
    assert name(4096, 4096, 4096, argmax=True).startswith(
        "tropical_gemm_tiled<float, FastMaxPlus, true, false, 64, 128, 16, 4, 8, 2>"
    )
    assert name(1 << 20, 16, 16) == "tropical_gemm_rows<float, FastMaxPlus, false, 16>"
    assert (
        name(16, 1 << 20, 8, "minplus", "int32") == "tropical_gemm_rows<int, FastMinPlus, false, 8>"
    )
    assert name(3, 5, 7, "andor", "bool").startswith("tropical_gemm<bool, AndOr, false")
    # Past the tuned kernel's 16-bit tile count, an argmax takes the generic kernel.
    assert name(4, 4, 1 << 21, argmax=True).startswith("tropical_gemm<float, MaxPlus, true")
    with pytest.raises(ValueError, match="sizes must be positive, got M=0"):
        tropical.kernel_spec(0, 4, 4)
    with pytest.raises(ValueError, match=r"^dtype is float32; andor takes bool$"):
        tropical.kernel_spec(4, 4, 4, "andor", "float32")


def test_skinny_kernel_serves_strided_operands() -> None:
    # A sweep's tall steps read A with k's stride the rest of the tensor: the skinny kernel
    # (any strides), not the generic kernel's 64 x 64 tiles; other strided products keep the
    # generic kernel (the tiles want row-major operands).
    from aionvrtc.tropical.products._product_plan import choose

    ring, f4 = tropical.SEMIRINGS["minplus"], np.dtype(np.float32)

    def name(m: int, n: int, k: int, *, rowmajor: bool) -> str:
        spec, *_ = choose(
            ring, f4, m, n, k, batch=2, argmax=False, accumulate=False, rowmajor=rowmajor,
            tile="auto", table=None,
        )  # fmt: skip
        return spec.name_expressions[0]

    assert name(1 << 30, 2, 2, rowmajor=False) == "tropical_gemm_rows<float, FastMinPlus, false, 4>"
    assert name(2, 1 << 30, 2, rowmajor=False) == "tropical_gemm_rows<float, FastMinPlus, false, 4>"
    assert (
        name(300, 260, 70, rowmajor=False) == "tropical_gemm<float, MinPlus, false, false, false>"
    )
    assert name(1 << 20, 16, 40, rowmajor=False).startswith("tropical_gemm<float, MinPlus, false")
    assert name(1 << 20, 16, 40, rowmajor=True).startswith("tropical_gemm_tiled<float, FastMinPlus")


KERNEL_DTYPES = "float32, float64, int32, int64, bool"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: tropical.kernel_spec(4, 4, 4, "maxplus", "float33"),
            f"dtype must be one of {KERNEL_DTYPES}, got 'float33'",
        ),
        (
            lambda: tropical.kernel_spec(4, 4, 4, "maxplus", None),
            f"dtype must be one of {KERNEL_DTYPES}, got None",
        ),
        (
            lambda: tropical.kernel_spec(4, 4, 4, "maxplus", np.float16),
            "dtype is float16; maxplus takes float32, float64, int32, int64",
        ),
        (
            lambda: tropical.gemm_spec(
                "maxplus", "float33", argmax=False, accumulate=False, layout="rowmajor"
            ),
            f"dtype must be one of {KERNEL_DTYPES}, got 'float33'",
        ),
        (
            lambda: tropical.gemm_spec(
                "andor", np.dtype(np.int32), argmax=False, accumulate=False, layout="rowmajor"
            ),
            "dtype is int32; andor takes bool",
        ),
        (
            lambda: tropical.backward_spec("maxplus", "float33"),
            f"dtype must be one of {KERNEL_DTYPES}, got 'float33'",
        ),
        (
            lambda: tropical.all_specs(["maxplus"], ["float32", "float33"]),
            f"each of dtypes must be one of {KERNEL_DTYPES}, got 'float33'",
        ),
        (
            lambda: tropical.all_specs(["andor"], ["float32", "int64"]),
            "no tropical kernels for semiring andor with dtypes float32, int64: andor takes bool",
        ),
        (
            lambda: tropical.all_specs(["maxplus", "minplus"], ["float32", "bool"]),
            "no tropical kernels for dtype bool under semirings maxplus, minplus: andor takes bool",
        ),
        (
            lambda: anyio.run(tropical.warm, ["andor"], ["float32"]),
            "no tropical kernels for semiring andor with dtype float32: andor takes bool",
        ),
        (
            lambda: anyio.run(tropical.warm, ["maxplus"], ["float33"]),
            f"each of dtypes must be one of {KERNEL_DTYPES}, got 'float33'",
        ),
    ],
)
def test_every_dtype_argument_names_itself_and_what_it_takes(call: Any, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        call()


def test_warm_and_all_specs_take_what_a_semiring_defines() -> None:
    # Named together, each semiring with its own dtypes: the pairs that exist, no error.
    both = tropical.all_specs(["maxplus", "andor"], ["float32", "bool"])
    assert both == tropical.all_specs(["maxplus"], ["float32"]) + tropical.all_specs(
        ["andor"], ["bool"]
    )
    # Every semiring (the default) with one dtype: the semirings that take it.
    assert tropical.all_specs(None, ["bool"]) == tropical.all_specs(["andor"], ["bool"])
    for given, what in (("maxplus", "semirings"), ("float32", "dtypes")):
        with pytest.raises(TypeError, match=rf"^{what} must be a list such as \['{given}'\]"):
            tropical.all_specs(**{what: given})


def test_warm_refuses_a_target_nvrtc_cannot_compile_for_before_compiling(tmp_path: Path) -> None:
    from aionvrtc import NvrtcError

    async def main() -> int:
        async with Compiler(arch="sm_90", cache_dir=tmp_path) as compiler:
            with pytest.raises(NvrtcError, match=r"cannot target sm_30 \(it supports sm_"):
                await tropical.warm(["andor"], ["bool"], arch="sm_30", compiler=compiler)
            with pytest.raises(NvrtcError, match=r"cannot target sm_35 \(it supports sm_"):
                await tropical.warm(["andor"], ["bool"], arch=["sm_90", "sm_35"], compiler=compiler)
            return compiler.stats().compiles

    assert anyio.run(main) == 0  # refused before any compile, sm_90's included


def test_warm_for_several_targets_in_one_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIONVRTC_CACHE_DIR", str(tmp_path))
    kernels = len(tropical.all_specs(["andor"], ["bool"]))
    count = anyio.run(lambda: tropical.warm(["andor"], ["bool"], arch=["sm_80", "sm_90", "sm_80"]))
    assert count == 2 * kernels  # a target named twice is compiled once

    async def again() -> tuple[int, int, dict[str, int]]:
        async with Compiler(arch="sm_75", cache_dir=tmp_path) as compiler:
            found = await tropical.warm(
                ["andor"], ["bool"], arch=("sm_90", "sm_80"), compiler=compiler
            )
            stats = compiler.stats()
            return found, stats.compiles, stats.memory.archs

    assert anyio.run(again) == (2 * kernels, 0, {"sm_80": kernels, "sm_90": kernels})
    with pytest.raises(ValueError, match=r"arch: name at least one target, such as \['sm_90'\]"):
        anyio.run(lambda: tropical.warm(["andor"], ["bool"], arch=[]))


def test_warm_without_a_compiler_fails_when_nothing_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aionvrtc import AionvrtcError

    path = tmp_path / "a-file"
    path.write_text("not a folder")
    monkeypatch.setenv("AIONVRTC_CACHE_DIR", str(path))
    kernels = len(tropical.all_specs(["andor"], ["bool"]))
    with pytest.raises(AionvrtcError) as raised:
        anyio.run(lambda: tropical.warm(["andor"], ["bool"], arch="sm_90"))
    assert str(raised.value) == (
        f"{kernels} of the {kernels} kernels compiled for sm_90 were not kept: the disk cache "
        f"at {path} is not writable (aionvrtc doctor says why, and the fix)"
    )


@pytest.mark.parametrize(
    ("dtypes", "error", "message"),
    [
        (["float33"], ValueError, "dtypes must be one of float32, float64, int32, int64, bool, "
         "got 'float33'"),
        (["bool"], ValueError, "dtypes: autotune tunes float32, float64, int32, int64, not bool"),
        ("float32", TypeError, "dtypes must be a list such as"),
    ],
)  # fmt: skip
def test_autotune_names_a_bad_dtype_before_it_needs_a_gpu(
    dtypes: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=re.escape(message)):
        anyio.run(lambda: tropical.autotune(dtypes))  # type: ignore[arg-type]


def test_a_failed_warm_compile_raises_its_error_not_a_group(tmp_path: Path) -> None:
    # The first compile that fails stops the others: its own error comes out, as from compile().
    from aionvrtc import CompileError, KernelSpec, Target
    from aionvrtc.tropical.products._calls import _compile_all

    broken = KernelSpec("__global__ void k() { not_defined(); }")
    good = KernelSpec("__global__ void k(int* x) { x[0] = 1; }")

    async def main() -> None:
        async with Compiler(arch="sm_90", cache_dir=tmp_path) as compiler:
            await _compile_all(compiler, [good, broken], [Target("sm_80"), Target("sm_90")])

    with pytest.raises(CompileError, match='identifier "not_defined" is undefined'):
        anyio.run(main)


def test_a_kernels_key_covers_its_family_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # Editing the backward kernel (or any other family) must not invalidate the cached tiled
    # kernels, nor their tuning record; editing what the tiled kernels include must.
    from aionvrtc.tropical.products import _specs

    def keys() -> dict[str, str]:
        _specs._text.cache_clear()  # the one monkeypatch put there, if any
        _specs.family_source.cache_clear()
        for spec_of in (_specs._gemm_spec, _specs.tiled_spec, _specs.rows_spec):
            spec_of.cache_clear()
        _specs._backward_spec.cache_clear()
        f4 = np.dtype("float32")
        maxplus = tropical.SEMIRINGS["maxplus"]
        specs = {
            "gemm": _specs.gemm_spec(
                "maxplus", f4, argmax=True, accumulate=False, layout="strided"
            ),
            "tiled": _specs.tiled_spec(maxplus, f4, argmax=False, accumulate=False),
            "rows": _specs.rows_spec(maxplus, f4, accumulate=False, kmax=16),
            "backward": _specs.backward_spec("maxplus", f4),
        }
        found = {name: kernel_key(spec, "sm_90") for name, spec in specs.items()}
        found["record"] = _specs.family_digest("tiled")
        return found

    real = _specs._text.__wrapped__
    before = keys()
    edited: dict[str, list[str]] = {
        "tropical_backward.cu": ["backward"],
        "tropical_gemm.cu": ["gemm"],
        "tropical_rows.cu": ["rows"],
        "tropical_fast.cuh": ["tiled", "rows", "record"],
        "tropical_common.cuh": ["gemm", "tiled", "rows", "record"],
        "tropical_tiled.cu": ["tiled", "record"],
    }
    try:
        for file, changed in edited.items():

            def text(name: str, edited_file: str = file) -> str:
                return real(name) + ("// edited\n" if name == edited_file else "")

            monkeypatch.setattr(_specs, "_text", functools.cache(text))
            after = keys()
            assert sorted(k for k in before if before[k] != after[k]) == sorted(changed), file
    finally:
        monkeypatch.undo()
        keys()  # the real sources again in every cache


def test_a_semiring_made_elsewhere_is_refused() -> None:
    # The kernels know the four semirings by name: one built with another struct is refused.
    import dataclasses

    from aionvrtc.tropical import SEMIRINGS

    maxplus = SEMIRINGS["maxplus"]
    fake = dataclasses.replace(maxplus, cpp="MinPlus")
    f4 = np.dtype("float32")
    with pytest.raises(ValueError, match=r"not a Semiring made elsewhere: 'maxplus'"):
        tropical.gemm_spec(fake, f4, argmax=False, accumulate=False, layout="rowmajor")
    by_object = tropical.gemm_spec(maxplus, f4, argmax=False, accumulate=False, layout="rowmajor")
    by_name = tropical.gemm_spec("maxplus", f4, argmax=False, accumulate=False, layout="rowmajor")
    assert by_object is by_name


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_batch": 0}, "max_batch must be a positive int, got 0"),
        ({"max_batch": True}, "max_batch must be a positive int, got True"),
        ({"max_batch": 2.0}, "max_batch must be a positive int, got 2.0"),
        ({"max_delay": -0.001}, r"max_delay must be a finite number of seconds >= 0, got -0.001"),
        ({"max_delay": float("inf")}, "max_delay must be a finite number of seconds >= 0, got inf"),
        ({"max_delay": "1ms"}, "max_delay must be a finite number of seconds >= 0, got '1ms'"),
        ({"max_queue": 0}, "max_queue must be a positive int or None, got 0"),
        ({"max_queue": True}, "max_queue must be a positive int or None, got True"),
        ({"max_queue": 8.0}, r"max_queue must be a positive int or None, got 8.0"),
    ],
)
def test_batcher_options_are_checked(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tropical.Batcher(**options)


def test_a_batcher_needs_no_gpu_until_it_is_asked() -> None:
    batcher = tropical.Batcher(max_batch=16, max_delay=0.002, max_queue=32)
    assert (batcher.max_batch, batcher.max_delay, batcher.max_queue) == (16, 0.002, 32)
    assert tropical.Batcher().max_queue is None
    assert batcher.stats() == tropical.BatcherStats(
        requests=0, launches=0, alone=0, standins=0, rejected=0
    )
    assert repr(batcher) == "<Batcher max_batch=16 max_delay=0.002: 0 requests in 0 launches>"
