"""Named API keys, shared by every gateway through Redis, stored only as hashes.

An operator creates, lists, rotates and revokes them live (``omniserve keys``, or
``/v1/admin/keys``); each gateway checks a presented key at connect with one ``HGET`` of its
sha256 (keys are random 256-bit tokens, so a plain hash is as good as a keyed one), and caches
the answer for ``cache_s`` (``OMNISERVE_KEY_CACHE_S``): a revoked or rotated key is refused on
every gateway within that. The key's name is what usage is counted under and what its quotas
belong to. Records are JSON in two hashes (``Keys.api_keys``: digest -> record, what a gateway
reads; ``Keys.api_key_names``: name -> record, the listing); each change rewrites both in one
Lua step.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import asdict, dataclass, field

import orjson
import redis.asyncio as aioredis

from streaming.keys import Keys

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
RESERVED_NAMES = frozenset({"anonymous", "settings", "other"})
"""Labels the gateway uses itself: no key, a key of ``OMNISERVE_API_KEYS``, and the fold of
names past the metrics' label budget."""

ANONYMOUS = "anonymous"
SETTINGS_KEY = "settings"
SECRET_PREFIX = "osk_"
MAX_KEY_CHARS = 256

# KEYS: api_keys, api_key_names   ARGV: name, digest, record JSON, replace ('1': a revoked
# name may be created again).  Returns 1, or 0 when the name holds a live key.
CREATE = """
local old = redis.call('HGET', KEYS[2], ARGV[1])
if old then
  local rec = cjson.decode(old)
  if rec.revoked_at == nil or rec.revoked_at == cjson.null then
    return 0
  end
  redis.call('HDEL', KEYS[1], rec.digest)
end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return 1
"""

# KEYS: api_keys, api_key_names   ARGV: name, op ('rotate' | 'revoke' | 'quota'), new digest
# (rotate), now, quota JSON (quota).  Returns the new record JSON, or false when the name has
# no live key.
CHANGE = """
local old = redis.call('HGET', KEYS[2], ARGV[1])
if not old then
  return false
end
local rec = cjson.decode(old)
if rec.revoked_at ~= nil and rec.revoked_at ~= cjson.null then
  return false
end
if ARGV[2] == 'rotate' then
  redis.call('HDEL', KEYS[1], rec.digest)
  rec.digest = ARGV[3]
  rec.rotated_at = tonumber(ARGV[4])
elseif ARGV[2] == 'revoke' then
  rec.revoked_at = tonumber(ARGV[4])
else
  rec.quota = cjson.decode(ARGV[5])
end
local out = cjson.encode(rec)
redis.call('HSET', KEYS[1], rec.digest, out)
redis.call('HSET', KEYS[2], ARGV[1], out)
return out
"""


class KeyProblem(ValueError):
    """A key operation that cannot be done (a bad or taken name, no such live key)."""


@dataclass(frozen=True, slots=True)
class KeyQuota:
    """One key's limits; None: no limit of that kind."""

    max_sessions: int | None = None  # open sessions at once, all gateways
    minutes_per_day: float | None = None  # session-minutes per UTC day, checked at admission
    max_session_s: float | None = None  # one session's own cap (announced by session.expiring)

    @classmethod
    def of(cls, raw: object) -> KeyQuota:
        """From a record's JSON object (unknown fields ignored, bad values dropped)."""
        if not isinstance(raw, dict):
            return cls()

        def num(name: str) -> float | None:
            v = raw.get(name)
            return float(v) if isinstance(v, int | float) and v > 0 else None

        sessions = num("max_sessions")
        return cls(
            max_sessions=int(sessions) if sessions is not None else None,
            minutes_per_day=num("minutes_per_day"),
            max_session_s=num("max_session_s"),
        )

    def is_empty(self) -> bool:
        return (
            self.max_sessions is None
            and self.minutes_per_day is None
            and (self.max_session_s is None)
        )


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """What Redis holds of one named key (never the key itself)."""

    name: str
    digest: str
    created_at: float
    rotated_at: float | None = None
    revoked_at: float | None = None
    quota: KeyQuota = field(default_factory=KeyQuota)

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> KeyRecord:
        d = orjson.loads(raw)
        return cls(
            name=str(d["name"]),
            digest=str(d["digest"]),
            created_at=float(d.get("created_at") or 0.0),
            rotated_at=d.get("rotated_at"),
            revoked_at=d.get("revoked_at"),
            quota=KeyQuota.of(d.get("quota")),
        )

    def public(self) -> dict[str, object]:
        """The listing's view: everything but the digest."""
        return {
            "name": self.name,
            "created_at": self.created_at,
            "rotated_at": self.rotated_at,
            "revoked_at": self.revoked_at,
            "state": "revoked" if self.revoked else "active",
            "quota": asdict(self.quota),
        }


