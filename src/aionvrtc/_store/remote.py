"""The remote tier: a Redis server that a fleet of hosts shares (``pip install 'aionvrtc[redis]'``).

Read after memory and disk, written after each compile; a remote hit is written to the local
disk too. One host compiles a kernel while the others wait for it (a lock with an expiry, SET NX
PX, renewed while the compile runs); a waiter gives up after ``wait_timeout`` and compiles
itself. With a ``secret`` every entry is signed (HMAC-SHA256 over the key and the entry) and an
unsigned or badly signed entry is refused: a shared cache is code that runs on the GPU, so a tier
without a secret refuses to start unless ``allow_unsigned=True`` says every writer is trusted.

Whoever can write to the Redis must not be able to stall, flood or poison the fleet:

- A lock's value is a token of this format (``aionvrtc-lock:1:<nonce>``, with a secret also an
  HMAC of the lock key and the nonce), always set and renewed with an expiry of ``lock_ttl``. A
  waiter reads the lock it found (value and PTTL, in the same round trip as its ``SET NX``) and
  waits only on one that could be ours: well formed, signed with our secret when there is one,
  expiring within ``lock_ttl``. Anything else (a foreign lock) is counted in ``foreign_locks``
  and this host compiles at once. So a genuine lock is waited on for at most ``wait_timeout``,
  a foreign one not at all.
- A waiter polls the lock, not the entry: the entry is read once, when the lock is gone (its
  holder stores, then releases), so a large value that is refused is not pulled on every poll.
- An entry is read only if it is at most ``max_entry_bytes`` long: its size is checked in the
  same round trip, on the server, before any byte of it is sent. Larger ones are refused
  (``rejected``) and never transferred, and this tier does not upload one either.

Redis being down, slow or restarted never fails a request: every call has a short timeout, a
failure is counted and warned about once, and the tier is skipped for a backoff (doubling up to
``MAX_BACKOFF``) before it is tried again; redis-py reconnects by itself.

It is blocking (redis-py's client, thread-safe through its connection pool), as every tier
is: the Compiler calls it from its lanes' worker threads, so it serves under asyncio and trio
alike, and ``KernelCache(remote=...)`` from any thread. A compile lock is renewed by a daemon
thread while its compile runs.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import math
import re
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

from .. import _config
from .._artifact import Artifact, decode, encode
from .._config import ENV_REMOTE_ALLOW_UNSIGNED, ENV_REMOTE_SECRET, ENV_REMOTE_URL
from .._exceptions import CacheCorruptError
from .._units import quoted
from ._fork import reset_in_forked_child
from .tier import Hold, Origin

__all__ = [
    "DEFAULT_MAX_ENTRY_BYTES",
    "RedisTier",
    "check_url",
]

logger = logging.getLogger("aionvrtc")

MAGIC = b"AIONVRTC-R1"  # remote value: MAGIC, a flag byte (1: signed), [32-byte HMAC], entry
MAX_BACKOFF = 30.0  # seconds between tries while Redis is unreachable
# bytes of a remote value (MAGIC, signature and entry). The tropical cubins are 26 to 70 KiB
# (sm_90, NVRTC 13.5): room for kernels far larger, small enough that a planted value cannot
# make every host pull gigabytes.
DEFAULT_MAX_ENTRY_BYTES = 16 << 20
# bytes of a lock value read back: ours are 16 + 32 + 1 + 64 = 113; a longer one is foreign
# and is not transferred.
MAX_LOCK_BYTES = 256
_MAX_WARNED_KEYS = 1024  # keys remembered as warned about, so the set cannot grow without end

# A lock token: a nonce and, with a secret, HMAC-SHA256(secret, LOCK_DOMAIN, lock key, nonce)
# in hex. The domain keeps a lock signature from ever serving as an entry signature: those
# sign a key (hex SHA-256, never this string) followed by an entry.
LOCK_PREFIX = "aionvrtc-lock:1:"
LOCK_DOMAIN = b"aionvrtc-lock:1\0"
_LOCK_TOKEN = re.compile(r"aionvrtc-lock:1:(?P<nonce>[0-9a-f]{32})(?::(?P<mac>[0-9a-f]{64}))?")

# SET NX PX, and if the lock is taken, what holds it, in one round trip: 1 (taken by us), or
# {pttl, value} (value left out when the key is not a string or is longer than ARGV[3], so a
# planted value is never sent back). Within a script no key expires, so a failed SET NX means
# the key is there.
_TAKE_LOCK = """if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
local pttl = redis.call('pttl', KEYS[1])
if redis.call('type', KEYS[1])['ok'] ~= 'string' then return {pttl} end
if redis.call('strlen', KEYS[1]) > tonumber(ARGV[3]) then return {pttl} end
return {pttl, redis.call('get', KEYS[1])}"""
# GET if the value is a string of at most ARGV[1] bytes; else {'size', n} or {'type', name},
# decided on the server so a value that is refused is never transferred. nil: no entry.
_GET_BOUNDED = """local kind = redis.call('type', KEYS[1])['ok']
if kind == 'none' then return false end
if kind ~= 'string' then return {'type', kind} end
local size = redis.call('strlen', KEYS[1])
if size > tonumber(ARGV[1]) then return {'size', size} end
return redis.call('get', KEYS[1])"""
_RELEASE = """if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0"""
_RENEW = """if redis.call('get', KEYS[1]) == ARGV[1] then
return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"""


def check_url(url: str) -> None:
    """Raise ValueError, quoting ``url`` and the forms taken, unless redis-py can parse it: a
    bad URL is refused where it is given, not on first use by redis-py's own message."""
    try:
        from redis.connection import parse_url
    except ImportError:
        return  # RedisTier says what to install
    try:
        parse_url(url)  # type: ignore[no-untyped-call]  # redis-py's, untyped
    except ValueError as exc:
        raise ValueError(
            f"not a Redis URL: {quoted(url)} ({exc}; examples: redis://host:6379/0, "
            "rediss://user:password@host:6380, unix:///run/redis.sock)"
        ) from None


