from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from aionvrtc import KernelSpec, Target, _cuda_headers, _includes, _nvrtc, kernel_key
from aionvrtc._spec import derive_key

SRC = "__global__ void k(float* x) { x[0] = 1.0f; }"


def test_spec_is_frozen_hashable_and_normalised() -> None:
    spec = KernelSpec(SRC, name_expressions=["k"], options=["-O3"], headers={"b.h": "", "a.h": ""})
    assert spec.name_expressions == ("k",)
    assert spec.options == ("-O3",)
    assert list(spec.headers) == ["a.h", "b.h"]
    headers = {"a.h": "", "b.h": ""}
    same = KernelSpec(SRC, name_expressions=("k",), options=("-O3",), headers=headers)
    assert spec == same
    assert len({spec, same}) == 1
    with pytest.raises(AttributeError):
        spec.source = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.headers["c.h"] = ""  # type: ignore[index]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"source": ""}, ValueError, "source must be a non-empty"),
        ({"source": "  \n"}, ValueError, "source must be a non-empty"),
        ({"source": b"__global__ void k(){}"}, TypeError, "source must be a str, not bytes"),
        ({"source": "a\x00b"}, ValueError, "source must not contain NUL"),
        ({"options": "-O3"}, TypeError, "options must be a sequence of str"),
        ({"options": ["-O3", 3]}, TypeError, r"options\[1\] must be a str, not int"),
        ({"options": [""]}, ValueError, r"options\[0\] must not be empty"),
        ({"options": ["-arch=sm_90"]}, ValueError, r"options\[0\] is '-arch=sm_90': the target"),
        ({"options": ["-O3", "--gpu-architecture=sm_80"]}, ValueError, r"options\[1\].*compiler"),
        ({"options": ["-arch", "sm_90"]}, ValueError, r"options\[0\] is '-arch'"),
        ({"options": ["-arch sm_90"]}, ValueError, r"options\[0\]"),
        ({"name_expressions": "k"}, TypeError, "name_expressions must be a sequence of str"),
        ({"name_expressions": [None]}, TypeError, r"name_expressions\[0\] must be a str"),
        ({"headers": [("a.h", "")]}, TypeError, "headers must be a mapping"),
        ({"headers": {"/abs.h": ""}}, ValueError, "'/abs.h' is not a plain relative name"),
        ({"headers": {"../up.h": ""}}, ValueError, "'../up.h' is not a plain relative name"),
        ({"headers": {"a/../b.h": ""}}, ValueError, "is not a plain relative name"),
        ({"headers": {"": ""}}, ValueError, "is not a plain relative name"),
        ({"headers": {"a\\b.h": ""}}, ValueError, "is not a plain relative name"),
        ({"headers": {"a.h": 1}}, TypeError, r"headers\['a.h'\] must be a str, not int"),
        ({"headers": {1: ""}}, TypeError, "a header name must be a str, not int"),
        ({"headers": {".": ""}}, ValueError, "'.' is not a plain relative name"),
        # A newline in a name would end the #line that names the file to NVRTC.
        ({"headers": {"x\n#include </etc/hostname>\nz.h": ""}}, ValueError, "plain relative"),
        ({"headers": {"a\rb.h": ""}}, ValueError, "is not a plain relative name"),
        ({"name": ""}, ValueError, "name must be a non-empty program name without control"),
        ({"name": "k\n#include </etc/hostname>\n.cu"}, ValueError, "without control characters"),
        ({"name": "k\x7f.cu"}, ValueError, "without control characters"),
        (
            {"options": ["--no-source-include"]},
            ValueError,
            r"options\[0\] is '--no-source-include': aionvrtc already keeps NVRTC from the "
            "working directory",
        ),
        ({"options": ["-no-source-include"]}, ValueError, r"options\[0\]"),
        ({"name": 5}, TypeError, "name must be a str, not int"),
    ],
)
def test_validation_names_the_bad_field(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    args = {"source": SRC, **kwargs}
    source = args.pop("source")
    with pytest.raises(error, match=message):
        KernelSpec(source, **args)  # type: ignore[arg-type]


def test_odd_but_plain_names_keep_their_spelling_in_file_and_messages() -> None:
    # "..cfg.h" is a plain name (no ".." component); "??/" would be a trigraph in a string
    # under C++14, and a quote must not end the #line naming the file.
    spec = KernelSpec(
        '#include "..cfg.h"\n__device__ const char f[] = __FILE__;\n__global__ void k() {}',
        headers={"..cfg.h": "__device__ const char g[] = __FILE__;\n"},
        name='k??/"q".cu',
        options=["-std=c++14"],
    )
    image = _nvrtc.compile_program(spec, Target("sm_90")).image
    assert b'k??/"q".cu\x00' in image
    assert b"..cfg.h\x00" in image


def test_header_subfolders_are_allowed() -> None:
    spec = KernelSpec(SRC, headers={"detail/tile.cuh": "#pragma once"})
    assert dict(spec.headers) == {"detail/tile.cuh": "#pragma once"}


def test_target_validation() -> None:
    assert Target("sm_90").number == 90
    assert Target("sm_90a").number == 90
    assert Target("sm_100f").number == 100
    assert Target("sm_90") == Target("sm_90")
    for bad in ("90", "sm90", "compute_90", "sm_9", "sm_90x", ""):
        with pytest.raises(ValueError, match=f"arch must look like 'sm_90'.*got {bad!r}"):
            Target(bad)
    with pytest.raises(TypeError, match="arch must be a str"):
        Target(90)  # type: ignore[arg-type]


# Each variant changes exactly one input; every one must change the key.
VARIANTS: dict[str, Callable[[], KernelSpec]] = {
    "source": lambda: KernelSpec(SRC + " "),
    "name": lambda: KernelSpec(SRC, name="other.cu"),
    "header content": lambda: KernelSpec(SRC, headers={"a.h": "x"}),
    "header name": lambda: KernelSpec(SRC, headers={"b.h": ""}),
    "one option": lambda: KernelSpec(SRC, options=["-O3"]),
    "option order": lambda: KernelSpec(SRC, options=["-DB=1", "-DA=1"]),
    "name expression": lambda: KernelSpec(SRC, name_expressions=["k"]),
    "split options": lambda: KernelSpec(SRC, options=["-DA=1-DB=1"]),
}


def test_key_sensitivity_to_every_field() -> None:
    base = KernelSpec(SRC, headers={"a.h": ""}, options=["-DA=1", "-DB=1"])
    keys = {"base": derive_key(base, "sm_90", "13.5")}
    keys["plain"] = derive_key(KernelSpec(SRC), "sm_90", "13.5")
    for what, make in VARIANTS.items():
        keys[what] = derive_key(make(), "sm_90", "13.5")
    keys["arch"] = derive_key(base, "sm_80", "13.5")
    keys["nvrtc version"] = derive_key(base, "sm_90", "13.0")
    assert len(set(keys.values())) == len(keys), keys
    assert all(len(k) == 64 and int(k, 16) >= 0 for k in keys.values())


def test_key_is_length_prefixed_and_ignores_expression_order() -> None:
    ab_c = KernelSpec(SRC, options=["-Dab", "-Dc"])
    a_bc = KernelSpec(SRC, options=["-Da", "-Dbc"])
    assert derive_key(ab_c, "sm_90", "13.5") != derive_key(a_bc, "sm_90", "13.5")
    headers1 = KernelSpec(SRC, headers={"a.h": "bc"})
    headers2 = KernelSpec(SRC, headers={"a.hb": "c"})
    assert derive_key(headers1, "sm_90", "13.5") != derive_key(headers2, "sm_90", "13.5")
    one = KernelSpec(SRC, name_expressions=["x", "y"])
    two = KernelSpec(SRC, name_expressions=["y", "x", "y"])
    assert two.name_expressions == ("y", "x")
    assert derive_key(one, "sm_90", "13.5") == derive_key(two, "sm_90", "13.5")


def test_key_is_computed_once_per_target() -> None:
    spec = KernelSpec(SRC)
    k90 = kernel_key(spec, "sm_90")
    assert kernel_key(spec, Target("sm_90")) is k90  # memoised: the very same string
    assert kernel_key(spec, "sm_80") != k90
    assert len(spec._keys) == 2
    from aionvrtc import _nvrtc

    assert k90 == derive_key(spec, "sm_90", _nvrtc.build())


@pytest.mark.parametrize("option", ["=", "=x", "=sm_90"])
def test_options_with_an_empty_name_are_kept_for_nvrtc_to_judge(option: str) -> None:
    # Found by the property test of tests/reliability: these raised IndexError in validation
    # (" =x" did too; an option with white space around it is now refused, see below).
    spec = KernelSpec(SRC, options=(option,))
    assert spec.options == (option,)
    assert len(kernel_key(spec, "sm_90")) == 64


# -- options that read or write host files, or give no loadable image ---------------------

_WRITES = "it writes a file on the host"
_PCH = "precompiled headers are host files"
_LTO = "LTO IR for a link step"


@pytest.mark.parametrize(
    ("option", "reason"),
    [
        ("--time=/tmp/nvrtc-time.csv", _WRITES),
        ("-time=t.csv", _WRITES),
        ("--time /tmp/t.csv", _WRITES),
        ("--time", _WRITES),
        ("--fdevice-time-trace=/tmp/trace.json", _WRITES),
        ("-fdevice-time-trace=trace.json", _WRITES),
        ("--pch", _PCH),
        ("-pch", _PCH),
        ("--create-pch=k.pch", _PCH),
        ("-use-pch=k.pch", _PCH),
        ("--pch-dir=/tmp", _PCH),
        ("-dlto", _LTO),
        ("--dlink-time-opt", _LTO),
        ("--gen-opt-lto", _LTO),
        ("-gen-opt-lto", _LTO),
        ("-lto", _LTO),
        ("--optix-ir", "OptiX IR, not an image this library can load"),
        ("-optix-ir", "OptiX IR"),
        ("--fdevice-syntax-only", "produces no image to load"),
        ("-fdevice-syntax-only", "produces no image to load"),
        ("--arch=sm_90", "the target architecture belongs to the compiler"),
    ],
)
def test_options_that_touch_host_files_or_give_no_image_are_refused(
    option: str, reason: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(f"options[1] is {option!r}: ")) as info:
        KernelSpec(SRC, options=["-O3", option])
    assert reason in str(info.value)


def test_options_that_only_look_alike_are_kept() -> None:
    options = ("-Dtime=1", "-DLTO", "--pch-verbose=false", "-lineinfo", "--timeout")
    assert KernelSpec(SRC, options=options).options == options


# -- include directives in the source and in-memory headers --------------------------------


@pytest.mark.parametrize(
    ("text", "line", "why"),
    [
        ('#include "/tmp/val.h"\n', 1, "names an absolute path"),
        ("\n\n  #  include </usr/include/val.h>\n", 3, "names an absolute path"),
        ('#include "../val.h"\n', 1, "goes through '..' (NVRTC resolves it through the host's"),
        ('#include "a/../../val.h"\n', 1, "goes through '..'"),
        # Inside the in-memory names too: NVRTC opens <its folder>/d/.., a folder that need
        # not exist there, then looks in the -I folders.
        ('#include "./d/../val.h"\n', 1, "goes through '..'"),
        ('#include_next "/tmp/val.h"\n', 1, "absolute"),
        ("#define VAL_H <val.h>\n#include VAL_H\n", 2, "is a computed include"),
        # NVRTC reads each of these as an include of the host file (measured):
        ('%:include "/tmp/val.h"\n', 1, "absolute"),  # the digraph of "#"
        ('#/* c */include "/tmp/val.h"\n', 1, "absolute"),
        ('/*\n*/ # /*\n*/ include "/tmp/val.h"\n', 2, "absolute"),
        ('#inc\\\nlude "/tmp/val.h"\n', 1, "absolute"),  # a line splice
        ('??=include "/tmp/val.h"\n', 1, "absolute"),  # the trigraph, with -std=c++11
        ('#if __has_include("/tmp/val.h")\n#endif\n', 1, "absolute"),
        # A line regex, not a preprocessor: a directive inside a block comment is refused too.
        # That false refusal is the safe direction.
        ('/*\n#include "/tmp/val.h"\n*/\n', 2, "absolute"),
    ],
)
def test_includes_the_key_cannot_cover_are_refused(text: str, line: int, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"source, line {line}: ")) as info:
        KernelSpec(text + SRC)
    message = str(info.value)
    assert why in message
    assert "headers={'val.h': text}" in message
    assert "-I<dir>" in message
    with pytest.raises(ValueError, match=re.escape(f"headers['d/a.h'], line {line}: ")):
        KernelSpec(SRC, headers={"d/a.h": text})


