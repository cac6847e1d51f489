"""On the GPU: modules, launches, recompiling refused images, synchronize."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from aionvrtc import (
    Compiler,
    GPUOutOfMemoryError,
    KernelSpec,
    ModuleLoadError,
    Target,
    kernel_key,
    synchronize,
)
from aionvrtc._artifact import encode
from aionvrtc._cuda_versions import driver_cuda

from .support import ENTRIES, run_python
from .support.gpu import run_axpy

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]

AXPY = r"""
template <typename T>
__global__ void axpy_{tag}(T a, const T* x, T* y, int n) {{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}}
"""

SPIN = r"""
extern "C" __global__ void spin(long long cycles, int* out) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
    out[threadIdx.x] = threadIdx.x + 1;
}
"""


async def spin(compiler: Compiler, seconds: float) -> tuple[Any, Any]:
    """A kernel that runs about ``seconds`` on a stream of its own: (the stream, its output,
    1 to 32 once it is done)."""
    import cupy

    module = await compiler.get(KernelSpec(SPIN))
    stream = cupy.cuda.Stream(non_blocking=True)
    out = cupy.zeros(32, dtype=cupy.int32)
    rate = cupy.cuda.runtime.getDeviceProperties(0)["clockRate"] * 1000  # cycles/s
    with stream:
        module.get_function("spin")((1,), (32,), (np.int64(rate * seconds), out))
    return stream, out


_tags = iter(range(10**6))


def axpy_spec() -> KernelSpec:
    tag = f"t{next(_tags)}_{id(_tags)}"
    return KernelSpec(
        AXPY.format(tag=tag),
        name_expressions=(f"axpy_{tag}<float>", f"axpy_{tag}<double>"),
        name=f"axpy_{tag}.cu",
    )


async def test_a_compiled_kernel_computes_the_right_answer(cache_dir: Path) -> None:
    spec = axpy_spec()
    float_expr, double_expr = spec.name_expressions
    async with Compiler(cache_dir=cache_dir) as compiler:
        module = await compiler.get(spec)
        assert module.device == 0
        assert run_axpy(module, float_expr, np.float32) < 1e-5
        assert run_axpy(module, double_expr, np.float64) < 1e-12
        # The mangled name works as well as the name expression.
        lowered = module.artifact.lowered_names[double_expr]
        assert module.get_function(lowered) is not None
        with pytest.raises(KeyError, match="no kernel 'nope' in this module"):
            module.get_function("nope")
        # A second get loads nothing: the same Module.
        assert await compiler.get(spec) is module
        assert await compiler.get(spec, device=0) is module
        stats = compiler.stats()
        assert (stats.compiles, stats.requests) == (1, 3)


def test_a_second_process_loads_from_disk_without_compiling(cache_dir: Path) -> None:
    spec = axpy_spec()

    async def first() -> None:
        async with Compiler(cache_dir=cache_dir) as compiler:
            await compiler.get(spec)

    anyio.run(first)
    expression = spec.name_expressions[0]
    out = run_python(
        f"""
import json, anyio, numpy as np
from aionvrtc import Compiler, KernelSpec
from tests.support.gpu import run_axpy
spec = KernelSpec({spec.source!r}, name_expressions={spec.name_expressions!r}, name={spec.name!r})
async def main():
    async with Compiler(cache_dir={str(cache_dir)!r}) as compiler:
        module = await compiler.get(spec)
        error = run_axpy(module, {expression!r}, np.float32)
        s = compiler.stats()
        print(json.dumps({{"compiles": s.compiles, "disk_hits": s.disk.hits, "error": error}}))
