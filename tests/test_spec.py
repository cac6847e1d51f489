from __future__ import annotations

from collections.abc import Callable

import pytest

from aionvrtc import KernelSpec, Target
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
        ({"name": ""}, ValueError, "name must be a non-empty one-line program name"),
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
    k90 = spec.key("sm_90")
    assert spec.key(Target("sm_90")) is k90  # memoised: the very same string
    assert spec.key("sm_80") != k90
    assert len(spec._keys) == 2
    from aionvrtc import _nvrtc

    assert k90 == derive_key(spec, "sm_90", _nvrtc.version_string())


@pytest.mark.parametrize("option", ["=", " =x", "=sm_90"])
def test_options_with_an_empty_name_are_kept_for_nvrtc_to_judge(option: str) -> None:
    # Found by the property test of tests/reliability: these raised IndexError in validation.
    spec = KernelSpec(SRC, options=(option,))
    assert spec.options == (option,)
    assert len(spec.key("sm_90")) == 64
