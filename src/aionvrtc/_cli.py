"""The command line, ``aionvrtc`` or ``python -m aionvrtc``: inspect, prune, warm and diagnose
the disk cache. Every command takes ``--json`` (one JSON document on stdout, for scripts) and
``--cache-dir`` (default: ``$AIONVRTC_CACHE_DIR``, else the user cache dir); tables and progress
for people are drawn by rich.

A failure is one line on stderr saying what was wrong and the fix (with ``--json``, also a JSON
document with an ``error`` field on stdout), exit status 1; bad usage exits 2 (argparse's), an
interrupt 130. Tracebacks only with ``--debug``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import logging
import math
import os
import platform
import re
import shutil
import signal
import stat
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

from ._config import ENV_ARCH, ENV_CACHE_DIR, ENV_DISK_LIMIT, ENV_MANIFEST, ENV_REMOTE_SECRET
from ._cuda_errors import map_cuda_errors
from ._exceptions import AionvrtcError, NoDeviceError
from ._spec import FORMAT_VERSION, KernelSpec
from ._store.disk import (
    PROBE_KEY,
    Damage,
    DiskTier,
    EntryInfo,
    Listing,
    default_cache_dir,
)
from ._target import Target  # loaded by ._spec already
from ._units import format_size, parse_age, parse_size
from ._version import __version__

if TYPE_CHECKING:
    from ._actor import Compiler

__all__ = ["main"]

Result = tuple[Any, int]  # (what --json prints, exit status)
# Rows of the `cache ls` table for people, most recently used first: rich takes about a
# millisecond a row, and 50,000 rows are no table to read (--json lists every entry).
_TABLE_ROWS = 200
# Skipped manifest lines that `warm manifest` says one by one; --json lists them all.
_SKIPPED_SAID = 5
# Exit statuses: 2 is argparse's for bad usage; 130 is what a shell reports for a command that
# SIGINT stopped (128 + 2), so scripts see an interrupt as one whichever way it was handled.
_FAILED, _USAGE, _INTERRUPTED = 1, 2, 130
# The names `warm tropical` takes, spelled here rather than imported: importing aionvrtc.tropical
# loads NumPy and the GPU API (0.13 s on the dev VM) for every command, `cache ls` included.
# tests/test_cli.py checks them against tropical.SEMIRINGS and the kernels' dtypes.
SEMIRING_NAMES = ("maxplus", "minplus", "maxmul", "andor")
DTYPE_NAMES = ("float32", "float64", "int32", "int64", "bool")

# People read a terminal's help: the module docstring above is reST for developers.
_DESCRIPTION = """\
Inspect, prune, warm and diagnose aionvrtc's disk cache of compiled CUDA kernels.

Every command takes --json (one JSON document on stdout, for scripts), --cache-dir DIR
(default: $AIONVRTC_CACHE_DIR, else the user cache dir) and --debug (tracebacks and logs).
Exit status: 0 done; 1 failed (one line on stderr says why and the fix; with --json, a
document with an "error" field on stdout); 2 bad usage; 130 interrupted."""


class _UsageError(Exception):
    """Raised by a parser instead of printing and exiting, so that main() can answer in JSON."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser
        self.message = message


class _Parser(argparse.ArgumentParser):
    # add_subparsers makes its parsers of this class too (parser_class defaults to ours).
    def error(self, message: str) -> NoReturn:
        raise _UsageError(self, message)


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


def main(argv: list[str] | None = None) -> int:
    as_program = argv is None  # the process is ours: signal handling may be changed
    arguments = sys.argv[1:] if argv is None else list(argv)
    # Known before parsing, so that a usage error is answered in JSON too.
    wants_json = "--json" in arguments
    try:
        return _main(arguments)
    except _UsageError as exc:
        return _usage_error(exc.parser.prog, exc.message, wants_json)
    except BaseException as raised:
        interrupt = _innermost(raised)
        if not isinstance(interrupt, KeyboardInterrupt) or "--debug" in arguments:
            raise
        if as_program:
            # A second Ctrl-C while worker threads finish their compile ends the process at
            # once, by the signal, rather than with a traceback from the interpreter's exit.
            signal.signal(signal.SIGINT, signal.SIG_DFL)
        done = interrupt.data if isinstance(interrupt, _Interrupted) else {}
        if wants_json:
            _print_json({"error": "interrupted", **done})
        if isinstance(interrupt, _Interrupted):
            _print_error(str(interrupt), label="interrupted")
        return _INTERRUPTED