anyio.run(main)
"""
    )
    # The last line: the axpy's seed is printed before it.
    result = json.loads(out.splitlines()[-1])
    assert (result["compiles"], result["disk_hits"]) == (0, 1)
    assert result["error"] < 1e-5


@pytest.mark.parametrize("damage", ["bit-flip", "elf-garbage", "other-arch-cubin"])
async def test_a_bad_image_on_disk_is_recompiled_and_runs(cache_dir: Path, damage: str) -> None:
    spec = axpy_spec()
    arch = Target.current().arch
    key = kernel_key(spec, arch)
    entry = cache_dir / ENTRIES / key[:2] / key
    async with Compiler(cache_dir=cache_dir) as compiler:
        good = await compiler.compile(spec)
    if damage == "bit-flip":  # caught by the checksum
        data = bytearray(entry.read_bytes())
        data[len(data) // 2] ^= 0x40
        entry.write_bytes(bytes(data))
    else:  # a well-formed entry whose image the driver refuses
        if damage == "elf-garbage":
            image = b"\x7fELF" + bytes(range(256)) * 8
        else:
            async with Compiler(arch="sm_80", cache_dir=cache_dir) as other:
                image = (await other.compile(spec)).image
        entry.write_bytes(encode(dataclasses.replace(good, image=image)))
    async with Compiler(cache_dir=cache_dir) as compiler:
        # Another arch's entry of the same spec, which the recovery must leave alone.
        eighty = await compiler.compile(spec, arch="sm_80")
        module = await compiler.get(spec)
        assert run_axpy(module, spec.name_expressions[0], np.float32) < 1e-5
        stats = compiler.stats()
        # The refused image once, and sm_80 unless the damage was made of its disk entry.
        assert stats.compiles == (1 if damage == "other-arch-cubin" else 2)
        assert stats.disk.corrupt_dropped == (1 if damage == "bit-flip" else 0)
        assert await compiler.compile(spec, arch="sm_80") is eighty  # still in memory
    assert entry.read_bytes() == encode(dataclasses.replace(module.artifact))
    assert (cache_dir / ENTRIES / eighty.key[:2] / eighty.key).exists()  # and on disk


async def test_get_compiles_for_the_device_whatever_the_compilers_default(
    cache_dir: Path,
) -> None:
    from aionvrtc import _cuda

    spec = axpy_spec()
    own = Target.current()
    async with Compiler(arch="sm_80", cache_dir=cache_dir) as compiler:
        assert compiler.target_for(0) == own
        module = await compiler.get(spec)  # for the GPU's own arch, not compile()'s sm_80
        assert (module.artifact.arch, module.artifact.kind) == (own.arch, "cubin")
        assert module.artifact.key == kernel_key(spec, own)
        assert run_axpy(module, spec.name_expressions[0], np.float32) < 1e-5
        assert await compiler.get(spec, device=0) is module
        other = await compiler.compile(spec)  # compile() keeps the Compiler's arch
        assert other.arch == "sm_80"
        stats = compiler.stats()
        assert stats.compiles == 2
        assert {arch: share.compiles for arch, share in stats.archs.items()} == {
            "sm_80": 1,
            own.arch: 1,
        }
        if own.number // 10 != 8:  # a cubin of another major cannot run here, and says why
            with pytest.raises(ModuleLoadError, match=r"cubin for sm_80 cannot run on a GPU of"):
                _cuda.load(other, 0)
    # The driver here is known, and the image is one it runs.
    driver = driver_cuda()
    assert driver is not None
    assert _cuda.runnable(module.artifact, _cuda.check_device(0), driver) is None


async def test_a_suffixed_arch_for_this_gpu_is_kept(cache_dir: Path) -> None:
    own = Target.current()
    spec = axpy_spec()
    async with Compiler(arch=f"{own.arch}a", cache_dir=cache_dir) as compiler:
        assert compiler.target_for(0) == Target(f"{own.arch}a")
        module = await compiler.get(spec)
        assert module.artifact.arch == f"{own.arch}a"
        assert run_axpy(module, spec.name_expressions[0], np.float32) < 1e-5


async def test_synchronize_keeps_the_loop_serving() -> None:
    import cupy

    ticks = 0
    done = anyio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            await anyio.sleep(0.001)
            ticks += 1

    async with Compiler(disk=False) as compiler:
        stream, out = await spin(compiler, 0.2)
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            started = anyio.current_time()
            await synchronize(stream)
            waited = anyio.current_time() - started
            done.set()
        assert waited > 0.1  # it really waited for the kernel
        assert ticks > 20  # and the loop kept running meanwhile
        assert out.get().tolist() == list(range(1, 33))
        event = cupy.cuda.Event()
        event.record(stream)
        await synchronize(event)
        await synchronize()  # the current stream
        with pytest.raises(TypeError, match=r"synchronize takes a cupy\.cuda\.Stream"):
            await synchronize(42)


async def test_tasks_waiting_for_the_same_work_wake_together() -> None:
    """Tasks that began to wait at different times (so their polls have backed off to
    different periods) go on in one pass once the work they wait for is done: the first to
    find its event done wakes the others."""

    async with Compiler(disk=False) as compiler:
        stream, out = await spin(compiler, 0.2)
        woke: list[float] = []

        async def wait(i: int) -> None:
            await anyio.sleep(0.003 * i)
            await synchronize(stream)
            woke.append(anyio.current_time())

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(wait, i)
        assert len(woke) == 8
        assert out.get().tolist() == list(range(1, 33))  # woken when the work was done
        # Backed off to periods of up to 1 ms, each on its own clock, they would wake up to a
        # period apart; woken by the first, within one pass of the loop.
        assert max(woke) - min(woke) < 5e-4


def test_get_sync_from_threads(cache_dir: Path) -> None:
    spec = axpy_spec()
    modules: list[Any] = []

    async def main() -> None:
        async with Compiler(cache_dir=cache_dir) as compiler:

            def work() -> None:
                modules.append(compiler.get_sync(spec))

            async with anyio.create_task_group() as tg:
                for _ in range(4):
                    tg.start_soon(anyio.to_thread.run_sync, work)
            assert compiler.stats().compiles == 1

    anyio.run(main)
    assert len(modules) == 4
    assert all(m is modules[0] for m in modules)
    assert run_axpy(modules[0], spec.name_expressions[0], np.float32) < 1e-5


async def test_each_device_gets_its_own_module(cache_dir: Path) -> None:
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    if count < 2:
        pytest.skip("needs two GPUs: run on a machine with two for this check")
    spec = axpy_spec()
    async with Compiler(cache_dir=cache_dir) as compiler:
        modules: dict[int, list[Any]] = {device: [] for device in range(count)}

        async def request(device: int) -> None:
            modules[device].append(await compiler.get(spec, device=device))

        # Every device at once: one job per (kernel, arch), so GPUs of one arch share it.
        async with anyio.create_task_group() as tg:
            for _ in range(8):
                for device in range(count):
                    tg.start_soon(request, device)
        archs = {compiler.target_for(device) for device in range(count)}
        for device in range(count):
            assert all(m is modules[device][0] for m in modules[device])
            assert modules[device][0].device == device
            with cupy.cuda.Device(device):
                assert run_axpy(modules[device][0], spec.name_expressions[0], np.float32) < 1e-5
        assert len({id(m[0]) for m in modules.values()}) == count  # a module per device
        assert len({m[0].artifact.key for m in modules.values()}) == len(archs)
        stats = compiler.stats()
        assert stats.compiles == len(archs)  # compiled once per arch
        assert {arch: share.compiles for arch, share in stats.archs.items()} == {
            target.arch: 1 for target in archs
        }
        # The blocking form, from a thread whose current device is another one.
        one = await anyio.to_thread.run_sync(lambda: compiler.get_sync(spec, device=1))
        assert one is modules[1][0]
        print(f"{count} GPUs of {sorted(t.arch for t in archs)}: {stats.compiles} compile(s)")


async def test_bad_device_arguments(cache_dir: Path) -> None:
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    async with Compiler(cache_dir=cache_dir) as compiler:
        with pytest.raises(ValueError, match=f"device must be in 0..{count - 1}, got {count}"):
            await compiler.get(axpy_spec(), device=count)
        with pytest.raises(TypeError, match="device must be an int, not str"):
            await compiler.get(axpy_spec(), device="0")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="device must be an int, not bool"):  # not as 1
            await compiler.get(axpy_spec(), device=True)
        with pytest.raises(TypeError, match="device must be an int, not str"):
            compiler.target_for("0")  # type: ignore[arg-type]


# A kernel whose module needs 1 GiB of device memory when it loads (a __device__ array lives
# in the module): loading it on a GPU with less free is a real CUDA_ERROR_OUT_OF_MEMORY.
HOG = r"""
__device__ char hog_{tag}[1 << 30];
template <typename T>
__global__ void touch_{tag}(int i) {{ hog_{tag}[i] = T(1); }}
"""


async def test_a_full_gpu_keeps_the_cached_kernel_and_a_retry_loads_it(cache_dir: Path) -> None:
    import cupy

    tag = f"t{next(_tags)}_{id(_tags)}"
    spec = KernelSpec(HOG.format(tag=tag), name_expressions=(f"touch_{tag}<char>",))
    async with Compiler(cache_dir=cache_dir) as compiler:
        cached = await compiler.compile(spec, arch=compiler.target_for(0))  # not loaded yet
        entry = cache_dir / ENTRIES / cached.key[:2] / cached.key
        stored = entry.read_bytes()
        cupy.get_default_memory_pool().free_all_blocks()
        free, _ = cupy.cuda.runtime.memGetInfo()
        # All but 512 MiB taken, as a busy server's GPU: too little for the module's 1 GiB.
        taken = cupy.cuda.runtime.malloc(free - (512 << 20))
        try:
            with pytest.raises(GPUOutOfMemoryError) as info:
                await compiler.get(spec)
        finally:
            cupy.cuda.runtime.free(taken)
        assert info.value.status == "CUDA_ERROR_OUT_OF_MEMORY"
        assert str(info.value).endswith(
            "out of GPU memory (CUDA_ERROR_OUT_OF_MEMORY); the cached kernel is kept; free GPU "
            "memory and retry"
        )
        assert compiler.stats().compiles == 1
        assert entry.read_bytes() == stored
        # Free again: the cached kernel loads and runs, compiling nothing.
        module = await compiler.get(spec)
        assert module.artifact is cached
        module.get_function(spec.name_expressions[0])((1,), (1,), (np.int32(7),))
        await synchronize()
        assert compiler.stats().compiles == 1
    assert entry.read_bytes() == stored


def test_a_context_broken_by_a_fault_keeps_the_cached_kernel(cache_dir: Path) -> None:
    spec = axpy_spec()

    async def first() -> Path:
        async with Compiler(cache_dir=cache_dir) as compiler:
            key = (await compiler.get(spec)).artifact.key
        return cache_dir / ENTRIES / key[:2] / key

    entry = anyio.run(first)
    stored = entry.read_bytes()
    # In a process of its own: a kernel's fault breaks the process's context for good.
    out = run_python(
        f"""
