"""`aionvrtc cache export|import`: bundles, a warm cache in one file to ship."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .._config import ENV_DISK_LIMIT, ENV_REMOTE_SECRET
from .._store.disk import (
    DiskTier,
    Listing,
)
from .._target import Target  # loaded by ._spec already
from .._units import format_size

if TYPE_CHECKING:
    pass
from ._shared import (
    CommandError,
    Result,
    _by_arch,
    _cache_dir,
    _contents,
    _natural,
    _tier,
    _where_nothing_is_kept,
)

__all__ = []


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
    """The keys of the manifests' specs for ``archs`` (default: every arch the cache holds
    that this NVRTC compiles for) under this NVRTC: what ``cache export --manifest`` ships."""
    from .._cache import kernel_key
    from .._exceptions import NvrtcError
    from .._manifest import read_manifests
    from .._nvrtc import check_target

    read = read_manifests(paths)
    if archs is None:
        archs = []
        for arch in _by_arch(listing, readable):
            # A header's untrusted text that is no arch, or an arch another CUDA version's
            # NVRTC compiled for (a dir shared with a CUDA 12 host: sm_70): no key of this
            # NVRTC's can name its entries, which another host's export ships.
            with contextlib.suppress(ValueError, NvrtcError):
                target = Target(arch)
                check_target(target)
                archs.append(target.arch)
    return {kernel_key(spec, arch) for spec in read.specs for arch in archs}


def _export(args: argparse.Namespace, console: Any) -> Result:
    from .._artifact import encode
    from .._store.bundle import environment_secret, write_bundle

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
    from .._artifact import encode
    from .._store.bundle import environment_secret, verify_bundle

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
