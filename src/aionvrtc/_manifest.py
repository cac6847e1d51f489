"""The manifest: a file of the KernelSpecs a service compiled, one JSON line each, appended by
every process that records to it, for ``aionvrtc warm manifest`` to compile again for any arch.

A line is one canonical JSON object (sorted keys, no spaces) holding every field of the spec::

    {"headers":{},"manifest":1,"name":"kernel.cu","name_expressions":["f<int>"],"options":[],...}

Recording never fails a request: a manifest that cannot be written is warned about once and no
longer recorded to. Reading tolerates what concurrent appenders and crashes leave behind: the
same spec from several processes, a last line cut short.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread

from ._config import ENV_MANIFEST
from ._exceptions import ManifestError
from ._spec import KernelSpec
from ._store import _locks
from ._store._fs import kind_of, read_up_to

try:
    import fcntl
except ImportError:  # not POSIX: appends without a lock (see _append)
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "MANIFEST_VERSION",
    "Manifest",
    "ManifestRead",
    "read_manifests",
    "spec_line",
]

# Bump when a line's fields change what spec it rebuilds: a reader skips lines of another
# version rather than rebuild a different spec from them.
MANIFEST_VERSION = 1
_FIELDS = frozenset(("manifest", "source", "name", "options", "headers", "name_expressions"))
# A batch is written in microseconds: a process that holds the lock this long is stopped or
# hung, and the batch is appended without it (one O_APPEND write, which a local file system
# keeps whole) rather than hold up the Compiler's closing.
LOCK_WAIT = 10.0  # seconds
# The specs a Manifest remembers on the event loop, so that repeated misses of one spec (requests
# joining a compile, a remembered failure) cost a dict lookup. Bounded: holding every spec of a
# service that generates sources would keep them all alive; past it, the worker thread's digests
# still keep each spec to one line.
RECENT = 1024  # specs
# Created private, as the cache's entries are: a manifest holds the service's kernel sources. An
# existing file keeps its mode, so a team may share one on purpose (chmod g+rw).
_MODE = 0o600
_OPEN = (
    os.O_RDWR  # read too: the last byte says whether a write was cut short (see _append)
    | os.O_APPEND
    | os.O_CREAT
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_NONBLOCK", 0)  # a FIFO at the path fails the open instead of blocking it
    | getattr(os, "O_NOCTTY", 0)
)

logger = logging.getLogger("aionvrtc")


def spec_line(spec: KernelSpec) -> str:
    """``spec`` as one manifest line, newline included: canonical, so equal specs give equal
    lines, and ASCII (json escapes the rest), so no encoding can tear a character."""
    fields = {
        "manifest": MANIFEST_VERSION,
        "source": spec.source,
        "name": spec.name,
        "options": list(spec.options),
        "headers": dict(spec.headers),
        "name_expressions": list(spec.name_expressions),
    }
    return json.dumps(fields, sort_keys=True, separators=(",", ":")) + "\n"


class _Path:
    """What every Manifest of one path in this process shares: the digests of the lines written
    there (a spec is one line per process, whichever Compiler recorded it), and the lock that
    keeps this process's batches from racing each other's digests."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: set[bytes] = set()


# By absolute path. setdefault is atomic: two Manifests of a path made at once get one _Path.
_PATHS: dict[str, _Path] = {}


def _unlock_in_child() -> None:
    # A thread of the parent may have held a lock (writing a batch) as it forked, and no thread
    # of the child ever lets go of it: a Compiler of the child would wait forever.
    for shared in _PATHS.values():
        shared.lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_unlock_in_child)


