"""tropical.einsum on the GPU against the NumPy reference: index forms, views, networks and
generated expressions for every semiring and type; out=, stream=, compiler=, einsum_sync; the
argmax's assignment of every index, checked against the operands' entries on the host.

Each test draws fresh operands from a seed it prints (pytest shows it when the test fails);
``TROPICAL_TEST_SEED=<seed>`` runs a test again on the same operands.

The GPU contracts along its plan's path, the reference left to right unless given that path:
with it (``path=plan.path``), both form the same products in the same order, so they agree
exactly, floats and saturating integers included. Without it, the orders differ, which changes
only float rounding (compared with a tolerance) and integer saturation (operands drawn without
the extreme values there).
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import opt_einsum
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import aionvrtc
from aionvrtc import Compiler, tropical
from aionvrtc.tropical import SEMIRINGS, reference
from aionvrtc.tropical.networks import _steps

from .support.einsum import (
    ARGMAX_CASES,
    CASES,
    CYCLE5,
    IDS,
    PETERSEN,
    SPIN,
    Array,
    assert_same,
    check_assignment,
    check_assignments,
    expressions,
    independent_sets,
    layouts,
    network_values,
    random_network,
    relayout,
    tensors,
    with_output,
)
from .support.tropical_data import gpu, host, until_loaded

pytestmark = pytest.mark.gpu


def assert_close(got: Any, want: Array, what: str) -> None:
    """The reference's values up to float rounding (integers and booleans exactly)."""
    values = host(got)
    assert (values.shape, values.dtype) == (want.shape, want.dtype), what
    if want.dtype.kind != "f":
        np.testing.assert_array_equal(values, want, err_msg=what)
    else:
        tight = want.dtype == np.float64
        np.testing.assert_allclose(
            values, want, rtol=1e-12 if tight else 1e-5, atol=1e-9 if tight else 1e-3, err_msg=what
        )


def run_and_check(
    subscripts: str, operands: Sequence[Array], ring: str, arrays: Sequence[Any] | None = None
) -> Any:
    """einsum_sync on ``arrays`` (default: ``operands`` uploaded; views of the same values)
    against the reference along the plan's path; returns the plan."""
    arrays = [gpu(x) for x in operands] if arrays is None else arrays
    plan = tropical.einsum_plan(subscripts, *arrays)
    got = tropical.einsum_sync(subscripts, *arrays, semiring=ring, optimize=plan)
    want = reference.einsum(subscripts, *operands, semiring=ring, path=plan.path)
    assert_same(got, want, f"{ring} {subscripts}\n{plan}")
    return plan


# -- index forms, views, networks, for every semiring and type --------------------------------

Layout = Callable[[Array], Any] | None


def _transposed(x: Array) -> Any:
    return relayout(x, list(range(x.ndim))[::-1], [False] * x.ndim, False, upload=gpu)


def _reversed(x: Array) -> Any:
    return relayout(x, list(range(x.ndim)), [True] * x.ndim, False, upload=gpu)


def _sliced(x: Array) -> Any:
    return relayout(x, list(range(x.ndim)), [False] * x.ndim, True, upload=gpu)


