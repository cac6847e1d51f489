"""The command line, ``aionvrtc`` or ``python -m aionvrtc``: inspect, prune, warm and diagnose
the disk cache. Every command takes ``--json`` (one JSON document on stdout, for scripts) and
``--cache-dir`` (default: ``$AIONVRTC_CACHE_DIR``, else the user cache dir); tables and progress
for people are drawn by rich.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import math
import os
import platform
import shutil
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from ._cuda_errors import map_cuda_errors
from ._exceptions import AionvrtcError, NoDeviceError
from ._spec import FORMAT_VERSION
from ._store.disk import ENV_CACHE_DIR, PROBE_KEY, Damage, DiskTier, Listing, default_cache_dir
from ._units import format_size, parse_age, parse_size
from ._version import __version__

__all__ = ["main"]

Result = tuple[Any, int]  # (what --json prints, exit status)
# Rows of the `cache ls` table for people, most recently used first: rich takes about a
# millisecond a row, and 50,000 rows are no table to read (--json lists every entry).
_TABLE_ROWS = 200


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    from rich.console import Console

    console = Console(stderr=False, highlight=False)
    run: Callable[[argparse.Namespace, Any], Result] = args.run
    try:
        try:
            data, status = run(args, console)
        except BrokenPipeError:
            raise
        except (AionvrtcError, ValueError, OSError) as exc:
            if args.json:
                print(json.dumps({"error": str(exc)}))
            else:
                Console(stderr=True, highlight=False).print(f"[red]error:[/red] {exc}")
            return 1
        if args.json:
            print(_json_text(data), flush=True)
    except BrokenPipeError:
        # The reader stopped early (`aionvrtc cache ls | head`): not a failure. Point stdout at
        # /dev/null so that the interpreter's own flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return status


def _json_text(data: Any) -> str:
    """``data`` as indented JSON; the rows of ``cache ls`` one per line, encoded in one call of
    json's C encoder (indenting takes its Python one: 0.4 s for 50,000 rows)."""
    if not isinstance(data, list) or not data:
        return json.dumps(data, indent=2)
    # Rows are flat objects whose first field is "key", and a quote inside a JSON string is
    # always escaped: '}, {"key": ' occurs between rows and nowhere else.
    return "[\n  " + json.dumps(data)[1:-1].replace('}, {"key": ', '},\n  {"key": ') + "\n]"


