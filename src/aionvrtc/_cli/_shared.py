"""What the commands share: the result and error types, the lines they print on failure, and
the cache dir as the commands open, describe and list it."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .._config import ENV_CACHE_DIR
from .._exceptions import AionvrtcError
from .._store.disk import (
    Damage,
    DiskTier,
    Listing,
    default_cache_dir,
)
from .._version import __version__

if TYPE_CHECKING:
    pass

__all__ = ["CommandError", "Result"]

Result = tuple[Any, int]  # (what --json prints, exit status)
# Rows of the `cache ls` table for people, most recently used first: rich takes about a
# millisecond a row, and 50,000 rows are no table to read (--json lists every entry).
_TABLE_ROWS = 200
# Skipped manifest lines that `warm manifest` says one by one; --json lists them all.
_SKIPPED_SAID = 5


class _Interrupted(KeyboardInterrupt):
    """Raised by a command that Ctrl-C stopped, with what it did: the line said on stderr, and
    ``data`` for its --json document."""

    def __init__(self, message: str, data: dict[str, Any]) -> None:
        super().__init__(message)
        self.data = data


class CommandError(Exception):
    """Raised by a command that ran but did not do what was asked; ``data`` is the rest of
    its --json document (what it did do)."""

    def __init__(self, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.data = data or {}


def _innermost(exc: BaseException) -> BaseException:
    """The first error inside task groups' exception groups (a warm-up's compiles run in one):
    the others were cancelled because of it, or are more of the same."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _error_line(exc: Exception) -> str:
    """``exc`` as one line: what aionvrtc, the OS or a bad value says is already the whole
    story (a compile error's first line, not NVRTC's log); anything else is a bug."""
    text = _first_line(str(exc))
    if isinstance(exc, (CommandError, AionvrtcError, ValueError, OSError)):
        return text or type(exc).__name__
    return (
        f"{type(exc).__name__}: {text} (a bug in aionvrtc {__version__}: run the command "
        "again with --debug for the traceback, and report it)"
    )


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _print_error(message: str, *, label: str = "error") -> None:
    from rich.console import Console
    from rich.text import Text

    # soft_wrap: one line, however wide the terminal; Text: a "[Errno 13]" is not markup.
    colour = "red" if label == "error" else "yellow"
    line = Text.assemble((f"{label}:", colour), " ", message)
    Console(stderr=True, highlight=False, soft_wrap=True).print(line)


def _tier(args: argparse.Namespace) -> DiskTier:
    """The command's disk tier: one per command, so that its warnings are given once."""
    tier: DiskTier | None = getattr(args, "tier", None)
    if tier is None:
        tier = args.tier = DiskTier(
            args.cache_dir if args.cache_dir is not None else default_cache_dir()
        )
    return tier


def _cache_dir(args: argparse.Namespace, *, reading: bool = False) -> tuple[DiskTier, bool]:
    """The command's disk tier, and whether its cache dir exists: the check of --cache-dir
    that the cache commands make. CommandError where it is a file or under one (no command can
    use it); with ``reading`` (a command that only reads the cache), also where an explicit
    --cache-dir does not exist: a typo more often than a cache to come. The default one (or
    $AIONVRTC_CACHE_DIR) is missing on a fresh machine until the first compile makes it,
    which is no error: the cache is empty."""
    tier = _tier(args)
    problem = _unusable(tier)
    if problem is not None:
        raise CommandError(problem)
    exists = tier.root.is_dir()
    if reading and not exists and args.cache_dir is not None:
        raise CommandError(
            f"{tier.root} does not exist; point --cache-dir at a cache dir (the first compile, "
            "or aionvrtc warm, makes one)"
        )
    return tier, exists


def _unusable(tier: DiskTier) -> str | None:
    """Why no command can use ``tier``'s cache dir, with the fix, or None: the one rule for
    every command (the cache commands through _cache_dir, warm and import through
    _where_nothing_is_kept; doctor's cache dir check finds the same, said as a check)."""
    blocker = _not_a_folder(tier.root)
    if blocker is None:
        return None
    return f"{blocker} is not a folder; point --cache-dir (or {ENV_CACHE_DIR}) at a folder"


def _not_made(tier: DiskTier) -> str:
    """What the cache commands say of a cache dir that does not exist yet."""
    return f"{tier.root} does not exist yet: the first compile (or aionvrtc warm) makes it"