import json, anyio, cupy, numpy as np
from aionvrtc import Compiler, KernelSpec, ModuleLoadError
spec = KernelSpec({spec.source!r}, name_expressions={spec.name_expressions!r}, name={spec.name!r})
fault = cupy.RawKernel('extern "C" __global__ void fault(int* p) {{ *p = 1; }}', "fault")
fault((1,), (1,), (np.uint64(8),))  # writes to address 8
try:
    cupy.cuda.runtime.deviceSynchronize()
except cupy.cuda.runtime.CUDARuntimeError:
    pass
async def main():
    async with Compiler(cache_dir={str(cache_dir)!r}) as compiler:
        try:
            await compiler.get(spec)
        except ModuleLoadError as error:
            s = compiler.stats()
            print(json.dumps({{"type": type(error).__name__, "status": error.status,
                              "message": str(error), "compiles": s.compiles}}))
anyio.run(main)
"""
    )
    result = json.loads(out.splitlines()[-1])
    # cuModuleLoadData's status after the fault, as an H100 gave it (device queries and making
    # the device current still succeed then).
    assert (result["type"], result["status"]) == ("ModuleLoadError", "CUDA_ERROR_ILLEGAL_ADDRESS")
    assert result["message"].endswith(
        "broke this process's CUDA context, which CUDA reports to every later call "
        "(CUDA_ERROR_ILLEGAL_ADDRESS); the cached kernel is kept; restart the process"
    )
    assert result["compiles"] == 0
    assert entry.read_bytes() == stored  # for the next process, which loads it
