"""A cache dir with things in it that aionvrtc did not put there: FIFOs, folders and links at the
names of entries, shards and logs, bad permissions, other users' files. None of it may fail or
hang a request, and an entry is read only from a tree that nobody else can write.

Real files, FIFOs, permissions, processes and a real second user (uid 65534, through fork and
setuid, as root ignores file modes). Anything that would hang on a regression runs in a child
process with a timeout, so it fails instead.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from aionvrtc import Artifact, Compiler, KernelCache, KernelSpec, kernel_key
from aionvrtc._artifact import encode
from aionvrtc._store.disk import DiskTier

from ..support import ENTRIES, NOBODY, as_other_user, as_root, make_spec, run_python


def artifact(shard: str, fill: int = 1) -> Artifact:
    """A small entry whose key starts with ``shard`` (no compile needed)."""
    return Artifact(
        key=shard + f"{fill:02x}" * 31, kind="cubin", image=b"\x7fELF" + bytes([fill]) * 500,
        arch="sm_90", nvrtc_version="13.5", created=1_700_000_000.0,
    )  # fmt: skip


def warm_up(root: Path, art: Artifact) -> None:
    """Write, read and lock once in this process, so that a forked child (which cannot read
    the interpreter's library) finds everything it uses imported."""
    tier = DiskTier(root)
    assert tier.write(art)
    assert tier.read(art.key) == art
    with tier.lock(art.key):
        pass


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


DEEP = 1_200  # levels: past Python's recursion limit (1,000), which rmtree ran into


@pytest.fixture
def deep_folder(tmp_path: Path) -> Iterator[Callable[[Path], None]]:
    """Makes a folder nested DEEP levels at a path. Everything under tmp_path is removed with
    rm afterwards: shutil.rmtree (pytest's clean-up too) cannot remove it."""

    def make(path: Path) -> None:
        path.mkdir()
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for _ in range(DEEP):
                os.mkdir("d", dir_fd=fd)
                inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
                os.close(fd)
                fd = inner
        finally:
            os.close(fd)

    yield make
    subprocess.run(["rm", "-rf", "--", *map(str, tmp_path.iterdir())], check=True)


class Messages(logging.Handler):
    """aionvrtc's warnings, as text (caplog cannot see into a forked child)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def warnings() -> Iterator[Messages]:
    handler = Messages()
    logger = logging.getLogger("aionvrtc")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


# -- FIFOs, folders and links at an entry's name ---------------------------------------------

FIFO_AT_AN_ENTRY = """
import json, os, sys
import anyio
from aionvrtc import FORMAT_VERSION, Compiler, kernel_key
from tests.support import make_spec

root = sys.argv[1]

async def main():
    stuck, other = make_spec(), make_spec()
    key = kernel_key(stuck, "sm_90")
    shard = os.path.join(root, f"v{FORMAT_VERSION}", key[:2])
    os.makedirs(shard, mode=0o700)
    fifo = os.path.join(shard, key)
    os.mkfifo(fifo)
    async with Compiler(arch="sm_90", cache_dir=root, concurrency=1) as compiler:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                group.start_soon(compiler.compile, stuck)
                await anyio.sleep(0.05)  # the FIFO's request first, in the I/O lane
                other_done = await compiler.compile(other)
            first = await compiler.compile(stuck)
        stats = compiler.stats()
    print(json.dumps({
        "other": other_done.key == kernel_key(other, "sm_90"), "first": first.image[:4].hex(),
        "fifo_left": os.path.exists(fifo) and not os.path.isfile(fifo),
        "entry_written": os.path.isfile(fifo),
        "compiles": stats.compiles, "corrupt": stats.disk.corrupt_dropped,
    }))

anyio.run(main)
"""


def test_a_fifo_at_an_entry_is_dropped_and_blocks_no_request(tmp_path: Path) -> None:
    # In a child with a timeout: on a regression the open(2) of the FIFO blocks forever.
    out = run_python(
        f"import sys; sys.argv = ['-', {str(tmp_path / 'cache')!r}]\n" + FIFO_AT_AN_ENTRY,
        timeout=90,
    )
    assert json.loads(out) == {
        "other": True, "first": "7f454c46", "fifo_left": False, "entry_written": True,
        "compiles": 2, "corrupt": 1,
    }  # fmt: skip


def test_a_folder_at_an_entry_is_dropped_without_leaking_a_descriptor(
    tmp_path: Path, warnings: Messages
) -> None:
    tier = DiskTier(tmp_path / "cache")
    good = artifact("ab")
    assert tier.write(good)
    planted = tmp_path / "cache" / ENTRIES / "ab" / ("ab" + "77" * 31)
    planted.mkdir()
    (planted / "inside").write_bytes(b"x")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_bytes(b"keep me")
    (planted / "link").symlink_to(victim)  # rmtree must not follow it
    before = open_fds()
    for _ in range(3):
        assert tier.read(planted.name, arch="sm_90") is None
    assert open_fds() == before
    assert not planted.exists()
    assert (victim / "keep").read_bytes() == b"keep me"
    assert (tier.corrupt, tier.misses) == (1, 3)
    assert [m for m in warnings.messages if "dropping" in m] == [
        f"dropping disk cache entry {planted}: a folder, not a regular file"
    ]
    assert tier.read(good.key, arch="sm_90") == good  # the rest of the shard is fine


def test_a_deep_folder_at_an_entry_is_set_aside_and_the_key_written_again(
    tmp_path: Path, deep_folder: Callable[[Path], None]
) -> None:
    # A request never removes a tree: rmtree raised RecursionError here (the read failed), and
    # a large tree would take as long as it is large. It is renamed aside in its shard instead.
    tier = DiskTier(tmp_path / "cache")
    good = artifact("ab")
    assert tier.write(artifact("ab", 2))  # makes the shard
    planted = tier.path(good.key)
    deep_folder(planted)
    assert tier.read(good.key, arch="sm_90") is None
    assert (tier.corrupt, tier.misses, tier.read_failures) == (1, 1, 0)
    [aside] = [p for p in planted.parent.iterdir() if p.is_dir()]
    assert aside.name.startswith(f".{good.key}.damaged-")
    assert tier.write(good)  # the key's name is free again
    assert tier.read(good.key, arch="sm_90") == good
    # Never removed by the cache: reported, with a fix that works.
    [damage] = tier.survey().damaged
    assert damage.path == aside
    assert damage.problem == "a folder set aside: it was found where an entry or lock belongs"
    assert damage.fix == f"rm -r {aside}"
    subprocess.run(shlex.split(damage.fix), check=True)
    assert tier.survey().damaged == ()
    assert {e.key for e in tier.survey().entries} == {good.key, artifact("ab", 2).key}


def test_a_deep_folder_at_a_stale_tmp_name_is_reported_never_removed(
    tmp_path: Path, deep_folder: Callable[[Path], None]
) -> None:
    # A folder at a tmp name was removed with rmtree by the scan of a write's eviction: it
    # raised RecursionError through write(), and `cache ls` printed a traceback.
    root = tmp_path / "cache"
    assert DiskTier(root).write(artifact("cd"))
    tmp = root / ENTRIES / "cd" / f".{artifact('cd').key}.4242.feedf00d.tmp"
    deep_folder(tmp)
    old = time.time() - 3600
    os.utime(tmp, (old, old))
    tier = DiskTier(root)
    assert tier.write(artifact("cd", 2))  # its first write scans the cache dir
    assert tier.evict() == 0
    assert (tier.writable, tier.write_failures, tmp.is_dir()) == (True, 0, True)
    damaged = {"path": str(tmp), "problem": "a folder, not a regular file", "fix": f"rm -r {tmp}"}
    assert [str(d) for d in tier.survey().damaged] == [
        f"{tmp} is a folder, not a regular file; fix: rm -r {tmp}"
    ]
    outputs = []
    for command in (["ls"], ["prune", "--max-size", "0"]):
        proc = subprocess.run(
            [sys.executable, "-m", "aionvrtc", "cache", *command, "--json", "--cache-dir", root],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert (proc.returncode, proc.stderr) == (0, "")
        outputs.append(json.loads(proc.stdout))
    listed, pruned = outputs
    assert [{k: r[k] for k in damaged} for r in listed if r["kind"] == "damaged"] == [damaged]
    assert len([r for r in listed if r["kind"] == "cubin"]) == 2
    assert (pruned["removed"], pruned["entries"], pruned["damaged"]) == (2, 0, [damaged])
    assert tmp.is_dir()


TERMINAL_AT_AN_ENTRY = """
import json, os, sys
from aionvrtc._store.disk import DiskTier

tier = DiskTier(sys.argv[1])
missed = tier.read(sys.argv[2]) is None
try:
    os.close(os.open("/dev/tty", os.O_RDWR))  # only a process with a controlling terminal can
    controlling = True
except OSError:
    controlling = False
print(json.dumps({"miss": missed, "corrupt": tier.corrupt, "controlling_terminal": controlling}))
"""


@as_root
def test_a_terminal_at_an_entry_does_not_become_the_controlling_terminal(tmp_path: Path) -> None:
    # A session leader without a controlling terminal that opens a terminal without O_NOCTTY
    # takes it as its controlling terminal (and its signals). A pty's terminal is bind-mounted at
    # an entry's name (a device node made elsewhere does not open), read by a new session.
    tier = DiskTier(tmp_path / "cache")
    assert tier.write(artifact("de", 2))
    entry = tier.path(artifact("de").key)
    entry.write_bytes(b"")
    master, terminal = os.openpty()
    try:
        mount = ["mount", "--bind", os.ttyname(terminal), str(entry)]
        mounted = subprocess.run(mount, capture_output=True, text=True, check=False)
        if mounted.returncode != 0:
            pytest.skip(f"cannot bind-mount a terminal here: {mounted.stderr}")
        try:
            child = subprocess.run(
                [sys.executable, "-c", TERMINAL_AT_AN_ENTRY, str(tmp_path / "cache"), entry.name],
                start_new_session=True, capture_output=True, text=True, timeout=60, check=True,
            )  # fmt: skip
        finally:
            subprocess.run(["umount", str(entry)], check=True)
    finally:
        os.close(master)
        os.close(terminal)
    result = json.loads(child.stdout)
    assert result == {"miss": True, "corrupt": 1, "controlling_terminal": False}


def test_a_fifo_at_a_lock_is_removed_and_the_compile_goes_on_unlocked(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path / "cache")
    key = artifact("cd").key
    shard = tmp_path / "cache" / ENTRIES / "cd"
    shard.mkdir(parents=True)
    fifo = shard / f".{key}.lock"
    os.mkfifo(fifo)
    with tier.lock(key) as locked:
        assert locked is False
    assert not fifo.exists()
    with tier.lock(key) as locked:  # a real lock file from now on, while it is held
        assert locked is True
        assert stat.S_ISREG(fifo.lstat().st_mode)
    assert not fifo.exists()  # and removed as it is let go
    assert (tier.writable, tier.write_failures) == (True, 0)


def test_an_entry_others_can_write_is_dropped(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path / "cache")
    good = artifact("ef")
    tier.write(good)
    path = tier.path(good.key)
    path.chmod(0o666)
    assert tier.read(good.key) is None
    assert (tier.corrupt, path.exists()) == (1, False)


# -- shards ----------------------------------------------------------------------------------


def test_a_symlinked_shard_is_never_followed(tmp_path: Path, warnings: Messages) -> None:
    tier = DiskTier(tmp_path / "cache")
    assert tier.write(artifact("01"))  # makes the version folder
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    shard = tmp_path / "cache" / ENTRIES / "aa"
    shard.symlink_to(elsewhere)

    # A write does not land in the link's target, and fails for that shard only.
    assert tier.write(artifact("aa")) is False
    assert list(elsewhere.iterdir()) == []
    assert tier.write(artifact("bb")) is True
    assert tier.read(artifact("bb").key) == artifact("bb")
    assert (tier.writable, tier.write_failures) == (True, 1)
    shard_warnings = [m for m in warnings.messages if str(shard) in m]
    assert shard_warnings == [
        f"disk cache folder {shard} is a symbolic link, not a folder: kernels whose keys start "
        f"with aa are compiled and kept in memory, the rest of the cache works. Fix: rm {shard}"
    ]

    # A read does not take an entry from the link's target.
    planted = elsewhere / artifact("aa").key
    planted.write_bytes(encode(artifact("aa")))
    assert tier.read(artifact("aa").key) is None
    assert planted.read_bytes() == encode(artifact("aa"))
    assert (tier.hits, tier.corrupt) == (1, 0)
    assert len([m for m in warnings.messages if str(shard) in m]) == 1  # one warning per shard


def test_a_shard_this_user_cannot_open_affects_that_shard_only(other_users_dir: Path) -> None:
    root = other_users_dir / "cache"
    root.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(root, NOBODY, NOBODY)
    arts = [artifact(shard) for shard in ("10", "20", "30")]
    warm_up(other_users_dir / "warm-up", arts[0])

    def work() -> dict[str, Any]:
        handler = Messages()
        logging.getLogger("aionvrtc").addHandler(handler)
        tier = DiskTier(root)
        assert tier.write(arts[0])
        bad = root / ENTRIES / "20"
        bad.mkdir(mode=0o700)
        bad.chmod(0o000)
        written = [tier.write(a) for a in arts]
        read = [tier.read(a.key) is not None for a in arts]
        later = tier.write(artifact("40"))
        return {
            "written": written, "read": read, "later": later, "writable": tier.writable,
            "write_failures": tier.write_failures,
            "files": sorted(p.name for p in (root / ENTRIES).iterdir()),
            "warnings": [m for m in handler.messages if str(bad) in m],
        }  # fmt: skip

    result = as_other_user(work)
    (root / ENTRIES / "20").chmod(0o700)
    bad = root / ENTRIES / "20"
    assert result == {
        "written": [True, False, True], "read": [True, False, True], "later": True,
        "writable": True, "write_failures": 1,
        "files": [".index", "10", "20", "30", "40"],  # .index: made with the version folder
        "warnings": [
            f"disk cache folder {bad} is not readable by this user (Permission denied; owner uid "
            f"{os.stat(root).st_uid}, mode 0000): kernels whose keys start with 20 are compiled "
            f"and kept in memory, the rest of the cache works. Fix: chmod 700 {bad}"
        ],
    }  # fmt: skip


# -- trust -----------------------------------------------------------------------------------


def _planted_cache(root: Path) -> tuple[KernelSpec, Artifact, bytes]:
    """A spec, and a valid entry for its key (right key, arch and checksum) holding another
    kernel's image: what someone who can write the dir would plant."""
    spec, other = make_spec(), make_spec()
    foreign = KernelCache("sm_90", disk=False).get_or_compile(other)
    key = kernel_key(spec, "sm_90")
    planted = encode(replace(foreign, key=key))
    shard = root / ENTRIES / key[:2]
    shard.mkdir(parents=True)
    (shard / key).write_bytes(planted)
    for folder in (root / ENTRIES, shard):
        folder.chmod(0o700)
    return spec, foreign, planted


@pytest.mark.parametrize("how", ["mode 0777", "owned by another user", "a parent others write"])
def test_a_cache_dir_others_can_write_is_neither_read_nor_written(
    tmp_path: Path, how: str, warnings: Messages
) -> None:
    root = tmp_path / "parent" / "cache"
    root.mkdir(parents=True, mode=0o700)
    spec, foreign, planted = _planted_cache(root)
    if how == "mode 0777":
        root.chmod(0o777)
        culprit, problem = root, f"is writable by others (owner uid {os.geteuid()}, mode 0777)"
        fix = f"chmod go-w {root}"
    elif how == "owned by another user":
        if os.geteuid() != 0:
            pytest.skip("needs root to chown to another user")
        os.chown(root, NOBODY, NOBODY)
        culprit, problem = root, f"is owned by uid {NOBODY} (mode 0700), not by this user"
        fix = "use a cache dir of your own (AIONVRTC_CACHE_DIR=/a/folder/you/own)"
    else:
        (tmp_path / "parent").chmod(0o777)  # without the sticky bit: others can swap `cache`
        culprit, problem = tmp_path / "parent", "is writable by others without the sticky bit"
        fix = f"chmod o-w {tmp_path / 'parent'}"
    cache = KernelCache("sm_90", cache_dir=root)
    artifact = cache.get_or_compile(spec)
    cache.get_or_compile(make_spec())
    assert artifact.image != foreign.image  # compiled, not the planted kernel
    stats = cache.stats()
    assert (stats.disk.hits, stats.compiles, stats.disk.corrupt_dropped) == (0, 2, 0)
    assert (stats.disk.trusted, stats.disk.writable, stats.disk.write_failures) == (False, False, 0)
    assert (
        root / ENTRIES / kernel_key(spec, "sm_90")[:2] / kernel_key(spec, "sm_90")
    ).read_bytes() == planted
    assert len(list((root / ENTRIES).glob("*/*"))) == 1  # nothing written
    [warning] = warnings.messages
    assert warning.startswith(f"not using the disk cache at {root}: {culprit} {problem}")
    assert warning.endswith(f"Fix: {fix}")


def _link_by_another_user(link: Path, target: Path) -> None:
    def plant() -> dict[str, Any]:
        os.symlink(target, link)  # the sticky bit lets its owner replace it, pointed elsewhere
        return {}

    as_other_user(plant)


@as_root
@pytest.mark.parametrize(
    "how", ["the dir a link of another user", "a chain through another user's link",
            "a chain through a folder others write", "a chain through another user's folder link"],
)  # fmt: skip
def test_a_cache_dir_or_layer_reached_through_links_others_control_is_not_used(
    other_users_dir: Path, how: str, warnings: Messages
) -> None:
    # Every link the path resolves through, and every folder holding one, is held to the rule
    # of the path's own folders: not only the links that are parts of the path as given.
    real = other_users_dir / "own" / "cache"
    real.mkdir(parents=True, mode=0o700)
    spec, foreign, _ = _planted_cache(real)
    drop = other_users_dir / "drop"
    drop.mkdir()
    drop.chmod(0o1777)  # as /tmp: anyone may add a link of their own
    fix = "use a cache dir of your own (AIONVRTC_CACHE_DIR=/a/folder/you/own)"
    theirs = f"is a symbolic link owned by uid {NOBODY}, not by this user (uid 0) or root"
    if how == "the dir a link of another user":
        root = culprit = drop / "cache"
        _link_by_another_user(root, real)
        problem = theirs
    elif how == "a chain through another user's link":
        culprit = drop / "cache"
        _link_by_another_user(culprit, real)
        root = other_users_dir / "cache"
        root.symlink_to(culprit)  # this user's link, to theirs
        problem = theirs
    elif how == "a chain through a folder others write":
        culprit = other_users_dir / "open"
        culprit.mkdir()
        culprit.chmod(0o777)  # without the sticky bit: others rename what is inside
        (culprit / "cache").symlink_to(real)
        root = other_users_dir / "cache"
        root.symlink_to("open/cache")
        problem, fix = "is writable by others without the sticky bit", f"chmod o-w {culprit}"
    else:
        culprit = drop / "own"
        _link_by_another_user(culprit, real.parent)
        root = other_users_dir / "cache"
        root.symlink_to(culprit / "cache")
        problem = theirs
    cache = KernelCache("sm_90", cache_dir=root, layers=[])
    artifact = cache.get_or_compile(spec)
    assert artifact.image != foreign.image  # compiled, not the planted kernel
    stats = cache.stats()
    assert (stats.disk.hits, stats.compiles, stats.disk.trusted, stats.disk.writable) == (
        0, 1, False, False,
    )  # fmt: skip
    [warning] = warnings.messages
    assert warning.startswith(f"not using the disk cache at {root}: {culprit} {problem}")
    assert warning.endswith(f"Fix: {fix}")
    # The same dir as a read-only layer is not read either, with the same warning.
    layered = KernelCache("sm_90", disk=False, layers=[root])
    assert layered.get_or_compile(spec).image != foreign.image
    assert (layered.stats().compiles, layered.stats().layers[0].hits) == (1, 0)
    assert warnings.messages[1:] == [warning]
    # Through this user's own links alone, the same dir is trusted and read: the planted entry.
    mine = other_users_dir / "mine"
    mine.symlink_to("own/../own/cache")
    assert KernelCache("sm_90", cache_dir=mine, layers=[]).get_or_compile(spec) == replace(
        foreign, key=kernel_key(spec, "sm_90")
    )


def test_a_sticky_parent_others_can_write_is_fine(tmp_path: Path) -> None:
    parent = tmp_path / "like-tmp"
    parent.mkdir()
    parent.chmod(0o1777)
    cache = KernelCache("sm_90", cache_dir=parent / "cache")
    art = cache.get_or_compile(make_spec())
    assert (cache.stats().disk.trusted, cache.stats().disk.write_failures) == (True, 0)
    assert (parent / "cache" / ENTRIES / art.key[:2] / art.key).is_file()


def _group_dir(root: Path, group: int) -> None:
    root.mkdir()
    os.chown(root, -1, group)
    root.chmod(0o2770)


def test_a_group_shared_cache_is_an_opt_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "team"
    _group_dir(root, os.getegid())
    assert DiskTier(root).trusted is False  # group-writable: not by default
    old = os.umask(0o077)  # the modes must not depend on the umask
    try:
        cache = KernelCache("sm_90", cache_dir=root, shared_cache=True)
        art = cache.get_or_compile(make_spec())
    finally:
        os.umask(old)
    assert cache.stats().disk.trusted is True
    entry = root / ENTRIES / art.key[:2] / art.key
    assert cache.disk is not None
    with cache.disk.lock(art.key) as locked:  # a lock file lives while it is held
        assert locked
        lock_mode = (entry.parent / f".{art.key}.lock").stat().st_mode & 0o7777
    modes = {
        "version": (root / ENTRIES).stat().st_mode & 0o7777,
        "shard": entry.parent.stat().st_mode & 0o7777,
        "entry": entry.stat().st_mode & 0o7777,
        "lock": lock_mode,
    }
    assert modes == {"version": 0o2770, "shard": 0o2770, "entry": 0o640, "lock": 0o660}
    assert entry.stat().st_gid == os.getegid()
    # $AIONVRTC_SHARED_CACHE=1 opts in for caches made without shared_cache=.
    monkeypatch.setenv("AIONVRTC_SHARED_CACHE", "1")
    reader = KernelCache("sm_90", cache_dir=root)
    assert reader.disk is not None
    assert reader.disk.read(art.key, arch="sm_90") == art
    monkeypatch.setenv("AIONVRTC_SHARED_CACHE", "maybe")
    with pytest.raises(
        ValueError,
        match=r"\$AIONVRTC_SHARED_CACHE must be 1 or 0 \(true/false, yes/no, on/off\), got 'maybe'",
    ):
        DiskTier(root)


@as_root
def test_a_shared_cache_still_refuses_a_group_this_user_is_not_in(tmp_path: Path) -> None:
    root = tmp_path / "their-team"
    _group_dir(root, NOBODY)
    tier = DiskTier(root, shared_cache=True)
    assert tier.trust_problem is not None
    assert tier.trust_problem.problem == (
        f"writable by group {NOBODY} (owner uid 0, mode 2770)"
    )  # fmt: skip
    # chmod o-w was named here, which leaves the group able to write: each fix named works.
    fixes = tier.trust_problem.fix.split(", or ")
    assert fixes == [f"chgrp {os.getegid()} {root}", f"chmod g-w {root}"]
    for fix in fixes:
        subprocess.run(shlex.split(fix), check=True)
        assert DiskTier(root, shared_cache=True).trusted is True
        os.chown(root, -1, NOBODY)
        root.chmod(0o2770)


@as_root
def test_a_shared_shard_of_a_group_this_user_is_not_in_names_a_fix_that_works(
    tmp_path: Path, warnings: Messages
) -> None:
    root = tmp_path / "team"
    _group_dir(root, os.getegid())
    tier = DiskTier(root, shared_cache=True)
    assert tier.write(artifact("aa"))
    shard = root / ENTRIES / "bb"
    shard.mkdir()
    os.chown(shard, -1, NOBODY)
    shard.chmod(0o2770)
    assert tier.write(artifact("bb")) is False
    fix = f"chgrp {os.getegid()} {shard} && chmod 2770 {shard}"  # was: chmod 2770, a no-op
    assert [m for m in warnings.messages if str(shard) in m] == [
        f"disk cache folder {shard} is writable by group {NOBODY} (owner uid 0, mode 2770): "
        "kernels whose keys start with bb are compiled and kept in memory, the rest of the "
        f"cache works. Fix: {fix}"
    ]
    for command in fix.split(" && "):
        subprocess.run(shlex.split(command), check=True)
    assert tier.write(artifact("bb")) is True
    assert tier.read(artifact("bb").key) == artifact("bb")


@pytest.mark.anyio
async def test_the_compiler_passes_shared_cache_on(tmp_path: Path) -> None:
    root = tmp_path / "team"
    _group_dir(root, os.getegid())
    async with Compiler(arch="sm_90", cache_dir=root, shared_cache=True) as compiler:
        art = await compiler.compile(make_spec())
        assert compiler.stats().disk.hits == 0
    assert (root / ENTRIES / art.key[:2] / art.key).stat().st_mode & 0o777 == 0o640


@as_root
def test_a_cache_root_baked_is_read_not_written_by_another_user(other_users_dir: Path) -> None:
    # A cache built as root into an image, readable by all, used by a service's own user.
    root = other_users_dir / "image-cache"
    baked, fresh = artifact("5a"), artifact("6b")
    assert DiskTier(root).write(baked)
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    warm_up(other_users_dir / "warm-up", fresh)

    def work() -> dict[str, Any]:
        handler = Messages()
        logging.getLogger("aionvrtc").addHandler(handler)
        tier = DiskTier(root)
        got = tier.read(baked.key, arch="sm_90")
        written = [tier.write(fresh), tier.write(artifact("7c"))]
        with tier.lock(fresh.key) as locked:
            pass
        return {
            "read": got == baked, "written": written, "locked": locked, "trusted": tier.trusted,
            "writable": tier.writable, "write_failures": tier.write_failures,
            "warnings": handler.messages,
        }  # fmt: skip

    result = as_other_user(work)
    assert result == {
        **result, "read": True, "written": [False, False], "locked": False, "trusted": True,
        "writable": False, "write_failures": 1,
    }  # fmt: skip
    [warning] = result["warnings"]
    assert warning.startswith(f"disk cache at {root / ENTRIES} is not writable (")
    assert f"this user (uid {NOBODY}) cannot write to it (owner uid 0, mode 0755)" in warning
    assert "writing disabled, kernels are still compiled and served from memory" in warning
    assert sorted(p.name for p in (root / ENTRIES).iterdir()) == [".index", "5a"]  # root's
