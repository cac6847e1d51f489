"""aionvrtc: an async, actor-style CUDA compilation service, and the kernels it serves."""

from ._actor import Compiler, CompilerStats
from ._artifact import Artifact
from ._cache import ArchStats, CacheStats, KernelCache, kernel_key
from ._cuda import Module, synchronize
from ._exceptions import (
    AionvrtcError,
    BundleError,
    CacheCorruptError,
    CompileError,
    CompilerClosed,
    GPUOutOfMemoryError,
    ManifestError,
    ModuleLoadError,
    NoDeviceError,
    NvrtcError,
)
from ._manifest import Manifest, ManifestRead, read_manifests
from ._spec import FORMAT_VERSION, KernelSpec
from ._store import default_cache_dir
from ._store.remote import RedisTier
from ._sync import close_default_compiler, compile_sync, default_compiler, get_sync
from ._target import Target, resolve_target
from ._version import __version__

__all__ = [
    "FORMAT_VERSION",
    "AionvrtcError",
    "ArchStats",
    "Artifact",
    "BundleError",
    "CacheCorruptError",
    "CacheStats",
    "CompileError",
    "Compiler",
    "CompilerClosed",
    "CompilerStats",
    "GPUOutOfMemoryError",
    "KernelCache",
    "KernelSpec",
    "Manifest",
    "ManifestError",
    "ManifestRead",
    "Module",
    "ModuleLoadError",
    "NoDeviceError",
    "NvrtcError",
    "RedisTier",
    "Target",
    "__version__",
    "close_default_compiler",
    "compile_sync",
    "default_cache_dir",
    "default_compiler",
    "get_sync",
    "kernel_key",
    "read_manifests",
    "resolve_target",
    "synchronize",
]
