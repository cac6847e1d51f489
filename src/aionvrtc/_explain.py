"""Why a kernel's lookup missed: which part of its key differs from the nearest entry that the
tiers hold of the same kernel: one sharing a name expression with it, or for a spec of none,
one of none and the same program name (``Compiler.explain``).

Every compiled entry keeps what each part of its key held (``key_parts``: the format, name,
arch and NVRTC build as they are, the source, headers, options, name expressions and include
files as digests), so that a miss is told apart part by part, as JAX's
``jax_explain_cache_misses`` tells why a compilation-cache lookup missed; and the items of the
options, name expressions, headers and include folders (``part_items``), so that it says which
of them were added, removed, changed or reordered. The memory, the disk and the cache-dir
layers are searched (the entries' headers, not their images); signed bundles and Redis are
not, being read by key only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import _nvrtc
from ._artifact import header_part_items, header_parts
from ._cache import KernelCache
from ._spec import DIGEST_CHARS, KEY_PARTS, KernelSpec, key_parts, part_items
from ._store import DiskTier
from ._store.layers import DirLayer

__all__ = ["Explanation", "explain"]

# An entry's items of its key's parts (``part_items``), by part.
Items = Mapping[str, Sequence[str]]


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why a kernel's lookup hits or misses (``Compiler.explain``); ``str()`` says it in words.

    Attributes:
        key: The kernel's key for the target asked about.
        held_in: Where an entry of that key is: ``"memory"``, ``"disk"`` or ``"layer"``; None
            when none of them holds it (a signed bundle or Redis, read by key only and not
            searched, may still).
        parts: What each part of the key holds for this spec (``key_parts``).
        nearest: The key of the entry of the same kernel names (sharing a name expression
            with the spec, or for a spec of none, of none and the same program name) whose
            parts agree with these the most (the first found among equals: memory's, then the
            disk's, then the layers'); None when the tiers hold no such entry, or ``held_in``
            is set.
        differs: The parts in which ``nearest`` differs, in key order; ``("unknown",)`` when
            it was written before entries kept their parts.
        theirs: What ``nearest`` holds in each part that differs.
        compared: The entries of the same kernel names that were compared.
        changes: What changed in each part that differs, in words, where both sides keep its
            items (``"--use_fast_math added"``, ``"scale.h changed"``); the other parts that
            differ (the source, and any written before entries kept items) are told by
            ``theirs`` and ``parts``.
    """

    key: str
    held_in: str | None
    parts: Mapping[str, str]
    nearest: str | None = None
    differs: tuple[str, ...] = ()
    theirs: Mapping[str, str] | None = None
    compared: int = 0
    changes: Mapping[str, str] | None = None

    def __str__(self) -> str:
        program = self.parts.get("name", "?")
        if self.held_in is not None:
            return f"{program} ({self.key[:16]}): held in {self.held_in}, a lookup hits"
        if self.nearest is None:
            return (
                f"{program} ({self.key[:16]}) missed in memory, on disk and in the cache-dir "
                "layers: no entry of the same kernel names there (its first compile here, or "
                "its entries were evicted or pruned)"
            )
        head = (
            f"{program} ({self.key[:16]}) missed in memory, on disk and in the cache-dir layers: "
            f"the nearest of {self.compared} {'entry' if self.compared == 1 else 'entries'} of "
            f"the same kernel names ({self.nearest[:16]})"
        )
        if self.differs == ("unknown",):
            return f"{head} keeps no parts of its key (written before entries kept them)"
        theirs, changes = self.theirs or {}, self.changes or {}
        each = "; ".join(
            f"{part}: {changes[part]}"
            if part in changes
            else f"{part}: {theirs.get(part, '?')} there, {self.parts[part]} here"
            for part in self.differs
        )
        return f"{head} differs in {', '.join(self.differs)} ({each})"


