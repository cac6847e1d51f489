"""KernelSpec, the description of one NVRTC program, and the cache key derived from it."""

from __future__ import annotations

import hashlib
import os
import posixpath
import threading
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from . import _cuda_headers, _includes
from ._target import Target

__all__ = [
    "DIGEST_CHARS", "FORMAT_VERSION", "ITEM_CHARS", "ITEM_PARTS", "KEY_PARTS", "PART_CHARS",
    "KernelSpec", "derive_key", "key_parts", "part_items",
]  # fmt: skip

# Bump when the key derivation or the entry encoding changes: old entries then live in another
# folder of the disk tier and are never read as current ones.
FORMAT_VERSION = 3

_NO_HOST_FILES = _includes.HostFiles()

# Equal specs are one object while they are in this table (see KernelSpec.__new__), so a spec
# built per request derives its key once per process, not once per request. Bounded in specs
# and in text, oldest first out: an evicted spec only costs its next twin one key derivation.
INTERN_LIMIT = 4096  # specs
INTERN_BYTES = 32 << 20  # bytes of source and header text (32 MiB)

_TARGET = (
    # The target belongs to the compiler (one spec, many GPUs): a spec naming one would
    # silently disagree with the key.
    "the target architecture belongs to the compiler (pass arch='sm_90' to it), not to the "
    "KernelSpec"
)
_WRITES = (
    "it writes a file on the host as a side effect of compiling, which a cache hit would "
    "silently skip and concurrent compiles would race on"
)
_PCH = (
    "precompiled headers are host files that NVRTC writes and reads back in later compiles, "
    "outside what the cache key covers"
)
_LTO = "it produces LTO IR for a link step, not an image this library can load"
# Refused options by name without leading dashes, so that the single- and double-dash forms
# (-time, --time) are one entry, with the reason the error gives.
_REFUSED: dict[str, str] = {
    "arch": _TARGET,
    "gpu-architecture": _TARGET,
    "time": _WRITES,
    "fdevice-time-trace": _WRITES,
    "pch": _PCH,
    "create-pch": _PCH,
    "use-pch": _PCH,
    "pch-dir": _PCH,
    "dlto": _LTO,
    "dlink-time-opt": _LTO,
    "gen-opt-lto": _LTO,
    "lto": _LTO,
    "optix-ir": "it produces OptiX IR, not an image this library can load",
    "fdevice-syntax-only": "it only checks the syntax and produces no image to load",
    # The program is compiled in a private folder of its own (_nvrtc), so NVRTC reads neither
    # the working directory nor the program's folder; this option would also stop it looking
    # beside the file that includes a header, which CUDA's and CuPy's headers need, and send
    # such an include to the folder above that private one.
    "no-source-include": (
        "aionvrtc already keeps NVRTC from the working directory and the program's folder, and "
        "this option would make it look for an include of a library's header above the "
        "program's private folder instead of beside that header; leave it out"
    ),
}


def _require_str(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if "\x00" in value:
        raise ValueError(f"{what} must not contain NUL characters")
    try:
        value.encode("utf-8")  # NVRTC and the key take UTF-8; a lone surrogate has none
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{what} cannot be encoded as UTF-8: {value[exc.start : exc.end]!r} at index "
            f"{exc.start} ({exc.reason}); pass text without lone surrogates"
        ) from None
    return value


def _str_tuple(values: object, what: str) -> tuple[str, ...]:
    # A bare str is a sequence of characters; treating "-O3" as ("-", "O", "3") helps nobody.
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise TypeError(
            f"{what} must be a sequence of str such as ('a', 'b'), not {type(values).__name__}"
        )
    items = tuple(values)
    for index, item in enumerate(items):
        if not _require_str(item, f"{what}[{index}]").strip():
            raise ValueError(f"{what}[{index}] must not be empty")
    return items


def _check_option(index: int, option: str) -> None:
    if option != option.strip():
        # NVRTC skips the white space (" -I/dir" reads /dir), so every reading of an option
        # here (refusals, include directories, pre-includes) would have to as well: refused.
        raise ValueError(
            f"options[{index}] is {option!r}: white space around an option; write it without, "
            f"as {option.strip()!r}"
        )
    words = option.split("=", 1)[0].split(maxsplit=1)  # none for "="
    head = words[0] if words else ""
    reason = _REFUSED.get(head.lstrip("-")) if head.startswith("-") else None
    if reason is not None:
        raise ValueError(f"options[{index}] is {option!r}: {reason}")