@dataclass(frozen=True, slots=True)
class RemoteStats:
    """A snapshot of the remote tier's counters since it was made (this process's).

    ``RemoteStats()``, all zero, is what a Compiler without a remote tier reports.

    Attributes:
        hits: Entries read and served.
        misses: Lookups that found no entry.
        rejected: Entries refused: unsigned while a secret is configured, badly signed,
            corrupt, over ``max_entry_bytes`` or not a string (those two left unread on the
            server).
        errors: Redis calls that failed (down, slow, refusing); the tier is then skipped for
            a backoff.
        lock_waits: Compiles that waited for another host's compile lock.
        foreign_locks: Compile locks ignored as not another aionvrtc host's (see
            ``RedisTier.hold``): this host compiled at once instead.
    """

    hits: int = 0
    misses: int = 0
    rejected: int = 0
    errors: int = 0
    lock_waits: int = 0
    foreign_locks: int = 0


class RedisTier:
    """A Redis-backed tier shared by hosts: read after memory, disk and layers, written after
    each compile; one host compiles a kernel while the others wait for it.

    Without a secret the tier refuses to start unless ``allow_unsigned=True``: anyone who can
    write to the Redis could then plant a kernel image that every host runs. Redis being down,
    slow or restarted never fails a request: each call has a short timeout, and a failure is
    counted, warned about once and followed by a backoff. Making one connects to nothing; the
    first call does.

    Pass it to ``Compiler(remote=...)``, or set ``$AIONVRTC_REMOTE_URL`` (and
    ``$AIONVRTC_REMOTE_SECRET`` or ``$AIONVRTC_REMOTE_ALLOW_UNSIGNED=1``) for Compilers made
    without one.

    Args:
        url: The Redis server, as redis-py takes it (``redis://host:6379/0``,
            ``rediss://user:password@host:6380``, ``unix:///run/redis.sock``).
        prefix: Namespaces the keys (one per fleet or deployment).
        ttl: Seconds after which an entry expires; None keeps them.
        secret: Signs and verifies entries and locks (HMAC-SHA256; bytes, or a str taken as
            UTF-8); every host of a fleet uses the same.
        allow_unsigned: True runs without a secret: only if every party that can write to this
            Redis is trusted.
        timeout: Seconds each Redis call (and each connection) may take.
        lock_ttl: Seconds until a compile lock expires, renewed while the compile runs; every
            host of a fleet should use the same one: a longer lock than ours looks foreign.
        wait_timeout: Seconds a compile waits on another host's genuine lock before it
            compiles itself; a foreign one is not waited on.
        poll: Seconds between looks at a lock another host holds.
        max_entry_bytes: Bytes of a value read or written (default 16 MiB): a larger one is
            refused on the server, unread, and not uploaded.

    Raises:
        ImportError: The redis package is not installed (``pip install 'aionvrtc[redis]'``).
        ValueError: ``url`` is not a Redis URL; ``ttl``, ``timeout``, ``lock_ttl`` or ``poll``
            is not positive and finite, ``wait_timeout`` not finite and >= 0, or
            ``max_entry_bytes`` not positive; ``secret`` is empty; or there is no secret and
            ``allow_unsigned`` is False.
    """

    origin: Origin = "remote"
    local = False

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "aionvrtc",
        ttl: float | None = None,
        secret: bytes | str | None = None,
        allow_unsigned: bool = False,
        timeout: float = 1.0,
        lock_ttl: float = 30.0,
        wait_timeout: float = 120.0,
        poll: float = 0.05,
        max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES,
    ) -> None:
        try:
            import redis
        except ImportError as exc:
            raise ImportError(
                "the remote tier needs the redis package: pip install 'aionvrtc[redis]'"
            ) from exc
        # NaN passes `<= 0`, and an infinite poll or lock wait would hang a request.
        if ttl is not None and not 0 < ttl < math.inf:
            raise ValueError(f"ttl must be positive seconds or None, got {ttl}")
        for name, value in (("timeout", timeout), ("lock_ttl", lock_ttl), ("poll", poll)):
            if not 0 < value < math.inf:
                raise ValueError(f"{name} must be positive, finite seconds, got {value}")
        if not 0 <= wait_timeout < math.inf:
            raise ValueError(
                f"wait_timeout must be finite seconds >= 0 (0: never wait on another host's "
                f"lock), got {wait_timeout}"
            )
        if max_entry_bytes <= 0:
            raise ValueError(
                f"max_entry_bytes must be a positive byte count, got {max_entry_bytes}"
            )
        try:
            check_url(url)
        except ValueError as exc:
            raise ValueError(f"url: {exc}") from None
        if secret is not None and not secret:
            raise ValueError("secret is empty: pass a long random value, or None")
        if secret is None and not allow_unsigned:
            raise ValueError(
                "RedisTier without a secret: a shared cache is code that runs on every host's "
                "GPU, and anyone who can write to this Redis could plant a kernel image. Set "
                f"secret= (or ${ENV_REMOTE_SECRET}), or pass allow_unsigned=True (or set "
                f"${ENV_REMOTE_ALLOW_UNSIGNED}=1) if every party that can write to this Redis "
                "is trusted"
            )
        self.url = url
        self.prefix = prefix
        self.ttl = ttl
        self.lock_ttl = lock_ttl
        self.wait_timeout = wait_timeout
        self.poll = poll
        self.max_entry_bytes = max_entry_bytes
        self.allow_unsigned = allow_unsigned
        self._secret = secret.encode() if isinstance(secret, str) else secret
        self._client: Any = redis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        # Registered once: each call sends the script's SHA1, not its text (redis-py loads it
        # again by itself after a Redis restart).
        self._take_lock: Any = self._client.register_script(_TAKE_LOCK)
        self._get_bounded: Any = self._client.register_script(_GET_BOUNDED)
        self._release_lock: Any = self._client.register_script(_RELEASE)
        self._renew_lock: Any = self._client.register_script(_RENEW)
        self._closed = threading.Event()  # set by close(): every call is skipped from then on
        # Counters and the backoff are updated from the lanes' threads at once.
        self._lock = threading.Lock()
        self._down_until = 0.0
        self._backoff = 0.0
        self._warned = False
        self._warned_foreign = False
        self._warned_keys: set[str] = set()  # entries refused unread or not stored: warned once
        self.hits = 0
        self.misses = 0
        self.errors = 0
        self.lock_waits = 0
        self.rejected = 0
        # Its own counter, not ``rejected``: a refused entry is a value not served, while a
        # foreign lock is an attempt to stall the fleet or a misconfigured host (another
        # secret or lock_ttl); an operator acts on each differently.
        self.foreign_locks = 0
        self.writes = 0
        self._renewing: dict[tuple[str, str], threading.Event] = {}
        reset_in_forked_child(self)  # see _after_fork_in_child

    @classmethod
    def from_environment(cls) -> RedisTier | None:
        """A tier from ``$AIONVRTC_REMOTE_URL``, ``$AIONVRTC_REMOTE_SECRET`` and
        ``$AIONVRTC_REMOTE_ALLOW_UNSIGNED``, or None without a URL.

        Returns:
            The tier, with the defaults for its other settings; None where
            ``$AIONVRTC_REMOTE_URL`` is unset or empty.

        Raises:
            ValueError: ``$AIONVRTC_REMOTE_URL`` is not a Redis URL,
                ``$AIONVRTC_REMOTE_ALLOW_UNSIGNED`` is not a switch, or there is no secret and
                unsigned entries are not allowed; the message names the variable.
            ImportError: The redis package is not installed.
        """
        url = _config.text(ENV_REMOTE_URL)
        if url is None:
            return None
        try:
            check_url(url)
        except ValueError as exc:
            raise ValueError(f"${ENV_REMOTE_URL}: {exc}") from None
        return cls(
            url,
            secret=_config.raw(ENV_REMOTE_SECRET),
            allow_unsigned=_config.flag(ENV_REMOTE_ALLOW_UNSIGNED),
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def stats(self) -> RemoteStats:
        """A snapshot of the tier's counters since it was made.

        Returns:
            The ``RemoteStats`` as they are now; taking it makes no call to Redis.
        """
        with self._lock:
            return RemoteStats(
                self.hits, self.misses, self.rejected, self.errors, self.lock_waits,
                self.foreign_locks,
            )  # fmt: skip

    def close(self) -> None:
        """Let go of the connections and stop renewing locks (a lock still held lapses by its
        expiry). A claim still waiting on a lock stops at once; every call after this one is
        skipped, as if Redis were down, without counting an error. The Compiler given this
        tier closes it when it closes."""
        self._closed.set()
        with self._lock:
            stops = list(self._renewing.values())
            self._renewing.clear()
        for stop in stops:
            stop.set()
        self._client.close()

    def _after_fork_in_child(self) -> None:
        """In a forked child: the lock may have been held by a thread of the parent that the
        child does not have, and no renewal thread runs there."""
        self._lock = threading.Lock()
        self._renewing = {}

    def _add(self, counter: str) -> None:
        with self._lock:
            setattr(self, counter, getattr(self, counter) + 1)

    # -- entries ---------------------------------------------------------------------------------

    def _entry_key(self, key: str) -> str:
        return f"{self.prefix}:entry:{key}"

    def _lock_key(self, key: str) -> str:
        return f"{self.prefix}:lock:{key}"

    @property
    def secret(self) -> bytes | None:
        """The secret that signs this tier's entries, or None: read-only layers (bundles)
        are verified with it too, one secret for what the fleet trusts."""
        return self._secret

    def _sign(self, key: str, entry: bytes) -> bytes:
        assert self._secret is not None
        return hmac.new(self._secret, key.encode() + b"\0" + entry, hashlib.sha256).digest()

    def pack(self, artifact: Artifact) -> bytes:
        """``artifact`` as this tier stores it: a magic, a flag byte, with a secret the
        HMAC-SHA256 signature over the key and the entry, then the encoded entry.

        Args:
            artifact: The artifact to encode.

        Returns:
            The value to store under the artifact's key (``unpack`` reads it back).

        Raises:
            Nothing: any Artifact packs; whether it fits ``max_entry_bytes`` is for ``write``
                to decide.
        """
        entry = encode(artifact)
        if self._secret is None:
            return MAGIC + b"\0" + entry
        return MAGIC + b"\1" + self._sign(artifact.key, entry) + entry

    def unpack(self, key: str, value: bytes, arch: str | None) -> Artifact:
        """The verified artifact in ``value``; CacheCorruptError says why it is refused.

        A tier without a secret reads a signed value too, verifying the entry only.

        Args:
            key: The cache key the value was stored under (the signature covers it).
            value: The value as stored (``pack``).
            arch: The target the entry must be built for; None: any.

        Returns:
            The ``Artifact`` in it.

        Raises:
            CacheCorruptError: ``value`` is not an aionvrtc remote value; it is unsigned while
                a secret is configured, or badly signed; or the entry fails verification
                (truncated, modified, of another key, arch or format version).
        """
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

    def read(self, key: str, *, arch: str | None = None) -> Artifact | None:
        """The verified entry for ``key``, or None (a miss, a refused entry or Redis down).
        A value over ``max_entry_bytes`` is refused on the server, without being sent.

        Args:
            key: The cache key.
            arch: The target the entry must be built for; None: any.

        Returns:
            The ``Artifact``, or None.

        Raises:
            Nothing: a refused entry is counted (``rejected``) and warned about, and Redis down
                is a miss, never an error.
        """
        value = self._call(
            self._get_bounded, keys=[self._entry_key(key)], args=[self.max_entry_bytes]
        )
        if value is _DOWN:
            return None
        if value is None:
            self._add("misses")
            return None
        if isinstance(value, list):  # [b"size", n] or [b"type", name]: left on the server
            self._add("rejected")
            what, detail = value[0], value[1]
            if what == b"size":
                self._warn_key(
                    key, "refusing remote entry %s unread: %d bytes, over max_entry_bytes (%d)",
                    key[:16], detail, self.max_entry_bytes,
                )  # fmt: skip
            else:
                self._warn_key(
                    key, "refusing remote entry %s unread: a Redis %s, not a string",
                    key[:16], detail.decode(errors="replace"),
                )  # fmt: skip
            return None
        try:
            artifact = self.unpack(key, value, arch)
        except CacheCorruptError as exc:
            self._add("rejected")
            logger.warning("refusing remote entry %s: %s", key[:16], exc)
            return None
        self._add("hits")
        return artifact

    def write(self, artifact: Artifact) -> bool:
        """Upload ``artifact``; False if Redis is down or it is over ``max_entry_bytes`` (no
        host would read it).

        Args:
            artifact: The artifact to store under its key, expiring after ``ttl`` if set.

        Returns:
            True once stored; False otherwise (also after ``close``).

        Raises:
            Nothing: a failed upload is False, counted and warned about, never an error.
        """
        value = self.pack(artifact)
        if len(value) > self.max_entry_bytes:
            self._warn_key(
                artifact.key, "not storing %s in the remote cache: %d bytes, over "
                "max_entry_bytes (%d)", artifact.key[:16], len(value), self.max_entry_bytes,
            )  # fmt: skip
            return False
        ttl_ms = None if self.ttl is None else int(self.ttl * 1000)
        done = self._call(self._client.set, self._entry_key(artifact.key), value, px=ttl_ms)
        if done:
            self._add("writes")
        return bool(done)

    def _warn_key(self, key: str, message: str, *args: object) -> None:
        """Warn once per key (the set is emptied past a bound: a warning may come again)."""
        if key in self._warned_keys:
            return
        if len(self._warned_keys) >= _MAX_WARNED_KEYS:
            self._warned_keys.clear()
        self._warned_keys.add(key)
        logger.warning(message, *args)

    # -- single flight across hosts --------------------------------------------------------------

    def _lock_token(self, key: str) -> str:
        """A new lock value for ``key``: self-describing and, with a secret, signed (over the
        lock key too, so a token seen on one key cannot be planted on another)."""
        nonce = secrets.token_hex(16)
        if self._secret is None:
            return LOCK_PREFIX + nonce
        return f"{LOCK_PREFIX}{nonce}:{self._lock_mac(key, nonce)}"

    def _lock_mac(self, key: str, nonce: str) -> str:
        assert self._secret is not None
        message = LOCK_DOMAIN + self._lock_key(key).encode() + b"\0" + nonce.encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def _foreign(self, key: str, pttl: int, value: bytes | None) -> str | None:
        """Why the lock on ``key`` (its PTTL in ms and value) is not one to wait on, or None
        if another host of this fleet may hold it."""
        if pttl == -1:
            return "it has no expiry"
        if pttl > int(self.lock_ttl * 1000):
            return f"it expires in {pttl / 1000:.0f} s, after lock_ttl ({self.lock_ttl:g} s)"
        if value is None:
            return "it is not an aionvrtc lock (not a short string)"
        match = _LOCK_TOKEN.fullmatch(value.decode("ascii", errors="replace"))
        if match is None:
            return "it is not an aionvrtc lock"
        if self._secret is None:
            return None  # unsigned fleet: a lock signed by a host with a secret is one of ours
        mac = match["mac"]
        if mac is None or not hmac.compare_digest(mac, self._lock_mac(key, match["nonce"])):
            return "it is not signed with this secret"
        return None

    def hold(
        self, key: str, arch: str, *, wait: bool = True, cancel: threading.Event | None = None
    ) -> Hold | None:
        """Before compiling ``key`` (see ``tier.Locking``): a Hold that ``held`` the fleet's
        compile lock (renewed until its release), one that ``found`` another host's compile
        stored meanwhile, or one that holds nothing: compile without the lock (Redis down, a
        foreign lock, or the wait timed out). With ``wait=False``, None when another host holds
        a genuine lock now: the caller waits for it (``wait=True``) where waiting holds no
        compile slot. Setting ``cancel`` (or closing the tier) ends a wait at once, holding
        nothing.

        While another host holds a genuine lock, only the lock is polled (a small SET NX that
        reads the lock back when taken); the entry is read once, when the lock is ours again.
        Each look checks the lock anew, so one planted after a genuine holder left is seen.

        Args:
            key: The cache key about to be compiled.
            arch: The target it is compiled for: an entry found meanwhile must be built for it.
            wait: False returns None at once where another host holds a genuine lock.
            cancel: Set, it ends a wait at once, holding nothing.

        Returns:
            The hold (let go of it with its ``release()``), or None: with ``wait=False``,
            another host holds a genuine lock now.

        Raises:
            Nothing: Redis down, a foreign lock or a wait that ran out is a hold that holds
                nothing, never an error.
        """
        token = self._lock_token(key)
        lock = self._lock_key(key)
        ttl_ms = int(self.lock_ttl * 1000)
        deadline = time.monotonic() + self.wait_timeout
        waited = False
        while True:
            reply = self._call(self._take_lock, keys=[lock], args=[token, ttl_ms, MAX_LOCK_BYTES])
            if reply is _DOWN:
                return Hold(local=False)
            if reply == 1:
                if waited:  # the holder stored it (or died) and let go
                    artifact = self.read(key, arch=arch)
                    if artifact is not None:
                        self.release(key, token)  # (renewal never started)
                        return Hold(found=artifact, local=False)
                self._renew_soon(key, token)
                release = functools.partial(self.release, key, token)
                return Hold(release=release, held=True, local=False)
            why = self._foreign(key, int(reply[0]), reply[1] if len(reply) > 1 else None)
            if why is not None:
                self._note_foreign(key, why)
                return Hold(local=False)
            if not wait:
                return None
            if not waited:
                self._add("lock_waits")
                waited = True
            if time.monotonic() > deadline:
                logger.warning(
                    "waited %.0f s for another host to compile %s; compiling here",
                    self.wait_timeout, key[:16],
                )  # fmt: skip
                return Hold(local=False)
            if self._closed.wait(self.poll) or (cancel is not None and cancel.is_set()):
                return Hold(local=False)

    def _note_foreign(self, key: str, why: str) -> None:
        self._add("foreign_locks")
        if self._warned_foreign:
            logger.debug("ignoring the compile lock on %s: %s", key[:16], why)
            return
        self._warned_foreign = True
        logger.warning(
            "ignoring the compile lock on %s in the remote cache %s: %s; compiling here without "
            "it. Locks this fleet writes expire within lock_ttl%s, and a genuine one is waited "
            "on for at most wait_timeout, a foreign one not at all: another writer, or a host "
            "with another secret or lock_ttl (counted in foreign_locks; this warning is shown "
            "once)", key[:16], self.url, why,
            "" if self._secret is None else " and are signed with the secret",
        )  # fmt: skip

    def release(self, key: str, token: str) -> None:
        """Let go of the compile lock on ``key`` that ``token`` took, and stop renewing it; a
        lock that another token holds now (ours lapsed, another host took it) is left alone.

        Args:
            key: The cache key whose lock to let go of.
            token: The lock's value, as ``hold`` took it (a hold's ``release()`` passes it).

        Raises:
            Nothing: with Redis down or the tier closed, the lock lapses by its expiry
                (``lock_ttl``).
        """
        with self._lock:
            stop = self._renewing.pop((key, token), None)
        if stop is not None:
            stop.set()
        self._call(self._release_lock, keys=[self._lock_key(key)], args=[token])

    def _renew_soon(self, key: str, token: str) -> None:
        """Renew the lock from a daemon thread until release() (or close()), as the file locks
        wait in one: the compile that holds it runs in a worker thread that cannot do both. A
        lock taken as the tier closes, or whose thread cannot start (the interpreter shutting
        down), is not renewed: it lapses within lock_ttl, as a dead host's does."""
        stop = threading.Event()
        with self._lock:
            if self._closed.is_set():
                return
            self._renewing[(key, token)] = stop
        renewer = threading.Thread(
            target=self._renew, args=(key, token, stop), name="aionvrtc-redis-lock", daemon=True
        )
        try:
            renewer.start()
        except RuntimeError:
            with self._lock:
                self._renewing.pop((key, token), None)

    def _renew(self, key: str, token: str, stop: threading.Event) -> None:
        # Renewed at a third of its expiry, so a live compile keeps it and a dead host's lapses;
        # always to lock_ttl, never beyond, which waiters check.
        while not stop.wait(self.lock_ttl / 3):
            self._call(
                self._renew_lock, keys=[self._lock_key(key)],
                args=[token, int(self.lock_ttl * 1000)],
            )  # fmt: skip

    # -- failures ----------------------------------------------------------------------------------

    def _call(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        """``method(*args, **kwargs)``, or _DOWN (counted, warned about once, backed off)."""
        from redis.exceptions import RedisError

        if self._closed.is_set() or time.monotonic() < self._down_until:
            return _DOWN
        try:
            result = method(*args, **kwargs)
        except Exception as exc:
            if self._closed.is_set():
                # In flight when close() closed its connection under it (redis-py then raises
                # what the socket does, a ValueError of a closed file among others): skipped,
                # as every call after close() is, and not a failure.
                return _DOWN
            if not isinstance(exc, RedisError | OSError | TimeoutError):
                raise
            with self._lock:
                self.errors += 1
                self._backoff = min(MAX_BACKOFF, max(0.5, self._backoff * 2))
                self._down_until = time.monotonic() + self._backoff
                warn, self._warned = not self._warned, True
            if warn:
                logger.warning(
                    "remote cache %s unreachable (%s); serving from local tiers, retrying with "
                    "backoff", self.url, exc,
                )  # fmt: skip
            return _DOWN
        if self._backoff:
            with self._lock:
                back, self._backoff, self._warned = self._backoff, 0.0, False
            if back:
                logger.info("remote cache %s reachable again", self.url)
        return result


class _Down:
    """The value of a Redis call that failed (None is a miss)."""

    def __bool__(self) -> bool:
        return False


_DOWN: Any = _Down()
