"""Whom a cache dir trusts: ssh's rule for ``~/.ssh``, or a group's shared cache by explicit
opt-in; the modes the disk tier creates; and the fix that works for what it finds untrusted.
An entry is code that runs on the GPU, so the disk tier and bundles read only what this says is
trusted."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from .._config import ENV_SHARED_CACHE
from ._fs import kind_of
from ._fs import stat_or_none as _stat

__all__ = ["Damage", "Policy", "Route", "route"]

# Links followed before a route is given up on: the kernel's own bound (MAXSYMLINKS), past
# which opening the path fails with ELOOP anyway.
_MAX_LINKS = 40


@dataclass(frozen=True, slots=True)
class Damage:
    """Something in the cache dir (or a bundle) that is not used: where, what is wrong, a fix
    that works."""

    path: Path
    problem: str  # reads after "<path> is"
    fix: str

    def __str__(self) -> str:
        return f"{self.path} is {self.problem}; fix: {self.fix}"


@dataclass(frozen=True, slots=True)
class Route:
    """How the kernel resolves a path, name by name: every folder a name is looked up in and
    every symbolic link followed, in the order met (``steps``: (path, lstat, is a link)), and
    where it ends (``end``, with its lstat, None where a name on the way does not exist yet)."""

    steps: tuple[tuple[Path, os.stat_result, bool], ...]
    end: Path
    end_info: os.stat_result | None


def route(path: str | os.PathLike[str]) -> Route:
    """The route to ``path`` (see ``Route``), resolved as the kernel does: a link's target read
    and walked in the link's folder (or from / when absolute), ``..`` applied to what is
    resolved so far. A link's own route counts as much as the path given: whoever can change
    a link, or rename in a folder that holds one, chooses what the path opens. A missing name
    ends the walk there (it is made later, by whoever makes what is below it)."""
    pending = list(reversed(Path(os.path.abspath(path)).parts[1:]))
    here = Path("/")
    steps: list[tuple[Path, os.stat_result, bool]] = []
    looked_in: set[Path] = set()
    links = 0
    info = _stat(here)
    while pending and info is not None:
        name = pending.pop()
        if name in ("", "."):
            continue
        if name == "..":
            here = here.parent
            info = _stat(here)
            continue
        if here not in looked_in:  # the folder the name is looked up in
            looked_in.add(here)
            steps.append((here, info, False))
        there = here / name
        info = _stat(there)
        if info is None or not stat.S_ISLNK(info.st_mode):
            here = there
            continue
        steps.append((there, info, True))
        links += 1
        try:
            target = os.readlink(there)
        except OSError:
            break
        if links > _MAX_LINKS:
            break
        parts = Path(target).parts
        if os.path.isabs(target):
            here, parts = Path("/"), parts[1:]
        pending.extend(reversed(parts))
        info = _stat(here)
    return Route(tuple(steps), here, info)


@dataclass(frozen=True, slots=True)
class Policy:
    """Whom the cache trusts and the modes it creates.

    Private (the default), ssh's rule for ``~/.ssh``: a folder or file is trusted when this user
    (euid) or root owns it (root: a cache baked into an image) and neither group nor others can
    write it. Shared (an explicit opt-in): owned by this user, root or any user of a group this
    user is in, writable by that group but never by others; folders are made setgid, so files
    take the folder's group.
    """

    shared: bool
    uid: int
    groups: frozenset[int]

    @classmethod
    def current(cls, shared: bool) -> Policy:
        return cls(shared, os.geteuid(), frozenset((os.getegid(), *os.getgroups())))

    @property
    def dir_mode(self) -> int:
        return 0o2770 if self.shared else 0o700

    @property
    def entry_mode(self) -> int:
        return 0o640 if self.shared else 0o600

    @property
    def lock_mode(self) -> int:  # lock and event files: every user of the cache writes them
        return 0o660 if self.shared else 0o600

    def _ours(self, info: os.stat_result) -> bool:
        return info.st_uid in (self.uid, 0) or (self.shared and info.st_gid in self.groups)

    def _owner_problem(self, info: os.stat_result) -> str:
        mode = stat.S_IMODE(info.st_mode)
        return (
            f"owned by uid {info.st_uid} (mode {mode:04o}), not by this user (uid {self.uid}) "
            "or root"
        )

    def problem(self, info: os.stat_result) -> str | None:
        """Why a folder or file of the cache tree is not trusted (after "is"), or None."""
        mode = stat.S_IMODE(info.st_mode)
        if not self._ours(info):
            return self._owner_problem(info)
        if mode & 0o002:
            return f"writable by others (owner uid {info.st_uid}, mode {mode:04o})"
        if mode & 0o020 and not (self.shared and info.st_gid in self.groups):
            return f"writable by group {info.st_gid} (owner uid {info.st_uid}, mode {mode:04o})"
        return None

    def file_problem(self, info: os.stat_result) -> str | None:
        """Why a file of the cache (an entry, a lock, the event log) is not used, or None."""
        if not stat.S_ISREG(info.st_mode):
            return f"{kind_of(info)}, not a regular file"
        return self.problem(info)

    def ancestor_problem(self, info: os.stat_result) -> str | None:
        """Why a folder above the cache dir lets others replace it (after "is"), or None: a
        folder that others can write without the sticky bit (as /tmp has) lets them rename
        what is inside."""
        mode = stat.S_IMODE(info.st_mode)
        if not self._ours(info):
            return self._owner_problem(info)
        if mode & 0o002 and not mode & stat.S_ISVTX:
            return f"writable by others without the sticky bit (mode {mode:04o})"
        return None

    def link_problem(self, info: os.stat_result) -> str | None:
        """Why a symbolic link on the way to a file lets others choose what it points at (after
        "is"), or None: whoever owns a link in a sticky folder (/tmp) may replace it."""
        if self._ours(info):
            return None
        return (
            f"a symbolic link owned by uid {info.st_uid}, not by this user (uid {self.uid}) or root"
        )

    def fix(self, path: Path, info: os.stat_result, *, instead: str, ancestor: bool = False) -> str:
        """A fix that works for ``path`` (``info``: its stat), a folder or file found untrusted:
        chmod (or chgrp) when it is ours, else ``instead`` (a folder or file of one's own), or
        the shared opt-in where that would trust it. ``ancestor``: a folder above what is
        trusted, where only others' writes count (see ``ancestor_problem``)."""
        mode = stat.S_IMODE(info.st_mode)
        if info.st_uid == self.uid:
            foreign = info.st_gid not in self.groups
            if self.shared and not ancestor and mode & 0o020 and foreign:
                # chmod o-w leaves a group this user is not in able to write
                if mode & 0o002:
                    return f"chmod go-w {path}"
                return f"chgrp {os.getegid()} {path}, or chmod g-w {path}"
            bits = "o-w" if self.shared or ancestor else "go-w"
            fix = f"chmod {bits} {path}"
            if not self.shared and not ancestor and mode & 0o020 and not mode & 0o002:
                fix += f", or share it with group {info.st_gid}: {ENV_SHARED_CACHE}=1"
            return fix
        fix = instead
        if not self.shared and info.st_gid in self.groups and not mode & 0o002:
            fix += (
                f", or, if you trust every user of group {info.st_gid}, opt in to a shared "
                f"cache: {ENV_SHARED_CACHE}=1 (shared_cache=True)"
            )
        return fix

    def route_problem(self, found: Route, *, instead: str) -> Damage | None:
        """The first step of ``found`` that lets others choose what its path opens, with a fix
        that works (``instead``: a folder or file of one's own), or None: a folder a name is
        looked up in that others can rename in (``ancestor_problem``), or a link that others
        own (``link_problem``). The end itself is held to ``problem`` by whoever opens it."""
        for path, info, link in found.steps:
            problem = self.link_problem(info) if link else self.ancestor_problem(info)
            if problem is not None:
                return Damage(
                    path, problem, self.fix(path, info, ancestor=not link, instead=instead)
                )
        return None
