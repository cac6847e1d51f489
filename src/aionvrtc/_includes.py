"""The host files an NVRTC program can read, and how its cache key covers them.

``compile_program`` always passes ``--no-source-include``, so NVRTC resolves an ``#include`` only
against the in-memory headers and the include directories (``-I``); never against the working
directory or the program's folder. What is left on the host, and what this module does about it:

- include directories: the key covers each one's real path and a digest of every file under it
  (``snapshot``). A file's digest is memoised by its stat, so a warm process re-stats the tree
  but does not re-read it.
- absolute or upward (``..``) include paths and computed includes (``#include MACRO``) in the
  source and the in-memory headers: refused (``check_directives``); the key cannot know the file.
- absolute or upward include paths inside an include directory's files: refused as well.
  Computed includes there are allowed (libraries use them) because they resolve through the same
  covered search path; a macro that expands to an absolute path is the one case this cannot see.
- pre-includes: only in-memory headers (checked by ``_spec``).
"""

from __future__ import annotations

import bisect
import errno
import hashlib
import os
import posixpath
import re
import stat
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "MAX_TREE_BYTES",
    "MAX_TREE_FILES",
    "RECENT_NS",
    "check_directives",
    "files_read",
    "include_dirs",
    "pre_includes",
    "snapshot",
]

# Bounds on one include directory: a tree past them is refused, not digested for minutes.
# A library's include folder (CUTLASS, CCCL) holds a few thousand files and tens of MiB.
MAX_TREE_FILES = 100_000  # files and folders under one include directory
MAX_TREE_BYTES = 2 << 30  # bytes of those files (2 GiB)
# A file whose mtime or ctime is this recent (ns) is re-read at every derivation instead of
# memoised: a rewrite within the file system's timestamp granularity could keep its stat.
RECENT_NS = 2_000_000_000

# How NVRTC 13 takes an include directory: -I<dir>, -I=<dir>, -I <dir> (one option),
# --include-path=<dir>, or the bare option followed by the directory as the next option.
# It rejects --include-path <dir> and -include-path=<dir>: those are left for NVRTC to refuse.
_INCLUDE_DIR = ("-I", "--include-path")
# How it takes a pre-include: --pre-include=<file>, -include=<file>, or followed by the next option.
_PRE_INCLUDE = ("--pre-include", "-include")


def _values(
    options: Sequence[str], heads: Sequence[str], what: str, example: str
) -> list[tuple[int, str]]:
    """(index, value) for each option in ``options`` whose head is one of ``heads``."""
    found: list[tuple[int, str]] = []
    for index, option in enumerate(options):
        for head in heads:
            if option == head:
                # NVRTC takes the next option as the value; one that starts with "-" is more
                # likely a forgotten value than a folder, and NVRTC's reading of it is unclear.
                value = options[index + 1] if index + 1 < len(options) else ""
                if value.startswith("-"):
                    value = ""
            elif option.startswith((head + "=", head + " ")):
                value = option[len(head) + 1 :]
                if option[len(head)] == " ":
                    value = value.lstrip(" ")  # NVRTC skips the spaces after "-I"
            elif head == "-I" and option.startswith(head):
                value = option[len(head) :]
            else:
                continue
            if not value:
                raise ValueError(
                    f"options[{index}] is {option!r}: it names no {what}; give it in the same "
                    f"option, as in {example!r}"
                )
            if value != value.strip():
                raise ValueError(
                    f"options[{index}] is {option!r}: NVRTC's reading of a {what} with white "
                    f"space around it is unclear; write it without, as in {example!r}"
                )
            found.append((index, value))
            break
    return found


def include_dirs(options: Sequence[str]) -> tuple[str, ...]:
    """The include directories that ``options`` give NVRTC, in order, as written.

    Raises ValueError for a form whose directory is missing or ambiguous.
    """
    found = _values(options, _INCLUDE_DIR, "directory", "-Iinclude")
    return tuple(value for _, value in found)


def pre_includes(options: Sequence[str]) -> list[tuple[int, str]]:
    """(option index, file name) for each pre-include in ``options``."""
    return _values(options, _PRE_INCLUDE, "header name", "--pre-include=val.h")


# -- include directives -------------------------------------------------------------------------

