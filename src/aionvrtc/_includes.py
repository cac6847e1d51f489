"""The host files an NVRTC program can read, and how its cache key covers them.

``compile_program`` compiles each program in a private folder of its own that holds the
in-memory headers as files (``_nvrtc._private_folder``), so NVRTC never reads the working
directory or the program's folder. NVRTC looks for ``#include "x.h"`` beside the file that
includes it, then (as for ``<x.h>``) in that private folder, then in each include folder in
order; the first file found is read. What is left on the host, and what this module does
about it:

- include folders (the ``-I`` ones, then CUDA's own, ``_cuda_headers``, where an include is
  found in none of the others): the key covers each one's real path and a digest of every file
  under it (``host_files``). A file's digest is memoised by its stat, so a warm process
  re-stats the tree but does not re-read it.
- absolute paths, paths through ``..`` and computed includes (``#include MACRO``) in the
  source and the in-memory headers: refused (``check_directives``); the key cannot know the
  file.
- include directives in the folders' files, followed from the program as NVRTC looks for them
  (only files the program can reach count; a computed include there, which cannot be followed,
  makes every file count). A path that lands outside every folder (``..``, absolute) is covered
  by what is there: where nothing is, the key records that; where a file is, NVRTC would read a
  file the key does not cover, and the spec is refused. The one case this cannot see is a
  computed include whose macro (defined in the program or in ``-D``) expands to such a path.
- pre-includes: only in-memory headers (checked by ``_spec``).
"""

from __future__ import annotations

import bisect
import errno
import hashlib
import itertools
import os
import posixpath
import re
import stat
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "MAX_TREE_BYTES",
    "MAX_TREE_FILES",
    "RECENT_NS",
    "HostFiles",
    "check_directives",
    "files_read",
    "host_files",
    "include_dirs",
    "pre_includes",
    "reads_host",
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
) -> list[tuple[int, int, str]]:
    """(index, end, value) for each option in ``options`` whose head is one of ``heads``: it
    spans ``options[index:end]`` (two options where the value is the next one)."""
    found: list[tuple[int, int, str]] = []
    for index, option in enumerate(options):
        for head in heads:
            end = index + 1
            if option == head:
                end += 1
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
            found.append((index, end, value))
            break
    return found


def include_dirs(options: Sequence[str]) -> tuple[str, ...]:
    """The include directories that ``options`` give NVRTC, in order, as written.

    Raises ValueError for a form whose directory is missing or ambiguous.
    """
    found = _values(options, _INCLUDE_DIR, "directory", "-Iinclude")
    return tuple(value for _, _, value in found)


def pre_includes(options: Sequence[str]) -> list[tuple[int, int, str]]:
    """(index, end, file name) for each pre-include in ``options``, which it spans as
    ``options[index:end]``."""
    return _values(options, _PRE_INCLUDE, "header name", "--pre-include=val.h")


# -- include directives -------------------------------------------------------------------------

# White space and block comments: translation phase 3 turns a comment into one space, so
# "#/* x */include" and a comment spanning lines before the "#" still make a directive.
_GAP = r"(?:[ \t\f\v]|(?>/\*.*?\*/))*"
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
class _Directive:
    """One reading of a file by name: #include (and its kin) or __has_include."""

    line: int
    shown: str  # the directive as written, on one line (for messages)
    path: str | None  # None: a computed include (#include MACRO)
    quoted: bool  # "path": looked for beside the including file first; <path>: not
    next: bool  # #include_next / __has_include_next: searched past the first folder found

    @property
    def problem(self) -> str | None:
        """Why the key cannot know the file this names from an in-memory text, or None."""
        if self.path is None:
            return "computed"
        if posixpath.isabs(self.path):
            return "absolute"
        # Even "a/../b.h": NVRTC resolves it through the host's folders, not through the names
        # of the in-memory headers.
        return "upward" if ".." in self.path.split("/") else None


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


