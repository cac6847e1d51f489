"""Read-only layers: cache dirs and bundle files read after the writable cache dir, before the
remote tier and NVRTC (a warm cache shipped in a container image, a shared read-only mount).

A layer is never written and nothing in it is removed or touched: an entry is verified as a
disk entry is, and a damaged one is skipped, counted and compiled instead. Hits are served in
place (a bundle from its memory map), never copied into the writable cache dir. A layer that
cannot be opened (missing, damaged, signed with another secret) or that others could change is
left out with a warning: the service runs without it, compiling what it would have served.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

from .. import _config
from .._artifact import Artifact
from .._config import ENV_CACHE_LAYERS
from .._exceptions import AionvrtcError
from .bundle import BundleTier, environment_secret
from .disk import DiskTier
from .tier import LayerStats, Origin

__all__ = ["DirLayer", "Layer", "open_layers"]


logger = logging.getLogger("aionvrtc")


class DirLayer:
    """A cache dir read as a layer: the disk tier's reads and trust checks, read-only."""

    origin: Origin = "layer"
    local = True

    def __init__(self, path: str | os.PathLike[str], *, shared_cache: bool | None = None) -> None:
        self.path = Path(path)
        self.tier = DiskTier(self.path, read_only=True, shared_cache=shared_cache)

    def read(self, key: str, *, arch: str | None = None) -> Artifact | None:
        return self.tier.read(key, arch=arch)

    def write(self, artifact: Artifact) -> bool:
        return False  # a layer is never written

    def close(self) -> None:
        return None  # holds no file open between reads

    def stats(self) -> LayerStats:
        disk = self.tier.stats()
        return LayerStats(
            path=str(self.path),
            kind="dir",
            hits=disk.hits,
            misses=disk.misses,
            damaged=disk.corrupt_dropped,
            entries=None,  # not counted: that would mean a walk of the dir
        )


Layer = DirLayer | BundleTier


def open_layers(
    paths: Iterable[str | os.PathLike[str]] | None,
    *,
    shared_cache: bool | None = None,
    secret: bytes | None = None,
) -> list[Layer]:
    """The layers at ``paths`` (default: ``$AIONVRTC_CACHE_LAYERS``), in order: a folder is a
    cache dir, a file a bundle (verified with ``secret``, default ``$AIONVRTC_REMOTE_SECRET``,
    when there is one). Either is held to the cache dir's ownership rules (a bundle others can
    replace is code others can run). One that cannot be opened or is not trusted is left out,
    with a warning saying why."""
    where = ""
    if paths is None:
        paths = _config.paths(ENV_CACHE_LAYERS)
        where = f" (in ${ENV_CACHE_LAYERS})"
    elif isinstance(paths, str | os.PathLike):
        raise TypeError("layers must be a list of paths, such as ['/opt/cache.bundle']")
    if secret is None:
        secret = environment_secret()
    layers: list[Layer] = []
    for path in paths:
        try:
            if os.path.isdir(path):
                layers.append(DirLayer(path, shared_cache=shared_cache))
            elif os.path.exists(path):
                layers.append(BundleTier(path, secret=secret, shared_cache=shared_cache))
            else:
                raise AionvrtcError(f"layer {os.fspath(path)!r} does not exist")
        except (AionvrtcError, OSError) as exc:
            logger.warning("not reading the cache layer %s: %s%s", os.fspath(path), exc, where)
    return layers