EXPRESSIONS: list[tuple[str, str, list[tuple[int, ...]], Layout]] = [
    ("matmul", "ij,jk->ik", [(37, 45), (45, 29)], None),
    ("matmul-large", "ij,jk->ik", [(300, 264), (264, 136)], None),  # a tuned tile
    ("matmul-tall", "ij,jk->ik", [(4100, 8), (8, 7)], None),  # the skinny kernel
    ("matmul-swapped", "ij,jk->ki", [(37, 45), (45, 29)], None),
    ("matmul-transposed", "ij,jk->ik", [(37, 45), (45, 29)], _transposed),
    ("matmul-reversed", "ij,jk->ik", [(37, 45), (45, 29)], _reversed),
    ("matmul-sliced", "ij,jk->ik", [(37, 45), (45, 29)], _sliced),
    ("batched", "bij,bjk->bik", [(3, 17, 9), (3, 9, 11)], None),
    ("batched-inner", "ibj,bjk->bik", [(17, 3, 9), (3, 9, 11)], None),
    ("batched-transposed", "bij,bjk->bik", [(3, 17, 9), (3, 9, 11)], _transposed),
    ("diagonal", "ii->i", [(9, 9)], None),
    ("trace", "ii->", [(9, 9)], None),
    ("diagonal-product", "iij,jk->ik", [(5, 5, 7), (7, 6)], None),
    ("private-sum-rows", "ij->i", [(13, 17)], None),
    ("private-sum-columns", "ij->j", [(13, 17)], None),
    ("private-sums", "ijk->ki", [(3, 4, 5)], None),
    ("sum-all", "ijk->", [(3, 4, 5)], _transposed),
    ("outer", "i,j->ij", [(13,), (17,)], None),
    ("hadamard", "ij,ij->ij", [(13, 17), (13, 17)], None),
    ("hadamard-transposed", "ij,ij->ij", [(13, 17), (13, 17)], _transposed),
    ("ring-5", "ab,bc,cd,de,ea->", [(3, 4), (4, 5), (5, 3), (3, 4), (4, 3)], None),
    ("chain-6", "ab,bc,cd,de,ef,fa->af", [(3, 4), (4, 5), (5, 6), (6, 3), (3, 2), (2, 3)], None),
    ("network-5", "ijk,jl,lm,mk,i->", [(3, 4, 5), (4, 2), (2, 3), (3, 5), (3,)], None),
    ("scalars", ",->", [(), ()], None),
    ("scalars-3", ",,->", [(), (), ()], None),
    ("scalar-times-vector", "i,->i", [(7,), ()], None),
    ("scalar-alone", "->", [()], None),
    ("copies", "abc,cba->b", [(2, 3, 4), (4, 3, 2)], None),
    ("transpose", "ij->ji", [(5, 7)], None),
    ("implicit-matmul", "ij,jk", [(5, 7), (7, 3)], None),
    ("implicit-transpose", "ji", [(5, 7)], None),
    ("implicit-trace", "ii", [(6, 6)], None),
    ("empty-sum", "ij,jk->ik", [(3, 0), (0, 4)], None),
    ("empty-result", "ij,jk->ik", [(0, 5), (5, 4)], None),
]


@pytest.mark.parametrize(
    ("name", "subscripts", "shapes", "layout"), EXPRESSIONS, ids=[e[0] for e in EXPRESSIONS]
)
@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_expressions(
    ring: str,
    dtype: Any,
    name: str,
    subscripts: str,
    shapes: list[tuple[int, ...]],
    layout: Layout,
    rng: np.random.Generator,
) -> None:
    # With the infinities: exactly the reference along the same path.
    operands = tensors(rng, ring, dtype, shapes)
    arrays = [gpu(x) if layout is None else layout(x) for x in operands]
    for x, y in zip(operands, arrays, strict=True):
        np.testing.assert_array_equal(host(y), x)
    plan = tropical.einsum_plan(subscripts, *arrays)
    got = await tropical.einsum(subscripts, *arrays, semiring=ring)
    want = reference.einsum(subscripts, *operands, semiring=ring, path=plan.path)
    assert_same(got, want, f"{name} {ring} {dtype}\n{plan}")
    # Without them: the reference's own order, up to float rounding.
    operands = tensors(rng, ring, dtype, shapes, infinities=False)
    arrays = [gpu(x) if layout is None else layout(x) for x in operands]
    got = await tropical.einsum(subscripts, *arrays, semiring=ring)
    assert_close(got, reference.einsum(subscripts, *operands, semiring=ring), name)
    # And as numpy.einsum shapes it (0-d for a scalar).
    want_shape = np.einsum(subscripts, *(np.zeros(s) for s in shapes)).shape
    assert got.shape == want_shape


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
@settings(derandomize=True, max_examples=40, deadline=None)
@given(data=st.data())
def test_generated_expressions(ring: str, dtype: Any, data: st.DataObject) -> None:
    # test_tropical_einsum_reference's expressions (the infinities, values whose (x) overflows
    # or is NaN, repeated indices, implicit outputs), with operands in any memory order.
    subscripts, operands = data.draw(expressions(ring, np.dtype(dtype)))
    assume(all(x.size for x in operands))  # size 0: test_size_0_indices
    arrays = [
        relayout(x, *data.draw(layouts(x.ndim), label="layout"), upload=gpu) for x in operands
    ]
    run_and_check(subscripts, operands, ring, arrays)