def _scan(text: str) -> tuple[_Directive, ...]:
    """Every include directive in ``text``, in order of position."""
    # A lone CR counts as a line end too: a directive after one is then not missed.
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    variants = [_spliced(text, _SPLICE) if "\\\n" in text else (text, list[int]())]
    if "??/\n" in text:
        variants.append(_spliced(text, _SPLICE_TRIGRAPHS))
    found: dict[tuple[int, str | None, bool, bool], tuple[int, _Directive]] = {}
    for variant, splices in variants:
        if not any(word in variant for word in _WORDS):
            continue
        for pattern in (_DIRECTIVE, _HAS_INCLUDE):
            for match in pattern.finditer(variant):
                path = match["quoted"] if match["quoted"] is not None else match["angled"]
                start = match.start("hash" if "hash" in match.re.groupindex else "what")
                line = variant.count("\n", 0, start) + bisect.bisect_right(splices, start) + 1
                shown = " ".join(variant[start : match.end()].split())[:120]
                quoted = match["quoted"] is not None
                following = match["what"].endswith("_next")
                found.setdefault(
                    (line, path, quoted, following),
                    (start, _Directive(line, shown, path, quoted, following)),
                )
    return tuple(directive for _, directive in sorted(found.values(), key=lambda x: x[0]))


_WHY = {
    "absolute": "names an absolute path",
    "upward": "goes through '..' (NVRTC resolves it through the host's folders)",
    "computed": "is a computed include (the key cannot tell which file the macro names)",
}


# The same sources and headers recur in many specs: their scans are memoised by a digest of
# the text, not by the text, so that the memo keeps no source alive (512 sources of 64 KiB
# would be 32 MiB). A plain dict, cleared when full: a scan is cheap to redo.
_SCANNED: dict[bytes, tuple[_Directive, ...]] = {}
_SCANNED_MAX = 512  # texts


def _scan_in_memory(text: str) -> tuple[_Directive, ...]:
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
    try:
        return _SCANNED[digest]
    except KeyError:
        pass
    found = _SCANNED[digest] = _scan(text)
    if len(_SCANNED) > _SCANNED_MAX:
        _SCANNED.clear()
    return found


def check_directives(text: str, where: str) -> None:
    """Raise ValueError if ``text`` (the source or an in-memory header) includes a host file
    the key cannot know."""
    found = next((d for d in _scan_in_memory(text) if d.problem is not None), None)
    if found is None or found.problem is None:
        return
    raise ValueError(
        f"{where}, line {found.line}: {found.shown!r} {_WHY[found.problem]}, so NVRTC would "
        "read a host file that the cache key does not cover. Pass the header's text in headers= "
        "(headers={'val.h': text} with #include \"val.h\"), or put it under a directory given "
        "with -I<dir> (the key digests every file there) and include it by its path there"
    )


def reads_host(source: str, headers: Mapping[str, str]) -> bool:
    """Whether a program of ``source`` and ``headers`` (each checked by ``check_directives``)
    includes a header that is not among ``headers``: one NVRTC would look for on the host."""
    texts = [("", source), *((posixpath.dirname(name), text) for name, text in headers.items())]
    for folder, text in texts:
        for directive in _scan_in_memory(text):
            assert directive.path is not None  # computed includes are refused in memory
            beside = posixpath.normpath(posixpath.join(folder, directive.path))
            if directive.path not in headers and not (directive.quoted and beside in headers):
                return True
    return False


# -- include directory trees --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Facts:
    identity: tuple[int, ...]
    what: bytes  # b"file <sha256>" (what the tree digest holds for it)
    directives: tuple[_Directive, ...]


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


def _file(path: str, st: os.stat_result) -> tuple[bytes, tuple[_Directive, ...]]:
    """What the tree digest holds for the regular file at ``path``, and its directives."""
    identity = _identity(st)
    with _memo.lock:
        facts = _memo.facts.get(path)
    if facts is not None and facts.identity == identity:
        return facts.what, facts.directives
    try:
        # O_NONBLOCK: a special file planted under the tree must not hang the key derivation.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        return b"gone", ()  # removed since it was listed: the next derivation sees it gone
    except OSError as exc:
        return f"unreadable {errno.errorcode.get(exc.errno or 0, exc.errno)}".encode(), ()
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):  # swapped for something else since the listing
            return b"other", ()
        with open(fd, "rb", closefd=False) as file:
            data = file.read(opened.st_size + 1)  # bounded; a file that grew fails the check
        after = os.fstat(fd)
    except OSError as exc:
        return f"unreadable {errno.errorcode.get(exc.errno or 0, exc.errno)}".encode(), ()
    finally:
        os.close(fd)
    what = b"file " + hashlib.sha256(data).hexdigest().encode()
    # Bytes, one character each: a header need not be UTF-8, and directives are ASCII.
    directives = _scan(data.decode("latin-1"))
    recent = time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < RECENT_NS
    with _memo.lock:
        _memo.reads += 1
        if _identity(after) == identity and not recent:
            _memo.facts[path] = _Facts(identity, what, directives)
    return what, directives


