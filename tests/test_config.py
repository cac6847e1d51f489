"""The settings read from the environment: one module names them all (``_config``), the README
names the same ones, and each kind is read as documented, its errors naming the variable."""

from __future__ import annotations

import os
import re

import pytest

from aionvrtc import _config

from .support import ROOT

SRC = ROOT / "src" / "aionvrtc"


def test_the_readme_names_every_setting_and_no_other() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"AIONVRTC_[A-Z_]*[A-Z]", readme))
    assert named == set(_config.SETTINGS)
    # The settings table: a row for each.
    table = readme.split("| location |", 1)[1].split("\n\n", 1)[0]
    assert {name for name in _config.SETTINGS if name in table} == set(_config.SETTINGS)


def test_no_other_module_reads_a_setting() -> None:
    elsewhere = [
        f"{path.relative_to(SRC)}:{n}"
        for path in SRC.rglob("*.py")
        if path.name != "_config.py"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"[\"']AIONVRTC_", line) or ("os.environ.get(" in line and "AIONVRTC" in line)
    ]
    assert elsewhere == []


def test_each_kind_is_read_as_documented(monkeypatch: pytest.MonkeyPatch) -> None:
    name = "AIONVRTC_TEST_SETTING"
    monkeypatch.delenv(name, raising=False)
    assert (_config.text(name), _config.flag(name), _config.size(name, 7)) == (None, False, 7)
    assert _config.paths(name) == []
    monkeypatch.setenv(name, "")  # set but empty: unset
    assert (_config.text(name), _config.size(name, 7), _config.paths(name)) == (None, 7, [])
    monkeypatch.setenv(name, "2GiB")
    assert (_config.text(name), _config.size(name, 7)) == ("2GiB", 2 << 30)
    monkeypatch.setenv(name, os.pathsep.join(["/a", "", "/b"]))
    assert _config.paths(name) == ["/a", "/b"]
    monkeypatch.setenv(name, "lots")
    with pytest.raises(ValueError, match=r"^\$AIONVRTC_TEST_SETTING: not a size: 'lots'"):
        _config.size(name, 7)
    with pytest.raises(ValueError, match=r"^\$AIONVRTC_TEST_SETTING must be 1 or 0"):
        _config.flag(name)
    for on in ("1", "true", "Yes", "ON"):
        monkeypatch.setenv(name, on)
        assert _config.flag(name)
