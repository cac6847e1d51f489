"""`aionvrtc cache info|ls|clear|prune`: what a cache dir holds, and removing from it."""

from __future__ import annotations

import argparse
import datetime
import functools
import math
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .._spec import FORMAT_VERSION
from .._store.disk import (
    Damage,
    DiskTier,
    EntryInfo,
    Listing,
)
from .._units import format_size

if TYPE_CHECKING:
    pass
from ._shared import (
    _TABLE_ROWS,
    CommandError,
    Result,
    _by_arch,
    _cache_dir,
    _contents,
    _not_made,
    _ownership,
    _text,
    _trust,
)

__all__ = []


def _when(timestamp: object) -> str | None:
    """An ISO time for a Unix time, or None for anything that is not one (a header value is
    untrusted input)."""
    if not isinstance(timestamp, (int, float)) or isinstance(timestamp, bool):
        return None
    try:
        return _iso_second(math.floor(timestamp))
    except (OverflowError, ValueError, OSError):
        return None


@functools.lru_cache(maxsize=4096)
def _iso_second(second: int) -> str:
    # Memoised: the entries of a listing were made and used in far fewer distinct seconds than
    # there are entries, and formatting a time costs more than the rest of a row.
    return datetime.datetime.fromtimestamp(second, datetime.UTC).isoformat(timespec="seconds")


def _ago(timestamp: float) -> str:
    seconds = max(0.0, time.time() - timestamp)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _damage(damage: Damage) -> dict[str, str]:
    return {"path": str(damage.path), "problem": damage.problem, "fix": damage.fix}


def _info(args: argparse.Namespace, console: Any) -> Result:
    tier, exists = _cache_dir(args, reading=True)
    # The summaries (for the archs) cost a little more than counting, in the same one walk.
    listing, readable, damaged = _contents(tier)
    archs = _by_arch(listing, readable)
    events = tier.events()
    used = [listing.last_used[i] for i in readable]
    others = sorted(
        p.name for p in tier.root.glob("v*") if p.is_dir() and p.name != tier.dir.name
    )  # fmt: skip
    data: dict[str, Any] = {
        "location": str(tier.root),
        "directory": str(tier.dir),
        "exists": exists,
        "format_version": FORMAT_VERSION,
        "trusted": tier.trusted,
        "trust_problem": _damage(tier.trust_problem) if tier.trust_problem else None,
        "shared_cache": tier.policy.shared,
        "entries": len(readable),
        "bytes": sum(listing.sizes[i] for i in readable),
        "limit": tier.limit,
        "oldest": _when(min(used) if used else None),
        "newest": _when(max(used) if used else None),
        "archs": archs,
        "damaged": len(damaged),
        "corrupt_dropped": events["corrupt"],
        "evictions": events["evicted"],
        "pruned": events["pruned"],
        "other_format_versions": others,
    }
    if not args.json:
        from rich.table import Table
        from rich.text import Text

        table = Table(title="aionvrtc disk cache", show_header=False)
        table.add_column(style="bold")
        table.add_column()
        table.add_row("location", f"{data['directory']} (format v{FORMAT_VERSION})")
        table.add_row("trust", _trust(tier) if exists else _not_made(tier))
        percent = 100 * data["bytes"] / tier.limit if tier.limit else 0.0
        table.add_row(
            "size",
            f"{data['entries']} entries, {format_size(data['bytes'])} of "
            f"{format_size(tier.limit)} ({percent:.0f}%)",
        )
        oldest, newest = data["oldest"] or "-", data["newest"] or "-"
        table.add_row("archs", Text(_archs_text(archs)))  # header text: never markup
        table.add_row("last used", f"oldest {oldest}, newest {newest}")
        table.add_row(
            "events",
            f"{data['corrupt_dropped']} corrupt entries dropped, {data['evictions']} evicted, "
            f"{data['pruned']} pruned",
        )
        if damaged:
            table.add_row("damaged", f"{len(damaged)} items, not used (aionvrtc cache ls)")
        if others:
            table.add_row("other formats", ", ".join(others) + " (not read by this version)")
        console.print(table)
    return data, 0