def _too_big(directory: str, real: str, what: str) -> ValueError:
    return ValueError(
        f"include directory {directory!r} ({real}) holds more than {what}: the cache key "
        "digests every file under an include directory; point -I at the library's include "
        "folder (such as cutlass/include), not at a whole tree"
    )


Files = dict[str, tuple[_Directive, ...]]  # relative path -> the file's directives


def _tree(directory: str, real: str, root: os.stat_result) -> tuple[str, Files]:
    """Hex digest of every regular file under ``real`` (relative path + content digest,
    sorted), and each file's directives by relative path.

    Symlinks are followed; a directory that is its own ancestor (a loop) is recorded, not
    entered. Raises ValueError past the bounds.
    """
    entries: list[tuple[bytes, bytes]] = []
    files: list[tuple[str, str, os.stat_result]] = []
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
                files.append((relative, path, st))
                total += st.st_size
                if total > MAX_TREE_BYTES:
                    raise _too_big(directory, real, f"{MAX_TREE_BYTES:,} bytes")
            else:
                entries.append((os.fsencode(relative), b"other"))
    found: Files = {}
    for relative, path, st in files:
        what, found[relative] = _file(path, st)
        entries.append((os.fsencode(relative), what))
    digest = hashlib.sha256()
    for entry_name, what in sorted(entries):
        for part in (entry_name, what):
            digest.update(len(part).to_bytes(8, "big"))
            digest.update(part)
    return digest.hexdigest(), found


@dataclass(slots=True)
class _Folder:
    """One folder of the search path, as the key covers it."""

    given: str  # as the program names it (-I<given>)
    real: str
    state: str  # the tree's digest, "missing", "not a directory", "error N" or "within <real>"
    files: Files | None  # None: not walked (not a folder, or within another that was)

    def holds(self, path: str) -> bool:
        return path == self.real or path.startswith(self.real.rstrip("/") + "/")


def _folders(directories: Sequence[str]) -> list[_Folder]:
    """Each of ``directories`` once, in order, with its tree; a folder inside another one of
    them is not walked twice (its files are that one's, under a longer path)."""
    folders: dict[str, _Folder] = {}
    roots: dict[str, os.stat_result] = {}
    for directory in directories:
        if directory in folders:
            continue
        # Resolved now, against this process's working directory: two services in different
        # folders with the same relative -I read different files and must not share a key.
        real = os.path.realpath(directory)
        try:
            st = os.stat(real)
        except (FileNotFoundError, NotADirectoryError):
            folders[directory] = _Folder(directory, real, "missing", None)
            continue
        except OSError as exc:
            folders[directory] = _Folder(directory, real, f"error {exc.errno}", None)
            continue
        if not stat.S_ISDIR(st.st_mode):
            folders[directory] = _Folder(directory, real, "not a directory", None)
        else:
            folders[directory] = _Folder(directory, real, "", {})
            roots[directory] = st
    walked = [f for f in folders.values() if f.files is not None]
    for folder in walked:
        outer = next((o for o in walked if o.real != folder.real and o.holds(folder.real)), None)
        if outer is not None:
            folder.state, folder.files = f"within {outer.real}", None
    for folder in walked:
        if not folder.state:
            folder.state, folder.files = _tree(folder.given, folder.real, roots[folder.given])
    return list(folders.values())


# -- what the program reaches -------------------------------------------------------------------


def _probe(path: str) -> str:
    """What is at ``path``, a place outside every include folder: "file" or what it is not."""
    try:
        st = os.stat(path)  # follows symlinks, as NVRTC's open does
    except (FileNotFoundError, NotADirectoryError):
        return "absent"
    except OSError as exc:
        return f"error {errno.errorcode.get(exc.errno or 0, exc.errno)}"
    if stat.S_ISREG(st.st_mode):
        return "file"
    return "folder" if stat.S_ISDIR(st.st_mode) else "other"


