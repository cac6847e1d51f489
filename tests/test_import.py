"""`import aionvrtc` loads nothing but its version: each public name is imported on first use
(a fresh interpreter per check, as a program starts)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

import aionvrtc


def fresh(code: str) -> object:
    """What ``code`` prints (JSON) in a new interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return json.loads(done.stdout)


def test_importing_the_package_loads_only_its_version() -> None:
    loaded = fresh(
        "import json, sys; import aionvrtc; "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('aionvrtc'))))"
    )
    assert loaded == ["aionvrtc", "aionvrtc._version"]
    # The first use of a name loads its module (and what that module needs), once.
    loaded = fresh(
        "import json, sys; import aionvrtc; aionvrtc.NvrtcError; "
        "print(json.dumps([m for m in ('aionvrtc._exceptions', 'aionvrtc._compiler') "
        "if m in sys.modules]))"
    )
    assert loaded == ["aionvrtc._exceptions"]


def test_every_public_name_is_there() -> None:
    where = aionvrtc._WHERE  # (the table the package's __getattr__ reads)
    assert set(aionvrtc.__all__) == {*where, "__version__"}
    for name, module in where.items():
        assert getattr(aionvrtc, name) is getattr(importlib.import_module(module, "aionvrtc"), name)
        assert name in dir(aionvrtc)
    names: dict[str, object] = {}
    exec("from aionvrtc import *", names)
    assert set(aionvrtc.__all__) <= set(names)
    with pytest.raises(AttributeError, match="module 'aionvrtc' has no attribute 'Compilr'"):
        aionvrtc.Compilr  # type: ignore[attr-defined]  # noqa: B018


def test_every_stats_type_a_compiler_reports_is_public() -> None:
    """What ``Compiler.stats()`` holds, each of its parts' types importable by name (to type a
    function that reads one, or to build one in a test)."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(aionvrtc.CompilerStats)
    for field in dataclasses.fields(aionvrtc.CompilerStats):
        kinds = [hints[field.name], *typing.get_args(hints[field.name])]
        for kind in kinds:
            if isinstance(kind, type) and kind.__name__.endswith("Stats"):
                assert getattr(aionvrtc, kind.__name__) is kind, field.name
                assert kind.__name__ in aionvrtc.__all__
    assert {"MemoryStats", "DiskStats", "RemoteStats", "LayerStats", "ArchStats"} <= set(
        aionvrtc.__all__
    )