def _archs_text(archs: dict[str, dict[str, Any]]) -> str:
    """``_by_arch`` for people: "sm_80: 3 (NVRTC 12.9: 1, 13.5: 2); sm_90: 5 (NVRTC 13.5)"."""
    parts = []
    for arch, counts in archs.items():
        versions: dict[str, int] = counts["nvrtc_versions"]
        if len(versions) == 1:
            which = next(iter(versions))
        else:
            which = ", ".join(f"{version}: {n}" for version, n in versions.items())
        parts.append(f"{arch}: {counts['entries']} (NVRTC {which})")
    return "; ".join(parts) or "-"


def _ls(args: argparse.Namespace, console: Any) -> Result:
    tier, exists = _cache_dir(args, reading=True)
    now = time.time()
    listing, readable, damaged = _contents(tier)
    used, headers = listing.last_used, listing.headers
    selected = [
        i
        for i in readable
        if (args.older_than is None or used[i] < now - args.older_than)
        and (args.newer_than is None or used[i] >= now - args.newer_than)
        and (args.arch is None or cast(dict[str, Any], headers[i]).get("arch") == args.arch)
    ]
    rows = [_row(listing, i) for i in selected[: None if args.json else _TABLE_ROWS]]
    # Damaged items have no arch or age worth filtering on: listed unless an arch is asked for.
    broken = [] if args.arch is not None else [_damaged_row(d) for d in damaged]
    if not args.json:
        from rich.table import Table

        table = Table(title=f"{len(selected)} entries in {tier.dir}")
        for column in ("key", "kind", "arch", "NVRTC", "size", "last used", "names"):
            table.add_column(column, justify="right" if column == "size" else "left")
        for row in rows:
            table.add_row(
                row["key"][:12], row["kind"] or "?", row["arch"] or "?",
                row["nvrtc_version"] or "?", format_size(row["size"]),
                _ago(row["last_used_unix"]) + " ago", "\n".join(row["names"]),
            )  # fmt: skip
        console.print(table)
        if not exists:
            console.print(_not_made(tier), soft_wrap=True)
        if len(selected) > len(rows):
            console.print(
                f"and {len(selected) - len(rows)} entries used less recently: "
                "aionvrtc cache ls --json lists every one",
                soft_wrap=True,
            )
        if broken:
            table = Table(title=f"{len(broken)} damaged items, not used")
            for column in ("path", "problem", "fix"):
                table.add_column(column)
            for row in broken:
                table.add_row(row["path"], row["problem"], row["fix"])
            console.print(table)
    return rows + broken, 0


def _row(listing: Listing, i: int) -> dict[str, Any]:
    """Entry ``i`` of ``listing`` (one whose header can be read) as an ``ls`` row."""
    header = cast(dict[str, Any], listing.headers[i])
    names = header.get("names")
    return {
        "key": listing.keys[i],
        "kind": _text(header.get("kind")),
        "arch": _text(header.get("arch")),
        "nvrtc_version": _text(header.get("nvrtc_version")),
        "size": listing.sizes[i],
        "last_used": _when(listing.last_used[i]),
        "last_used_unix": listing.last_used[i],
        "created": _when(header.get("created")),
        # A tuple (a JSON array all the same): the garbage collector stops tracking a tuple of
        # strings, and then the row, never a list: its passes over 50,000 rows cost 0.1 s.
        "names": tuple(sorted(names.split("\0"))) if isinstance(names, str) and names else (),
    }


def _damaged_row(damage: Damage) -> dict[str, Any]:
    """A damaged item as an ``ls`` row: kind "damaged", with what is wrong and the fix."""
    return {
        "key": damage.path.name,
        "kind": "damaged",
        "arch": None,
        "nvrtc_version": None,
        "size": None,
        "last_used": None,
        "last_used_unix": None,
        "created": None,
        "names": (),
        **_damage(damage),
    }


def _clear(args: argparse.Namespace, console: Any) -> Result:
    tier, exists = _cache_dir(args)
    removed = tier.clear()
    data: dict[str, Any] = {"removed": removed, "directory": str(tier.dir), "exists": exists}
    # Whatever is left was written since, or cannot be removed: a read-only cache says nothing
    # when an unlink fails, and "removed 0 entries" would pass for an empty cache.
    done = f"removed {removed} entries from {tier.dir}"
    _fail_if_stuck(tier.survey().entries, done, data)
    if not args.json:
        console.print(done if exists else _nothing_to_do(tier), soft_wrap=True)
    return data, 0