def _check_pre_includes(options: tuple[str, ...], headers: Mapping[str, str]) -> None:
    for index, _, header in _includes.pre_includes(options):
        if header not in headers:
            example = posixpath.basename(header) or "val.h"
            raise ValueError(
                f"options[{index}] is {options[index]!r}: a pre-include must be one of the "
                f"in-memory headers, and {header!r} is not in headers= (NVRTC would read it "
                "from the working directory, a file the cache key does not cover); pass "
                f"headers={{{example!r}: text}} with --pre-include={example}"
            )


def _control(text: str) -> bool:
    """Whether ``text`` holds a control character: a name with one would end the #line that
    names it to NVRTC (see _nvrtc), and the text after it would be read as code."""
    return any(ord(character) < 0x20 or ord(character) == 0x7F for character in text)


def _check_header_name(name: str) -> None:
    if (
        not name.strip()
        or name != name.strip()
        or "\\" in name
        or _control(name)
        or posixpath.isabs(name)
        or posixpath.normpath(name) != name
        or name in (".", "..")
        or name.startswith("../")
    ):
        raise ValueError(
            f"headers: {name!r} is not a plain relative name "
            "such as 'tile.cuh' or 'detail/tile.cuh'"
        )


def _check_header_folders(headers: Mapping[str, str]) -> None:
    # NVRTC reads the headers as files of one folder (see _nvrtc): a name cannot be a file
    # and a folder at once.
    for name in headers:
        folder = posixpath.dirname(name)
        while folder:
            if folder in headers:
                raise ValueError(
                    f"headers: {folder!r} is a header and also the folder of {name!r}; rename "
                    "one of them"
                )
            folder = posixpath.dirname(folder)