# White space and block comments: translation phase 3 turns a comment into one space, so
# "#/* x */include" and a comment spanning lines before the "#" still make a directive.
_GAP = r"(?:[ \t\f\v]|/\*.*?\*/)*"
_OPERAND = r'(?:"(?P<quoted>[^"\n]*)"|<(?P<angled>[^>\n]*)>)?'
# A line regex, not a preprocessor: a directive inside a comment or a raw string is refused too
# (a false refusal is the safe direction; a missed directive would be served stale). "%:" and
# "??=" are the digraph and trigraph of "#"; #import and #embed read files where supported.
_DIRECTIVE = re.compile(
    rf"^{_GAP}(?P<hash>#|%:|\?\?=){_GAP}(?P<what>include(?:_next)?|import|embed)\b{_GAP}"
    + _OPERAND,
    re.MULTILINE | re.DOTALL,
)
# __has_include("/abs.h") makes the program depend on whether a host file exists. (No \b
# before it: a literal start is much faster to search, and "x__has_include(" is refused too.)
_HAS_INCLUDE = re.compile(rf"(?P<what>__has_include(?:_next)?){_GAP}\({_GAP}" + _OPERAND, re.DOTALL)
# Every reading of a file needs one of these words, so a text without them is done at once.
_WORDS = ("include", "import", "embed")
# Line splices (phase 2) come before directives are recognised: "#inc\<newline>lude" is an
# include. NVRTC splices every backslash-newline, and "??/"-newline only when trigraphs are on
# (C++11/14), so a text holding the latter is scanned both with and without those splices.
_SPLICE = re.compile(r"\\\n")
_SPLICE_TRIGRAPHS = re.compile(r"(?:\\|\?\?/)\n")


@dataclass(frozen=True, slots=True)
class _Problem:
    line: int
    directive: str
    problem: str  # "absolute", "upward" or "computed"


def _spliced(text: str, splice: re.Pattern[str]) -> tuple[str, list[int]]:
    """``text`` with its line splices removed, and where (in the result) each one was."""
    parts: list[str] = []
    at: list[int] = []
    last = length = 0
    for match in splice.finditer(text):
        parts.append(text[last : match.start()])
        length += match.start() - last
        at.append(length)
        last = match.end()
    parts.append(text[last:])
    return "".join(parts), at


def _scan(text: str, computed_ok: bool) -> _Problem | None:
    """The first include directive in ``text`` that reaches a host file the key cannot cover."""
    # A lone CR counts as a line end too: a directive after one is then not missed.
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    variants = [_spliced(text, _SPLICE) if "\\\n" in text else (text, list[int]())]
    if "??/\n" in text:
        variants.append(_spliced(text, _SPLICE_TRIGRAPHS))
    for variant, splices in variants:
        if not any(word in variant for word in _WORDS):
            continue
        for pattern in (_DIRECTIVE, _HAS_INCLUDE):
            for match in pattern.finditer(variant):
                path = match["quoted"] if match["quoted"] is not None else match["angled"]
                if path is None:
                    if computed_ok:
                        continue
                    problem = "computed"
                elif posixpath.isabs(path):
                    problem = "absolute"
                elif posixpath.normpath(path) == ".." or posixpath.normpath(path).startswith("../"):
                    problem = "upward"
                else:
                    continue
                start = match.start("hash" if "hash" in match.re.groupindex else "what")
                line = variant.count("\n", 0, start) + bisect.bisect_right(splices, start) + 1
                shown = " ".join(variant[start : match.end()].split())[:120]
                return _Problem(line, shown, problem)
    return None


_WHY = {
    "absolute": "names an absolute path",
    "upward": "climbs out of its folder with '..'",
    "computed": "is a computed include (the key cannot tell which file the macro names)",
}


# The same sources and headers recur in many specs: their scans are memoised by a digest of
# the text, not by the text, so that the memo keeps no source alive (512 sources of 64 KiB
# would be 32 MiB). A plain dict, cleared when full: a scan is cheap to redo.
_SCANNED: dict[bytes, _Problem | None] = {}
_SCANNED_MAX = 512  # texts


def _scan_in_memory(text: str) -> _Problem | None:
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
    try:
        return _SCANNED[digest]
    except KeyError:
        pass
    found = _SCANNED[digest] = _scan(text, False)
    if len(_SCANNED) > _SCANNED_MAX:
        _SCANNED.clear()
    return found


def check_directives(text: str, where: str) -> None:
    """Raise ValueError if ``text`` (the source or an in-memory header) includes a host file."""
    found = _scan_in_memory(text)
    if found is None:
        return
    raise ValueError(
        f"{where}, line {found.line}: {found.directive!r} {_WHY[found.problem]}, so NVRTC would "
        "read a host file that the cache key does not cover. Pass the header's text in headers= "
        "(headers={'val.h': text} with #include \"val.h\"), or put it under a directory given "
        "with -I<dir> (the key digests every file there) and include it by its path there"
    )


# -- include directory trees --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Facts:
    identity: tuple[int, ...]
    what: bytes  # b"file <sha256>" (what the tree digest holds for it)
    problem: _Problem | None