def explain(cache: KernelCache, spec: KernelSpec) -> Explanation:
    """``Compiler.explain`` for the target of ``cache``. Blocking: it reads the disk's and the
    layers' entry headers (one walk of each dir; about a second at 50,000 entries)."""
    key = cache.key(spec)
    parts = key_parts(spec, cache.target.arch, _nvrtc.build())
    if key in cache.memory:
        return Explanation(key, "memory", parts)
    names = frozenset(spec.name_expressions)
    best: tuple[int, str, Mapping[str, str], Items] | None = None
    seen: set[str] = set()  # (memory's entries are on disk too)
    for where, other, theirs, items in _same_names(cache, names):
        if other == key:
            return Explanation(key, where, parts)
        if other in seen:
            continue
        seen.add(other)
        if not names and theirs and theirs.get("name") != parts["name"]:
            continue  # kernels without name expressions: the same program name, then
        agree = sum(theirs.get(part) == parts[part] for part in KEY_PARTS) if theirs else -1
        if best is None or agree > best[0]:
            best = agree, other, theirs, items
    if best is None:
        return Explanation(key, None, parts)
    _, nearest, theirs, items = best
    compared = len(seen)
    if not theirs:
        return Explanation(key, None, parts, nearest, ("unknown",), {}, compared)
    differs = tuple(part for part in KEY_PARTS if theirs.get(part) != parts[part])
    ours = part_items(spec)
    changes = {
        part: said
        for part in differs
        if part in items and part in ours
        for said in [_in_words(part, items[part], ours[part])]
        if said is not None
    }
    return Explanation(
        key, None, parts, nearest, differs, {p: theirs.get(p, "?") for p in differs}, compared,
        changes,
    )  # fmt: skip


def _in_words(part: str, theirs: Sequence[str], ours: Sequence[str]) -> str | None:
    """What changed from ``theirs`` to ``ours`` (one part's items, see ``part_items``), in
    words; None where the items kept do not tell (two items clipped alike)."""
    if part in ("headers", "include_files"):  # by name or path: "<digest> <name>"
        before = {item[DIGEST_CHARS + 1 :]: item[:DIGEST_CHARS] for item in theirs}
        after = {item[DIGEST_CHARS + 1 :]: item[:DIGEST_CHARS] for item in ours}
        changed = [name for name in after if name in before and before[name] != after[name]]
        added = [name for name in after if name not in before]
        removed = [name for name in before if name not in after]
        common = ([n for n in before if n in after], [n for n in after if n in before])
    else:  # options and name expressions: as they are, a repeated one counted as often
        added = list((Counter(ours) - Counter(theirs)).elements())
        removed = list((Counter(theirs) - Counter(ours)).elements())
        changed = []
        common = (_kept(theirs, ours), _kept(ours, theirs))
    said = [
        f"{', '.join(map(_shown, names))} {what}"
        for names, what in ((changed, "changed"), (added, "added"), (removed, "removed"))
        if names
    ]
    if common[0] != common[1]:
        was, now = (" ".join(map(_shown, names)) for names in common)
        said.append(f"reordered from {was} to {now}")
    return " and ".join(said) or None  # ("; " parts the parts in str(Explanation))


def _shown(item: str) -> str:
    """``item`` as the lists above show it: quoted where a space or a comma in it would read as
    two items (``'-DX=1 2'``)."""
    return repr(item) if any(c.isspace() or c == "," for c in item) else item


def _kept(items: Sequence[str], other: Sequence[str]) -> list[str]:
    """``items`` that ``other`` holds too (as often as it holds them), in their order."""
    left = Counter(other)
    kept = []
    for item in items:
        if left[item]:
            left[item] -= 1
            kept.append(item)
    return kept


def _same_names(
    cache: KernelCache, names: frozenset[str]
) -> Iterator[tuple[str, str, Mapping[str, str], Items]]:
    """(where, key, parts, part items) of each kernel entry that shares a name expression with
    ``names``: memory's first, then the disk's and each cache-dir layer's."""
    for artifact in cache.memory.artifacts():
        held = artifact.lowered_names.keys()
        if artifact.kind != "data" and (not names.isdisjoint(held) if names else not held):
            yield "memory", artifact.key, artifact.parts, artifact.part_items
    dirs: list[tuple[str, DiskTier]] = [("disk", cache.disk)] if cache.disk is not None else []
    dirs += [("layer", layer.tier) for layer in cache.layers if isinstance(layer, DirLayer)]
    for where, tier in dirs:
        for other, header in tier.headers_named(names):
            yield where, other, *_parts_of(header)


def _parts_of(header: dict[str, Any] | str) -> tuple[Mapping[str, str], Items]:
    if isinstance(header, str):  # unreadable: compared as one that keeps no parts
        return {}, {}
    return header_parts(header), header_part_items(header)