@dataclass(frozen=True, slots=True)
class KeyIdentity:
    """Who a connection is, for metering and quotas: a key's name and its quota."""

    name: str
    quota: KeyQuota = field(default_factory=KeyQuota)


def digest(secret: str) -> str:
    """The sha256 hex a key is stored and looked up by."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def new_secret() -> str:
    """A fresh key: ``osk_`` and 256 random bits."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def well_formed(secret: str) -> bool:
    """Whether a presented key could be a key at all (printable ASCII, bounded length)."""
    return 0 < len(secret) <= MAX_KEY_CHARS and secret.isascii() and secret.isprintable()


def check_name(name: str) -> str:
    """``name`` if it may name a key (lowercase, digits, ``_.-``; the gateway's own labels
    reserved), else KeyProblem."""
    if not NAME_RE.match(name):
        raise KeyProblem(f"{name!r}: a key name is 1-64 of a-z 0-9 _ . - (starting a-z 0-9)")
    if name in RESERVED_NAMES:
        raise KeyProblem(f"{name!r} is reserved")
    return name


class KeyStore:
    """The named keys in Redis, with each gateway's short cache of lookups."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, cache_s: float = 0.5) -> None:
        self.redis = redis
        self.keys = keys
        self.cache_s = cache_s
        self._cache: dict[str, tuple[float, KeyRecord | None]] = {}
        self._any: tuple[float, bool] | None = None
        self._create = redis.register_script(CREATE)
        self._change = redis.register_script(CHANGE)

    # ------------------------------------------------------------------ the gateway's checks
    async def lookup(self, secret: str) -> KeyRecord | None:
        """The record of the key ``secret`` (a revoked one too), or None: unknown."""
        d = digest(secret)
        now = time.monotonic()
        hit = self._cache.get(d)
        if hit is not None and hit[0] > now:
            return hit[1]
        raw = await self.redis.hget(self.keys.api_keys, d)
        rec = KeyRecord.from_json(raw) if raw else None
        if len(self._cache) > 10_000:  # unknown keys tried at random must not grow it forever
            self._cache.clear()
        self._cache[d] = (now + self.cache_s, rec)
        return rec

    async def any_keys(self) -> bool:
        """Whether any named key exists (then a client must present one)."""
        now = time.monotonic()
        if self._any is not None and self._any[0] > now:
            return self._any[1]
        found = bool(await self.redis.hlen(self.keys.api_keys))
        self._any = (now + self.cache_s, found)
        return found

    # ------------------------------------------------------------------ management
    async def create(self, name: str, quota: KeyQuota | None = None) -> tuple[str, KeyRecord]:
        """A new key under ``name``: the secret (shown once, never stored) and its record."""
        check_name(name)
        secret = new_secret()
        rec = KeyRecord(name, digest(secret), time.time(), quota=quota or KeyQuota())
        done = await self._create(
            keys=[self.keys.api_keys, self.keys.api_key_names],
            args=[name, rec.digest, rec.to_json()],
        )
        if not int(done):
            raise KeyProblem(f"{name!r} already names an active key")
        return secret, rec

    async def rotate(self, name: str) -> tuple[str, KeyRecord]:
        """A new secret for ``name``; the old one is refused from now on."""
        secret = new_secret()
        out = await self._run(name, "rotate", digest(secret))
        return secret, out

    async def revoke(self, name: str) -> KeyRecord:
        """Refuse ``name``'s key from now on (its record stays, listed as revoked)."""
        return await self._run(name, "revoke")

    async def set_quota(self, name: str, quota: KeyQuota) -> KeyRecord:
        return await self._run(name, "quota", quota_json=orjson.dumps(asdict(quota)))

    async def records(self) -> list[KeyRecord]:
        raw = await self.redis.hgetall(self.keys.api_key_names)
        return sorted((KeyRecord.from_json(v) for v in raw.values()), key=lambda r: r.name)

    async def _run(
        self, name: str, op: str, new_digest: str = "", quota_json: bytes = b"{}"
    ) -> KeyRecord:
        out = await self._change(
            keys=[self.keys.api_keys, self.keys.api_key_names],
            args=[name, op, new_digest, time.time(), quota_json],
        )
        if not out:
            raise KeyProblem(f"no active key named {name!r}")
        self._cache.clear()
        return KeyRecord.from_json(out)