class _Memo:
    """Facts about files by path (a path's newer version replaces its older one), and how many
    files were read, the memo's misses. Keys are derived on the event loop and in worker
    threads, hence the lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.facts: dict[str, _Facts] = {}
        self.reads = 0


_memo = _Memo()
if hasattr(os, "register_at_fork"):
    # A child forked while a thread of the parent held the lock would wait for it forever.
    os.register_at_fork(after_in_child=lambda: setattr(_memo, "lock", threading.Lock()))


def files_read() -> int:
    """How many files the tree digests have read in this process (memo misses)."""
    return _memo.reads


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _file(path: str, st: os.stat_result) -> tuple[bytes, _Problem | None]:
    """What the tree digest holds for the regular file at ``path``, and its first problem."""
    identity = _identity(st)
    with _memo.lock:
        facts = _memo.facts.get(path)
    if facts is not None and facts.identity == identity:
        return facts.what, facts.problem
    try:
        # O_NONBLOCK: a special file planted under the tree must not hang the key derivation.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        return b"gone", None  # removed since it was listed: the next derivation sees it gone
    except OSError as exc:
        return f"unreadable {errno.errorcode.get(exc.errno or 0, exc.errno)}".encode(), None
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):  # swapped for something else since the listing
            return b"other", None
        with open(fd, "rb", closefd=False) as file:
            data = file.read(opened.st_size + 1)  # bounded; a file that grew fails the check
        after = os.fstat(fd)
    except OSError as exc:
        return f"unreadable {errno.errorcode.get(exc.errno or 0, exc.errno)}".encode(), None
    finally:
        os.close(fd)
    what = b"file " + hashlib.sha256(data).hexdigest().encode()
    # Bytes, one character each: a header need not be UTF-8, and directives are ASCII.
    problem = _scan(data.decode("latin-1"), True)
    recent = time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < RECENT_NS
    with _memo.lock:
        _memo.reads += 1
        if _identity(after) == identity and not recent:
            _memo.facts[path] = _Facts(identity, what, problem)
    return what, problem


def _too_big(directory: str, real: str, what: str) -> ValueError:
    return ValueError(
        f"include directory {directory!r} ({real}) holds more than {what}: the cache key "
        "digests every file under an include directory; point -I at the library's include "
        "folder (such as cutlass/include), not at a whole tree"
    )


def _tree(directory: str, real: str, root: os.stat_result) -> str:
    """Hex digest of every regular file under ``real``: relative path + content digest, sorted.

    Symlinks are followed; a directory that is its own ancestor (a loop) is recorded, not
    entered. Raises ValueError past the bounds or for an include that leaves the tree.
    """
    entries: list[tuple[bytes, bytes]] = []
    files: list[tuple[bytes, str, os.stat_result]] = []
    total = listed = 0
    pending = [(real, "", frozenset({(root.st_dev, root.st_ino)}))]
    while pending:
        folder, rel, ancestors = pending.pop()
        try:
            with os.scandir(folder) as listing:
                names = sorted(entry.name for entry in listing)
        except OSError as exc:
            entries.append((os.fsencode(rel), f"unlistable {exc.errno}".encode()))
            continue
        listed += len(names)
        if listed > MAX_TREE_FILES:
            # Folders count too: links between folders can multiply the paths to walk.
            raise _too_big(directory, real, f"{MAX_TREE_FILES:,} files and folders")
        for name in names:
            path = os.path.join(folder, name)
            relative = posixpath.join(rel, name) if rel else name
            try:
                st = os.stat(path)  # follows symlinks, as NVRTC does
            except FileNotFoundError:
                continue  # a dangling link, or removed meanwhile: nothing NVRTC can read
            except OSError as exc:
                entries.append((os.fsencode(relative), f"error {exc.errno}".encode()))
                continue
            if stat.S_ISDIR(st.st_mode):
                node = (st.st_dev, st.st_ino)
                if node in ancestors:
                    entries.append((os.fsencode(relative), b"loop"))
                else:
                    pending.append((path, relative, ancestors | {node}))
            elif stat.S_ISREG(st.st_mode):
                files.append((os.fsencode(relative), path, st))
                total += st.st_size
                if total > MAX_TREE_BYTES:
                    raise _too_big(directory, real, f"{MAX_TREE_BYTES:,} bytes")
            else:
                entries.append((os.fsencode(relative), b"other"))
    for file_name, path, st in files:
        what, problem = _file(path, st)
        if problem is not None:
            raise ValueError(
                f"{path}, line {problem.line}: {problem.directive!r} {_WHY[problem.problem]}, "
                f"so it leaves include directory {directory!r} and NVRTC would read a file the "
                "cache key does not cover. Add the folder that holds the target as another -I "
                "and include the target by its path there, or pass it in headers="
            )
        entries.append((file_name, what))
    digest = hashlib.sha256()
    for entry_name, what in sorted(entries):
        for part in (entry_name, what):
            digest.update(len(part).to_bytes(8, "big"))
            digest.update(part)
    return digest.hexdigest()


def _covered(directory: str) -> tuple[str, str]:
    # Resolved now, against this process's working directory: two services in different
    # folders with the same relative -I read different files and must not share a key.
    real = os.path.realpath(directory)
    try:
        st = os.stat(real)
    except (FileNotFoundError, NotADirectoryError):
        return real, "missing"
    except OSError as exc:
        return real, f"error {exc.errno}"
    if not stat.S_ISDIR(st.st_mode):
        return real, "not a directory"
    return real, _tree(directory, real, st)


def snapshot(directories: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """For each include directory, in order: its real path and the digest of its tree
    ("missing" or "not a directory" when there is none)."""
    seen: dict[str, tuple[str, str]] = {}
    for directory in directories:
        if directory not in seen:
            seen[directory] = _covered(directory)
    return tuple(seen[directory] for directory in directories)
