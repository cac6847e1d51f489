"""`aionvrtc warm tropical|manifest`: compiling into the cache dir ahead of use."""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .._config import ENV_ARCH, ENV_MANIFEST
from .._exceptions import AionvrtcError, NoDeviceError
from .._spec import KernelSpec
from .._store.disk import (
    DiskTier,
)
from .._target import Target  # loaded by ._spec already
from .._units import format_size

if TYPE_CHECKING:
    from .._compiler import Compiler
from ._shared import (
    _SKIPPED_SAID,
    CommandError,
    Result,
    _first_line,
    _innermost,
    _Interrupted,
    _tier,
    _where_nothing_is_kept,
)

__all__ = []


def _warm_tropical(args: argparse.Namespace, console: Any) -> Result:
    from .. import tropical

    targets = _warm_targets(args)
    specs = tropical.warm_specs(
        args.semirings, args.dtypes, batched=args.batched, max_batch=args.max_batch
    )
    data = _warm(args, console, targets, specs)
    if not args.json:
        batched = " (batched)" if args.batched else ""
        _say_warmed(console, data, f"tropical kernels{batched}")
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
    from .._manifest import read_manifests

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
    from .. import _nvrtc
    from .._target import resolve_target

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

    from .._compiler import Compiler
    from .._exceptions import CompilerClosed

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
    from .._exceptions import CompileError

    if isinstance(exc, CompileError):
        first = next((line.strip() for line in exc.log.splitlines() if "error" in line), None)
        if first:
            return first
    return _first_line(str(exc)) or type(exc).__name__