@pytest.mark.parametrize(
    "text",
    [
        '#include "val.h"\n',
        '#include "./d/val.h"\n',
        "#include <cuda/std/cstdint>\n",
        "#if __has_include(<cuda_fp16.h>)\n#endif\n",
        "#if defined(__has_include)\n#endif\n",
        '// #include "/tmp/val.h"\n',
        '/* #include "/tmp/val.h" */\n',
        'const char* s = "#include \\"/tmp/val.h\\"";\n',
        "#define TWO 2 // include ../x\n",
    ],
)
def test_includes_that_resolve_in_memory_or_in_include_dirs_are_kept(text: str) -> None:
    assert KernelSpec(text + SRC, headers={"h.h": text}).source.startswith(text)


# -- pre-includes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "shown"),
    [
        (["--pre-include=val.h"], "val.h"),
        (["-include=val.h"], "val.h"),
        (["--pre-include", "val.h"], "val.h"),
        (["-include=/tmp/dir/val.h"], "val.h"),
        (["--pre-include=other.h"], "other.h"),
    ],
)
def test_a_pre_include_must_be_an_in_memory_header(options: list[str], shown: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"options[0] is {options[0]!r}: ")) as info:
        KernelSpec(SRC, options=options, headers={"x.h": ""})
    message = str(info.value)
    assert "is not in headers=" in message
    assert f"pass headers={{{shown!r}: text}} with --pre-include={shown}" in message


