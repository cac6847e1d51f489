"""The remote tier: a Redis server that a fleet of hosts shares (``pip install 'aionvrtc[redis]'``).

Read after memory and disk, written after each compile; a remote hit is written to the local
disk too. One host compiles a kernel while the others wait for it (a lock with an expiry, SET NX
PX, renewed while the compile runs); a waiter gives up after ``wait_timeout`` and compiles
itself. With a ``secret`` every entry is signed (HMAC-SHA256 over the key and the entry) and an
unsigned or badly signed entry is refused: a shared cache is code that runs on the GPU.

Redis being down, slow or restarted never fails a request: every call has a short timeout, a
failure is counted and warned about once, and the tier is skipped for a backoff (doubling up to
``MAX_BACKOFF``) before it is tried again; redis-py reconnects by itself.

It runs under asyncio only (redis-py's async client). Calls come from the compile worker
threads (``KernelCache.resolve``) through ``anyio.from_thread.run`` into the event loop that
owns the async client.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import time
from typing import Any

import anyio
import anyio.abc

from .._artifact import Artifact, decode, encode
from .._exceptions import CacheCorruptError

__all__ = ["ENV_REMOTE_SECRET", "ENV_REMOTE_URL", "RedisTier"]

logger = logging.getLogger("aionvrtc")

ENV_REMOTE_URL = "AIONVRTC_REMOTE_URL"
ENV_REMOTE_SECRET = "AIONVRTC_REMOTE_SECRET"
MAGIC = b"AIONVRTC-R1"  # remote value: MAGIC, a flag byte (1: signed), [32-byte HMAC], entry
MAX_BACKOFF = 30.0  # seconds between tries while Redis is unreachable
_RELEASE = """if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0"""
_RENEW = """if redis.call('get', KEYS[1]) == ARGV[1] then
return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"""


class RedisTier:
    """A Redis-backed tier shared by hosts. ``url`` as redis-py takes it (``redis://host:6379/0``);
    ``prefix`` namespaces the keys (one per fleet or deployment); ``ttl`` (seconds) expires
    entries, None keeps them; ``secret`` signs and verifies entries (bytes or str).

    Pass it to ``Compiler(remote=...)``, or set ``$AIONVRTC_REMOTE_URL`` (and
    ``$AIONVRTC_REMOTE_SECRET``) for Compilers made without one.
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "aionvrtc",
        ttl: float | None = None,
        secret: bytes | str | None = None,
        timeout: float = 1.0,
        lock_ttl: float = 30.0,
        wait_timeout: float = 120.0,
        poll: float = 0.05,
    ) -> None:
        try:
            import redis.asyncio
        except ImportError as exc:
            raise ImportError(
                "the remote tier needs the redis package: pip install 'aionvrtc[redis]'"
            ) from exc
        if ttl is not None and ttl <= 0:
            raise ValueError(f"ttl must be positive seconds or None, got {ttl}")
        for name, value in (("timeout", timeout), ("lock_ttl", lock_ttl), ("poll", poll)):
            if value <= 0:
                raise ValueError(f"{name} must be positive seconds, got {value}")
        self.url = url
        self.prefix = prefix
        self.ttl = ttl
        self.lock_ttl = lock_ttl
        self.wait_timeout = wait_timeout
        self.poll = poll
        self._secret = secret.encode() if isinstance(secret, str) else secret
        self._client: Any = redis.asyncio.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        self._task_group: anyio.abc.TaskGroup | None = None
        self._down_until = 0.0
        self._backoff = 0.0
        self._warned = False
        self.hits = 0
        self.misses = 0
        self.errors = 0
        self.lock_waits = 0
        self.rejected = 0
        self.writes = 0
        self._renewing: dict[tuple[str, str], anyio.Event] = {}

    @classmethod
    def from_environment(cls) -> RedisTier | None:
        """A tier from ``$AIONVRTC_REMOTE_URL`` and ``$AIONVRTC_REMOTE_SECRET``, or None."""
        url = os.environ.get(ENV_REMOTE_URL)
        if not url:
            return None
        return cls(url, secret=os.environ.get(ENV_REMOTE_SECRET) or None)

    # -- lifecycle (the Compiler's) ------------------------------------------------------------

    @staticmethod
    def check_backend() -> None:
        """Raise RuntimeError outside asyncio: redis-py's async client runs on asyncio only."""
        import sniffio

        if sniffio.current_async_library() != "asyncio":
            raise RuntimeError(
                "the remote tier (RedisTier) needs asyncio: redis-py's async client does not "
                "run under trio; open this Compiler under asyncio, or without remote="
            )

    def bind(self, task_group: anyio.abc.TaskGroup) -> None:
        """Where lock renewals run: the Compiler's task group, while it is open."""
        self._task_group = task_group

    async def aclose(self) -> None:
        self._task_group = None
        await self._client.aclose()

    # -- entries ---------------------------------------------------------------------------------

    def _entry_key(self, key: str) -> str:
        return f"{self.prefix}:entry:{key}"

    def _lock_key(self, key: str) -> str:
        return f"{self.prefix}:lock:{key}"

    def _sign(self, key: str, entry: bytes) -> bytes:
        assert self._secret is not None
        return hmac.new(self._secret, key.encode() + b"\0" + entry, hashlib.sha256).digest()

    def pack(self, artifact: Artifact) -> bytes:
        entry = encode(artifact)
        if self._secret is None:
            return MAGIC + b"\0" + entry
        return MAGIC + b"\1" + self._sign(artifact.key, entry) + entry

    def unpack(self, key: str, value: bytes, arch: str) -> Artifact:
        """The verified artifact in ``value``; CacheCorruptError says why it is refused."""
        if not value.startswith(MAGIC) or len(value) < len(MAGIC) + 1:
            raise CacheCorruptError("remote entry: not an aionvrtc remote value")
        signed, body = value[len(MAGIC)], value[len(MAGIC) + 1 :]
        if self._secret is not None:
            if signed != 1 or len(body) < 32:
                raise CacheCorruptError("remote entry: unsigned, and a secret is configured")
            signature, body = body[:32], body[32:]
            if not hmac.compare_digest(signature, self._sign(key, body)):
                raise CacheCorruptError("remote entry: bad signature")
        elif signed == 1:
            body = body[32:]  # signed by a fleet with a secret; verified below as an entry only
        return decode(body, expected_key=key, expected_arch=arch)

    async def fetch(self, key: str, arch: str) -> Artifact | None:
        """The verified entry for ``key``, or None (a miss, a refused entry or Redis down)."""
        value = await self._call(self._client.get, self._entry_key(key))
        if value is _DOWN:
            return None
        if value is None:
            self.misses += 1
            return None
        try:
            artifact = self.unpack(key, value, arch)
        except CacheCorruptError as exc:
            self.rejected += 1
            logger.warning("refusing remote entry %s: %s", key[:16], exc)
            return None
        self.hits += 1
        return artifact

    async def store(self, artifact: Artifact) -> bool:
        ttl_ms = None if self.ttl is None else int(self.ttl * 1000)
        done = await self._call(
            self._client.set, self._entry_key(artifact.key), self.pack(artifact), px=ttl_ms
        )
        self.writes += bool(done)
        return bool(done)

    # -- single flight across hosts --------------------------------------------------------------

    async def claim(self, key: str, arch: str) -> tuple[str | None, Artifact | None]:
        """Before compiling ``key``: (token, None) if this host holds the compile lock (renewed
        until release()), (None, artifact) if another host's compile arrived meanwhile, (None,
        None) if this host should compile without the lock (Redis down, or the wait timed out).
        """
        token = secrets.token_hex(16)
        deadline = time.monotonic() + self.wait_timeout
        waited = False
        while True:
            got = await self._call(
                self._client.set, self._lock_key(key), token, nx=True,
                px=int(self.lock_ttl * 1000),
            )  # fmt: skip
            if got is _DOWN:
                return None, None
            if got:
                if waited:  # the holder may have stored it and let go since the last look
                    artifact = await self.fetch(key, arch)
                    if artifact is not None:
                        await self.release(key, token)  # (renewal never started)
                        return None, artifact
                self._renew_soon(key, token)
                return token, None
            if not waited:
                self.lock_waits += 1
                waited = True
            artifact = await self.fetch(key, arch)
            if artifact is not None:
                return None, artifact
            if time.monotonic() > deadline:
                logger.warning(
                    "waited %.0f s for another host to compile %s; compiling here",
                    self.wait_timeout, key[:16],
                )  # fmt: skip
                return None, None
            await anyio.sleep(self.poll)

    async def release(self, key: str, token: str) -> None:
        stop = self._renewing.pop((key, token), None)
        if stop is not None:
            stop.set()
        await self._call(self._client.eval, _RELEASE, 1, self._lock_key(key), token)

    def _renew_soon(self, key: str, token: str) -> None:
        stop = self._renewing[(key, token)] = anyio.Event()
        if self._task_group is not None:
            self._task_group.start_soon(self._renew, key, token, stop)

    async def _renew(self, key: str, token: str, stop: anyio.Event) -> None:
        # Renewed at a third of its expiry, so a live compile keeps it and a dead host's lapses.
        while not stop.is_set():
            with anyio.move_on_after(self.lock_ttl / 3):
                await stop.wait()
            if stop.is_set():
                return
            await self._call(
                self._client.eval, _RENEW, 1, self._lock_key(key), token,
                int(self.lock_ttl * 1000),
            )  # fmt: skip

    # -- failures ----------------------------------------------------------------------------------

    async def _call(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        """``method(*args, **kwargs)``, or _DOWN (counted, warned about once, backed off)."""
        from redis.exceptions import RedisError

        if time.monotonic() < self._down_until:
            return _DOWN
        try:
            result = await method(*args, **kwargs)
        except (RedisError, OSError, TimeoutError) as exc:
            self.errors += 1
            self._backoff = min(MAX_BACKOFF, max(0.5, self._backoff * 2))
            self._down_until = time.monotonic() + self._backoff
            if not self._warned:
                self._warned = True
                logger.warning(
                    "remote cache %s unreachable (%s); serving from local tiers, retrying with "
                    "backoff", self.url, exc,
                )  # fmt: skip
            return _DOWN
        if self._backoff:
            logger.info("remote cache %s reachable again", self.url)
            self._backoff, self._warned = 0.0, False
        return result


class _Down:
    """The value of a Redis call that failed (None is a miss)."""

    def __bool__(self) -> bool:
        return False


_DOWN: Any = _Down()
