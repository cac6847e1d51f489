"""aionvrtc: an async, actor-style CUDA compilation service, and the kernels it serves."""

from ._artifact import Artifact
from ._cache import CacheStats, KernelCache
from ._exceptions import (
    AionvrtcError,
    CacheCorruptError,
    CompileError,
    NoDeviceError,
    NvrtcError,
)
from ._spec import FORMAT_VERSION, KernelSpec
from ._store import default_cache_dir
from ._target import Target
from ._version import __version__

__all__ = [
    "FORMAT_VERSION",
    "AionvrtcError",
    "Artifact",
    "CacheCorruptError",
    "CacheStats",
    "CompileError",
    "KernelCache",
    "KernelSpec",
    "NoDeviceError",
    "NvrtcError",
    "Target",
    "__version__",
    "default_cache_dir",
]
