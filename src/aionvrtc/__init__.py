"""aionvrtc: an async, actor-style CUDA compilation service, and the kernels it serves."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

# Where each public name lives. A name is imported on first use (PEP 562), so that `import
# aionvrtc` costs what its version does and a program loads only what it touches: the whole
# package, asyncio with it, took 105-187 ms to import on a 2-CPU machine after cupy and anyio.
_WHERE = {
    "FORMAT_VERSION": "._spec",
    "AionvrtcError": "._exceptions",
    "ArchStats": "._cache",
    "Artifact": "._artifact",
    "BundleError": "._exceptions",
    "CacheCorruptError": "._exceptions",
    "CacheStats": "._cache",
    "CompileError": "._exceptions",
    "CompileOnHotPath": "._exceptions",
    "Compiler": "._compiler",
    "CompilerClosed": "._exceptions",
    "CompilerStats": "._compiler",
    "DiskStats": "._store.disk",
    "Explanation": "._explain",
    "GPUOutOfMemoryError": "._exceptions",
    "KernelCache": "._cache",
    "KernelSpec": "._spec",
    "LayerStats": "._store.tier",
    "Manifest": "._manifest",
    "ManifestError": "._exceptions",
    "ManifestRead": "._manifest",
    "MemoryStats": "._store.memory",
    "Module": "._cuda",
    "ModuleLoadError": "._exceptions",
    "NoDeviceError": "._exceptions",
    "NvrtcError": "._exceptions",
    "QueueFull": "._exceptions",
    "RedisTier": "._store.remote",
    "RemoteStats": "._store.remote",
    "Target": "._target",
    "close_default_compiler": "._sync",
    "compile_sync": "._sync",
    "default_cache_dir": "._store",
    "default_compiler": "._sync",
    "get_sync": "._sync",
    "kernel_key": "._cache",
    "read_manifests": "._manifest",
    "resolve_target": "._target",
    "synchronize": "._cuda",
}

__all__ = [
    "FORMAT_VERSION",
    "AionvrtcError",
    "ArchStats",
    "Artifact",
    "BundleError",
    "CacheCorruptError",
    "CacheStats",
    "CompileError",
    "CompileOnHotPath",
    "Compiler",
    "CompilerClosed",
    "CompilerStats",
    "DiskStats",
    "Explanation",
    "GPUOutOfMemoryError",
    "KernelCache",
    "KernelSpec",
    "LayerStats",
    "Manifest",
    "ManifestError",
    "ManifestRead",
    "MemoryStats",
    "Module",
    "ModuleLoadError",
    "NoDeviceError",
    "NvrtcError",
    "QueueFull",
    "RedisTier",
    "RemoteStats",
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

if TYPE_CHECKING:
    from ._artifact import Artifact
    from ._cache import ArchStats, CacheStats, KernelCache, kernel_key
    from ._compiler import Compiler, CompilerStats
    from ._cuda import Module, synchronize
    from ._exceptions import (
        AionvrtcError,
        BundleError,
        CacheCorruptError,
        CompileError,
        CompileOnHotPath,
        CompilerClosed,
        GPUOutOfMemoryError,
        ManifestError,
        ModuleLoadError,
        NoDeviceError,
        NvrtcError,
        QueueFull,
    )
    from ._explain import Explanation
    from ._manifest import Manifest, ManifestRead, read_manifests
    from ._spec import FORMAT_VERSION, KernelSpec
    from ._store import default_cache_dir
    from ._store.disk import DiskStats
    from ._store.memory import MemoryStats
    from ._store.remote import RedisTier, RemoteStats
    from ._store.tier import LayerStats
    from ._sync import close_default_compiler, compile_sync, default_compiler, get_sync
    from ._target import Target, resolve_target
else:

    def __getattr__(name: str) -> Any:
        where = _WHERE.get(name)
        if where is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where, __name__), name)
        globals()[name] = value  # (once: the next access finds it here)
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *_WHERE})