def test_an_in_memory_pre_include_is_in_the_key() -> None:
    one = KernelSpec(SRC, options=["--pre-include=val.h"], headers={"val.h": "#define VAL 1"})
    two = KernelSpec(SRC, options=["--pre-include=val.h"], headers={"val.h": "#define VAL 2"})
    assert not one.reads_host_files
    assert kernel_key(one, "sm_90") != kernel_key(two, "sm_90")


# -- include directories -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "dirs"),
    [
        (["-Iinc"], ("inc",)),
        (["-I=inc"], ("inc",)),
        (["-I inc"], ("inc",)),
        (["-I  inc"], ("inc",)),
        (["--include-path=inc"], ("inc",)),
        (["-I", "inc"], ("inc",)),
        (["--include-path", "inc"], ("inc",)),
        (["-Ia", "-DX", "-I=/abs/b", "-O3"], ("a", "/abs/b")),
        (["-I==inc"], ("=inc",)),  # NVRTC reads the folder "=inc" (measured)
        (["--include-path inc"], ("inc",)),  # NVRTC rejects it; covering it costs nothing
        (["-DA=1"], ()),
    ],
)
def test_include_dirs_in_every_form_nvrtc_accepts(
    options: list[str], dirs: tuple[str, ...]
) -> None:
    spec = KernelSpec(SRC, options=options)
    assert spec._include_dirs == dirs
    assert spec.reads_host_files is bool(dirs)