def _main(arguments: list[str]) -> int:
    parser = _parser()
    args, extras = parser.parse_known_args(arguments)
    command: argparse.ArgumentParser = getattr(args, "command", parser)
    leaf = hasattr(args, "run")
    # Before a group's help: `aionvrtc --foo` is a typo to name, not a reason to print it all.
    # A group takes the options every command takes (`aionvrtc cache --json` answers in JSON).
    unknown = [arg for arg in extras if leaf or arg not in ("--json", "--debug")]
    if unknown:
        command.error(f"unrecognized arguments: {' '.join(unknown)}")
    if not leaf:  # `aionvrtc`, `aionvrtc cache`: the group's own help
        command.print_help(sys.stderr)
        needed = f"a command is needed: {', '.join(_subcommands(command))}"
        return _usage_error(command.prog, needed, "--json" in arguments, help_shown=True)
    from rich.console import Console

    console = Console(stderr=False, highlight=False)
    run: Callable[[argparse.Namespace, Any], Result] = args.run
    with _logging(debug=args.debug) as warnings:
        try:
            try:
                data, status = run(args, console)
            except BaseException as raised:
                exc = _innermost(raised)
                # A broken pipe is answered below, bad usage (found by a command) by main().
                if args.debug or not isinstance(exc, Exception):
                    raise
                if isinstance(exc, (BrokenPipeError, _UsageError)):
                    raise
                message = _error_line(exc)
                extra = exc.data if isinstance(exc, CommandError) else {}
                if args.json:
                    _print_json({"error": message, **extra})
                _print_error(message)
                return _FAILED
            if args.json:
                print(_json_text(data), flush=True)
        except BrokenPipeError:
            # The reader stopped early (`aionvrtc cache ls | head`): not a failure. Point stdout
            # at /dev/null so that the interpreter's own flush at exit does not raise again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        # Said after the output, one line each; a failure's line says all that is needed.
        for warning in warnings:
            _print_error(warning, label="warning")
    return status


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


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2), flush=True)


def _usage_error(prog: str, message: str, wants_json: bool, *, help_shown: bool = False) -> int:
    line = message if help_shown else f"{message}; see {prog} --help"
    if wants_json:
        _print_json({"error": line})
    print(f"{prog}: error: {line}", file=sys.stderr, flush=True)
    return _USAGE


def _subcommands(parser: argparse.ArgumentParser) -> list[str]:
    return [
        name
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name in action.choices
    ]


class _Warnings(logging.Handler):
    """What aionvrtc logs during a command (WARNING and above): first lines, each once."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = _first_line(record.getMessage())
        except Exception:
            self.handleError(record)
            return
        if line and line not in self.lines:
            self.lines.append(line)


@contextlib.contextmanager
def _logging(*, debug: bool) -> Iterator[list[str]]:
    """Route the library's log for a command: with ``debug``, everything to stderr as it
    happens (tracebacks included); else warnings kept to be said once each at the end, so
    that a failure is one line (its cause in it) and a job's traceback never shows."""
    logger = logging.getLogger("aionvrtc")
    handler: logging.Handler
    if debug:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        lines: list[str] = []
    else:
        handler = collected = _Warnings()
        lines = collected.lines
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    if debug:
        logger.setLevel(logging.DEBUG)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


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


def _arch(text: str) -> str:
    from ._target import Target

    return Target(text).arch  # its ValueError names the forms an arch takes


def _jobs(text: str) -> int:
    try:
        jobs = int(text)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise ValueError(f"must be a whole number of parallel compiles, at least 1, got {text!r}")
    return jobs


