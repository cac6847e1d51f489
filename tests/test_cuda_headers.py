"""CUDA's own headers (the runtime's, CCCL's) and third-party include trees (CuPy's), with the
real NVRTC: found, searched, compiled, and covered by the key."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio
import pytest

from aionvrtc import (
    CompileError,
    Compiler,
    KernelSpec,
    NvrtcError,
    Target,
    _cuda_headers,
    _nvrtc,
    kernel_key,
)

from .support import make_spec

SM90 = Target("sm_90")

# What a CUDA user writes: each needs CUDA's headers (and, but for fp16, CCCL's).
PROGRAMS = {
    "cuda_fp16": """
#include <cuda_fp16.h>
__global__ void twice(__half* h) { h[threadIdx.x] = __hadd(h[threadIdx.x], h[threadIdx.x]); }
""",
    # cooperative_groups/reduce.h includes "../cooperative_groups.h", and
    # details/driver_abi.h includes "info.h" from its own folder.
    "cooperative_groups": """
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
namespace cg = cooperative_groups;
__global__ void twice(int* x) {
    auto tile = cg::tiled_partition<32>(cg::this_thread_block());
    int total = cg::reduce(tile, x[threadIdx.x], cg::plus<int>());
    if (tile.thread_rank() == 0) x[0] = total;
}
""",
    "cub": """