SIZE_0 = [
    ("ij,jk->ik", [(3, 0), (0, 4)]),
    ("ij,jk->", [(2, 0), (0, 3)]),
    ("ij,jk->ik", [(0, 5), (5, 4)]),
    ("i->", [(0,)]),
    ("ab,->ab", [(2, 0), ()]),
    ("abc,c->ab", [(2, 0, 3), (3,)]),
    ("ab->", [(0, 0)]),
]


@pytest.mark.parametrize(("subscripts", "shapes"), SIZE_0)
def test_size_0_indices(subscripts: str, shapes: list[tuple[int, ...]]) -> None:
    for ring, dtype in CASES:
        operands = [np.zeros(s, dtype) for s in shapes]
        run_and_check(subscripts, operands, ring)


# -- out=, stream=, compiler=, einsum_sync ----------------------------------------------------

OUT_CASES = [
    ("ij,jk->ik", [(37, 45), (45, 29)]),  # the product writes into out
    ("ij,jk->ki", [(37, 45), (45, 29)]),  # swapped, into out too
    ("bij,bjk->bik", [(3, 17, 9), (3, 9, 11)]),
    ("abc,cba->ba", [(2, 3, 4), (4, 3, 2)]),  # copies, the result reordered into out
    ("ij->ji", [(5, 7)]),  # only the final copy
    ("ij->i", [(13, 17)]),
    ("ij,jk->", [(5, 7), (7, 3)]),
    (",->", [(), ()]),
]


@pytest.mark.parametrize(("subscripts", "shapes"), OUT_CASES)
@pytest.mark.parametrize(("ring", "dtype"), [("maxplus", np.float32), ("minplus", np.int64),
                                             ("andor", np.bool_)])  # fmt: skip
def test_out(
    ring: str, dtype: Any, subscripts: str, shapes: list[tuple[int, ...]], rng: np.random.Generator
) -> None:
    import cupy

    operands = tensors(rng, ring, dtype, shapes)
    arrays = [gpu(x) for x in operands]
    plan = tropical.einsum_plan(subscripts, *arrays)
    want = reference.einsum(subscripts, *operands, semiring=ring, path=plan.path)
    sentinel = np.dtype(dtype).type(1 if dtype == np.bool_ else 7)
    # Contiguous: filled, and returned.
    out = cupy.full(want.shape, sentinel, dtype)
    assert tropical.einsum_sync(subscripts, *arrays, semiring=ring, out=out) is out
    assert_same(out, want, f"contiguous out {subscripts}")
    if want.ndim == 0:
        return
    # Every other element of a larger array: filled, the elements between left alone.
    big = cupy.full((*want.shape[:-1], 2 * want.shape[-1]), sentinel, dtype)
    out = big[..., ::2]
    assert not out.flags.c_contiguous
    assert tropical.einsum_sync(subscripts, *arrays, semiring=ring, out=out) is out
    assert_same(out, want, f"strided out {subscripts}")
    assert (host(big[..., 1::2]) == sentinel).all()
    if want.ndim == 2:  # F order
        out = cupy.full(want.shape[::-1], sentinel, dtype).T
        assert tropical.einsum_sync(subscripts, *arrays, semiring=ring, out=out) is out
        assert_same(out, want, f"F-order out {subscripts}")


def test_out_of_the_wrong_kind_is_refused() -> None:
    import cupy

    a, b = cupy.ones((3, 4), cupy.float32), cupy.ones((4, 5), cupy.float32)
    cases: list[tuple[Any, type[Exception], str]] = [
        (cupy.empty((5, 3), cupy.float32), ValueError, "out must be float32 of shape (3, 5) on "
         "device 0, got float32 of shape (5, 3) on device 0"),
        (cupy.empty((3, 5), cupy.float64), ValueError, "out must be float32 of shape (3, 5) on "
         "device 0, got float64 of shape (3, 5) on device 0"),
        (np.empty((3, 5), np.float32), TypeError, "out must be a cupy.ndarray, not ndarray"),
    ]  # fmt: skip
    for out, error, message in cases:
        with pytest.raises(error, match="^" + re.escape(message) + "$"):
            tropical.einsum_sync("ij,jk->ik", a, b, out=out)


