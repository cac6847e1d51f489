"""KernelSpec, the description of one NVRTC program, and the cache key derived from it."""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ._target import Target, TargetLike, as_target

__all__ = ["FORMAT_VERSION", "KernelSpec", "derive_key"]

# Bump when the key derivation or the entry encoding changes: old entries then live in another
# folder of the disk tier and are never read as current ones.
FORMAT_VERSION = 2

# Options that choose the target. The target belongs to the compiler (one spec, many GPUs), so a
# spec naming one would silently disagree with the key.
_TARGET_OPTIONS = ("-arch", "--gpu-architecture")


def _require_str(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if "\x00" in value:
        raise ValueError(f"{what} must not contain NUL characters")
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
    words = option.split("=", 1)[0].split(maxsplit=1)  # none for "=", " =x"
    head = words[0] if words else ""
    if head in _TARGET_OPTIONS:
        raise ValueError(
            f"options[{index}] is {option!r}: the target architecture belongs to the compiler "
            "(pass arch='sm_90' to it), not to the KernelSpec"
        )


def _check_header_name(name: str) -> None:
    normal = posixpath.normpath(name)
    if (
        not name.strip()
        or name != name.strip()
        or "\\" in name
        or posixpath.isabs(name)
        or normal != name
        or normal.startswith("..")
    ):
        raise ValueError(
            f"headers: {name!r} is not a plain relative name "
            "such as 'tile.cuh' or 'detail/tile.cuh'"
        )


@dataclass(frozen=True, slots=True, eq=True)
class KernelSpec:
    """One NVRTC program: source, in-memory headers, options and the name expressions whose
    lowered (mangled) names are wanted. Frozen and validated on construction.

    ``name`` is the program's file name; it appears in NVRTC's messages and in ``__FILE__``, so it
    is part of the cache key.
    """

    source: str
    name_expressions: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    name: str = "kernel.cu"
    _keys: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __init__(
        self,
        source: str,
        *,
        name_expressions: Iterable[str] = (),
        options: Iterable[str] = (),
        headers: Mapping[str, str] | None = None,
        name: str = "kernel.cu",
    ) -> None:
        if not _require_str(source, "source").strip():
            raise ValueError("source must be a non-empty CUDA C++ program")
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
        if not _require_str(name, "name").strip() or "\n" in name:
            raise ValueError(f"name must be a non-empty one-line program name, got {name!r}")
        setter = object.__setattr__
        setter(self, "source", source)
        setter(self, "name_expressions", exprs)
        setter(self, "options", opts)
        setter(self, "headers", MappingProxyType(dict(sorted(checked.items()))))
        setter(self, "name", name)
        setter(self, "_keys", {})

    def __hash__(self) -> int:
        headers = tuple(self.headers.items())
        return hash((self.source, self.name_expressions, self.options, headers, self.name))

    def key(self, target: TargetLike | None = None) -> str:
        """The cache key (hex SHA-256) of this program for ``target`` and the loaded NVRTC.

        Computed once per (spec, target) and remembered.
        """
        from . import _nvrtc

        arch = as_target(target).arch
        version = _nvrtc.version_string()
        memo = memo_id(arch, version)
        try:
            return self._keys[memo]
        except KeyError:
            key = self._keys[memo] = derive_key(self, arch, version)
            return key


def memo_id(arch: str, nvrtc_version: str) -> str:
    """The key under which a spec remembers its cache key for one target and NVRTC.

    A str, not a tuple: str hashes are cached, so the per-request lookup hashes nothing.
    """
    return f"{arch}/{nvrtc_version}"


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


def derive_key(spec: KernelSpec, arch: Target | str, nvrtc_version: str) -> str:
    """Digest over the format version and every input that can change the compiled image."""
    digest = hashlib.sha256()
    _field(digest, f"aionvrtc-key/{FORMAT_VERSION}")
    _field(digest, spec.name)
    _field(digest, spec.source)
    _field(digest, str(len(spec.headers)))
    for header, text in spec.headers.items():  # sorted by name at construction
        _field(digest, header)
        _field(digest, text)
    _field(digest, str(len(spec.options)))
    for option in spec.options:  # order matters: later options override earlier ones
        _field(digest, option)
    names = sorted(spec.name_expressions)
    _field(digest, str(len(names)))
    for expression in names:
        _field(digest, expression)
    _field(digest, str(arch))
    _field(digest, nvrtc_version)
    return digest.hexdigest()