#include <cub/block/block_reduce.cuh>
#include <cuda/std/cstdint>
__global__ void twice(cuda::std::int32_t* x) {
    using Reduce = cub::BlockReduce<cuda::std::int32_t, 128>;
    __shared__ typename Reduce::TempStorage scratch;
    cuda::std::int32_t total = Reduce(scratch).Sum(x[threadIdx.x]);
    if (threadIdx.x == 0) x[0] = total;  // the sum is thread 0's alone
}
""",
}


def test_cuda_headers_are_found_with_their_versions() -> None:
    found = {place.what: place for place in _cuda_headers.located()}
    assert set(found) == {"CUDA runtime", "CCCL"}, found  # the cuXX extra brings both
    runtime, cccl = found["CUDA runtime"], found["CCCL"]
    assert (Path(runtime.path) / "cuda_fp16.h").is_file()
    assert (Path(runtime.path) / "cooperative_groups.h").is_file()
    assert (Path(cccl.path) / "cuda" / "std" / "version").is_file()
    assert runtime.version is not None
    assert runtime.version.split(".")[0] == str(_nvrtc.version()[0])  # one CUDA major
    assert cccl.version is not None
    assert re.fullmatch(r"\d+\.\d+\.\d+", cccl.version)
    assert _cuda_headers.search_dirs() == (runtime.path, cccl.path)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_programs_that_include_cuda_headers_compile(name: str) -> None:
    spec = KernelSpec(PROGRAMS[name], name_expressions=("twice",), options=("-std=c++17",))
    assert spec.reads_host_files
    result = _nvrtc.compile_program(spec, SM90)
    assert result.kind == "cubin"
    assert result.image[:4] == b"\x7fELF"
    assert set(result.lowered_names) == {"twice"}


def test_the_key_covers_cuda_headers_only_for_programs_that_read_host_headers() -> None:
    plain = make_spec()
    assert not plain.reads_host_files
    assert plain._host_files().entries == ()
    including = KernelSpec(PROGRAMS["cuda_fp16"])
    entries = dict(including._host_files().entries)
    for place in _cuda_headers.located():
        assert place.path in entries  # its tree's digest, or "within" the folder that holds it
    assert re.fullmatch(r"[0-9a-f]{64}", entries[_cuda_headers.search_dirs()[0]])
    # Each spec that reads host files takes them anew (a change is seen by the next spec).
    assert KernelSpec(PROGRAMS["cuda_fp16"]) is not including
    assert kernel_key(KernelSpec(PROGRAMS["cuda_fp16"]), "sm_90") == kernel_key(including, "sm_90")


def test_in_memory_headers_that_cover_every_include_need_no_cuda_headers() -> None:
    spec = KernelSpec(
        '#include "tile.cuh"\n#include <detail/more.cuh>\n__global__ void k() {}',
        headers={"tile.cuh": '#include "detail/more.cuh"\n', "detail/more.cuh": "\n"},
    )
    assert not spec.reads_host_files
    assert spec._host_files().entries == ()
    assert KernelSpec(spec.source, headers=dict(spec.headers)) is spec  # shared, as any spec


def test_without_cuda_headers_a_program_that_needs_them_says_where_to_get_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No CUDA header found on this host (as on a machine without the wheels or a toolkit).
    monkeypatch.setattr(_cuda_headers, "search_dirs", lambda: ())
    spec = KernelSpec(PROGRAMS["cuda_fp16"])
    with pytest.raises(CompileError) as info:
        _nvrtc.compile_program(spec, SM90)
    message = str(info.value)
    assert 'cannot open source file "cuda_fp16.h"' in message
    extra = "cu13" if _nvrtc.version()[0] == 13 else "cu12"
    assert (
        "(if it is one of CUDA's own headers: none were found on this host; pip install "
        f"'aionvrtc[{extra}]' brings them"
    ) in message
    assert "or set CUDA_PATH to a CUDA toolkit" in message


def test_cupys_include_folder_works(tmp_path: Path) -> None:
    import cupy

    include = Path(cupy.__file__).parent / "_core" / "include"
    # 106 of its files include "../something.h": each lands inside the folder, beside the file.
    upward = [
        path
        for path in include.rglob("*.h")
        if re.search(r'^\s*#\s*include\s*"\.\./', path.read_text(errors="replace"), re.M)
    ]
    assert len(upward) > 50
    spec = KernelSpec(
        "#include <cupy/complex.cuh>\n"
        "__global__ void square(complex<float>* z) { z[0] = z[0] * z[0]; }\n",
        name_expressions=("square",),
        options=(f"-I{include}", "-std=c++17"),
    )
    entries = spec._host_files().entries
    assert entries[0][0] == str(include.resolve())  # the key covers CuPy's tree, then CUDA's
    assert [path for path, _ in entries[1:3]] == list(_cuda_headers.search_dirs())

    async def main() -> None:
        async with Compiler(arch="sm_90", cache_dir=tmp_path / "cache") as compiler:
            artifact = await compiler.compile(spec)
            assert artifact.image[:4] == b"\x7fELF"
            twin = KernelSpec(spec.source, name_expressions=("square",), options=spec.options)
            again = await compiler.compile(twin)
            assert again.key == artifact.key
            assert compiler.stats().compiles == 1

    anyio.run(main)


def test_a_header_is_found_beside_the_header_that_includes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # NVRTC reads the in-memory headers as files of a private folder: "b.h" from "sub/a.h"
    # is sub/b.h if there is one, as for files on disk; never a file of the working directory.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.h").write_text("__device__ int from_the_working_directory;\n")
    headers = {"sub/a.h": '#include "b.h"\n', "b.h": "__device__ int from_b;\n"}
    source = '#include "sub/a.h"\n__global__ void k() {}'
    image = _nvrtc.compile_program(KernelSpec(source, headers=headers), SM90).image
    assert set(re.findall(rb"from_\w+", image)) == {b"from_b"}  # the cubin's symbols
    beside = {**headers, "sub/b.h": "__device__ int from_sub_b;\n"}
    image = _nvrtc.compile_program(KernelSpec(source, headers=beside), SM90).image
    assert set(re.findall(rb"from_\w+", image)) == {b"from_sub_b"}


def test_messages_and_file_macros_name_the_program_and_headers_as_given() -> None:
    spec = KernelSpec(
        '#include "detail/a.h"\n__device__ const char where[] = __FILE__;\n'
        "__global__ void k() { undefined_in_source; }\n",
        headers={"detail/a.h": "__device__ const char there[] = __FILE__;\n"},
        name="my/kernel.cu",
    )
    with pytest.raises(CompileError) as info:
        _nvrtc.compile_program(spec, SM90)
    assert 'my/kernel.cu(3): error: identifier "undefined_in_source" is undefined' in info.value.log
    assert tempfile.gettempdir() not in info.value.log
    fixed = KernelSpec(spec.source.replace("undefined_in_source;", ""), headers=spec.headers,
                       name=spec.name)  # fmt: skip
    image = _nvrtc.compile_program(fixed, SM90).image
    # __FILE__ is the name given, in the cubin's data: not the private folder's path.
    assert b"my/kernel.cu\x00" in image
    assert b"detail/a.h\x00" in image
    assert tempfile.gettempdir().encode() not in image


def test_no_private_folder_is_left_behind_and_an_unwritable_temp_dir_is_an_nvrtc_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    spec = KernelSpec('#include "a.h"\n__global__ void k() {}', headers={"a.h": "\n"})
    _nvrtc.compile_program(spec, SM90)
    with pytest.raises(CompileError):
        _nvrtc.compile_program(KernelSpec("__global__ void k() { nope; }"), SM90)
    assert list(tmp_path.iterdir()) == []  # removed after a compile, and after a failure
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(blocked))
    with pytest.raises(NvrtcError) as info:
        _nvrtc.compile_program(spec, SM90)
    assert str(info.value).startswith(
        f"cannot make a private folder for the program's headers in {blocked} ("
    )
    assert str(info.value).endswith("); set TMPDIR to a folder this user can write")
    assert os.listdir(tmp_path) == ["a-file"]


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_programs_that_include_cuda_headers_run_right_on_the_gpu(name: str, tmp_path: Path) -> None:
    import cupy
    import numpy as np

    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed}")  # to replay a failure
    rng = np.random.default_rng(seed)
    spec = KernelSpec(PROGRAMS[name], name_expressions=("twice",), options=("-std=c++17",))

    async def main() -> None:
        async with Compiler(cache_dir=tmp_path / "cache") as compiler:
            module = await compiler.get(spec)
            kernel = module.get_function("twice")
            if name == "cuda_fp16":
                halves = rng.uniform(-8, 8, 128).astype(np.float16)
                x = cupy.asarray(halves)
                kernel((1,), (128,), (x,))
                assert (cupy.asnumpy(x) == halves + halves).all()  # exact: doubling a half
            else:
                values = rng.integers(-1000, 1000, 128, dtype=np.int32)
                x = cupy.asarray(values)
                kernel((1,), (128 if name == "cub" else 32,), (x,))
                want = values.sum() if name == "cub" else values[:32].sum()
                assert int(x[0]) == int(want)

    anyio.run(main)


def test_cuda_headers_are_searched_only_where_an_include_needs_them(tmp_path: Path) -> None:
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "val.h").write_text("#define VAL 1\n")
    body = "__device__ int value = VAL;\n__global__ void k() {}\n"
    own = KernelSpec('#include "val.h"\n' + body, options=[f"-I{inc}"])
    assert own.reads_host_files
    host = own._host_files()
    # Every include is found in its own folder: CUDA's are neither searched nor keyed.
    assert host.added == ()
    assert [path for path, _ in host.entries] == [str(inc.resolve())]
    assert _nvrtc.compile_program(own, SM90).kind == "cubin"
    # One include its folder lacks, or a question about one: CUDA's folders come after it.
    for wanting in ("#include <cuda_fp16.h>\n", "#if __has_include(<cuda_fp16.h>)\n#endif\n"):
        spec = KernelSpec('#include "val.h"\n' + wanting + body, options=[f"-I{inc}"])
        assert spec._host_files().added == _cuda_headers.search_dirs()
        assert len(spec._host_files().entries) == 1 + len(_cuda_headers.search_dirs())


def test_a_dot_dot_in_a_library_header_resolves_as_the_os_resolves_it(tmp_path: Path) -> None:
    # "m/../val.h" beside inc/c.h: inc/m does not exist, so that open fails and NVRTC goes on
    # to the in-memory headers' folder, where m/ does exist: val.h is the in-memory one.
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "c.h").write_text('#include "m/../val.h"\n')
    (inc / "val.h").write_text("__device__ int from_the_folder;\n")
    headers = {"m/x.h": "\n", "val.h": "__device__ int from_memory;\n"}
    spec = KernelSpec(
        "#include <c.h>\n__global__ void k() { from_memory = 1; }",
        headers=headers,
        options=[f"-I{inc}"],
    )
    image = _nvrtc.compile_program(spec, SM90).image
    assert set(re.findall(rb"from_\w+", image)) == {b"from_memory"}
    assert spec._host_files().entries == ((str(inc.resolve()), spec._host_files().entries[0][1]),)


def test_private_folders_of_dead_processes_are_removed_and_an_open_temp_dir_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead = tmp_path / f"aionvrtc-{gone.stdout.strip()}-x1y2"
    living = tmp_path / f"aionvrtc-{os.getppid()}-a1b2"  # pytest's parent: alive
    for folder in (dead, living):
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "h.h").write_text("\n")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    _nvrtc._temp_root_problem.cache_clear()
    _nvrtc.compile_program(KernelSpec("__global__ void k() {}"), SM90)
    assert sorted(os.listdir(tmp_path)) == [living.name]
    # A temp dir others can write without the sticky bit: they could swap a private folder.
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    monkeypatch.setattr(tempfile, "tempdir", str(open_dir))
    with pytest.raises(NvrtcError) as info:
        _nvrtc.compile_program(KernelSpec("__global__ void k() {}"), SM90)
    assert str(info.value).startswith(f"cannot compile in {open_dir}: {open_dir} is writable by")
    assert str(info.value).endswith(
        "set TMPDIR to a folder only this user can write (or fix its mode)"
    )
    assert os.listdir(open_dir) == []