@dataclass(frozen=True, slots=True, eq=True, init=False)  # built in __new__
class KernelSpec:
    """One NVRTC program: source, in-memory headers, options and the name expressions whose
    lowered (mangled) names are wanted. Frozen and validated on construction:
    ``KernelSpec(source, *, name_expressions=(), options=(), headers=None, name="kernel.cu")``.

    NVRTC reads no host file that the key does not cover: includes resolve against ``headers``
    and the include folders (``-I<dir>``, then CUDA's own headers where those do not hold a
    header the program includes; the key digests every file of each); an absolute path or a
    path through ``..``, a computed include (``#include MACRO``), a pre-include that is not in
    ``headers`` and options that write host files or produce no loadable image are refused here
    with a ValueError. The one read this cannot see is a computed include in an include
    folder's file whose macro, defined by the program or a ``-D``, names a path outside them.

    Building a spec equal to one built before returns that object (while it is among the last
    few thousand built), so a spec made per request costs one table lookup and its cache key
    is derived once per process. A spec that reads host headers is always a new object: its
    key covers the files as it first read them (build it once and keep it).

    Attributes:
        source: The CUDA C++ program.
        name_expressions: The name expressions whose lowered (mangled) names are wanted
            (``"gemm<float>"``), duplicates dropped; ``Artifact.lowered_names`` maps each to
            its name, and ``Module.get_function`` takes it. Given as any iterable of str.
        options: NVRTC's options, in order (``"-std=c++17"``, ``"-Iinclude"``); never the
            target, which the compiler gives. Given as any iterable of str.
        headers: The in-memory headers, name (``"tile.cuh"``, ``"detail/tile.cuh"``) to text,
            for ``#include "tile.cuh"``; held read-only, sorted by name. Given as any mapping
            of str to str (default: none).
        name: The program's file name (default ``"kernel.cu"``); it appears in NVRTC's
            messages and in ``__FILE__``, so it is part of the cache key.

    Raises:
        TypeError: ``source``, ``name``, a header's name or text, or an item of
            ``name_expressions`` or ``options`` is not a str; ``name_expressions`` or
            ``options`` is a bare str or not iterable; or ``headers`` is not a mapping.
        ValueError: ``source`` or ``name`` is empty, or a text holds a NUL character or a lone
            surrogate; an option or name expression is empty; an option has white space around
            it, names the target (``-arch``), writes host files or produces no loadable image
            (``-time``, PCH, LTO, OptiX IR, ``-fdevice-syntax-only``, ``--no-source-include``),
            or is an include directory or pre-include that names none; a header's name is not
            a plain relative name, or is also the folder of another; a pre-include is not one
            of ``headers``; an include that the key cannot cover (an absolute path, a path
            through ``..``, ``#include MACRO``); or ``name`` holds a control character.
    """

    source: str
    name_expressions: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    name: str = "kernel.cu"
    _keys: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)
    _include_dirs: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)
    # Whether NVRTC looks for a header on the host: -I folders, or an include of a header
    # not in headers= (then CUDA's own header folders are searched too).
    _reads_host: bool = field(default=False, init=False, repr=False, compare=False)
    # The host files as this spec's keys cover them, taken once (kernel_key).
    _host: dict[str, _includes.HostFiles] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __new__(
        cls,
        source: str,
        *,
        name_expressions: Iterable[str] = (),
        options: Iterable[str] = (),
        headers: Mapping[str, str] | None = None,
        name: str = "kernel.cu",
    ) -> KernelSpec:
        # An equal spec built before, found by the arguments as given: the source's hash is
        # cached on the str, and equal strings that are one object compare by identity.
        try:
            twin = _interned.get(
                (source, name_expressions, options, () if headers is None else _items(headers),
                 name)
            )  # fmt: skip
        except TypeError:  # lists, a dict of headers...: validated, then looked up normalised
            twin = None
        if twin is not None and type(twin) is cls:
            return twin
        spec = object.__new__(cls)
        spec._build(source, name_expressions, options, headers, name)
        return spec._intern()

    def _build(
        self,
        source: str,
        name_expressions: Iterable[str],
        options: Iterable[str],
        headers: Mapping[str, str] | None,
        name: str,
    ) -> None:
        if not _require_str(source, "source").strip():
            raise ValueError("source must be a non-empty CUDA C++ program")
        _includes.check_directives(source, "source")
        exprs = tuple(dict.fromkeys(_str_tuple(name_expressions, "name_expressions")))
        opts = _str_tuple(options, "options")
        for index, option in enumerate(opts):
            _check_option(index, option)
        if headers is None:
            headers = {}
        if not isinstance(headers, Mapping):
            raise TypeError(
                f"headers must be a mapping of name to source, not {type(headers).__name__}"
            )
        checked: dict[str, str] = {}
        for header, text in headers.items():
            _check_header_name(_require_str(header, "headers: a header name"))
            checked[header] = _require_str(text, f"headers[{header!r}]")
            _includes.check_directives(text, f"headers[{header!r}]")
        _check_header_folders(checked)
        _check_pre_includes(opts, checked)
        include_dirs = _includes.include_dirs(opts)
        if not _require_str(name, "name").strip() or _control(name):
            raise ValueError(
                f"name must be a non-empty program name without control characters, got {name!r}"
            )
        setter = object.__setattr__
        setter(self, "source", source)
        setter(self, "name_expressions", exprs)
        setter(self, "options", opts)
        setter(self, "headers", MappingProxyType(dict(sorted(checked.items()))))
        setter(self, "name", name)
        setter(self, "_keys", {})
        setter(self, "_include_dirs", include_dirs)
        reads = bool(include_dirs) or _includes.reads_host(source, checked)
        setter(self, "_reads_host", reads)
        setter(self, "_host", {})

    def _intern(self) -> KernelSpec:
        """The equal spec already in the table, else this one, added. A spec that reads host
        files is never shared: its key covers the files as it first read them, and the next
        spec must read them anew (see ``kernel_key``)."""
        if self._reads_host:
            return self
        table = _intern_state
        fields = self.source, self.name_expressions, self.options, _items(self.headers)
        identity = (*fields, self.name)
        with table.lock:
            twin = _interned.get(identity)
            if twin is not None:
                if type(twin) is type(self):
                    return twin
                table.size -= _text_size(twin)  # an equal spec of another class: replaced
            _interned[identity] = self
            table.size += _text_size(self)
            while len(_interned) > INTERN_LIMIT or table.size > INTERN_BYTES:
                table.size -= _text_size(_interned.pop(next(iter(_interned))))
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        # Copies and pickles are built as any spec is: validated, and equal ones shared.
        fields = (self.source, self.name_expressions, self.options, dict(self.headers), self.name)
        return (_rebuild, fields)

    def __hash__(self) -> int:
        headers = tuple(self.headers.items())
        return hash((self.source, self.name_expressions, self.options, headers, self.name))

    @property
    def reads_host_files(self) -> bool:
        """Whether deriving this spec's first key reads host files (it has include
        directories, or includes a header that is not in ``headers``): derive it off the
        event loop."""
        return self._reads_host

    def _reread_host_files(self) -> None:
        """Forget the keys and the include directories' snapshot: the next key reads the
        files again (``forget()`` calls this, so a changed header is compiled)."""
        self._keys.clear()
        self._host.clear()

    def _host_files(self) -> _includes.HostFiles:
        """The host files this spec's keys cover, taken once and kept (see kernel_key)."""
        if not self._reads_host:
            return _NO_HOST_FILES
        taken = self._host.get("snapshot")
        if taken is None:
            # setdefault: two threads deriving the first keys at once keep one snapshot.
            taken = self._host.setdefault("snapshot", self._take_host_files())
        return taken

    def _take_host_files(
        self, added: Callable[[], Sequence[str]] | None = None
    ) -> _includes.HostFiles:
        """The host files as they are now, searched through ``added()`` after the -I folders
        where those do not hold every header included (default: CUDA's header folders found
        on this host)."""
        return _includes.host_files(
            self.source,
            self.headers,
            self._include_dirs,
            added or _cuda_headers.search_dirs,
        )