def test_operands_of_the_wrong_kind_are_refused() -> None:
    import cupy

    a = cupy.ones((3, 4), cupy.float32)
    cases: list[tuple[Callable[[], Any], type[Exception], str]] = [
        (lambda: tropical.einsum_sync("ij,jk->ik", a, cupy.ones((4, 5), cupy.float64)), TypeError,
         "einsum operands must have one dtype, got float32 (operand 0) and float64 (operand 1); "
         "convert them with .astype()"),
        (lambda: tropical.einsum_sync("ij,jk->ik", a, a), ValueError,
         "einsum index 'j' has size 4 in operand 0 and 3 in operand 1; an index must have one "
         "size everywhere"),
        (lambda: tropical.einsum_sync("ij->i", a, semiring="andor"), TypeError,
         "einsum operand 0 has dtype float32; andor takes bool"),
        (lambda: tropical.einsum_sync("ij->i", a.astype(cupy.float16)), TypeError,
         "einsum operand 0 has dtype float16; maxplus takes float32, float64, int32, int64"),
        (lambda: tropical.einsum_sync("ij,jk->ik", a, a.T, optimize="nonsense"), ValueError,
         "optimize='nonsense' is not an opt_einsum strategy, optimizer or path for 2 operands"),
    ]  # fmt: skip
    for call, error, message in cases:
        with pytest.raises(error, match="^" + re.escape(message)):
            call()


