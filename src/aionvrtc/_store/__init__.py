"""The cache tiers: memory (per process) and disk (per host)."""

from .disk import DiskTier, default_cache_dir
from .memory import MemoryTier

__all__ = ["DiskTier", "MemoryTier", "default_cache_dir"]