def _rebuild(
    source: str,
    name_expressions: tuple[str, ...],
    options: tuple[str, ...],
    headers: dict[str, str],
    name: str,
) -> KernelSpec:
    return KernelSpec(
        source, name_expressions=name_expressions, options=options, headers=headers, name=name
    )


class _InternState:
    """The byte count of the interned specs' text, and the lock writers of the table take."""

    def __init__(self) -> None:
        self.size = 0
        self.lock = threading.Lock()


# The specs built in this process by content, oldest first (see KernelSpec.__new__). Lookups
# take no lock: one dict lookup, atomic.
_interned: dict[Hashable, KernelSpec] = {}
_intern_state = _InternState()


def _text_size(spec: KernelSpec) -> int:
    return len(spec.source) + sum(map(len, spec.headers.values()))


def _items(headers: Mapping[str, str] | None) -> tuple[Any, ...]:
    if not headers:
        return ()
    if not isinstance(headers, Mapping):
        raise TypeError  # not a spec's headers: validation says so
    return tuple(headers.items())


def memo_id(arch: str, nvrtc_build: str) -> str:
    """The key under which a spec remembers its cache key for one target and NVRTC build.

    A str, not a tuple: str hashes are cached, so the per-request lookup hashes nothing.
    """
    return f"{arch}/{nvrtc_build}"


def _field(digest: hashlib._Hash, data: str | bytes) -> None:
    raw = data.encode() if isinstance(data, str) else data
    # Length-prefix every field so that ("ab", "c") and ("a", "bc") never collide.
    digest.update(len(raw).to_bytes(8, "big"))
    digest.update(raw)


def record_key(name: str, arch: Target | str) -> str:
    """The key of a named record (data kept beside the kernels, such as tuning results): its
    own domain in the digest, so it never equals a kernel's key."""
    digest = hashlib.sha256()
    _field(digest, f"aionvrtc-record/{FORMAT_VERSION}")
    _field(digest, name)
    _field(digest, str(arch))
    return digest.hexdigest()


# The parts of a kernel's key, in the order their fields are digested: what ``explain`` tells
# apart when a lookup misses.
KEY_PARTS = (
    "format", "name", "source", "headers", "options", "name_expressions", "include_files",
    "arch", "nvrtc_build",
)  # fmt: skip
# Parts kept as they are in an entry's header (short, and telling as they are); the others as
# a digest of their fields, DIGEST_CHARS hex digits of it.
_PLAIN_PARTS = frozenset({"format", "name", "arch", "nvrtc_build"})
DIGEST_CHARS = 16