def _place(folder: str, path: str) -> str | None:
    """Where NVRTC's open of ``path`` in ``folder`` lands, or None where it fails on the way
    (a ``..`` after a folder that does not exist). Lexically, as the trees list their files,
    but a ``..`` is resolved as the OS does: after a symlinked folder it climbs out of the
    link's target, not out of the link's folder."""
    if ".." not in path.split("/"):
        return posixpath.normpath(posixpath.join(folder, path))
    place = folder
    for part in path.split("/"):
        if part == "..":
            if not os.path.isdir(place):
                return None
            place = posixpath.dirname(os.path.realpath(place))
        elif part not in ("", "."):
            place = posixpath.join(place, part)
    return posixpath.normpath(place)


# Where a file is: ("memory", its name's folder) for the source (folder "") and the in-memory
# headers, which NVRTC reads from a private folder of their own (``_nvrtc``), or ("host", the
# real folder) for a file of an include folder.
_Where = tuple[str, str]


class _Reach:
    """The files of the include folders a program can reach, what its includes find outside
    them (``probes``), and whether one of them finds nothing there (``wanting``: then CUDA's
    header folders are searched too).

    NVRTC looks for ``"path"`` beside the including file first, then (as for ``<path>``) in
    the in-memory headers' folder, then in each include folder in order; the first file found
    is read (``#include_next`` goes on: every one counts).
    """

    def __init__(self, folders: list[_Folder], headers: Mapping[str, str]) -> None:
        self.folders = folders
        # Walked folders first: a place inside a folder within another is found in the outer
        # one's files; a place inside a missing folder is covered by that folder's state.
        self.covering = sorted(folders, key=lambda f: f.files is None)
        self.headers = headers
        self.header_folders = {
            parent
            for name in headers
            for parent in itertools.accumulate(name.split("/")[:-1], "{}/{}".format)
        }
        self.reached: set[tuple[int, str]] = set()
        self.pending: list[tuple[str, _Where, _Directive]] = []
        self.probes: dict[str, str] = {}
        self.everything = False
        self.wanting = False

    def run(self, texts: Sequence[tuple[str, str, str]]) -> None:
        """Follow the includes of ``texts``: (where, as said in messages; folder; text)."""
        for origin, name_folder, text in texts:
            at: _Where = ("memory", name_folder)
            self.pending.extend((origin, at, d) for d in _scan_in_memory(text))
        self._drain()
        if self.everything:
            # Which file a computed include names cannot be told: every file counts, and so
            # does every folder NVRTC could search.
            self.wanting = True
            for index, folder in enumerate(self.folders):
                for relative in folder.files or {}:
                    self._reach(index, relative)
            self._drain()

    def _drain(self) -> None:
        while self.pending:
            origin, where, directive = self.pending.pop()
            if directive.path is None:
                self.everything = True
            else:
                self._resolve(origin, where, directive, directive.path)

    def _reach(self, index: int, relative: str) -> None:
        if (index, relative) in self.reached:
            return
        self.reached.add((index, relative))
        folder = self.folders[index]
        assert folder.files is not None
        origin = os.path.join(folder.real, relative)
        beside = ("host", posixpath.dirname(origin))
        self.pending.extend((origin, beside, d) for d in folder.files[relative])

    def _resolve(self, origin: str, where: _Where, directive: _Directive, path: str) -> None:
        """Follow ``directive`` (in ``origin``, at ``where``) as NVRTC looks for ``path``."""
        if posixpath.isabs(path):
            candidates: list[_Where] = [("host", "/")]
        else:
            candidates = [
                *([where] if directive.quoted else []),  # beside the including file
                ("memory", ""),
                *(("host", f.real) for f in self.folders),
            ]
        for kind, folder in candidates:
            found = (
                self._in_memory(origin, directive, posixpath.join(folder, path))
                if kind == "memory"
                else self._on_host(origin, directive, folder, path)
            )
            if found and not directive.next:
                return
        self.wanting = True  # found nowhere so far (or, with #include_next, maybe further on)

    def _in_memory(self, origin: str, directive: _Directive, name: str) -> bool:
        """Whether ``name``, opened in the in-memory headers' folder, is one of them; a ".."
        there is resolved as the OS resolves it, through folders that exist."""
        parts: list[str] = []
        for part in name.split("/"):
            if part in ("", "."):
                continue
            if part != "..":
                parts.append(part)
            elif not parts:
                # Above the in-memory headers' folder lies a temporary folder of the host.
                raise ValueError(
                    f"{origin}, line {directive.line}: {directive.shown!r} leads above the "
                    "folder of the in-memory headers (NVRTC looks there before the -I folders), "
                    "into a temporary folder the cache key does not cover. Give the folder that "
                    "holds the file it means as another -I, or pass it in headers="
                )
            elif "/".join(parts) in self.header_folders:
                parts.pop()
            else:
                return False  # the open fails: no such folder there
        return "/".join(parts) in self.headers  # found, or (the folder holds only them) not

    def _on_host(self, origin: str, directive: _Directive, base: str, path: str) -> bool:
        place = _place(base, path)
        if place is None:
            return False  # the open fails before it gets anywhere
        folder = next((f for f in self.covering if f.holds(place)), None)
        if folder is not None:
            if folder.files is None:
                return False  # not there: the folder's state says so, and would change
            relative = place[len(folder.real.rstrip("/")) + 1 :]
            if relative not in folder.files:
                return False  # not there: the folder's digest says so, and would change
            self._reach(self.folders.index(folder), relative)
            return True
        what = _probe(place)
        if what == "file":
            raise ValueError(
                f"{origin}, line {directive.line}: {directive.shown!r} makes NVRTC read "
                f"{place}, a file outside every include folder, which the cache key does not "
                "cover. Give the folder that holds it as another -I (the key then covers it), "
                "or pass it in headers="
            )
        self.probes[place] = what
        return False


