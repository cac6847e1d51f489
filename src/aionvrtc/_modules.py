"""The Compiler's loaded modules, per device: which target each device compiles for, the modules
loaded there by key, and the replacement of an image the driver refuses."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import anyio

from . import _cuda
from ._artifact import Artifact
from ._cache import KernelCache
from ._cuda import Module
from ._cuda_errors import IMAGE_REFUSED
from ._exceptions import ModuleLoadError
from ._target import Target, device_target

__all__ = ["REFUSAL_WINDOW", "Modules"]

logger = logging.getLogger("aionvrtc")

# An image the driver refuses as invalid is dropped and compiled again once per key in this
# window; a refusal of the replacement within it raises instead. NVRTC and the driver, all a
# recompile depends on beside the key, do not change under a running process, so a second
# refusal would repeat at every try, each costing seconds of NVRTC (a compile slot that, at
# the default concurrency of 1, every other key waits for). An hour caps that at one compile
# per key per hour, a fraction of a percent of one CPU even for a 10 s program, while a
# long-running server still tries again now and then (another host may have replaced the
# remote tier's entry meanwhile); forget() lets it try at once.
REFUSAL_WINDOW = 3600.0  # seconds


class _Replacement:
    """A key whose image the driver refused as invalid: when, which image, and the one that
    replaced it (None until compiled, or if compiling it failed)."""

    __slots__ = ("at", "done", "fresh", "refused")

    def __init__(self, refused: Artifact, at: float) -> None:
        self.refused = refused
        self.at = at  # time.monotonic()
        self.fresh: Artifact | None = None
        self.done = anyio.Event()  # set once the replacement is compiled, or failed


class Modules:
    """Modules loaded by device and key, for the Compiler's life (or until forget/clear): a
    module is small, and reloading one that is in use would waste a load.

    ``by_device``, ``hot`` and the memo keys are what ``get()``'s hot path reads: ``hot`` is
    the only GPU's modules when the process sees one GPU (so a request that names no device
    needs no device query), ``hot_memo`` its memo key, ``memos`` each device's."""

    def __init__(self, cache: KernelCache, target: Target | None, hot_memo: str) -> None:
        self._cache = cache
        self._target = target  # the Compiler's: a feature suffix or family a device may take
        self.by_device: dict[int, dict[str, Module]] = {}
        self.hot: dict[str, Module] = {}
        self.hot_memo = hot_memo
        self.memos: dict[int, str] = {}
        self._caches: dict[int, KernelCache] = {}  # each device's view of the cache
        # Keys whose image was dropped and compiled again in the last ``refusal_window`` s.
        self._replacements: dict[str, _Replacement] = {}
        self.refusal_window = REFUSAL_WINDOW

    def cache_for(self, device: int) -> KernelCache:
        """The cache's view for ``device``'s target (see ``Compiler.target_for``)."""
        capability = _cuda.check_device(device)  # validates it (cached: a dict lookup)
        cache = self._caches.get(device)
        if cache is None:
            target = device_target(capability, self._target)
            cache = self._caches[device] = self._cache.for_arch(target)
        return cache

    def of(self, device: int, memo: str) -> dict[str, Module]:
        """``device``'s modules, made ready for the hot path under ``memo``."""
        modules = self.by_device.setdefault(device, {})
        self.memos[device] = memo
        if _cuda.device_count() == 1:
            self.hot, self.hot_memo = modules, memo
        return modules

    def drop(self, key: str) -> None:
        """Forget ``key``'s modules on every device, and its replacement: an image refused
        again may be replaced at once."""
        self._replacements.pop(key, None)
        for modules in self.by_device.values():
            modules.pop(key, None)

    def clear(self) -> None:
        self._replacements.clear()
        for modules in self.by_device.values():
            modules.clear()

    def close(self) -> None:
        self.by_device, self.hot = {}, {}

    async def replace(
        self,
        refused: Artifact,
        exc: ModuleLoadError,
        device: int,
        drop: Callable[[str], Awaitable[None]],
        compile: Callable[[], Awaitable[Artifact]],
    ) -> Module:
        """Drop ``refused``, an image the driver refused as invalid (``drop``), compile it
        again (``compile``) and load the new image: once per key in ``refusal_window``
        seconds. Within the window, a refusal of any image but the one replaced raises,
        keeping what is cached: compiling again would make the same image (see
        REFUSAL_WINDOW)."""
        key = refused.key
        now = time.monotonic()
        for old in [k for k, r in self._replacements.items() if self._expired(r, now)]:
            del self._replacements[old]
        replacement = self._replacements.get(key)
        if replacement is None:
            replacement = self._replacements[key] = _Replacement(refused, now)
            logger.warning("%s; dropping it and compiling again", exc)
            try:
                await drop(key)  # this image only: other archs' stay
                replacement.fresh = await compile()
            finally:
                replacement.done.set()
                # Not replaced (the compile failed or was cancelled): nothing to guard, unless
                # forget() or clear() let go of it meanwhile.
                if replacement.fresh is None and self._replacements.get(key) is replacement:
                    del self._replacements[key]
            fresh = replacement.fresh
        else:
            await replacement.done.wait()
            if refused is not replacement.refused:
                raise self._refused_again(exc, replacement) from exc.__cause__
            # Loaded before another request replaced it: that request's image, or its error.
            fresh = replacement.fresh or await compile()
        try:
            return _cuda.load(fresh, device)
        except ModuleLoadError as again:
            if again.status not in IMAGE_REFUSED:
                raise
            # From the driver's error, as every load error is: the message holds the rest.
            raise self._refused_again(again, replacement) from again.__cause__

    def _expired(self, replacement: _Replacement, now: float) -> bool:
        return replacement.done.is_set() and now - replacement.at >= self.refusal_window

    def _refused_again(self, exc: ModuleLoadError, replacement: _Replacement) -> ModuleLoadError:
        ago = time.monotonic() - replacement.at
        return ModuleLoadError(
            f"{exc}; it was dropped and replaced {ago:.0f} s ago after the same refusal, so it "
            f"is kept now and not replaced again for {max(0.0, self.refusal_window - ago):.0f} s "
            "(compiling it again would make the same image; `await compiler.forget(spec)` "
            "retries at once)",
            status=exc.status,
        )
