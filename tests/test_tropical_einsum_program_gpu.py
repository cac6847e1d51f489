"""Compiled contractions (``tropical.einsum_program``) on the GPU: replays against the NumPy
reference on fresh random inputs for every semiring and dtype, replays after the operands
change, inputs read in place, ``out=``, streams, the assignment found on the device, the
program cache and its bounds, and two devices where the host has them."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from aionvrtc import Compiler, tropical
from aionvrtc.tropical import reference
from aionvrtc.tropical.networks import _programs, _rows, _steps
from aionvrtc.tropical.networks._backtrace import Scan

from .support.einsum import (
    ARGMAX_CASES,
    CASES,
    IDS,
    PETERSEN,
    SPIN,
    assert_same,
    check_assignment,
    check_assignments,
    independent_sets,
    kings_graph,
    network_values,
    random_network,
    tensors,
    with_output,
)
from .support.tropical_data import gpu, host

pytestmark = pytest.mark.gpu

# Expressions with products, reductions, batch indices, copies (abc,cba), a final reordering
# (->ki) and diagonals: every kind of launch a program captures.
EXPRESSIONS: list[tuple[str, list[tuple[int, ...]]]] = [
    ("ij,jk->ik", [(37, 45), (45, 29)]),
    ("ij,jk,kl->li", [(30, 20), (20, 10), (10, 50)]),
    ("bij,bjk->bik", [(3, 17, 9), (3, 9, 11)]),
    ("abc,cba->b", [(2, 3, 4), (4, 3, 2)]),
    ("ii,ij->j", [(6, 6), (6, 5)]),
    ("ijk->ki", [(4, 5, 6)]),
    ("ab,bc,cd,de,ea->", [(3, 4), (4, 5), (5, 3), (3, 4), (4, 3)]),
]


@pytest.fixture(autouse=True)
def _fresh_programs() -> Any:
    tropical.clear_programs()
    yield
    tropical.clear_programs()


def want(subscripts: str, operands: list[Any], ring: str, program: Any) -> Any:
    return reference.einsum(subscripts, *operands, semiring=ring, path=program.plan.path)


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
def test_programs_replay_the_reference(ring: str, dtype: Any, rng: np.random.Generator) -> None:
    # And a network of ten tensors: its first level's tiny steps run in one launch.
    network = random_network(rng, 10, 8)
    for subscripts, shapes in [*EXPRESSIONS, network]:
        first = tensors(rng, ring, dtype, shapes)
        program = tropical.einsum_program_sync(subscripts, *map(gpu, first), semiring=ring)
        assert program.plan.subscripts == subscripts
        assert (program.dtype, program.argmax) == (np.dtype(dtype), False)
        assert [x.shape for x in program.inputs] == shapes
        if subscripts == "abc,cba->b":  # no view reads either operand: read as they lie
            assert (program.plan.copies, program.plan.in_place) == (0, frozenset({0}))
            assert program.launches == 1  # (by tropical_many)
        what = f"{ring} {dtype} {subscripts}"
        assert_same(
            program.run_sync(*map(gpu, first)), want(subscripts, first, ring, program), what
        )
        # Again on other values: the replay reads each call's operands.
        second = tensors(rng, ring, dtype, shapes)
        got = program.run_sync(*map(gpu, second))
        assert_same(got, want(subscripts, second, ring, program), what + " (replayed)")
        # Written into the bound inputs, and run without operands: read in place.
        third = tensors(rng, ring, dtype, shapes)
        for bound, values in zip(program.inputs, third, strict=True):
            bound[...] = gpu(values)
        assert_same(program.run_sync(), want(subscripts, third, ring, program), what + " (bound)")
        # Some operands bound, others given: those given are gathered.
        mixed = [program.inputs[0], *map(gpu, second[1:])]
        expected = want(subscripts, [third[0], *second[1:]], ring, program)
        assert_same(program.run_sync(*mixed), expected, what + " (mixed)")


def test_operands_of_any_layout_and_out(rng: np.random.Generator) -> None:
    import cupy

    subscripts, shapes = "ij,jk,kl->li", [(30, 20), (20, 10), (10, 50)]
    operands = tensors(rng, "maxplus", np.float32, shapes)
    program = tropical.einsum_program_sync(subscripts, *shapes, dtype="float32")
    expected = want(subscripts, operands, "maxplus", program)
    # A transposed view (not contiguous) is made contiguous, then gathered.
    arrays = [gpu(x) for x in operands]
    arrays[1] = cupy.asfortranarray(arrays[1])
    assert not arrays[1].flags.c_contiguous
    assert_same(program.run_sync(*arrays), expected, "a Fortran-ordered operand")
    out = cupy.empty((50, 30), cupy.float32)
    assert program.run_sync(*arrays, out=out) is out
    assert_same(out, expected, "out=")
    strided = cupy.zeros((50, 60), cupy.float32)[:, ::2]
    assert program.run_sync(*arrays, out=strided) is strided
    assert_same(strided, expected, "a strided out=")
    # The bound output: no copy; it holds the latest call's result.
    assert program.run_sync(*arrays, out=program.output) is program.output
    assert_same(program.output, expected, "out=program.output")
    with pytest.raises(ValueError, match=re.escape("out must be float32 of shape (50, 30)")):
        program.run_sync(*arrays, out=cupy.empty((30, 50), cupy.float32))


def test_the_same_operands_again_are_read_again(rng: np.random.Generator) -> None:
    """The arrays of the previous call, passed again (written in place meanwhile), are not
    checked again but still read; one reshaped in place is checked, and refused."""
    subscripts, shapes = "ij,jk,kl->il", [(6, 4), (4, 5), (5, 3)]
    program = tropical.einsum_program_sync(subscripts, *shapes, dtype="int64", semiring="minplus")
    arrays = [gpu(x) for x in tensors(rng, "minplus", np.int64, shapes)]
    for _ in range(3):
        values = tensors(rng, "minplus", np.int64, shapes)
        for array, value in zip(arrays, values, strict=True):
            array[...] = gpu(value)
        assert_same(
            program.run_sync(*arrays), want(subscripts, values, "minplus", program), "again"
        )
    arrays[1].shape = (5, 4)
    with pytest.raises(ValueError, match=re.escape("operand 1 must be int64 of shape (4, 5)")):
        program.run_sync(*arrays)


def test_bad_operands_are_refused_with_what_to_do() -> None:
    import cupy

    program = tropical.einsum_program_sync("ij,jk->ik", (4, 5), (5, 6), dtype="float32")
    a, b = cupy.ones((4, 5), cupy.float32), cupy.ones((5, 6), cupy.float32)
    with pytest.raises(ValueError, match=re.escape("takes 2 operands (ij,jk->ik), got 1")):
        program.run_sync(a)
    message = (
        "einsum program operand 1 must be float32 of shape (5, 6) on device 0 (as the program "
        "was made), got float64 of shape (5, 6) on device 0; make a program for these with "
        "einsum_program"
    )
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        program.run_sync(a, b.astype(cupy.float64))
    with pytest.raises(
        TypeError, match=re.escape("operand 0 must be a cupy.ndarray, not numpy.ndarray")
    ):
        program.run_sync(np.ones((4, 5), np.float32), b)
    with pytest.raises(TypeError, match=re.escape("einsum_program of shapes needs dtype=")):
        tropical.einsum_program_sync("ij,jk->ik", (4, 5), (5, 6))
    with pytest.raises(ValueError, match=re.escape("more than it takes (16,777,216 elements")):
        tropical.einsum_program_sync("ij,jk->ik", (5000, 1), (1, 5000), dtype="float32",
                                     argmax=True)  # fmt: skip
    with pytest.raises(ValueError, match="index 'j' has size 0"):
        tropical.einsum_program_sync("ij,jk->ik", (4, 0), (0, 6), dtype="float32")


def test_calls_on_several_streams_are_ordered(rng: np.random.Generator) -> None:
    """Operands written on a stream behind a spinning kernel are read once written; a call on
    another stream waits for the previous call (they share the program's buffers)."""
    import cupy

    subscripts, shapes = "ij,jk,kl->il", [(64, 32), (32, 48), (48, 16)]
    operands = tensors(rng, "minplus", np.float32, shapes)
    program = tropical.einsum_program_sync(subscripts, *shapes, dtype="float32", semiring="minplus")
    expected = want(subscripts, operands, "minplus", program)
    spin = cupy.RawKernel(SPIN, "spin")
    first, second = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    sources = [gpu(x) for x in operands]
    late = [cupy.zeros_like(x) for x in sources]
    other = [gpu(x) for x in tensors(rng, "minplus", np.float32, shapes)]
    cupy.cuda.Device().synchronize()
    with first:
        spin((1,), (1,), (np.int64(400_000_000),))  # about 0.2 s
        for target, source in zip(late, sources, strict=True):
            target[...] = source
    got = program.run_sync(*late, stream=first)
    # On the second stream, right after: it must not overwrite the buffers the first call
    # still reads (that call is behind the spinning kernel).
    again = program.run_sync(*other, stream=second)
    second.synchronize()
    first.synchronize()
    assert_same(got, expected, "behind the spinning kernel")
    others = want(subscripts, [host(x) for x in other], "minplus", program)
    assert_same(again, others, "on a second stream")


@pytest.mark.parametrize(("ring", "dtype"), ARGMAX_CASES)
def test_the_assignment_found_on_the_device_attains_the_value(
    ring: str, dtype: str, rng: np.random.Generator
) -> None:
    for _ in range(4):
        subscripts, shapes = random_network(rng, int(rng.integers(8, 13)), int(rng.integers(7, 11)))
        program = tropical.einsum_program_sync(
            subscripts, *shapes, dtype=dtype, semiring=ring, argmax=True
        )
        for _ in range(2):  # replayed on new values
            operands = network_values(rng, ring, dtype, shapes)
            value, assignment = program.run_sync(*map(gpu, operands))
            assert_same(value, want(subscripts, operands, ring, program), subscripts)
            check_assignment(subscripts, operands, ring, host(value), assignment)
    # Many ties: the assignment must be a maximum independent set of the Petersen graph.
    subscripts, operands = independent_sets(10, PETERSEN, ring, dtype)
    program = tropical.einsum_program_sync(
        subscripts, *map(gpu, operands), semiring=ring, argmax=True
    )
    value, assignment = program.run_sync(*map(gpu, operands))
    assert host(value).item() == (4 if ring == "maxplus" else -4)
    check_assignment(subscripts, operands, ring, host(value), assignment)
    # The eager einsum finds it on the device too.
    value, assignment = tropical.einsum_sync(
        subscripts, *map(gpu, operands), semiring=ring, argmax=True
    )
    check_assignment(subscripts, operands, ring, host(value), assignment)


@pytest.mark.parametrize(("ring", "dtype"), ARGMAX_CASES)
def test_a_program_with_output_indices_finds_each_element_s_assignment(
    ring: str, dtype: str, rng: np.random.Generator
) -> None:
    # The batch of queries' form: a leading index of the output, an assignment per element;
    # the program's large products scanned again by each element's walk.
    attained = elements = 0
    for _ in range(3):
        subscripts, shapes = random_network(rng, int(rng.integers(8, 13)), int(rng.integers(7, 11)))
        subscripts = with_output(rng, subscripts, most=1)
        program = tropical.einsum_program_sync(
            subscripts, *shapes, dtype=dtype, semiring=ring, argmax=True
        )
        for _ in range(2):  # replayed on new values
            operands = network_values(rng, ring, dtype, shapes)
            value, assignment = program.run_sync(*map(gpu, operands))
            assert_same(value, want(subscripts, operands, ring, program), subscripts)
            attained += check_assignments(subscripts, operands, ring, host(value), assignment)
            elements += value.size
    assert attained >= elements // 2


@pytest.mark.parametrize(("ring", "dtype"), ARGMAX_CASES)
def test_large_products_are_scanned_again_by_the_backtrace(
    ring: str, dtype: str, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A program's large products keep no argmax: its backtrace scans their K again at the
    position it reaches. Forced here for every product of two operands the program keeps
    (SCAN_WORK 0): the value as the program that keeps every argmax, and an assignment that
    attains it."""
    scans = 0
    for _ in range(3):
        subscripts, shapes = random_network(rng, int(rng.integers(8, 13)), int(rng.integers(7, 11)))
        kept = tropical.einsum_program_sync(
            subscripts, *shapes, dtype=dtype, semiring=ring, argmax=True
        )
        with monkeypatch.context() as patched:
            patched.setattr(_rows, "SCAN_WORK", 0)
            patched.setattr(_steps, "_prepared", {})
            tropical.clear_programs()
            scanning = tropical.einsum_program_sync(
                subscripts, *shapes, dtype=dtype, semiring=ring, optimize=kept.plan, argmax=True
            )
        scans += sum(isinstance(w, Scan) for w in scanning._steps.argmaxes)
        for _ in range(2):  # replayed on new values
            operands = network_values(rng, ring, dtype, shapes)
            value, assignment = scanning.run_sync(*map(gpu, operands))
            assert_same(value, host(kept.run_sync(*map(gpu, operands))[0]), subscripts)
            check_assignment(subscripts, operands, ring, host(value), assignment)
    assert scans >= 3
    # Many ties: a maximum independent set of the Petersen graph.
    subscripts, operands = independent_sets(10, PETERSEN, ring, dtype)
    with monkeypatch.context() as patched:
        patched.setattr(_rows, "SCAN_WORK", 0)
        patched.setattr(_steps, "_prepared", {})
        program = tropical.einsum_program_sync(
            subscripts, *map(gpu, operands), semiring=ring, argmax=True
        )
    assert any(isinstance(w, Scan) for w in program._steps.argmaxes)
    value, assignment = program.run_sync(*map(gpu, operands))
    assert host(value).item() == (4 if ring == "maxplus" else -4)
    check_assignment(subscripts, operands, ring, host(value), assignment)


@pytest.mark.parametrize(("ring", "dtype"), CASES, ids=IDS)
def test_chains_of_steps_run_as_one_launch(
    ring: str, dtype: Any, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A king's graph row by row: chains of steps contracted as one (the products folded as
    the steps apart take them: the same values to the bit, floats with infinities included),
    and again with 64-bit offsets into the tensors (taken where a tensor's elements are
    numbered past 2^31: forced here, as no such tensor fits a test)."""
    subscripts, shapes, path = kings_graph(5)
    for wide in (False, True):
        if wide:
            monkeypatch.setattr(_rows, "NARROW", 0)
            tropical.clear_programs()
        program = tropical.einsum_program_sync(
            subscripts, *shapes, dtype=dtype, semiring=ring, optimize=path
        )
        assert program.launches * 2 < len(program.plan.steps)
        for _ in range(2):
            operands = tensors(rng, ring, dtype, shapes)
            got = program.run_sync(*map(gpu, operands))
            assert_same(got, want(subscripts, operands, ring, program), f"{ring} wide={wide}")
        if (ring, str(np.dtype(dtype))) in ARGMAX_CASES:
            found = tropical.einsum_program_sync(
                subscripts, *shapes, dtype=dtype, semiring=ring, optimize=path, argmax=True
            )
            operands = network_values(rng, ring, dtype, shapes)
            value, assignment = found.run_sync(*map(gpu, operands))
            assert_same(value, want(subscripts, operands, ring, found), f"{ring} argmax")
            check_assignment(subscripts, operands, ring, host(value), assignment)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_async_programs_through_a_compiler(tmp_path: Path, rng: np.random.Generator) -> None:
    subscripts, shapes = random_network(rng, 10, 8)
    operands = network_values(rng, "maxplus", "float32", shapes)
    async with Compiler(cache_dir=tmp_path) as compiler:
        program = await tropical.einsum_program(
            subscripts, *map(gpu, operands), argmax=True, compiler=compiler
        )
        # Every kernel of the steps, the gather and the small steps' kernel (the steps' own
        # where a step reads its operands in place), compiled through the caller's Compiler.
        kernels = program.plan.kernel_specs("maxplus", "float32", argmax=True, program=True)
        assert set(program._steps.specs) < set(kernels)
        assert compiler.stats().compiles == len(kernels)
        assert (
            await tropical.einsum_program(subscripts, *shapes, dtype="float32", argmax=True)
            is program
        )
        value, assignment = await program.run(*map(gpu, operands))
    assert_same(value, want(subscripts, operands, "maxplus", program), subscripts)
    check_assignment(subscripts, operands, "maxplus", host(value), assignment)
    # Calls from many tasks at once: each gets its own operands' result.
    values = [network_values(rng, "maxplus", "float32", shapes) for _ in range(8)]
    results: list[Any] = [None] * len(values)

    async def one(n: int) -> None:
        results[n] = await program.run(*map(gpu, values[n]))

    async with anyio.create_task_group() as tg:
        for n in range(len(values)):
            tg.start_soon(one, n)
    for n, (value, assignment) in enumerate(results):
        assert_same(value, want(subscripts, values[n], "maxplus", program), f"task {n}")
        check_assignment(subscripts, values[n], "maxplus", host(value), assignment)


def test_programs_are_cached_within_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    make = tropical.einsum_program_sync
    first = make("ij,jk->ik", (40, 50), (50, 60), dtype="float32")
    assert make("ij,jk->ik", (40, 50), (50, 60), dtype="float32") is first
    assert make("ij,jk->ik", (40, 50), (50, 60), dtype="float64") is not first
    assert make("ij,jk->ik", (40, 50), (50, 60), dtype="float32", semiring="minplus") is not first
    assert len(_programs._programs) == 3
    # Past MAX_PROGRAMS, the least recently used goes.
    monkeypatch.setattr(_programs, "MAX_PROGRAMS", 2)
    assert make("ij,jk->ik", (40, 50), (50, 60), dtype="float32") is first  # used: now newest
    make("ij,jk->ik", (4, 5), (5, 6), dtype="float32")
    assert len(_programs._programs) == 2
    assert first in _programs._programs.values()
    # Past MAX_PROGRAM_BYTES: dropped until the rest fit; a program larger than it is not kept.
    monkeypatch.setattr(_programs, "MAX_PROGRAM_BYTES", first.nbytes)
    big = make("ij,jk->ik", (400, 500), (500, 600), dtype="float32")
    assert big.nbytes > first.nbytes
    assert big not in _programs._programs.values()
    small = make("ij,jk->ik", (4, 5), (5, 6), dtype="float64")
    assert small in _programs._programs.values()
    assert sum(p.nbytes for p in _programs._programs.values()) <= first.nbytes
    assert make("ij,jk->ik", (400, 500), (500, 600), dtype="float32") is not big
    # A dropped program still runs: it owns its buffers.
    tropical.clear_programs()
    a, b = tensors(np.random.default_rng(5), "maxplus", np.float32, [(40, 50), (50, 60)])
    assert_same(first.run_sync(gpu(a), gpu(b)), reference.einsum("ij,jk->ik", a, b), "dropped")


def test_programs_on_a_second_device(rng: np.random.Generator) -> None:
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("one GPU")
    subscripts, shapes = random_network(rng, 10, 8)
    operands = network_values(rng, "minplus", "int64", shapes)
    with cupy.cuda.Device(1):
        arrays = [gpu(x) for x in operands]
    program = tropical.einsum_program_sync(subscripts, *arrays, semiring="minplus", argmax=True)
    assert program.device == 1
    assert program.inputs[0].device.id == 1
    value, assignment = program.run_sync(*arrays)  # called with device 0 current
    assert value.device.id == 1
    assert_same(value, want(subscripts, operands, "minplus", program), "device 1")
    check_assignment(subscripts, operands, "minplus", host(value), assignment)
    on_zero = tropical.einsum_program_sync(subscripts, *shapes, dtype="int64", semiring="minplus")
    assert on_zero.device == 0
    assert on_zero is not program


def test_the_byte_bound_is_each_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    # Programs of two devices, each within MAX_PROGRAM_BYTES but past it together, are both
    # kept (a sliced einsum over two GPUs holds one on each); a third on device 0 drops only
    # device 0's older one.
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs: run it on a machine with two")
    make = functools.partial(tropical.einsum_program_sync, "ij,jk->ik", dtype="float32")
    tropical.clear_programs()
    zero = make((40, 50), (50, 60), device=0)
    monkeypatch.setattr(_programs, "MAX_PROGRAM_BYTES", zero.nbytes)
    one = make((40, 50), (50, 60), device=1)
    assert zero.nbytes + one.nbytes > _programs.MAX_PROGRAM_BYTES
    assert list(_programs._programs.values()) == [zero, one]
    assert make((40, 50), (50, 60), device=0) is zero
    other = make((4, 5), (5, 6), device=0)
    assert list(_programs._programs.values()) == [one, other]