def _prune(args: argparse.Namespace, console: Any) -> Result:
    if args.max_size is None and args.older_than is None:
        args.command.error("prune needs --max-size SIZE, --older-than AGE or both")
    tier, exists = _cache_dir(args)
    started = time.time()
    pruned = tier.prune_report(max_bytes=args.max_size, older_than=args.older_than)
    removed_bytes = sum(e.size for e in pruned.removed)
    data: dict[str, Any] = {
        "removed": len(pruned.removed),
        "removed_keys": sorted(e.key for e in pruned.removed),
        "entries": pruned.entries,
        "bytes_before": pruned.bytes + removed_bytes,
        "bytes": pruned.bytes,
        "damaged": [_damage(d) for d in pruned.damaged],  # skipped: not entries
        "exists": exists,
    }
    # Whether prune left what it chose (its removals fail silently in a folder this user
    # cannot write): over the size asked for, or entries left in such a folder. Only then a
    # second walk, to name them: a prune that worked walks the shards once.
    over = args.max_size is not None and pruned.bytes > args.max_size
    if pruned.entries and (over or _cannot_remove_in(tier.dir) is not None):
        due = _due(tier.survey().entries, args.max_size, args.older_than, started)
        _fail_if_stuck(due, f"removed {data['removed']} entries from {tier.dir}", data)
    if not args.json:
        console.print(
            f"removed {data['removed']} entries: {format_size(data['bytes_before'])} -> "
            f"{format_size(data['bytes'])} in {pruned.entries} entries"
            if exists
            else _nothing_to_do(tier),
            soft_wrap=True,
        )
        for damage in pruned.damaged:
            console.print(f"skipped damaged {damage}", soft_wrap=True)
    return data, 0


def _nothing_to_do(tier: DiskTier) -> str:
    """What a removal says where the cache dir does not exist: no failure, as what it was asked
    for holds (no entries there), but not "removed 0 entries", which would pass for a cache."""
    return f"nothing to do: {tier.root} does not exist"


def _due(
    entries: Iterable[EntryInfo], max_bytes: int | None, older_than: float | None, started: float
) -> list[EntryInfo]:
    """Which of ``entries`` (found after a prune) that prune should have removed: those unused
    since before the cutoff, then the least recently used beyond ``max_bytes``. The cutoff is
    from before the prune began, so nothing it rightly kept counts as due."""
    cutoff = None if older_than is None else started - older_than
    due: list[EntryInfo] = []
    kept: list[EntryInfo] = []
    for entry in sorted(entries, key=lambda e: e.last_used, reverse=True):
        (due if cutoff is not None and entry.last_used < cutoff else kept).append(entry)
    if max_bytes is not None:
        total = sum(entry.size for entry in kept)
        for entry in reversed(kept):  # least recently used first
            if total <= max_bytes:
                break
            due.append(entry)
            total -= entry.size
    return due


def _fail_if_stuck(entries: Iterable[EntryInfo], done: str, data: dict[str, Any]) -> None:
    """Raise CommandError if some of ``entries``, still there after a removal, are in a folder
    this user cannot remove them from. Entries elsewhere were written by another process since
    (services use the cache meanwhile), not refused: those are no failure."""
    verdicts: dict[Path, tuple[str, str] | None] = {}
    stuck, first = 0, None
    for entry in entries:
        folder = entry.directory / entry.key[:2]
        if folder not in verdicts:
            verdicts[folder] = _cannot_remove_in(folder)
        verdict = verdicts[folder]
        if verdict is not None:
            stuck += 1
            first = first or verdict
    if first is not None:
        problem, fix = first
        data["not_removed"] = stuck
        raise CommandError(f"{done}, but {stuck} could not be removed: {problem}; {fix}", data)


def _cannot_remove_in(folder: Path) -> tuple[str, str] | None:
    """Why this user cannot remove files in ``folder``, and the fix; None if it can."""
    try:
        if os.statvfs(folder).f_flag & getattr(os, "ST_RDONLY", 1):
            return (
                f"{folder} is on a read-only file system",
                "remove them where it is mounted read-write (read-only, the cache is still read)",
            )
        effective = os.access in os.supports_effective_ids
        if os.access(folder, os.W_OK | os.X_OK, effective_ids=effective):
            return None
    except OSError as exc:
        return f"{folder} cannot be used ({exc.strerror})", "see aionvrtc doctor"
    return (
        f"{folder} is not writable by this user ({_ownership(folder)})",
        "run the command as the folder's owner",
    )