def _parser() -> argparse.ArgumentParser:
    size, age, arch = _argument(parse_size), _argument(parse_age), _argument(_arch)
    common = _Parser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON document")
    common.add_argument(
        "--cache-dir", type=Path, default=None, metavar="DIR",
        help="default: $AIONVRTC_CACHE_DIR or the user's",
    )  # fmt: skip
    common.add_argument(
        "--debug", action="store_true", help="show the library's log, and tracebacks of errors"
    )
    parser = _Parser(
        prog="aionvrtc",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"aionvrtc {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    group = commands.add_parser("cache", help="the disk cache", description="The disk cache.")
    group.set_defaults(command=group)
    cache = group.add_subparsers(title="commands", metavar="COMMAND")

    def command(
        parent: argparse._SubParsersAction[_Parser],
        name: str,
        run: Callable[..., Result],
        help: str,
    ) -> _Parser:
        leaf = parent.add_parser(name, parents=[common], help=help, description=help)
        leaf.set_defaults(run=run, command=leaf)
        return leaf

    command(cache, "info", _info, "location, size, entries, events")
    ls = command(cache, "ls", _ls, "one row per entry")
    ls.add_argument("--arch", type=arch, help="only entries compiled for this arch, such as sm_90")
    ls.add_argument("--older-than", type=age, help="last used before, such as 7d")
    ls.add_argument("--newer-than", type=age, help="last used within, such as 12h")
    command(cache, "clear", _clear, "remove every entry; exit 1 if some cannot be removed")
    prune = command(
        cache, "prune", _prune, "remove old entries, then the least recently used beyond a size"
    )
    prune.add_argument("--max-size", type=size, help="keep at most this much, such as 2G")
    prune.add_argument("--older-than", type=age, help="remove entries unused for, e.g. 30d")
    export = command(
        cache, "export", _export,
        "write the cache's entries to one bundle file, to ship a warm cache (signed when "
        "$AIONVRTC_REMOTE_SECRET is set); exit 1 if there is nothing to export",
    )  # fmt: skip
    export.add_argument("output", type=Path, metavar="OUTPUT", help="the bundle file to write")
    export.add_argument(
        "--arch", type=arch, action="append",
        help="only entries compiled for this arch, such as sm_90; again for more archs",
    )  # fmt: skip
    export.add_argument(
        "--manifest", type=Path, action="append", metavar="PATH",
        help="only the entries of this manifest's specs (for the archs named, else every arch "
        "in the cache); again for more manifests",
    )  # fmt: skip
    imported = command(
        cache, "import", _import,
        "add a bundle's entries to the cache, once the bundle is found trusted as a layer is "
        "(nobody else can change it or a folder above it) and all of its entries are verified "
        "(and its signature, when $AIONVRTC_REMOTE_SECRET is set); exit 1, adding nothing, if "
        "not",
    )  # fmt: skip
    imported.add_argument("bundle", type=Path, metavar="BUNDLE", help="a file cache export wrote")

    group = commands.add_parser(
        "warm", help="compile kernels ahead of use (no GPU needed)",
        description="Compile kernels ahead of use into the disk cache (no GPU needed).",
    )  # fmt: skip
    group.set_defaults(command=group)
    warm = group.add_subparsers(title="kernels", metavar="KERNELS")
    tropical = command(
        warm, "tropical", _warm_tropical,
        "the tropical GEMM kernels; exit 1 if what was compiled cannot be kept on disk",
    )  # fmt: skip
    tropical.add_argument(
        "--arch", type=arch, action="append",
        help="target, such as sm_90; again for more archs (default: $AIONVRTC_ARCH, else this "
        "machine's GPU)",
    )  # fmt: skip
    tropical.add_argument(
        "--semirings", nargs="+", choices=SEMIRING_NAMES, metavar="SEMIRING",
        help=f"default: all; of {', '.join(SEMIRING_NAMES)}",
    )  # fmt: skip
    tropical.add_argument(
        "--dtypes", nargs="+", choices=DTYPE_NAMES, metavar="DTYPE",
        help=f"default: all; of {', '.join(DTYPE_NAMES)} (andor takes bool, the others the rest)",
    )  # fmt: skip
    tropical.add_argument(
        "--jobs", type=_argument(_jobs), default=os.cpu_count() or 1,
        help="parallel compiles (default: CPUs)",
    )  # fmt: skip
    manifest = command(
        warm, "manifest", _warm_manifest,
        "the kernels that services recorded to manifests (Compiler(manifest=PATH) or "
        "$AIONVRTC_MANIFEST); exit 1 if one fails to compile (the others are kept) or what was "
        "compiled cannot be kept on disk",
    )  # fmt: skip
    manifest.add_argument(
        "paths", type=Path, nargs="+", metavar="PATH", help="a manifest file; more are read as one"
    )
    manifest.add_argument(
        "--arch", type=arch, action="append",
        help="target, such as sm_90; again for more archs (default: $AIONVRTC_ARCH, else this "
        "machine's GPU)",
    )  # fmt: skip
    manifest.add_argument(
        "--jobs", type=_argument(_jobs), default=os.cpu_count() or 1,
        help="parallel compiles (default: CPUs)",
    )  # fmt: skip

    command(commands, "doctor", _doctor, "check NVRTC, GPUs and the cache dir; exit 1 if broken")
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


def _text(value: object) -> str | None:
    """A header value shown as text only if it is text (the header is untrusted input)."""
    return value if isinstance(value, str) else None


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


# -- export and import: bundles ------------------------------------------------------------------


def _export_keys(
    listing: Listing, readable: list[int], archs: list[str] | None, keys: set[str] | None
) -> list[str]:
    """The keys ``cache export`` packs, sorted: the entries whose header can be read, of
    ``archs`` when given, and among ``keys`` when given (a manifest's). Headers are untrusted
    summaries: this only chooses, each entry is verified when it is read."""
    chosen = []
    for i in readable:
        key = listing.keys[i]
        if keys is not None and key not in keys:
            continue
        if archs is not None and cast(dict[str, Any], listing.headers[i]).get("arch") not in archs:
            continue
        chosen.append(key)
    return sorted(chosen)


def _manifest_keys(
    paths: list[Path], archs: list[str] | None, listing: Listing, readable: list[int]
) -> set[str]:
    """The keys of the manifests' specs for ``archs`` (default: every arch the cache holds)
    under this NVRTC: what ``cache export --manifest`` ships."""
    from ._cache import kernel_key
    from ._manifest import read_manifests

    read = read_manifests(paths)
    if archs is None:
        archs = []
        for arch in _by_arch(listing, readable):
            with contextlib.suppress(ValueError):  # a header's untrusted text, not an arch
                archs.append(Target(arch).arch)
    return {kernel_key(spec, arch) for spec in read.specs for arch in archs}


def _export(args: argparse.Namespace, console: Any) -> Result:
    from ._artifact import encode
    from ._store.bundle import environment_secret, write_bundle

    tier, _ = _cache_dir(args, reading=True)
    archs = list(dict.fromkeys(args.arch)) if args.arch else None
    which = f" for {', '.join(archs)}" if archs else ""
    if tier.trust_problem is not None:
        damage = tier.trust_problem
        raise CommandError(
            f"nothing to export: {tier.root} is not trusted ({damage.path} is {damage.problem}); "
            f"{damage.fix}"
        )
    # Read through a read-only view: exporting neither refreshes the entries' recency (their
    # order for eviction) nor removes a damaged one (it is left out, and warned about).
    reader = DiskTier(tier.root, read_only=True, shared_cache=tier.policy.shared)
    listing, readable, _ = _contents(tier)  # one walk, for the manifest's archs and the keys
    wanted = _manifest_keys(args.manifest, archs, listing, readable) if args.manifest else None
    entries, records = [], 0
    for key in _export_keys(listing, readable, archs, wanted):
        artifact = reader.read(key)
        if artifact is None or (archs is not None and artifact.arch not in archs):
            continue  # damaged, removed since it was listed, or its header said another arch
        entries.append(encode(artifact))
        records += artifact.kind == "data"
    if not entries:
        raise CommandError(
            f"nothing to export: {tier.dir} holds no entries{which}; compile kernels into it "
            "first (aionvrtc warm, or run the program that uses them)"
        )
    try:
        bundle = write_bundle(args.output, entries, secret=environment_secret())
    except OSError as exc:
        raise CommandError(
            f"cannot write the bundle {args.output} ({exc.strerror or exc}); name a file in a "
            "folder this user can write"
        ) from exc
    data: dict[str, Any] = {
        "bundle": str(args.output),
        "entries": bundle.entries,
        "records": records,
        "bytes": bundle.bytes,
        "archs": sorted(bundle.archs, key=_natural),
        "signed": bundle.signed,
        "sha256": bundle.sha256,
    }
    if wanted is not None:  # what the manifests name that the cache does not hold
        data["missing"] = len(wanted) - bundle.entries
    if not args.json:
        signed = "signed" if bundle.signed else f"unsigned (no ${ENV_REMOTE_SECRET})"
        console.print(
            f"exported {bundle.entries} entries{which} ({format_size(bundle.bytes)}, "
            f"{', '.join(data['archs'])}) to {args.output}, {signed}; sha256 {bundle.sha256}",
            soft_wrap=True,
        )
    return data, 0


def _import(args: argparse.Namespace, console: Any) -> Result:
    from ._artifact import encode
    from ._store.bundle import environment_secret, verify_bundle

    secret = environment_secret()
    # Every entry is checked before any is added: a bundle that fails adds nothing. It is held
    # to a layer's trust rules (verify_bundle, as BundleTier): once imported, its kernels are
    # served from the cache dir to every process.
    artifacts = verify_bundle(args.bundle, secret=secret)
    tier = _tier(args)
    why = _where_nothing_is_kept(tier, probe=True)
    if why is not None:
        raise CommandError(f"cannot import {args.bundle}: {why}")
    total = sum(len(encode(artifact)) for artifact in artifacts)
    if total > tier.limit:  # they would evict each other (and everything else) as they came
        raise CommandError(
            f"cannot import {args.bundle}: its {len(artifacts)} entries take "
            f"{format_size(total)}, more than the cache limit of {format_size(tier.limit)}; "
            f"raise ${ENV_DISK_LIMIT}"
        )
    data: dict[str, Any] = {
        "bundle": str(args.bundle),
        "entries": len(artifacts),
        "added": 0,
        "present": 0,
        "signature_verified": secret is not None,  # without a secret, not checked
        "directory": str(tier.dir),
    }
    for artifact in artifacts:
        if tier.read(artifact.key, arch=artifact.arch) is not None:
            data["present"] += 1
        elif tier.write(artifact):
            data["added"] += 1
        else:
            why = _where_nothing_is_kept(tier) or (
                f"writes to {tier.dir} failed (its limit is {format_size(tier.limit)}); "
                "aionvrtc doctor checks it"
            )
            raise CommandError(
                f"added {data['added']} of the {len(artifacts)} entries of {args.bundle}, then "
                f"the cache refused one: {why}",
                data,
            )
    if not args.json:
        console.print(
            f"{data['added']} entries added, {data['present']} already present, from "
            f"{args.bundle} to {tier.dir}",
            soft_wrap=True,
        )
    return data, 0


# -- warm ----------------------------------------------------------------------------------------


def _warm_tropical(args: argparse.Namespace, console: Any) -> Result:
    from . import tropical

    targets = _warm_targets(args)
    data = _warm(args, console, targets, tropical.all_specs(args.semirings, args.dtypes))
    if not args.json:
        _say_warmed(console, data, "tropical kernels")
    return data, 0


def _say_warmed(console: Any, data: dict[str, Any], what: str) -> None:
    """A warm command's one line for people: how many of ``what``, for which archs, how."""
    done = f"{data['compiled']} compiled, {data['from_disk']} already on disk"
    console.print(
        f"{data['kernels']} {what} for {', '.join(data['archs'])}: {done}, in "
        f"{data['seconds']:.1f} s ({data['directory']})",
        soft_wrap=True,
    )


def _warm_manifest(args: argparse.Namespace, console: Any) -> Result:
    from ._manifest import read_manifests

    targets = _warm_targets(args)
    read = read_manifests(args.paths)
    report = {"specs": len(read.specs), "duplicates": read.duplicates, "skipped": read.skipped}
    if not read.specs:
        count = len(read.skipped)
        skipped = f" ({count} {'line' if count == 1 else 'lines'} skipped)" if count else ""
        raise CommandError(
            f"no kernels to warm in {', '.join(map(str, args.paths))}{skipped}: record them by "
            f"running the service with {ENV_MANIFEST} (or Compiler(manifest=...)) set to the "
            "manifest's path",
            report,
        )
    # Said at the end (main() prints what was logged): lines of a manifest that a crash cut
    # short or that are not manifest lines are not the command's failure.
    logger = logging.getLogger("aionvrtc")
    for line in read.skipped[:_SKIPPED_SAID]:
        logger.warning("skipped %s", line)
    if len(read.skipped) > _SKIPPED_SAID:
        more = len(read.skipped) - _SKIPPED_SAID
        logger.warning("skipped %d more lines that are not manifest lines; --json lists them", more)
    data = _warm(args, console, targets, read.specs, report=report, keep_going=True)
    failed: list[dict[str, str]] = data["failed"]
    if failed:
        # One line, however many failed: grouped by kernel and error, the archs listed.
        grouped: dict[tuple[str, str], list[str]] = {}
        for entry in failed:
            grouped.setdefault((entry["name"], entry["error"]), []).append(entry["arch"])
        which = "; ".join(
            f"{name} for {', '.join(archs)}: {error}" for (name, error), archs in grouped.items()
        )
        kept = len(failed) < data["kernels"]
        others = f" (the others are in {data['directory']})" if kept else ""
        raise CommandError(
            f"{len(failed)} of {data['kernels']} kernels failed to compile{others}: {which}", data
        )
    if not args.json:
        _say_warmed(console, data, f"kernels ({data['specs']} from the manifests)")
    return data, 0


def _warm_targets(args: argparse.Namespace) -> list[Target]:
    """The targets of a warm command: each ``--arch`` once, else ``$AIONVRTC_ARCH`` or this
    machine's GPU; each checked against this NVRTC before anything is compiled."""
    from . import _nvrtc
    from ._target import resolve_target

    if args.arch:
        # An arch named twice is one set of kernels: compiled once.
        targets = [Target(arch) for arch in dict.fromkeys(args.arch)]
    else:
        try:
            targets = [resolve_target(None)]
        except NoDeviceError as exc:  # the same advice, in the command line's words
            # Without CuPy or NVRTC, naming an arch would not help: say that, and the extra.
            _nvrtc.version()
            raise NoDeviceError(
                f"no GPU here to take the arch from: name one, such as --arch sm_90 (or set "
                f"{ENV_ARCH})"
            ) from exc
    # An arch this NVRTC cannot target is said once, with the extra whose NVRTC can, before any
    # compile: not by every compile, and not after the other archs' minutes of compiles.
    for target in targets:
        _nvrtc.check_target(target)
    return targets


def _warm(
    args: argparse.Namespace,
    console: Any,
    targets: list[Target],
    specs: list[KernelSpec],
    *,
    report: dict[str, Any] | None = None,
    keep_going: bool = False,
) -> dict[str, Any]:
    """Compile each of ``specs`` for each of ``targets`` into the cache dir, ``--jobs`` at a
    time, with a progress bar on a terminal: the runner of the warm commands. Returns the
    --json report (``report``'s fields after the archs and kernels). The first failed compile
    is raised; with ``keep_going``, the others go on and the report lists it under ``failed``.
    CommandError if what was compiled cannot be kept."""
    import anyio

    from ._actor import Compiler
    from ._exceptions import CompilerClosed

    archs = [target.arch for target in targets]
    named = ", ".join(archs)
    jobs = [(spec, target) for target in targets for spec in specs]
    tier = _tier(args)
    # A file, or an untrusted tree (neither read nor written): nothing compiled would be kept,
    # so say so before the compiles rather than minutes after them.
    problem = _where_nothing_is_kept(tier)
    if problem is not None:
        raise CommandError(f"nothing compiled for {named} could be kept: {problem}")
    data: dict[str, Any] = {"archs": archs, "kernels": len(jobs), **(report or {})}
    failed: list[tuple[int, dict[str, str]]] = []  # (the job's index, what failed)

    # One Compiler for every arch: one pool of --jobs compiles, one disk tier's counters (made
    # here, so that an interrupted run can say them). No manifest: replaying one (or warming)
    # into $AIONVRTC_MANIFEST would append the same specs to it again at every run. No layers:
    # a kernel found in $AIONVRTC_CACHE_LAYERS would be served from there and never reach the
    # cache dir this fills.
    compiler = Compiler(
        arch=targets[0], cache_dir=args.cache_dir, concurrency=args.jobs, manifest=False, layers=[]
    )

    async def run() -> None:
        from rich.progress import Progress

        started = time.perf_counter()
        lost = False
        # Progress only on a terminal: elsewhere (a Dockerfile step, a pipe) rich would print
        # a blank line where the transient bar was.
        quiet = args.json or not console.is_terminal
        async with compiler as c:
            with Progress(console=console, disable=quiet, transient=True) as progress:
                task = progress.add_task(f"compiling for {named}", total=len(jobs))
                async with anyio.create_task_group() as group:

                    async def one(index: int, spec: KernelSpec, target: Target) -> None:
                        nonlocal lost
                        try:
                            # Written to disk, if it can be, before this returns.
                            await c.compile(spec, arch=target)
                        except (AionvrtcError, ValueError, OSError) as exc:
                            if not keep_going or isinstance(exc, CompilerClosed):
                                raise
                            error = _compile_failure(exc)
                            entry = {"name": spec.name, "arch": target.arch, "error": error}
                            failed.append((index, entry))
                        # A write failed: the rest would be compiled for nothing. (Comparing
                        # compiles with writes here would race: another job's compile is counted
                        # before its write is done.)
                        if c.stats().disk.write_failures:
                            lost = True
                            group.cancel_scope.cancel()
                        progress.advance(task)

                    for index, (spec, target) in enumerate(jobs):
                        group.start_soon(one, index, spec, target)
            stats = c.stats()
        data.update({
            "compiled": stats.compiles,
            "kept": stats.disk.writes,
            "from_disk": stats.disk.hits,
            "compile_seconds": round(stats.compile_seconds, 3),
            "seconds": round(time.perf_counter() - started, 3),
            "directory": str(tier.dir),
        })  # fmt: skip
        if keep_going:  # in the order of the jobs, not of their ends
            data["failed"] = [entry for _, entry in sorted(failed, key=lambda item: item[0])]
        if lost or stats.compiles > stats.disk.writes:  # every job done: no race now
            why = _where_nothing_is_kept(tier, probe=True) or (
                f"writes to {tier.dir} failed (its limit is {format_size(tier.limit)}); "
                "aionvrtc doctor checks it"
            )
            raise CommandError(f"kernels compiled for {named} cannot be kept: {why}", data)

    _run_warm(run, compiler, data, tier)
    return data


def _run_warm(
    run: Callable[[], Awaitable[None]], compiler: Compiler, data: dict[str, Any], tier: DiskTier
) -> None:
    """``anyio.run(run)``, where Ctrl-C raises _Interrupted saying what ``compiler`` kept: it
    is kept, and worth saying after minutes of compiles. (A compile running then finishes in
    its thread and is kept too, after this is said.)"""
    import anyio

    try:
        anyio.run(run)
    except BaseException as raised:
        if not isinstance(_innermost(raised), KeyboardInterrupt):
            raise
        stats = compiler.stats()
        kept, there = stats.disk.writes, stats.disk.hits
        data.update({
            "compiled": stats.compiles, "kept": kept, "from_disk": there,
            "directory": str(tier.dir),
        })  # fmt: skip
        found = f", {there} were there already" if there else ""
        raise _Interrupted(
            f"{kept} of {data['kernels']} kernels compiled and kept in {tier.dir}{found}", data
        ) from None


def _compile_failure(exc: Exception) -> str:
    """Why a compile failed, in one line: NVRTC's first error for a program it rejected (the
    program and arch are said beside it), else the error's first line."""
    from ._exceptions import CompileError

    if isinstance(exc, CompileError):
        first = next((line.strip() for line in exc.log.splitlines() if "error" in line), None)
        if first:
            return first
    return _first_line(str(exc)) or type(exc).__name__


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


# -- doctor --------------------------------------------------------------------------------------

Check = dict[str, str]


def _doctor(args: argparse.Namespace, console: Any) -> Result:
    checks: list[Check] = []
    probes = (
        _check_nvrtc, _check_gpus, _check_cuda_headers, _check_cache_dir, _check_free_space,
        _check_locks,
    )  # fmt: skip
    for probe in probes:
        try:
            checks.extend(probe(args))
        except Exception as exc:  # a probe that breaks is itself a finding
            if args.debug:
                raise
            detail = f"the check failed: {_error_line(exc)}"
            fix = "run aionvrtc doctor --debug for the traceback, and report it"
            checks.append(_check(probe.__name__[7:].replace("_", " "), "fail", detail, fix))
    failed = [c for c in checks if c["status"] == "fail"]
    data: dict[str, Any] = {
        "aionvrtc": __version__,
        "python": platform.python_version(),
        "nvrtc": _nvrtc_facts(),
        "driver": _driver_facts(),
        "ok": not failed,
        "checks": checks,
    }
    if failed:  # what every failing command has, for scripts
        names = ", ".join(dict.fromkeys(c["check"] for c in failed))
        data["error"] = f"checks failed: {names} (each says its fix)"
    if not args.json:
        from rich.table import Table
        from rich.text import Text

        table = Table(title=f"aionvrtc {__version__} doctor")
        for column in ("check", "status", "detail", "fix"):
            table.add_column(column)
        colours = {"ok": "green", "warn": "yellow", "fail": "red"}
        for c in checks:
            status = Text(c["status"], style=colours[c["status"]])
            # Text, not markup: "aionvrtc[cu12]" in a fix is no style tag.
            table.add_row(Text(c["check"]), status, Text(c["detail"]), Text(c["fix"]))
        console.print(table)
        if failed:
            _print_error(data["error"])
    return data, 1 if failed else 0


def _check(name: str, status: str, detail: str, fix: str = "") -> Check:
    return {"check": name, "status": status, "detail": detail, "fix": fix}


def _check_nvrtc(args: argparse.Namespace) -> list[Check]:
    from . import _cuda_versions, _nvrtc

    try:
        version = _nvrtc.version_string()
        archs = ", ".join(f"sm_{a}" for a in _nvrtc.supported_archs())
    except AionvrtcError as exc:  # no CuPy, or no NVRTC: the message ends with the fix
        detail, fix = _split_fix(str(exc), _cuda_versions.CHOOSE_EXTRA, _nvrtc._install_hint)
        return [_check("nvrtc", "fail", detail, fix)]
    library = _nvrtc._loaded_library() or "CuPy (where it loaded libnvrtc from cannot be told)"
    return [
        _check("nvrtc", "ok", f"NVRTC {version} from {library}"),
        _check("archs", "ok", archs),
        _check_min_driver(version),
        _check_driver(version),
    ]


def _check_cuda_headers(args: argparse.Namespace) -> list[Check]:
    from . import _cuda_headers, _nvrtc

    try:
        major: int | None = _nvrtc.version()[0]
    except AionvrtcError:  # no NVRTC: the nvrtc check says so and how to install it
        major = None
    problem = _cuda_headers.locator_problem()
    if problem is not None:
        fix = _cuda_headers.LOCATOR_FIX
        return [_check("CUDA headers", "warn", f"not looked for: {problem}", fix)]
    found = {place.what: place for place in _cuda_headers.located()}
    checks = []
    for what in ("CUDA runtime", "CCCL"):
        place = found.get(what)
        name = f"{what} headers"
        if place is None:
            detail = (
                "not found: a program that includes one of them (<cuda_fp16.h>, "
                "<cooperative_groups.h>, <cuda/std/...>, CUB) fails to compile"
            )
            checks.append(_check(name, "warn", detail, _cuda_headers.install_hint(major)))
            continue
        version = f" {place.version}" if place.version else ""
        detail = f"{what}{version} in {place.path} (found via {place.found_via})"
        if (
            what == "CUDA runtime"
            and major is not None
            and place.version is not None
            and int(place.version.split(".")[0]) != major
        ):
            detail += f", with NVRTC of CUDA {major}: programs that include them may not compile"
            checks.append(_check(name, "warn", detail, _cuda_headers.other_major_hint(major)))
        else:
            checks.append(_check(name, "ok", detail))
    return checks


def _split_fix(message: str, *fixes: str | Callable[[], str]) -> tuple[str, str]:
    """``message`` (an error's "problem; fix") as (problem, fix), for the first of ``fixes``
    that ends it; the fixes themselves hold "; ", so the message cannot just be split. A fix
    given as a function is asked only when it is needed (it reads the wheels' metadata)."""
    fix = ""
    for candidate in fixes:
        fix = candidate() if callable(candidate) else candidate
        if message.endswith(f"; {fix}"):
            return message[: -len(fix) - 2], fix
    return message, fix  # the last fix, said beside the whole message


def _check_min_driver(version: str) -> Check:
    from . import _cuda_versions, _nvrtc

    number = _nvrtc.version()[0]
    known = _cuda_versions.MAJORS.get(number)
    if known is None:
        detail = (
            f"NVRTC {version} is of CUDA {number}, which aionvrtc has no extra for: the driver "
            "its cubins need is not known here"
        )
        return _check("min driver", "warn", detail, _cuda_versions.CHOOSE_EXTRA)
    detail = (
        f"{known.min_driver}: cubins from NVRTC {version} load on NVIDIA drivers "
        f"{known.min_driver} or newer (CUDA {number}, as aionvrtc[{known.extra}] installs it)"
    )
    return _check("min driver", "ok", detail)


def _check_driver(version: str) -> Check:
    """The installed driver against NVRTC: whether it can load the cubins compiled here."""
    from . import _cuda_versions, _nvrtc

    number = _nvrtc.version()[0]
    known = _cuda_versions.MAJORS.get(number)
    cuda, release = _cuda_versions.driver_cuda(), _cuda_versions.driver_release()
    if cuda is None and release is None:
        # Not a warning of its own: the gpus check warns that there is no driver.
        needs = f"{known.min_driver} or newer" if known else f"for CUDA {number} or newer"
        detail = (
            "none here: kernels compile (aionvrtc warm), and load on machines whose NVIDIA "
            f"driver is {needs}"
        )
        return _check("driver", "ok", detail)
    if cuda is None:  # the kernel module is loaded, and libcuda cannot be
        detail = (
            f"the NVIDIA kernel module {release} is loaded, but CUDA cannot use the driver "
            "(libcuda): kernels compile but do not load"
        )
        fix = (
            "install the driver's CUDA library (libcuda) of the same release; in a container, "
            "run it with the NVIDIA container toolkit (docker run --gpus all)"
        )
        return _check("driver", "warn", detail, fix)
    which = f"{release} (CUDA {cuda[0]}.{cuda[1]})" if release else f"CUDA {cuda[0]}.{cuda[1]}"
    if cuda[0] >= number:
        return _check("driver", "ok", f"{which}: loads the cubins of NVRTC {version}")
    detail = (
        f"{which} is older than NVRTC {version} (CUDA {number}) and cannot load the kernels "
        "compiled here"
    )
    return _check("driver", "fail", detail, _cuda_versions.driver_fix(cuda, (number, 0)))


def _nvrtc_facts() -> dict[str, Any] | None:
    """NVRTC as doctor's --json gives it: version, library, extra, the driver its cubins
    need; None where it cannot be loaded (the nvrtc check says why)."""
    from . import _cuda_versions, _nvrtc

    try:
        number = _nvrtc.version()[0]
    except (AionvrtcError, ImportError):  # what loading CuPy and NVRTC raises
        return None
    known = _cuda_versions.MAJORS.get(number)
    return {
        "version": _nvrtc.version_string(),
        "library": _nvrtc._loaded_library(),
        "extra": known.extra if known else None,
        "min_driver": known.min_driver if known else None,
    }


def _driver_facts() -> dict[str, Any] | None:
    """The installed NVIDIA driver (its release, the CUDA it runs) or None without one."""
    from . import _cuda_versions

    cuda, release = _cuda_versions.driver_cuda(), _cuda_versions.driver_release()
    if cuda is None and release is None:
        return None
    return {"release": release, "cuda": f"{cuda[0]}.{cuda[1]}" if cuda else None}


def _check_gpus(args: argparse.Namespace) -> list[Check]:
    compile_only = "kernels compile (aionvrtc warm) but do not load"
    fix = "none to compile only; to run kernels, a machine with an NVIDIA GPU and its driver"
    driver = 0
    try:
        with map_cuda_errors("none usable", NoDeviceError):
            try:
                import cupy
            except ModuleNotFoundError as exc:
                if exc.name != "cupy":
                    raise  # CuPy itself is broken: "none usable", with its error
                from ._cuda_versions import CHOOSE_EXTRA

                detail = "CuPy is not installed: no GPU can be found or used"
                return [_check("gpus", "warn", detail, CHOOSE_EXTRA)]

            # 0 where no driver is installed at all (CUDA's documented answer): then the
            # runtime's "driver version is insufficient" would send people to upgrade one.
            driver = cupy.cuda.runtime.driverGetVersion()
            if driver == 0:
                return [_check("gpus", "warn", f"no NVIDIA driver found: {compile_only}", fix)]
            count = cupy.cuda.runtime.getDeviceCount()
    except NoDeviceError as exc:
        if "InsufficientDriver" in str(exc):  # a driver, older than this CUDA runtime needs
            with contextlib.suppress(Exception):
                from ._cuda_versions import cuda_version, driver_fix

                number = cupy.cuda.runtime.runtimeGetVersion()
                runtime = _cuda_version(number)
                detail = (
                    f"the NVIDIA driver (CUDA {_cuda_version(driver)}) is too old for the CUDA "
                    f"runtime {runtime}: {compile_only}"
                )
                fix = driver_fix(cuda_version(driver), cuda_version(number))
                return [_check("gpus", "warn", detail, fix)]
        return [_check("gpus", "warn", f"{_first_line(str(exc))}: {compile_only}", fix)]
    if count == 0:
        return [_check("gpus", "warn", f"none: {compile_only}", fix)]
    rows = []
    for device in range(count):
        props = cupy.cuda.runtime.getDeviceProperties(device)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        arch = f"sm_{props['major']}{props['minor']}"
        detail = f"{name}, {arch}, driver CUDA {_cuda_version(driver)}"
        rows.append(_check(f"gpu {device}", "ok", detail))
    return rows


def _cuda_version(number: int) -> str:
    from ._cuda_versions import cuda_version

    return "{}.{}".format(*cuda_version(number))


def _check_cache_dir(args: argparse.Namespace) -> list[Check]:
    tier = _tier(args)
    root = tier.root
    blocker = _not_a_folder(root)
    if blocker is not None:
        where = "" if blocker == root else f", so {root} cannot be made"
        detail = f"{blocker} is not a folder{where}: nothing can be cached there"
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
        fix = f"point {ENV_CACHE_DIR} (or --cache-dir) at a folder this user can write"
        return [_check("file locks", "fail", f"cannot create a lock file in {tier.dir}", fix)]
    return [_check("file locks", "ok", "flock works: one compile per kernel across processes")]