def _contents(tier: DiskTier, *, summaries: bool = True) -> tuple[Listing, list[int], list[Damage]]:
    """The tier's listing (most recently used first; ``summaries=False``: empty summaries, for
    counting), which of its entries have a header that can be read, and damaged items: what
    the walk skipped, and entries whose header cannot be read (a request for one drops it and
    recompiles). One walk of the shards; the summaries come from the cache dir's index."""
    listing = tier.listing(summaries=summaries)
    readable, damaged = [], list(listing.damaged)
    for i, header in enumerate(listing.headers):
        if isinstance(header, dict):
            readable.append(i)
        else:
            path = listing.directory / listing.keys[i][:2] / listing.keys[i]
            problem = f"an entry whose header cannot be read ({header})"
            damaged.append(Damage(path, problem, f"rm {path}"))
    return listing, readable, damaged


def _trust(tier: DiskTier) -> str:
    problem = tier.trust_problem
    shared = " (shared cache)" if tier.policy.shared else ""
    if problem is None:
        return f"trusted{shared}: {_ownership(tier.root)}"
    return f"NOT TRUSTED{shared}, not used: {problem}"


def _ownership(path: Path) -> str:
    """Owner and mode of ``path``, for people."""
    try:
        info = path.stat()
    except OSError as exc:
        return f"cannot stat: {exc.strerror}"
    owner = f"uid {info.st_uid}"
    with contextlib.suppress(ImportError, KeyError):
        import pwd

        owner += f" ({pwd.getpwuid(info.st_uid).pw_name})"
    if info.st_uid == os.geteuid():
        owner += ", this user"
    return f"owner {owner}, mode {stat.S_IMODE(info.st_mode):04o}"


def _by_arch(listing: Listing, readable: list[int]) -> dict[str, dict[str, Any]]:
    """Entries, bytes and NVRTC versions (entries each) per arch, archs and versions in order.
    Processes of both CUDA majors share a cache dir (keys name the NVRTC build), so an arch
    may hold entries of several. A header naming no arch is damaged: not counted here."""
    archs: dict[str, dict[str, Any]] = {}
    versions: dict[str, dict[str, int]] = {}
    for i in readable:
        header = cast(dict[str, Any], listing.headers[i])
        arch = _text(header.get("arch"))
        if arch is None:
            continue
        if arch not in archs:
            archs[arch] = {"entries": 0, "bytes": 0}
            versions[arch] = {}
        archs[arch]["entries"] += 1
        archs[arch]["bytes"] += listing.sizes[i]
        version = _text(header.get("nvrtc_version")) or "?"
        versions[arch][version] = versions[arch].get(version, 0) + 1
    return {
        arch: {
            **archs[arch],
            "nvrtc_versions": {v: versions[arch][v] for v in sorted(versions[arch], key=_natural)},
        }
        for arch in sorted(archs, key=_natural)
    }


def _natural(text: str) -> tuple[bool, tuple[int, ...], str]:
    """Order by the numbers in ``text`` (sm_80 before sm_100, 12.9 before 13.5), then text;
    one without numbers ("?") last."""
    numbers = tuple(int(n) for n in re.findall(r"\d+", text))
    return not numbers, numbers, text


def _text(value: object) -> str | None:
    """A header value shown as text only if it is text (the header is untrusted input)."""
    return value if isinstance(value, str) else None


def _where_nothing_is_kept(tier: DiskTier, *, probe: bool = False) -> str | None:
    """Why kernels cannot be written to ``tier``'s cache dir, with the fix: it is a file (or
    under one), or untrusted; with ``probe``, also what a test write found (this makes the
    folders that are missing, as a write does). None if nothing says so."""
    unusable = _unusable(tier)
    if unusable is not None:
        return unusable
    damage = tier.trust_problem
    if damage is not None:
        return f"{tier.root} is not trusted ({damage.path} is {damage.problem}); {damage.fix}"
    failure = tier.probe_write() if probe else None
    if failure is None:
        return None
    return (
        f"{tier.dir} cannot be written ({failure}); point --cache-dir (or {ENV_CACHE_DIR}) at "
        "a folder this user can write"
    )


def _not_a_folder(root: Path) -> Path | None:
    """The path at or above ``root`` that exists and is not a folder (so no cache dir can be
    made there), or None."""
    for path in (root, *Path(os.path.abspath(root)).parents):
        if os.path.exists(path):
            return None if os.path.isdir(path) else path
    return None