_NO_DIR = "it names no directory; give it in the same option, as in '-Iinclude'"
_SPACES = "NVRTC's reading of a directory with white space around it is unclear"
_AROUND = "white space around an option; write it without"


@pytest.mark.parametrize(
    ("options", "index", "why"),
    [
        (["-I"], 0, _NO_DIR),
        (["-I="], 0, _NO_DIR),
        (["--include-path="], 0, _NO_DIR),
        (["-O3", "-I", "-DX"], 1, _NO_DIR),  # a forgotten directory, not a folder named -DX
        (["-I= inc"], 0, _SPACES),  # NVRTC reads " inc" here but "inc" from "-I", " inc"
        (["-I", " inc"], 1, _AROUND),
        (["-Iinc "], 0, _AROUND),
        # NVRTC skips leading white space: " -I/dir" reads /dir, which the key must cover.
        ([" -I/dir"], 0, _AROUND),
        (["\t-I/dir"], 0, _AROUND),
        (["  --include-path=/dir"], 0, _AROUND),
        ([" --pre-include=/dir/val.h"], 0, _AROUND),
        (["-O3", " -include", "/dir/val.h"], 1, _AROUND),
        ([" -time=/tmp/t.csv"], 0, _AROUND),
        (["-I\tinc"], 0, _SPACES),
        (["-include="], 0, "it names no header name; give it in the same option"),
    ],
)
def test_include_options_nvrtc_would_read_unclearly_are_refused(
    options: list[str], index: int, why: str
) -> None:
    expected = f"options[{index}] is {options[index]!r}: {why}"
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}"):
        KernelSpec(SRC, options=options)


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


INCLUDING = '#include "val.h"\n__device__ int value = VAL;\n' + SRC


