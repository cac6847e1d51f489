"""The cache tiers: memory (per process) and disk (per host)."""

from .disk import NO_LOCK, DiskStats, DiskTier, KeyLock, default_cache_dir
from .memory import MemoryTier

__all__ = ["NO_LOCK", "DiskStats", "DiskTier", "KeyLock", "MemoryTier", "default_cache_dir"]
