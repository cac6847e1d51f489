"""The settings read from the environment: one module names them all (``_config``), the README
names the same ones, and each kind is read as documented, its errors naming the variable."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from aionvrtc import _config

from .support import ROOT, make_spec

SRC = ROOT / "src" / "aionvrtc"


def test_the_pages_name_no_setting_that_does_not_exist() -> None:
    # The settings page is generated from SETTINGS (one row each); every AIONVRTC_ name that a
    # page written by hand mentions is one of them.
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    import aionvrtc_docs

    table = aionvrtc_docs.settings_table()
    assert [line.split("`")[1] for line in table.splitlines()[2:]] == list(_config.SETTINGS)
    pages = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    named = {n for page in pages for n in re.findall(r"AIONVRTC_[A-Z_]*[A-Z]", page.read_text())}
    assert named <= set(_config.SETTINGS), named - set(_config.SETTINGS)
    assert {"AIONVRTC_CACHE_DIR", "AIONVRTC_DISK_LIMIT", "AIONVRTC_REMOTE_URL"} <= named


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


# -- every setting against hostile values --------------------------------------------------

URL = "AIONVRTC_REMOTE_URL"
UNREACHABLE = "redis://127.0.0.1:1"  # refused at once: the remote tier is a miss, never waited on
HUGE = "9" * 400
HOSTILE = {
    "garbage": "garbage\x01!@#",
    "huge": HUGE,
    "negative": "-5",
    "blank": " ",
    "unicode": "\u00fc\u6f22\U0001f600",
    "undecodable": "a\udcff",  # a byte that is not UTF-8, as os.environ holds it
}
SERVED = None  # the request is served (what cannot be used is warned of, never raised)
BAD_SIZE = r"^\$AIONVRTC_DISK_LIMIT: not a size: "
BAD_FLAG = r" must be 1 or 0 \(true/false, yes/no, on/off\), got "
BAD_URL = r"^\$AIONVRTC_REMOTE_URL: not a Redis URL: "
# What each value of each setting gives: SERVED, or the error's message (a regex). Every error
# names its variable first; a value that no use can give a meaning is an error, any other is
# served. The remote settings are tried with a URL (unreachable) and a secret set.
EXPECTED: dict[str, dict[str, str | None]] = {
    "AIONVRTC_CACHE_DIR": dict.fromkeys(HOSTILE, SERVED),  # relative folders: made in the cwd
    "AIONVRTC_DISK_LIMIT": {
        **dict.fromkeys(HOSTILE, BAD_SIZE),
        "huge": r"^\$AIONVRTC_DISK_LIMIT: too large a size: '9{40}'\.\.\. \(400 characters\) "
        r"\(at most 9223372036854775807 bytes, 8 EiB",
        "1e26": r"^\$AIONVRTC_DISK_LIMIT: too large a size: '1" + "0" * 26,
    },
    "AIONVRTC_SHARED_CACHE": {
        **dict.fromkeys(HOSTILE, r"^\$AIONVRTC_SHARED_CACHE" + BAD_FLAG),
        "huge": r"^\$AIONVRTC_SHARED_CACHE" + BAD_FLAG + r"'9{40}'\.\.\. \(400 characters\)$",
        "blank": SERVED,  # stripped: empty, so off
    },
    "AIONVRTC_ARCH": {
        **dict.fromkeys(HOSTILE, r"^\$AIONVRTC_ARCH: arch must look like 'sm_90'"),
        "huge": r"^\$AIONVRTC_ARCH: arch must look like .*, got '9{40}'\.\.\. \(400 characters\)$",
    },
    "AIONVRTC_CACHE_LAYERS": dict.fromkeys(HOSTILE, SERVED),  # each one missing: left out
    "AIONVRTC_MANIFEST": dict.fromkeys(HOSTILE, SERVED),  # relative files: made in the cwd
    URL: {
        **dict.fromkeys(HOSTILE, BAD_URL),
        "huge": BAD_URL + r"'9{40}'\.\.\. \(400 characters\) \(Redis URL must specify",
        "no scheme": BAD_URL + r"'localhost:6379' \(Redis URL must specify one of the",
        "bad IPv6": BAD_URL + r"'redis://\[::1:6379' \(Invalid IPv6 URL; examples: redis://",
        "port 99999": BAD_URL + r"'redis://localhost:99999' \(Port out of range 0-65535",
        "non-ASCII scheme": BAD_URL + r"'r\u00e9dis://x' \(Redis URL must specify",
    },
    "AIONVRTC_REMOTE_SECRET": dict.fromkeys(HOSTILE, SERVED),  # any bytes sign
    "AIONVRTC_REMOTE_ALLOW_UNSIGNED": {
        **dict.fromkeys(HOSTILE, r"^\$AIONVRTC_REMOTE_ALLOW_UNSIGNED" + BAD_FLAG),
        "blank": SERVED,
    },
}
VALUES = {
    **HOSTILE,
    "1e26": "1" + "0" * 26,
    "no scheme": "localhost:6379",
    "bad IPv6": "redis://[::1:6379",
    "port 99999": "redis://localhost:99999",
    "non-ASCII scheme": "r\u00e9dis://x",
}


def test_the_table_covers_every_setting() -> None:
    assert set(EXPECTED) == set(_config.SETTINGS)


@pytest.mark.parametrize(
    ("name", "label"),
    [(name, label) for name, cases in EXPECTED.items() for label in cases],
)
def test_a_hostile_value_is_served_or_refused_naming_its_variable(
    name: str, label: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aionvrtc import Compiler

    for variable in _config.SETTINGS:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AIONVRTC_ARCH", "sm_90")
    monkeypatch.setenv("AIONVRTC_CACHE_DIR", str(tmp_path / "cache"))
    if name.startswith("AIONVRTC_REMOTE"):
        monkeypatch.setenv(URL, UNREACHABLE)
        monkeypatch.setenv("AIONVRTC_REMOTE_SECRET", "a secret")
    monkeypatch.setenv(name, VALUES[label])
    expected = EXPECTED[name][label]
    spec = make_spec()

    async def request() -> int:
        async with Compiler() as compiler:
            await compiler.compile(spec)
            return compiler.stats().compiles

    if expected is SERVED:
        assert anyio.run(request) == 1
        return
    with pytest.raises(ValueError, match=expected) as raised:
        anyio.run(request)
    assert type(raised.value) is ValueError  # not redis-py's, nor a UnicodeError
    assert len(str(raised.value)) < 300  # the value shortened, however long


def test_a_size_past_what_a_file_system_counts_is_refused_exactly() -> None:
    from aionvrtc._units import MAX_SIZE, parse_size

    # Exact where a float is not: 2^63 - 1 is taken, one byte more is not, in any spelling.
    assert parse_size(str(MAX_SIZE)) == MAX_SIZE == parse_size("8589934591.999999999999999G")
    assert parse_size("0" * 5000 + "5K") == 5 << 10  # leading zeros, however many
    assert parse_size("1." + "9" * 5000) == 1  # digits past a byte's 10^-30th: dropped
    for past in (str(MAX_SIZE + 1), "8589934592G", "8388608T", HUGE):
        with pytest.raises(
            ValueError, match=r"^too large a size: .* \(at most 9223372036854775807"
        ):
            parse_size(past)


def test_the_command_line_reports_a_size_too_large_as_the_setting_it_is(tmp_path: Path) -> None:
    # Not "a bug in aionvrtc": the variable, its value shortened, what it takes.
    env = {**os.environ, "AIONVRTC_DISK_LIMIT": HUGE, "AIONVRTC_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "aionvrtc", "cache", "info"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == (
        f"error: $AIONVRTC_DISK_LIMIT: too large a size: '{'9' * 40}'... (400 characters) (at "
        "most 9223372036854775807 bytes, 8 EiB, the most a file system counts; examples: "
        "1048576, 500M, 2GiB)\n"
    )