class Manifest:
    """Records specs to the manifest at ``path``: each distinct spec once per process.

    ``record`` runs on the event loop and only notes the spec; the lines are appended by
    ``flush`` in a worker thread, a batch at a time under an exclusive flock, so processes
    appending to one file never interleave. Bound to a task group (``bind``), a record starts
    that flush itself; ``aclose`` writes what is left.

    Not fsynced: a manifest says what to warm, and a power cut that loses its last lines costs
    those kernels one compile at their first request, while an fsync per batch would cost a
    disk flush per burst of misses. A line cut short is skipped by ``read_manifests``.

    Args:
        path: The manifest file, made absolute now (a later chdir does not move it). It is
            created at the first write, readable and writable by this user only; an existing
            file keeps its mode, so a team may share one on purpose.

    Raises:
        TypeError: ``path`` is neither a str nor an ``os.PathLike``.
        ValueError: ``path`` is empty (which would name the working directory).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        if not os.fspath(path):
            raise ValueError(
                "manifest must be a file's path, not '' (which names the working directory); "
                "pass one such as 'kernels.jsonl', or manifest=False to a Compiler for none"
            )
        self.path = os.path.abspath(os.fspath(path))  # a later chdir must not move it
        self.written = 0  # lines this Manifest appended
        self.failed = False  # the path could not be written: recording stopped
        self._shared = _PATHS.setdefault(self.path, _Path())
        self._mutex = threading.Lock()
        self._recent: dict[KernelSpec, None] = {}
        self._pending: list[KernelSpec] = []
        self._flushing = False  # a flush is due or running: it writes what records add
        self._task_group: anyio.abc.TaskGroup | None = None

    def __repr__(self) -> str:
        return f"Manifest({self.path!r})"

    def bind(self, task_group: anyio.abc.TaskGroup) -> None:
        """Where flushes run: the Compiler's task group, while it is open.

        Args:
            task_group: The task group in which ``record`` starts each flush.

        Raises:
            Nothing: the task group is kept, not checked.
        """
        self._task_group = task_group

    async def aclose(self) -> None:
        """Write what is still pending (a flush the closing cancelled before it ran)."""
        self._task_group = None
        if self._pending:
            await anyio.to_thread.run_sync(self.flush)

    def record(self, spec: KernelSpec) -> None:
        """Note ``spec`` for the manifest, unless noted before. Cheap, never blocks: the line is
        written by ``flush``, in a worker thread.

        Args:
            spec: The spec to record.

        Raises:
            Nothing: recording never fails a request; a manifest that cannot be written is
                warned about once and no longer recorded to.
        """
        with self._mutex:
            # Equal specs are equal keys (KernelSpec hashes and compares by content); interned
            # ones are one object, and a dict lookup tries identity first.
            if self.failed or spec in self._recent:
                return
            self._recent[spec] = None
            if len(self._recent) > RECENT:
                del self._recent[next(iter(self._recent))]
            self._pending.append(spec)
            if self._flushing:
                return
            self._flushing = True
        if self._task_group is not None:
            self._task_group.start_soon(self._flush_soon)

    async def _flush_soon(self) -> None:
        await anyio.to_thread.run_sync(self.flush)

    def flush(self) -> None:
        """Append the pending specs' lines that this process has not written before. Blocking:
        run it in a worker thread."""
        while True:
            with self._mutex:
                batch, self._pending = self._pending, []
                if not batch:
                    self._flushing = False
                    return
            if not self.failed:
                self._write(batch)

    def _write(self, batch: list[KernelSpec]) -> None:
        shared = self._shared
        with shared.lock:
            lines: dict[bytes, str] = {}
            for spec in batch:
                line = spec_line(spec)
                digest = hashlib.sha256(line.encode()).digest()
                if digest not in shared.seen:
                    lines.setdefault(digest, line)
            if not lines:
                return
            try:
                _append(self.path, "".join(lines.values()).encode("ascii"))
            except OSError as exc:
                self._fail(exc.strerror or str(exc))
                return
            except Exception as exc:  # never the Compiler's task group's error
                self._fail(f"{type(exc).__name__}: {exc}")
                return
            shared.seen.update(lines)
            self.written += len(lines)

    def _fail(self, why: str) -> None:
        with self._mutex:
            self.failed = True
            self._pending.clear()
            self._recent.clear()
        logger.warning(
            "not recording kernels to the manifest %s: it cannot be written (%s); point "
            "manifest= (or $%s) at a file this user can write",
            self.path, why, ENV_MANIFEST,
        )  # fmt: skip


class _NotAFile(OSError):
    pass


def _append(path: str, data: bytes) -> None:
    """Append ``data`` (whole lines) to ``path`` under an exclusive flock."""
    fd = os.open(path, _OPEN, _MODE)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _NotAFile(0, f"it is {kind_of(info)}, not a file")
        try:
            held = fcntl is not None and _locks.flock_within(fd, LOCK_WAIT)
        except OSError:  # a file system without flock: O_APPEND alone keeps a write whole
            held = False
        try:
            size = os.fstat(fd).st_size
            # A writer that died mid-line left no newline: end its line, or the first of ours
            # would be glued to it and lost with it.
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            if held:
                _locks.unlock(fd)
    finally:
        os.close(fd)


# -- reading ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ManifestRead:
    """What ``read_manifests`` found.

    Attributes:
        specs: The distinct specs, in the order first seen (over every file read).
        duplicates: How many lines repeated a spec seen before.
        skipped: The lines skipped, each as ``"PATH:LINE: why"``.
    """

    specs: list[KernelSpec]
    duplicates: int
    skipped: list[str]


class _BadLine(Exception):
    pass


def read_manifests(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
) -> ManifestRead:
    """The specs of the manifests at ``paths``. Lines that are not manifest lines (a last line
    cut short by a crash, garbage) are skipped and listed.

    Each file is read as it was when opened: a line being appended meanwhile may be cut short,
    and skipped.

    Args:
        paths: The manifest files, read in order: a list of paths, or one path.

    Returns:
        The distinct specs, how many lines repeated one, and the lines skipped.

    Raises:
        ManifestError: A path cannot be read (missing, unreadable, not a regular file) or
            holds no manifest at all (its first line is not a JSON object, or no line is a
            manifest line).
    """
    if isinstance(paths, str | bytes | os.PathLike):
        paths = [paths]  # one path, not the characters of one
    specs: dict[KernelSpec, None] = {}
    duplicates = 0
    skipped: list[str] = []
    for path in paths:
        for spec in _read(os.fspath(path), skipped):
            if spec in specs:
                duplicates += 1
            else:
                specs[spec] = None
    return ManifestRead(specs=list(specs), duplicates=duplicates, skipped=skipped)


def _read(path: str, skipped: list[str]) -> list[KernelSpec]:
    data = _read_file(path)
    lines = data.split(b"\n")
    torn = lines.pop()  # after the last newline: b"" unless a write was cut short
    specs: list[KernelSpec] = []
    bad: list[tuple[int, str]] = []  # (line number, why)
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        if not specs and not bad and not raw.lstrip().startswith(b"{"):
            # The first line says whether this is a manifest at all: not JSON lines of ours,
            # and a file that is not ours is not read to its end to say so.
            raise ManifestError(
                f"{path} is not an aionvrtc manifest (line {number} is not a JSON object); "
                f"pass a file that Compiler(manifest=...) or ${ENV_MANIFEST} wrote"
            )
        try:
            specs.append(_parse(raw))
        except _BadLine as exc:
            bad.append((number, str(exc)))
    if not specs and bad:
        number, why = bad[0]
        raise ManifestError(
            f"{path} holds no manifest line (line {number}: {why}); pass a file that "
            f"Compiler(manifest=...) or ${ENV_MANIFEST} wrote"
        )
    if torn.strip():
        try:
            specs.append(_parse(torn))  # whole but for its newline: kept
        except _BadLine:
            why = "cut short (no newline at its end: a write that did not finish)"
            bad.append((len(lines) + 1, why))
    skipped.extend(f"{path}:{number}: {why}" for number, why in bad)
    return specs


def _read_file(path: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ManifestError(
            f"no manifest at {path}: no such file; pass the path given to "
            f"Compiler(manifest=...) or ${ENV_MANIFEST}"
        ) from None
    except OSError as exc:
        raise ManifestError(f"cannot read the manifest {path} ({exc.strerror})") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ManifestError(f"{path} is {kind_of(info)}, not a manifest file; pass a file")
        # As it was when opened: a line being appended now may be cut short (and skipped).
        return read_up_to(fd, info.st_size, info.st_size)
    except OSError as exc:
        raise ManifestError(f"cannot read the manifest {path} ({exc.strerror})") from exc
    finally:
        os.close(fd)


def _parse(raw: bytes) -> KernelSpec:
    try:
        fields: Any = json.loads(raw)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise _BadLine("not JSON") from None
    if not isinstance(fields, dict):
        raise _BadLine("not a JSON object")
    version = fields.get("manifest")
    if version != MANIFEST_VERSION:
        if version is None:
            raise _BadLine('not a manifest line (no "manifest" field)')
        raise _BadLine(
            f"a manifest line of version {version!r}, and this aionvrtc reads version "
            f"{MANIFEST_VERSION}: read it with the aionvrtc that wrote it"
        )
    if fields.keys() != _FIELDS:
        problems = []
        if missing := sorted(_FIELDS - fields.keys()):
            problems.append(f"no {', '.join(missing)}")
        if extra := sorted(fields.keys() - _FIELDS):
            problems.append(f"unknown {', '.join(extra)}")
        raise _BadLine(f"not a manifest line ({'; '.join(problems)})")
    try:
        return KernelSpec(
            fields["source"],
            name=fields["name"],
            options=fields["options"],
            headers=fields["headers"],
            name_expressions=fields["name_expressions"],
        )
    except (TypeError, ValueError) as exc:
        raise _BadLine(f"not a valid KernelSpec: {exc}") from None