def _argument(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` as an argparse type: its ValueError's message becomes the usage error."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def _parser() -> argparse.ArgumentParser:
    size, age = _argument(parse_size), _argument(parse_age)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON document")
    common.add_argument(
        "--cache-dir", type=Path, default=None, help="default: $AIONVRTC_CACHE_DIR or the user's"
    )
    parser = argparse.ArgumentParser(
        prog="aionvrtc", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"aionvrtc {__version__}")
    commands = parser.add_subparsers(title="commands")

    cache = commands.add_parser("cache", help="the disk cache").add_subparsers(title="commands")
    info = cache.add_parser("info", parents=[common], help="location, size, entries, events")
    info.set_defaults(run=_info)
    ls = cache.add_parser("ls", parents=[common], help="one row per entry")
    ls.add_argument("--arch", help="only entries compiled for this arch, such as sm_90")
    ls.add_argument("--older-than", type=age, help="last used before, such as 7d")
    ls.add_argument("--newer-than", type=age, help="last used within, such as 12h")
    ls.set_defaults(run=_ls)
    clear = cache.add_parser("clear", parents=[common], help="remove every entry")
    clear.set_defaults(run=_clear)
    prune = cache.add_parser("prune", parents=[common], help="remove least recently used entries")
    prune.add_argument("--max-size", type=size, help="keep at most this much, such as 2G")
    prune.add_argument("--older-than", type=age, help="remove entries unused for, e.g. 30d")
    prune.set_defaults(run=_prune)

    warm = commands.add_parser("warm", help="compile kernels ahead of use (no GPU needed)")
    warm_kinds = warm.add_subparsers(title="kernels")
    tropical = warm_kinds.add_parser("tropical", parents=[common], help="the tropical GEMM kernels")
    tropical.add_argument(
        "--arch", help="target, such as sm_90 (default: $AIONVRTC_ARCH, else this machine's GPU)"
    )
    tropical.add_argument("--semirings", nargs="+", help="default: all")
    tropical.add_argument("--dtypes", nargs="+", help="default: all, such as float32 int32")
    tropical.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="parallel compiles (default: CPUs)"
    )
    tropical.set_defaults(run=_warm_tropical)

    doctor = commands.add_parser(
        "doctor", parents=[common], help="check NVRTC, GPUs and the cache dir; exit 1 if broken"
    )
    doctor.set_defaults(run=_doctor)
    return parser


# -- cache ---------------------------------------------------------------------------------------


def _tier(args: argparse.Namespace) -> DiskTier:
    """The command's disk tier: one per command, so that its warnings are given once."""
    tier: DiskTier | None = getattr(args, "tier", None)
    if tier is None:
        tier = args.tier = DiskTier(
            args.cache_dir if args.cache_dir is not None else default_cache_dir()
        )
    return tier


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


def _damage(damage: Damage) -> dict[str, str]:
    return {"path": str(damage.path), "problem": damage.problem, "fix": damage.fix}


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


def _info(args: argparse.Namespace, console: Any) -> Result:
    tier = _tier(args)
    listing, readable, damaged = _contents(tier, summaries=False)
    events = tier.events()
    used = [listing.last_used[i] for i in readable]
    others = sorted(
        p.name for p in tier.root.glob("v*") if p.is_dir() and p.name != tier.dir.name
    )  # fmt: skip
    data: dict[str, Any] = {
        "location": str(tier.root),
        "directory": str(tier.dir),
        "format_version": FORMAT_VERSION,
        "trusted": tier.trusted,
        "trust_problem": _damage(tier.trust_problem) if tier.trust_problem else None,
        "shared_cache": tier.policy.shared,
        "entries": len(readable),
        "bytes": sum(listing.sizes[i] for i in readable),
        "limit": tier.limit,
        "oldest": _when(min(used) if used else None),
        "newest": _when(max(used) if used else None),
        "damaged": len(damaged),
        "corrupt_dropped": events["corrupt"],
        "evictions": events["evicted"],
        "pruned": events["pruned"],
        "other_format_versions": others,
    }
    if not args.json:
        from rich.table import Table

        table = Table(title="aionvrtc disk cache", show_header=False)
        table.add_column(style="bold")
        table.add_column()
        table.add_row("location", f"{data['directory']} (format v{FORMAT_VERSION})")
        table.add_row("trust", _trust(tier))
        percent = 100 * data["bytes"] / tier.limit if tier.limit else 0.0
        table.add_row(
            "size",
            f"{data['entries']} entries, {format_size(data['bytes'])} of "
            f"{format_size(tier.limit)} ({percent:.0f}%)",
        )
        oldest, newest = data["oldest"] or "-", data["newest"] or "-"
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


def _ls(args: argparse.Namespace, console: Any) -> Result:
    tier = _tier(args)
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
        if len(selected) > len(rows):
            console.print(
                f"and {len(selected) - len(rows)} entries used less recently: "
                "aionvrtc cache ls --json lists every one"
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


def _text(value: object) -> str | None:
    """A header value shown as text only if it is text (the header is untrusted input)."""
    return value if isinstance(value, str) else None


def _clear(args: argparse.Namespace, console: Any) -> Result:
    tier = _tier(args)
    removed = tier.clear()
    if not args.json:
        console.print(f"removed {removed} entries from {tier.dir}")
    return {"removed": removed, "directory": str(tier.dir)}, 0


def _prune(args: argparse.Namespace, console: Any) -> Result:
    if args.max_size is None and args.older_than is None:
        raise ValueError("prune needs --max-size SIZE, --older-than AGE or both")
    tier = _tier(args)
    pruned = tier.prune_report(max_bytes=args.max_size, older_than=args.older_than)
    removed_bytes = sum(e.size for e in pruned.removed)
    data: dict[str, Any] = {
        "removed": len(pruned.removed),
        "removed_keys": sorted(e.key for e in pruned.removed),
        "entries": pruned.entries,
        "bytes_before": pruned.bytes + removed_bytes,
        "bytes": pruned.bytes,
        "damaged": [_damage(d) for d in pruned.damaged],  # skipped: not entries
    }
    if not args.json:
        console.print(
            f"removed {data['removed']} entries: {format_size(data['bytes_before'])} -> "
            f"{format_size(data['bytes'])} in {pruned.entries} entries"
        )
        for damage in pruned.damaged:
            console.print(f"skipped damaged {damage}")
    return data, 0


# -- warm ----------------------------------------------------------------------------------------


def _warm_tropical(args: argparse.Namespace, console: Any) -> Result:
    import anyio

    from . import tropical
    from ._actor import Compiler
    from ._target import ENV_ARCH, resolve_target

    if args.jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {args.jobs}")
    try:
        target = resolve_target(args.arch)
    except NoDeviceError as exc:  # the same advice, in the command line's words
        raise NoDeviceError(
            f"no GPU here to take the arch from: name one, such as --arch sm_90 (or set {ENV_ARCH})"
        ) from exc
    specs = tropical.all_specs(args.semirings, args.dtypes)
    if not specs:
        raise ValueError(f"no tropical kernels for semirings {args.semirings}, {args.dtypes}")

    async def run() -> dict[str, Any]:
        from rich.progress import Progress

        started = time.perf_counter()
        async with Compiler(arch=target, cache_dir=args.cache_dir, concurrency=args.jobs) as c:
            with Progress(console=console, disable=args.json, transient=True) as progress:
                task = progress.add_task(f"compiling for {target}", total=len(specs))

                async def one(spec: Any) -> None:
                    await c.compile(spec)
                    progress.advance(task)

                async with anyio.create_task_group() as group:
                    for spec in specs:
                        group.start_soon(one, spec)
            stats = c.stats()
        return {
            "arch": target.arch,
            "kernels": len(specs),
            "compiled": stats.compiles,
            "from_disk": stats.disk.hits,
            "compile_seconds": round(stats.compile_seconds, 3),
            "seconds": round(time.perf_counter() - started, 3),
            "directory": str(_tier(args).dir),
        }

    data = anyio.run(run)
    if not args.json:
        console.print(
            f"{data['kernels']} tropical kernels for {data['arch']}: {data['compiled']} compiled, "
            f"{data['from_disk']} already on disk, in {data['seconds']:.1f} s ({data['directory']})"
        )
    return data, 0


# -- doctor --------------------------------------------------------------------------------------

Check = dict[str, str]


def _doctor(args: argparse.Namespace, console: Any) -> Result:
    checks: list[Check] = []
    for probe in (_check_nvrtc, _check_gpus, _check_cache_dir, _check_free_space, _check_locks):
        try:
            checks.extend(probe(args))
        except Exception as exc:  # a probe that breaks is itself a finding
            checks.append(_check(probe.__name__[7:], "fail", f"the check failed: {exc}", ""))
    failed = [c for c in checks if c["status"] == "fail"]
    data = {
        "aionvrtc": __version__,
        "python": platform.python_version(),
        "ok": not failed,
        "checks": checks,
    }
    if not args.json:
        from rich.table import Table

        table = Table(title=f"aionvrtc {__version__} doctor")
        for column in ("check", "status", "detail", "fix"):
            table.add_column(column)
        colours = {"ok": "green", "warn": "yellow", "fail": "red"}
        for c in checks:
            status = f"[{colours[c['status']]}]{c['status']}[/]"
            table.add_row(c["check"], status, c["detail"], c["fix"])
        console.print(table)
    return data, 1 if failed else 0


def _check(name: str, status: str, detail: str, fix: str = "") -> Check:
    return {"check": name, "status": status, "detail": detail, "fix": fix}


def _check_nvrtc(args: argparse.Namespace) -> list[Check]:
    from . import _nvrtc

    try:
        version = _nvrtc.version_string()
    except AionvrtcError as exc:
        fix = "pip install 'nvidia-cuda-nvrtc>=13,<14' (or install a CUDA 13 toolkit)"
        return [_check("nvrtc", "fail", str(exc), fix)]
    archs = ", ".join(f"sm_{a}" for a in _nvrtc.supported_archs())
    return [
        _check("nvrtc", "ok", f"NVRTC {version} from {_loaded('libnvrtc') or 'CuPy'}"),
        _check("archs", "ok", archs),
    ]


def _loaded(library: str) -> str | None:
    """Where the process mapped ``library`` from (Linux), for saying which NVRTC is in use."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/maps").read_text().splitlines():
            path = line.split()[-1]
            if library in Path(path).name:
                return path
    return None


def _check_gpus(args: argparse.Namespace) -> list[Check]:
    try:
        with map_cuda_errors("none usable", NoDeviceError):
            import cupy

            count = cupy.cuda.runtime.getDeviceCount()
            driver = cupy.cuda.runtime.driverGetVersion()
    except NoDeviceError as exc:
        detail = f"{str(exc).splitlines()[0]}: kernels compile (warm) but not load"
        return [_check("gpus", "warn", detail, "run on a machine with an NVIDIA GPU and driver")]
    if count == 0:
        return [_check("gpus", "warn", "none: kernels compile (warm) but do not load")]
    rows = []
    for device in range(count):
        props = cupy.cuda.runtime.getDeviceProperties(device)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        arch = f"sm_{props['major']}{props['minor']}"
        detail = f"{name}, {arch}, driver CUDA {driver // 1000}.{driver % 1000 // 10}"
        rows.append(_check(f"gpu {device}", "ok", detail))
    return rows


def _check_cache_dir(args: argparse.Namespace) -> list[Check]:
    tier = _tier(args)
    root = tier.root
    if root.exists() and not root.is_dir():
        detail = f"{root} is not a folder: nothing can be cached there"
        fix = f"point {ENV_CACHE_DIR} (or --cache-dir) at a folder; a missing one is made"
        return [_check("cache dir", "fail", detail, fix)]
    # Makes the folders as the tier does (0700, or 2770 shared); it may find the tree untrusted.
    failure = tier.probe_write() if tier.trusted else None
    if tier.trust_problem is not None:
        damage = tier.trust_problem
        detail = (
            f"{root} ({_ownership(root)}) is not trusted, so it is neither read nor written: "
            f"{damage.path} is {damage.problem}"
        )
        return [_check("cache dir", "fail", detail, damage.fix)]
    if failure is None:
        return [_check("cache dir", "ok", f"{tier.dir}: {_trust(tier)}; writable")]
    if root.is_dir():
        detail = (
            f"{tier.dir}: {_trust(tier)}; not writable by this user ({failure}): entries are "
            "read from it, new kernels are compiled and kept in memory"
        )
        fix = f"none if read-only on purpose; else point {ENV_CACHE_DIR} at a folder you own"
        return [_check("cache dir", "warn", detail, fix)]
    fix = f"point {ENV_CACHE_DIR} (or --cache-dir) at a folder this user can make and write"
    return [_check("cache dir", "fail", f"cannot make {tier.dir}: {failure}", fix)]


def _check_free_space(args: argparse.Namespace) -> list[Check]:
    tier = _tier(args)
    folder = tier.dir
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    detail = f"{format_size(free)} free, cache limit {format_size(tier.limit)}"
    if free < 64 << 20:
        return [_check("free space", "fail", detail, f"free space on the disk of {folder}")]
    if free < tier.limit:
        fix = "lower the limit (AIONVRTC_DISK_LIMIT) or free space: a full disk stops writes"
        return [_check("free space", "warn", detail, fix)]
    return [_check("free space", "ok", detail)]


def _check_locks(args: argparse.Namespace) -> list[Check]:
    tier = _tier(args)
    try:
        import fcntl  # noqa: F401
    except ImportError:
        return [_check("file locks", "warn", "not POSIX: processes may compile a kernel twice")]
    if not tier.trusted or tier.probe_write() is not None:
        return [_check("file locks", "ok", "not used: nothing is written to this cache dir")]
    # As a compile does: the key's lock, and its entry written under it (then both removed).
    with tier.lock(PROBE_KEY) as locked:
        tier.probe_write()
    if not tier.locking:
        detail = "flock fails here: processes may each compile a kernel once"
        fix = "put the cache on a local file system (AIONVRTC_CACHE_DIR)"
        return [_check("file locks", "warn", detail, fix)]
    if not locked:
        return [_check("file locks", "fail", "cannot create a lock file", "see cache dir")]
    return [_check("file locks", "ok", "flock works: one compile per kernel across processes")]