@pytest.fixture
def without_cuda_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the tests' own include folders: CUDA's (searched too, where a program includes a
    header from the host) would add their thousands of files to what these tests count."""
    monkeypatch.setattr(_cuda_headers, "search_dirs", lambda: ())


def test_the_key_covers_every_file_under_an_include_dir(tmp_path: Path) -> None:
    inc = _write(tmp_path / "inc", {"val.h": "#define VAL 1\n", "d/unused.h": "int a;\n"})
    options = [f"-I{inc}"]
    first = KernelSpec(INCLUDING, options=options)
    k1 = kernel_key(first, "sm_90")
    assert kernel_key(KernelSpec(INCLUDING, options=options), "sm_90") == k1  # nothing changed

    (inc / "val.h").write_text("#define VAL 2\n")
    assert kernel_key(KernelSpec(INCLUDING, options=options), "sm_90") != k1
    assert kernel_key(first, "sm_90") is k1  # a spec keeps its key: a new spec notices the change
    (inc / "val.h").write_text("#define VAL 1\n")
    assert kernel_key(KernelSpec(INCLUDING, options=options), "sm_90") == k1  # content, not time

    keys = {k1}
    (inc / "d" / "unused.h").write_text("int b;\n")  # not even included: still covered
    keys.add(kernel_key(KernelSpec(INCLUDING, options=options), "sm_90"))
    (inc / "d" / "new.h").write_text("")
    keys.add(kernel_key(KernelSpec(INCLUDING, options=options), "sm_90"))
    (inc / "d" / "new.h").rename(inc / "d" / "renamed.h")
    keys.add(kernel_key(KernelSpec(INCLUDING, options=options), "sm_90"))
    assert len(keys) == 4


def test_a_missing_include_dir_is_covered_as_missing(tmp_path: Path) -> None:
    options = [f"-I{tmp_path / 'later'}"]
    missing = kernel_key(KernelSpec(INCLUDING, options=options), "sm_90")
    assert kernel_key(KernelSpec(INCLUDING, options=options), "sm_90") == missing
    (tmp_path / "later").mkdir()
    empty = kernel_key(KernelSpec(INCLUDING, options=options), "sm_90")
    _write(tmp_path / "later", {"val.h": "#define VAL 1\n"})
    full = kernel_key(KernelSpec(INCLUDING, options=options), "sm_90")
    assert len({missing, empty, full}) == 3


def test_a_relative_include_dir_is_resolved_against_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for service in ("a", "b"):  # the same file in two folders: still two different files
        _write(tmp_path / service / "include", {"val.h": "#define VAL 1\n"})
    keys = []
    for service in ("a", "b"):
        monkeypatch.chdir(tmp_path / service)
        spec = KernelSpec(INCLUDING, options=["-Iinclude"])
        keys.append(kernel_key(spec, "sm_90"))
        assert spec._host_files().entries[0][0] == str((tmp_path / service / "include").resolve())
    assert keys[0] != keys[1]


def test_links_are_followed_and_loops_recorded(tmp_path: Path) -> None:
    outside = _write(tmp_path / "outside", {"val.h": "#define VAL 1\n"})
    inc = _write(tmp_path / "inc", {"a.h": ""})
    (inc / "val.h").symlink_to(outside / "val.h")
    (inc / "loop").symlink_to(inc)  # inc/loop/loop/... must not be walked forever
    (inc / "dangling.h").symlink_to(tmp_path / "nowhere.h")
    options = [f"-I{inc}"]
    first = kernel_key(KernelSpec(INCLUDING, options=options), "sm_90")
    (outside / "val.h").write_text("#define VAL 2\n")  # the link's target is what NVRTC reads
    assert kernel_key(KernelSpec(INCLUDING, options=options), "sm_90") != first


@pytest.mark.usefixtures("without_cuda_headers")
def test_a_warm_process_re_stats_but_does_not_re_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inc = _write(tmp_path / "inc", {f"h{i}.h": f"#define H{i} {i}\n" for i in range(5)})
    options = [f"-I{inc}"]
    monkeypatch.setattr(_includes, "RECENT_NS", 0)  # these files were written a moment ago
    before = _includes.files_read()
    first = kernel_key(KernelSpec(INCLUDING, options=options), "sm_90")
    assert _includes.files_read() - before == 5
    assert kernel_key(KernelSpec(INCLUDING, options=options), "sm_90") == first
    assert _includes.files_read() - before == 5  # the second derivation read no file
    (inc / "h3.h").write_text("#define H3 33\n")
    assert kernel_key(KernelSpec(INCLUDING, options=options), "sm_90") != first
    assert _includes.files_read() - before == 6  # only the changed one


@pytest.mark.usefixtures("without_cuda_headers")
def test_files_changed_a_moment_ago_are_read_again(tmp_path: Path) -> None:
    # A rewrite within the file system's timestamp granularity could keep a file's stat, so
    # recently changed files are not memoised.
    inc = _write(tmp_path / "inc", {"a.h": "", "b.h": ""})
    before = _includes.files_read()
    for _ in range(3):
        kernel_key(KernelSpec(INCLUDING, options=[f"-I{inc}"]), "sm_90")
    assert _includes.files_read() - before == 6


@pytest.mark.usefixtures("without_cuda_headers")  # they hold more than these bounds
def test_include_dirs_past_the_bounds_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inc = _write(tmp_path / "inc", {"a.h": "x" * 60, "b.h": "y" * 60, "d/c.h": ""})
    monkeypatch.setattr(_includes, "MAX_TREE_FILES", 3)
    with pytest.raises(ValueError, match=r"holds more than 3 files and folders") as info:
        kernel_key(KernelSpec(INCLUDING, options=[f"-I{inc}"]), "sm_90")
    assert f"include directory {str(inc)!r}" in str(info.value)
    assert "point -I at the library's include folder" in str(info.value)
    monkeypatch.setattr(_includes, "MAX_TREE_FILES", 4)
    monkeypatch.setattr(_includes, "MAX_TREE_BYTES", 100)
    with pytest.raises(ValueError, match="holds more than 100 bytes"):
        kernel_key(KernelSpec(INCLUDING, options=[f"-I{inc}"]), "sm_90")
    monkeypatch.setattr(_includes, "MAX_TREE_BYTES", 120)
    assert len(kernel_key(KernelSpec(INCLUDING, options=[f"-I{inc}"]), "sm_90")) == 64


def test_an_include_climbing_to_a_file_inside_the_include_dir_is_followed(tmp_path: Path) -> None:
    # CuPy's own tree does this: cupy/xsf/specfun/specfun.h includes "../config.h". NVRTC
    # looks for a quoted include beside the file that includes it first.
    inc = _write(
        tmp_path / "inc", {"val.h": "#define VAL 1\n", "d/e/c.h": '#include "../../val.h"\n'}
    )
    spec = KernelSpec(
        '#include "d/e/c.h"\n__device__ int value = VAL;\n' + SRC, options=[f"-I{inc}"]
    )
    first = kernel_key(spec, "sm_90")
    assert spec._host_files().entries[0] == (str(inc.resolve()), spec._host_files().entries[0][1])
    assert _nvrtc.compile_program(spec, Target("sm_90")).image  # NVRTC finds it too
    (inc / "val.h").write_text("#define VAL 2\n")
    assert kernel_key(KernelSpec(spec.source, options=spec.options), "sm_90") != first


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('#pragma once\n\n#include "../val.h"\n', "beside"),  # lands outside, on a file
        ("#pragma once\n\n#include <{outside}>\n", "absolute"),
    ],
)
def test_an_include_dir_file_that_reads_a_file_outside_is_refused_once_reached(
    tmp_path: Path, text: str, where: str
) -> None:
    outside = tmp_path / "val.h"
    outside.write_text("#define VAL 1\n")
    inc = _write(
        tmp_path / "inc", {"val.h": "#define VAL 1\n", "c.h": text.format(outside=outside)}
    )
    # Not included by the program: not checked (a library's tree holds many such files).
    assert len(kernel_key(KernelSpec(INCLUDING, options=[f"-I{inc}"]), "sm_90")) == 64
    reaching = KernelSpec("#include <c.h>\n" + INCLUDING, options=[f"-I{inc}"])
    with pytest.raises(ValueError, match=re.escape(f"{inc / 'c.h'}, line 3: ")) as info:
        kernel_key(reaching, "sm_90")
    message = str(info.value)
    assert f"makes NVRTC read {outside}, a file outside every include folder" in message
    assert "Give the folder that holds it as another -I" in message
    assert "edit" not in message  # a third-party tree cannot be edited
    # The fix it names works: the folder as another -I, so the key covers the file.
    fixed = KernelSpec(reaching.source, options=[f"-I{inc}", f"-I{tmp_path}"])
    assert len(kernel_key(fixed, "sm_90")) == 64


def test_an_absolute_include_of_nothing_is_covered_as_nothing(tmp_path: Path) -> None:
    later = tmp_path / "later" / "val.h"
    inc = _write(
        tmp_path / "inc", {"c.h": f"#if __has_include(<{later}>)\n#include <{later}>\n#endif\n"}
    )
    spec = KernelSpec("#include <c.h>\n" + SRC, options=[f"-I{inc}"])
    kernel_key(spec, "sm_90")
    assert spec._host_files().entries[-1] == (str(later), "absent")
    later.parent.mkdir()
    later.write_text("#define VAL 1\n")  # now NVRTC would read it: the next spec is refused
    with pytest.raises(ValueError, match=re.escape(f"makes NVRTC read {later}, a file outside")):
        kernel_key(KernelSpec(spec.source, options=spec.options), "sm_90")


def test_an_include_that_finds_nothing_beside_it_and_climbs_is_refused(tmp_path: Path) -> None:
    # NVRTC would go on looking above the private folder of the in-memory headers.
    inc = _write(tmp_path / "inc", {"d/c.h": '#include "../../gone.h"\n'})
    spec = KernelSpec("#include <d/c.h>\n" + SRC, options=[f"-I{inc}"])
    with pytest.raises(ValueError, match=re.escape(f"{inc / 'd' / 'c.h'}, line 1: ")) as info:
        kernel_key(spec, "sm_90")
    assert (
        "leads above the folder of the in-memory headers (NVRTC looks there before the -I "
        "folders), into a temporary folder the cache key does not cover" in str(info.value)
    )


def test_a_computed_include_in_a_reached_file_makes_every_file_count(tmp_path: Path) -> None:
    # Which file the macro names cannot be told, so every file of the folders is checked.
    outside = tmp_path / "outside.h"
    outside.write_text("")
    files = {"a.h": '#define NEXT "val.h"\n#include NEXT\n', "val.h": "#define VAL 1\n",
             "b.h": f'#include "{outside}"\n'}  # fmt: skip
    inc = _write(tmp_path / "inc", files)
    plain = KernelSpec(INCLUDING, options=[f"-I{inc}"])  # val.h only: b.h is not reached
    assert len(kernel_key(plain, "sm_90")) == 64
    computed = KernelSpec(
        '#include "a.h"\n__device__ int value = VAL;\n' + SRC, options=[f"-I{inc}"]
    )
    with pytest.raises(ValueError, match=re.escape(f"{inc / 'b.h'}, line 1: ")):
        kernel_key(computed, "sm_90")


def test_computed_includes_inside_an_include_dir_are_allowed(tmp_path: Path) -> None:
    # Libraries use them, and they resolve through the same covered search path.
    inc = _write(tmp_path / "inc", {"a.h": '#define NEXT "val.h"\n#include NEXT\n'})
    assert len(kernel_key(KernelSpec(INCLUDING, options=[f"-I{inc}"]), "sm_90")) == 64


def test_a_header_that_is_also_a_folder_of_headers_is_refused() -> None:
    with pytest.raises(ValueError, match=re.escape(
        "headers: 'detail' is a header and also the folder of 'detail/tile.cuh'; rename one"
    )):  # fmt: skip
        KernelSpec(SRC, headers={"detail": "", "detail/tile.cuh": ""})


def test_the_key_names_the_exact_nvrtc_build(monkeypatch: pytest.MonkeyPatch) -> None:
    from aionvrtc import _nvrtc

    source = SRC + "// the exact build"  # a spec no other test has keyed
    spec = KernelSpec(source)
    real = kernel_key(spec, "sm_90")
    assert real == derive_key(spec, "sm_90", _nvrtc.build())
    monkeypatch.setattr(_nvrtc, "build", lambda: f"{_nvrtc.version_string()}+another-build")
    rebuilt = kernel_key(KernelSpec(source), "sm_90")
    assert rebuilt != real
    assert rebuilt == derive_key(spec, "sm_90", f"{_nvrtc.version_string()}+another-build")
    assert kernel_key(spec, "sm_90") == rebuilt  # the spec remembers one key per target and build
    assert len(spec._keys) == 2


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"source": SRC + "// \ud800"}, "source"),
        ({"options": ["-O3", "-DX=\udc80"]}, "options[1]"),
        ({"name_expressions": ["k<\ud800>"]}, "name_expressions[0]"),
        ({"headers": {"a\ud800.h": ""}}, "headers: a header name"),
        ({"headers": {"a.h": "\udfff"}}, "headers['a.h']"),
        ({"name": "k\ud800.cu"}, "name"),
    ],
)
def test_text_that_cannot_be_utf8_is_refused_in_every_field(
    kwargs: dict[str, object], field: str
) -> None:
    args = {"source": SRC, **kwargs}
    source = args.pop("source")
    with pytest.raises(ValueError, match=re.escape(f"{field} cannot be encoded as UTF-8: ")):
        KernelSpec(source, **args)  # type: ignore[arg-type]


def test_keys_cost_no_import_and_the_spec_module_does_not_import_nvrtc() -> None:
    # An import statement in KernelSpec.key cost 638 ns of a memoised key's 1 us, and _spec
    # imported _nvrtc, which imported _spec (issue 16): the compiler derives keys now.
    import ast
    import dis

    from aionvrtc import Compiler, KernelCache, _cache, _spec

    for function in (kernel_key, _cache.keyed, KernelCache.key, Compiler.key):
        opcodes = {instruction.opname for instruction in dis.get_instructions(function)}
        assert not opcodes & {"IMPORT_NAME", "IMPORT_FROM"}, (function, opcodes)
    assert not hasattr(KernelSpec, "key")
    tree = ast.parse(Path(_spec.__file__).read_text())
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert "_nvrtc" not in imported


def test_an_equal_spec_built_again_is_the_same_object_and_derives_no_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Issue 16: a spec built per request re-derived its key on every hit (49.5 us for 34 KB).
    from aionvrtc import _cache

    source = SRC + "// " + "x" * 34_000  # one str object, as a server reuses its source
    first = KernelSpec(source, name_expressions=("k",), options=("-O3",), headers={"a.h": "1"})
    key = kernel_key(first, "sm_90")
    derived: list[KernelSpec] = []

    def counted(spec: KernelSpec, arch: str, build: str) -> str:
        derived.append(spec)
        return derive_key(spec, arch, build)

    monkeypatch.setattr(_cache, "derive_key", counted)
    again = KernelSpec(source, name_expressions=("k",), options=("-O3",), headers={"a.h": "1"})
    # Given differently (lists, unsorted headers), normalised to the same content:
    listed = KernelSpec(source, name_expressions=["k", "k"], options=["-O3"], headers={"a.h": "1"})
    assert again is first
    assert listed is first
    assert kernel_key(again, "sm_90") == kernel_key(listed, "sm_90") == key
    assert derived == []
    other = KernelSpec(source, name_expressions=("k",), options=("-O2",), headers={"a.h": "1"})
    assert other is not first
    assert kernel_key(other, "sm_90") != key
    assert derived == [other]


def test_the_interning_table_is_bounded_and_keeps_no_spec_that_reads_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import copy
    import pickle

    from aionvrtc import _spec

    monkeypatch.setattr(_spec, "_interned", {})
    monkeypatch.setattr(_spec, "_intern_state", _spec._InternState())
    monkeypatch.setattr(_spec, "INTERN_LIMIT", 3)
    specs = [KernelSpec(f"{SRC} // {i}") for i in range(4)]
    assert len(_spec._interned) == 3
    assert KernelSpec(f"{SRC} // 3") is specs[3]
    assert KernelSpec(f"{SRC} // 0") is not specs[0]  # the oldest went first
    assert KernelSpec(f"{SRC} // 0") == specs[0]
    for twin in (copy.copy(specs[3]), pickle.loads(pickle.dumps(specs[3]))):
        assert twin is specs[3]  # copies and pickles are built as specs are: shared
    monkeypatch.setattr(_spec, "INTERN_BYTES", 3 * len(SRC))  # bounded in text too
    KernelSpec(f"{SRC} // big")
    assert _spec._intern_state.size <= 3 * len(SRC)
    assert len(_spec._interned) < 3
    # A spec with include directories covers the files as it read them: always a new one.
    (tmp_path / "inc").mkdir()
    options = [f"-I{tmp_path / 'inc'}"]
    assert KernelSpec(SRC, options=options) is not KernelSpec(SRC, options=options)
    # ...and one with include directories reads them anew:
    reading = KernelSpec(SRC, options=options)
    for twin in (copy.deepcopy(reading), pickle.loads(pickle.dumps(reading))):
        assert twin == reading
        assert twin is not reading


def test_an_equal_spec_of_a_subclass_replaces_the_interned_one_without_leaking_its_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from aionvrtc import _spec

    class Tagged(KernelSpec):
        __slots__ = ()

    monkeypatch.setattr(_spec, "_interned", {})
    monkeypatch.setattr(_spec, "_intern_state", _spec._InternState())
    source = SRC + "// " + "x" * 1000
    for _ in range(10):
        assert type(KernelSpec(source)) is KernelSpec
        assert type(Tagged(source)) is Tagged
    assert len(_spec._interned) == 1
    assert _spec._intern_state.size == len(source)