def _key_fields(
    spec: KernelSpec, arch: Target | str, nvrtc_build: str
) -> Iterator[tuple[str, str | bytes]]:
    """Every field of ``spec``'s key, in the order digested, each with the part it belongs to."""
    yield "format", f"aionvrtc-key/{FORMAT_VERSION}"
    yield "name", spec.name
    yield "source", spec.source
    yield "headers", str(len(spec.headers))
    for header, text in spec.headers.items():  # sorted by name at construction
        yield "headers", header
        yield "headers", text
    yield "options", str(len(spec.options))
    for option in spec.options:  # order matters: later options override earlier ones
        yield "options", option
    names = sorted(spec.name_expressions)
    yield "name_expressions", str(len(names))
    for expression in names:
        yield "name_expressions", expression
    host = spec._host_files().entries
    yield "include_files", str(len(host))
    for real_path, what in host:  # the folders, in the order NVRTC searches them, then probes
        yield "include_files", os.fsencode(real_path)  # a link may resolve to a non-UTF-8 name
        yield "include_files", what
    yield "arch", str(arch)
    yield "nvrtc_build", nvrtc_build


def derive_key(spec: KernelSpec, arch: Target | str, nvrtc_build: str) -> str:
    """Digest over the format version and every input that can change the compiled image:
    every byte NVRTC can read (source, in-memory headers, the include directories' files),
    options, name expressions, target and the exact NVRTC build (``_nvrtc.build()``)."""
    digest = hashlib.sha256()
    for _, data in _key_fields(spec, arch, nvrtc_build):
        _field(digest, data)
    return digest.hexdigest()


def key_parts(spec: KernelSpec, arch: Target | str, nvrtc_build: str) -> dict[str, str]:
    """What each part of ``spec``'s key holds (KEY_PARTS): the format, name, arch and NVRTC
    build as they are, the others as the first DIGEST_CHARS hex digits of a digest of their
    fields. Kept in each compiled entry's header, so that a lookup that misses can say which
    part differs from an entry of the same kernel (``Compiler.explain``)."""
    digests: dict[str, hashlib._Hash] = {}
    plain: dict[str, str] = {}
    for part, data in _key_fields(spec, arch, nvrtc_build):
        if part in _PLAIN_PARTS:
            plain[part] = data if isinstance(data, str) else os.fsdecode(data)
        else:
            _field(digests.setdefault(part, hashlib.sha256()), data)
    return {
        part: plain[part] if part in plain else digests[part].hexdigest()[:DIGEST_CHARS]
        for part in KEY_PARTS
    }


# The parts whose items an entry keeps as well as their digest (``part_items``), for explain to
# say which option, name expression, header or include folder differs. Bounded per entry: an
# item of more than ITEM_CHARS characters is kept as its start and a digest of it, and a part
# whose items pass PART_CHARS in all is kept as its digest alone.
ITEM_PARTS = ("headers", "options", "name_expressions", "include_files")
ITEM_CHARS = 200
PART_CHARS = 4096
# A header or include folder is kept as its content's digest (DIGEST_CHARS hex digits), a space
# and its name or path.


def _digest(data: str | bytes) -> str:
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    return hashlib.sha256(raw).hexdigest()[:DIGEST_CHARS]


def _clipped(item: str) -> str:
    if len(item) <= ITEM_CHARS:
        return item
    return f"{item[: ITEM_CHARS - DIGEST_CHARS - len('... ()')]}... ({_digest(item)})"


def part_items(spec: KernelSpec) -> dict[str, tuple[str, ...]]:
    """The items of ``spec``'s key parts that can be told apart in words (ITEM_PARTS): its
    options in order, its name expressions sorted (as the key takes them), each header as
    ``"<digest of its text> <name>"`` by name and each include folder (or place an include
    looks) as ``"<digest of what is there> <path>"`` in search order. Kept in each compiled
    entry's header beside ``key_parts``, so that ``Compiler.explain`` can say which of them
    differ; a part too long to keep (PART_CHARS) is left out, and told by its digest alone.
    Reads the host files as the spec's keys cover them (taken at its first key)."""
    host = spec._host_files().entries
    items = {
        "headers": [f"{_digest(text)} {name}" for name, text in spec.headers.items()],
        "options": list(spec.options),
        "name_expressions": sorted(spec.name_expressions),
        "include_files": [
            f"{_digest(what)} {os.fsencode(path).decode('utf-8', 'backslashreplace')}"
            for path, what in host
        ],
    }
    kept = {}
    for part, values in items.items():
        clipped = tuple(map(_clipped, values))
        if sum(map(len, clipped)) <= PART_CHARS:
            kept[part] = clipped
    return kept