@dataclass(frozen=True, slots=True)
class HostFiles:
    """What an NVRTC program reads from the host, as its cache key covers it."""

    # The folders searched, as named: the -I ones, then ``added``.
    folders: tuple[str, ...] = ()
    # CUDA's header folders searched after the program's own -I folders (NVRTC gets them as -I).
    added: tuple[str, ...] = ()
    # Per folder searched, in order: (real path, its tree's digest or state); then, sorted, per
    # place outside them where an include looks and finds no file: (path, what is there).
    entries: tuple[tuple[str, str], ...] = ()

    def changed(self, now: HostFiles) -> str | None:
        """What differs in ``now`` (taken later, through the same folders), in words; None if
        nothing does."""
        for index, (before, after) in enumerate(zip(self.entries, now.entries, strict=False)):
            if before == after:
                continue
            if index < len(self.folders):
                return f"the files of include directory {self.folders[index]!r} ({after[0]})"
            return f"what is at {before[0]}, where an include looks"
        if len(self.entries) == len(now.entries):
            return None
        longer = max(self.entries, now.entries, key=len)
        return (
            f"what is at {longer[min(len(self.entries), len(now.entries))][0]}, where an "
            "include looks"
        )


def host_files(
    source: str,
    headers: Mapping[str, str],
    directories: Sequence[str],
    added: Callable[[], Sequence[str]] = tuple,
) -> HostFiles:
    """The host files a program of ``source`` and ``headers`` can read through
    ``directories`` (its -I folders, in order) and, where an include is found in none of them
    (or cannot be followed), through ``added()`` after them, as its key covers them.

    Raises ValueError for a folder past the bounds, or for an include of a reachable file
    that lands on a file outside every folder.
    """
    texts = [("source", "", source)]
    texts += [(f"headers[{n!r}]", posixpath.dirname(n), t) for n, t in headers.items()]

    def walk(searched: Sequence[str]) -> tuple[list[_Folder], _Reach]:
        folders = _folders(searched)
        reach = _Reach(folders, headers)
        reach.run(texts)
        return folders, reach

    folders, reach = walk(directories)
    more = tuple(added()) if reach.wanting else ()
    if more:
        folders, reach = walk([*directories, *more])
    searched = [*directories, *more]
    by_given = {folder.given: (folder.real, folder.state) for folder in folders}
    return HostFiles(
        tuple(searched),
        more,
        tuple(by_given[d] for d in searched) + tuple(sorted(reach.probes.items())),
    )