def test_an_output_larger_than_the_device_is_refused_before_allocating() -> None:
    import cupy

    total = cupy.cuda.Device(0).mem_info[1]
    v = cupy.ones(1 << 12, cupy.float32)
    pool = cupy.get_default_memory_pool()
    used = pool.used_bytes()
    # 2**36 float32, 256 GiB: more memory than any one GPU has.
    message = (
        "einsum output 'ijk' would hold 68,719,476,736 elements (274,877,906,944 bytes at 4 "
        f"each), more than the {total:,} bytes of device 0's memory; every order of contraction "
        "ends with it"
    )
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        tropical.einsum_sync("i,j,k->ijk", v, v, v)
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        anyio.run(lambda: tropical.einsum("i,j,k->ijk", v, v, v))
    assert pool.used_bytes() == used


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_the_kernels_fetched_serve_when_autotune_installs_others_meanwhile(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tiles installed (by autotune on another task) after einsum fetched its kernels and
    before it runs: the run uses the kernels it fetched. It used to fetch the new tiles' kernel
    on the event loop's thread, which with a caller's Compiler raised."""
    from aionvrtc.tropical.products import _launching, _shape_classes, _twins

    operands = tensors(rng, "maxplus", np.float32, [(300, 70), (70, 260)])
    arrays = [gpu(x) for x in operands]
    device = arrays[0].device.id
    table = {name: dict(variants) for name, variants in tropical.TILES.items()}
    table[tropical.shape_class(300, 260, 70)]["f4"] = (32, 32, 8, 2, 2, 1)
    fetch = _launching.module  # what einsum fetches its kernels with (through _twins)

    async def fetch_then_retune(spec: Any, device: int, compiler: Any) -> Any:
        found = await fetch(spec, device, compiler)
        _shape_classes.install(device, table)
        return found

    monkeypatch.setattr(_twins, "module", fetch_then_retune)
    try:
        async with Compiler(cache_dir=tmp_path) as compiler:
            got = await tropical.einsum("ij,jk->ik", *arrays, compiler=compiler)
            assert compiler.stats().compiles == 1  # the kernel fetched, nothing else
        assert tropical.tuned_tiles(device) is table  # installed meanwhile, as autotune does
    finally:
        _shape_classes.install(device, tropical.TILES)
    assert_same(got, reference.einsum("ij,jk->ik", *operands), "with tiles installed meanwhile")


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_stream_and_compiler(tmp_path: Path, rng: np.random.Generator) -> None:
    import cupy

    subscripts = "ij,jk,kl->il"
    operands = tensors(rng, "minplus", np.float32, [(300, 200), (200, 100), (100, 50)])
    stream = cupy.cuda.Stream(non_blocking=True)
    async with Compiler(cache_dir=tmp_path) as compiler:
        with stream:
            arrays = [gpu(x) for x in operands]
        plan = tropical.einsum_plan(subscripts, *arrays)
        assert tropical.tuned_tiles(arrays[0].device.id) == tropical.TILES  # what it names
        specs = plan.kernel_specs("minplus", np.float32)
        want = reference.einsum(subscripts, *operands, semiring="minplus", path=plan.path)
        got = await tropical.einsum(
            subscripts, *arrays, semiring="minplus", stream=stream, compiler=compiler
        )
        stream.synchronize()
        assert_same(got, want, "on a stream, through a compiler")
        first = compiler.stats()
        assert first.compiles == len(specs) >= 1
        # Again: every kernel from the compiler's memory, nothing compiled.
        again = await tropical.einsum(
            subscripts, *arrays, semiring="minplus", stream=stream, compiler=compiler
        )
        await aionvrtc.synchronize(stream)
        second = compiler.stats()
        assert second.compiles == first.compiles
        assert second.memory.hits - first.memory.hits == len(specs)
        assert_same(again, want, "again")
        # Work on the stream runs after what is queued there before it: operands written on the
        # stream behind a kernel that spins for a while are read only once written. (On another
        # stream, or CuPy's default one, which a non-blocking stream does not wait for, the
        # product would read the zeros.)
        spin = cupy.RawKernel(SPIN, "spin")
        sources = [gpu(x) for x in operands]
        late = [cupy.zeros_like(x) for x in sources]
        cupy.cuda.Device().synchronize()
        with stream:
            spin((1,), (1,), (np.int64(400_000_000),))  # about 0.2 s
            for target, source in zip(late, sources, strict=True):
                target[...] = source
        got = await tropical.einsum(
            subscripts, *late, semiring="minplus", stream=stream, compiler=compiler
        )
        stream.synchronize()
        assert_same(got, want, "behind the spinning kernel")
    # compiler=None from an event loop: aionvrtc's default Compiler.
    assert_same(await tropical.einsum(subscripts, *arrays, semiring="minplus"), want, "default")


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.parametrize(("ring", "dtype"), [("maxplus", np.float32), ("minplus", np.int32)])
async def test_a_step_whose_kernel_is_not_loaded_runs_at_once_on_one_that_is(
    tmp_path: Path, rng: np.random.Generator, ring: str, dtype: Any
) -> None:
    """One 256 x 64 x 256 product takes the small tiles, a batch of 64 the large ones: a
    network of the batch, contracted while serving, runs at once on the small tiles' kernel
    (a compile in front of it, "error" refuses) while its own loads in the background; the
    next contraction runs on its own. Values as the reference's, both times."""
    own = tropical.kernel_spec(256, 256, 64, ring, dtype, batch=64)
    assert own != tropical.kernel_spec(256, 256, 64, ring, dtype)
    small = tensors(rng, ring, dtype, [(256, 64), (64, 256)])
    batch = tensors(rng, ring, dtype, [(64, 256, 64), (64, 64, 256)])
    want = reference.einsum("bij,bjk->bik", *batch, semiring=ring)
    async with Compiler(cache_dir=tmp_path) as compiler:
        await tropical.einsum("ij,jk->ik", *map(gpu, small), semiring=ring, compiler=compiler)
        compiles = compiler.stats().compiles
        compiler.start_serving("error")
        for standing_in in (True, False):
            got = await tropical.einsum(
                "bij,bjk->bik", *map(gpu, batch), semiring=ring, compiler=compiler
            )
            assert_same(got, want, f"on a stand-in: {standing_in}")
            if standing_in:
                await until_loaded(compiler, own)
        stats = compiler.stats()
        assert (stats.hot_compiles, stats.compiles) == (0, compiles + 1)  # its own, meanwhile


def test_einsum_sync(rng: np.random.Generator) -> None:
    import cupy

    for ring, dtype in (("maxplus", np.float64), ("minplus", np.int32), ("maxmul", np.float32),
                        ("andor", np.bool_)):  # fmt: skip
        operands = tensors(rng, ring, dtype, [(6, 7), (7, 8), (8, 6)])
        arrays = [gpu(x) for x in operands]
        for subscripts in ("ij,jk,ki->i", "ij,jk,ki->", "ij,jk,kl"):
            run_and_check(subscripts, operands, ring, arrays)
        # On a stream, along an explicit path.
        stream = cupy.cuda.Stream(non_blocking=True)
        got = tropical.einsum_sync(
            "ij,jk,ki->ik", *arrays, semiring=ring, optimize=[(1, 2), (0, 1)], stream=stream
        )
        stream.synchronize()
        want = reference.einsum("ij,jk,ki->ik", *operands, semiring=ring, path=[(1, 2), (0, 1)])
        assert_same(got, want, f"{ring} on a stream")


@pytest.mark.parametrize(
    ("subscripts", "shapes", "copies", "in_place"),
    [
        ("abc,cba->b", [(4, 3, 8), (8, 3, 4)], 2, 0),
        ("abcd,dcba->ad", [(2, 5, 4, 3), (3, 4, 5, 2)], None, 0),
        ("ab,bc,cd,de,ea->", [(6, 6), (6, 6), (6, 6), (6, 6), (6, 6)], 1, 0),
        ("ijk->ki", [(3, 20, 5)], 1, 0),
        ("ij->ji", [(5, 7)], 1, 0),
        # Short sums that would copy read their operands in place (tropical_many).
        ("abc,cba->b", [(2, 3, 4), (4, 3, 2)], 0, 1),
        ("abcd,dcba->ad", [(2, 3, 2, 3), (3, 2, 3, 2)], 0, 1),
        ("ab,bc,cd,de,ea->", [(2, 3), (3, 4), (4, 2), (2, 3), (3, 2)], 0, 1),
        ("ijk->ki", [(3, 4, 5)], 0, 1),
    ],
)
def test_plans_with_copies(
    subscripts: str,
    shapes: list[tuple[int, ...]],
    copies: int | None,
    in_place: int,
    rng: np.random.Generator,
) -> None:
    for ring, dtype in CASES:
        operands = tensors(rng, ring, dtype, shapes)
        plan = run_and_check(subscripts, operands, ring)
        assert len(plan.in_place) == in_place, str(plan)
        if copies is None:
            assert plan.copies > 0, str(plan)
        else:
            assert plan.copies == copies, str(plan)


# -- the argmax: an assignment of every index that attains the value --------------------------


def argmax_and_check(subscripts: str, operands: Sequence[Array], ring: str) -> Any:
    arrays = [gpu(x) for x in operands]
    value, assignment = tropical.einsum_sync(subscripts, *arrays, semiring=ring, argmax=True)
    want = reference.einsum(subscripts, *operands, semiring=ring)
    assert_same(value, want, f"{ring} {subscripts}")
    check_assignment(subscripts, operands, ring, host(value), assignment)
    return value, assignment


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_backtrace_at_the_edge_of_shared_memory(dtype: str, rng: np.random.Generator) -> None:
    """The backtrace's values and code go in shared memory up to what a launch may ask beside
    the kernel's own (its scan's reduction, 2 KiB at most): a chain of 2 x 2 tensors whose walk
    just fits, and one just past it (its code read from global memory). Past 48 KiB in all, a
    launch fails."""
    for n, in_shared in ((903, True), (920, False)):
        symbols = [opt_einsum.get_symbol(i) for i in range(n + 1)]
        subscripts = ",".join(symbols[i] + symbols[i + 1] for i in range(n)) + "->"
        operands = network_values(rng, "maxplus", dtype, [(2, 2)] * n)
        path = [(0, 1)] * (n - 1)
        value, assignment = tropical.einsum_sync(
            subscripts, *map(gpu, operands), optimize=path, argmax=True
        )
        check_assignment(subscripts, operands, "maxplus", host(value), assignment)
        plan = tropical.einsum_plan(subscripts, *operands, optimize=path)
        steps = _steps.known(plan, SEMIRINGS["maxplus"], np.dtype(dtype), argmax=True, device=0)
        assert steps is not None
        walk = steps.ops[-1].launcher
        assert walk.spec.name_expressions[0].startswith("einsum_backtrace<")
        assert (walk.shared > 4 * len(plan.sizes)) is in_shared, walk.shared
        assert walk.shared <= 46 * 1024


@pytest.mark.parametrize(("ring", "dtype"), ARGMAX_CASES)
def test_argmax_of_small_networks(ring: str, dtype: str, rng: np.random.Generator) -> None:
    cases: list[tuple[str, list[tuple[int, ...]]]] = [
        ("ij,jk,ki->", [(4, 5), (5, 3), (3, 4)]),
        ("ij,jk->", [(37, 45), (45, 29)]),
        ("ij,jk->", [(300, 264), (264, 136)]),
        ("bij,bjk->", [(3, 17, 9), (3, 9, 11)]),
        ("ii->", [(9, 9)]),
        ("ij->", [(13, 17)]),
        ("i,i->", [(20,), (20,)]),
        ("abc,cba->", [(2, 3, 4), (4, 3, 2)]),  # with copies
        ("ab,bc,cd,de,ea->", [(3, 4), (4, 5), (5, 3), (3, 4), (4, 3)]),
        ("ijk,jl,lm,mk,i->", [(3, 4, 5), (4, 2), (2, 3), (3, 5), (3,)]),
        ("ii", [(6, 6)]),  # the implicit output is a scalar
    ]
    for subscripts, shapes in cases:
        argmax_and_check(subscripts, network_values(rng, ring, dtype, shapes), ring)
    _, assignment = argmax_and_check(",->", network_values(rng, ring, dtype, [(), ()]), ring)
    assert assignment == {}


LONG_K = "cdefghjkmnop"  # 12 summed indices of size 2: K = 4096 over a batch of few outputs


@pytest.mark.parametrize(("ring", "dtype"), ARGMAX_CASES)
def test_a_batch_of_few_outputs_over_a_long_k(
    ring: str, dtype: str, rng: np.random.Generator
) -> None:
    # Part of K summed as a batch first, then a reduction (the planner's relocation): the
    # value, eager and compiled, and (where the batch is summed later) the assignment.
    subscripts = f"bi{LONG_K},b{LONG_K}l->bil"
    shapes = [(2, 4) + (2,) * 12, (2,) + (2,) * 12 + (2,)]
    operands = network_values(rng, ring, dtype, shapes)
    plan = tropical.einsum_plan(subscripts, *operands, optimize=[(0, 1)])
    assert len(plan.steps) == 2
    assert plan.steps[0].split is None
    want = reference.einsum(subscripts, *operands, semiring=ring)
    got = tropical.einsum_sync(subscripts, *map(gpu, operands), semiring=ring, optimize=plan)
    assert_same(got, want, f"{ring} {subscripts}")
    program = tropical.einsum_program_sync(subscripts, *map(gpu, operands), semiring=ring,
                                           optimize=[(0, 1)])  # fmt: skip
    assert_same(program.run_sync(*map(gpu, operands)), want, f"{ring} {subscripts} (program)")
    scalar = f"bi{LONG_K},b{LONG_K}l,bil->"
    operands += network_values(rng, ring, dtype, [(2, 4, 2)])
    value, assignment = tropical.einsum_sync(
        scalar, *map(gpu, operands), semiring=ring, argmax=True, optimize=[(0, 1), (0, 1)]
    )
    assert_same(value, reference.einsum(scalar, *operands, semiring=ring), f"{ring} {scalar}")
    check_assignment(scalar, operands, ring, host(value), assignment)


@pytest.mark.parametrize(("ring", "dtype"), ARGMAX_CASES)
def test_argmax_of_random_tensor_networks(ring: str, dtype: str, rng: np.random.Generator) -> None:
    attained = 0
    for _ in range(6):
        subscripts, shapes = random_network(rng, int(rng.integers(8, 13)), int(rng.integers(7, 11)))
        operands = network_values(rng, ring, dtype, shapes)
        value, _ = argmax_and_check(subscripts, operands, ring)
        attained += int(host(value) != SEMIRINGS[ring].zero(np.dtype(dtype)))
    assert attained > 0  # most networks have some assignment avoiding the zeros


@pytest.mark.parametrize(("ring", "dtype"), ARGMAX_CASES)
@pytest.mark.parametrize(("n", "edges", "size"), [(5, CYCLE5, 2), (10, PETERSEN, 4)])
def test_argmax_finds_a_maximum_independent_set(
    ring: str, dtype: str, n: int, edges: list[tuple[int, int]], size: int
) -> None:
    # Many ties: every maximum set attains the value; the assignment must be one of them.
    subscripts, operands = independent_sets(n, edges, ring, dtype)
    value, assignment = argmax_and_check(subscripts, operands, ring)
    assert host(value).item() == (size if ring == "maxplus" else -size)
    chosen = {v for v in range(n) if assignment[string.ascii_lowercase[v]] == 1}
    assert len(chosen) == size
    assert not any(u in chosen and v in chosen for u, v in edges)


@pytest.mark.parametrize(("ring", "dtype"), ARGMAX_CASES)
def test_argmax_of_a_network_whose_value_is_the_zero(ring: str, dtype: str) -> None:
    zero = SEMIRINGS[ring].zero(np.dtype(dtype))
    x = np.array([zero, 3, 4], dtype)
    y = np.array([1, zero, zero], dtype)
    value, assignment = argmax_and_check("i,i->", [x, y], ring)
    assert host(value) == zero
    a = np.full((3, 4), zero, dtype)
    b = np.arange(20).reshape(4, 5).astype(dtype)
    value, assignment = argmax_and_check("ij,jk->", [a, b], ring)
    assert host(value) == zero
    assert sorted(assignment) == ["i", "j", "k"]


@pytest.mark.parametrize(("ring", "dtype"), ARGMAX_CASES)
def test_argmax_of_a_result_with_indices_gives_each_element_an_assignment(
    ring: str, dtype: str, rng: np.random.Generator
) -> None:
    # A block of the backtrace per element, each walking back from its own position.
    attained = elements = 0
    for _ in range(6):
        subscripts, shapes = random_network(rng, int(rng.integers(6, 10)), int(rng.integers(6, 9)))
        subscripts = with_output(rng, subscripts)
        operands = network_values(rng, ring, dtype, shapes)
        value, assignment = tropical.einsum_sync(
            subscripts, *map(gpu, operands), semiring=ring, argmax=True
        )
        assert_same(value, reference.einsum(subscripts, *operands, semiring=ring), subscripts)
        attained += check_assignments(subscripts, operands, ring, host(value), assignment)
        elements += value.size
    assert attained >= elements // 2


def test_argmax_needs_a_result_of_few_elements_and_indices_that_are_not_empty() -> None:
    import cupy

    a, b = cupy.ones((5000, 1), cupy.float32), cupy.ones((1, 5000), cupy.float32)
    message = (
        "einsum with argmax=True finds an assignment of all 3 indices for each of the "
        "result's 25,000,000 elements (800,000,000 bytes), more than it takes (16,777,216 "
        "elements, 1,073,741,824 bytes, within the "
    )
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        tropical.einsum_sync("ij,jk->ik", a, b, argmax=True)
    three = [cupy.ones(shape, cupy.float32) for shape in ((40, 50), (50, 30, 20), (30, 20, 60))]
    budget = 40 * 60 * 4  # the output itself: every index b, c, d sliced
    assert tropical.einsum_plan("ab,bcd,cde->ae", *three, memory_limit=budget).slicing
    message = (
        "a sliced einsum with argmax=True backtracks a scalar contraction, and "
        "'ab,bcd,cde->ae' has output indices 'ae'; give it an output of no indices "
        "('ij,jk->'), or run it whole on one device for an assignment of each element"
    )
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        tropical.einsum_sync("ab,bcd,cde->ae", *three, argmax=True, memory_limit=budget)
    for subscripts, shapes, index in (("ij,jk->", [(2, 0), (0, 3)], "j"), ("i->", [(0,)], "i"),
                                      ("ij,jk->", [(0, 2), (2, 3)], "i")):  # fmt: skip
        arrays = [cupy.ones(s, cupy.float32) for s in shapes]
        message = (
            f"einsum index {index!r} has size 0: the sum is empty and no assignment attains it"
        )
        with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
            tropical.einsum_sync(subscripts, *arrays, argmax=True)
        # Without the argmax, the empty sum is the zero.
        assert host(tropical.einsum_sync(subscripts, *arrays)).item() == -np.inf


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_async_argmax(rng: np.random.Generator) -> None:
    subscripts, shapes = random_network(rng, 10, 8)
    operands = network_values(rng, "maxplus", "float32", shapes)
    value, assignment = await tropical.einsum(
        subscripts, *(gpu(x) for x in operands), semiring="maxplus", argmax=True
    )
    assert_same(value, reference.einsum(subscripts, *operands), subscripts)
    check_assignment(subscripts, operands, "maxplus", host(value), assignment)
