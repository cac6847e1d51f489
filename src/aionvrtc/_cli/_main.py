"""The command line's entry point: the parser, ``main``, and how failures and interrupts end
a command (see the package's docstring)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from .._target import Target  # loaded by ._spec already
from .._units import parse_age, parse_size
from .._version import __version__

if TYPE_CHECKING:
    pass
from ._shared import (
    CommandError,
    Result,
    _error_line,
    _first_line,
    _innermost,
    _Interrupted,
    _print_error,
)
from .bundle import _export, _import
from .cache import _clear, _info, _ls, _prune
from .doctor import _doctor
from .warm import _warm_manifest, _warm_tropical

__all__ = ["build_parser", "main"]

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
    parser = build_parser()
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

    return Target(text).arch  # its ValueError names the forms an arch takes


def _at_least_one(what: str) -> Callable[[str], int]:
    """A parser of a whole number of ``what``, at least 1."""

    def parse(text: str) -> int:
        try:
            count = int(text)
        except ValueError:
            count = 0
        if count < 1:
            raise ValueError(f"must be a whole number of {what}, at least 1, got {text!r}")
        return count

    return parse


_jobs = _at_least_one("parallel compiles")


def _product_size(text: str) -> tuple[int, int, int]:
    try:
        m, n, k = (int(part) for part in text.lower().split("x"))
    except ValueError:
        m = n = k = 0
    if min(m, n, k) < 1:
        raise ValueError(
            f"must be a product's sizes MxNxK (A is M x K, B is K x N), such as 256x256x256, "
            f"got {text!r}"
        )
    return m, n, k


def build_parser() -> argparse.ArgumentParser:
    """The ``aionvrtc`` command's parser: every command, argument and help text (the
    documentation's command-line reference is generated from it)."""
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
        "--batched", type=_argument(_product_size), action="append", metavar="MxNxK",
        help="only the kernels a Batcher launches for M x K times K x N products, at every "
        "batch size up to --max-batch; again for more sizes (default: every kernel)",
    )  # fmt: skip
    tropical.add_argument(
        "--max-batch", type=_argument(_at_least_one("requests")), default=64, metavar="N",
        help="the largest batch of --batched (a Batcher's max_batch; default: 64)",
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
