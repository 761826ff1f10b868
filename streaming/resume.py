"""The resume record of a duplex session: who relays it now, its token, its grace period.

A session is addressed by its id, not by its socket. Once its client has ``session.created`` the
gateway writes this HASH (``Keys.session_resume``); every change of hands is one atomic Lua step:

- ``attach`` (a resume): the token must match (only its SHA-256 is stored), the mode too, the
  session must not have ended nor been detached longer than the grace; the token rotates and the
  new connection becomes the owner. A connection that finds itself no longer the owner was
  replaced (``session.closed`` reason ``replaced``).
- ``detach``: the owner's client went away; the grace period starts.
- ``reclaim``: a detached session whose connection still relays it (its gateway was frozen past
  its lease, and the worker noted it gone) is attached to it again.
- ``rebuild``: Redis restarted empty (or lost the record otherwise) while a connection still
  relays the session, or while that connection is detaching: the connection writes the record
  again from what it holds (the hash of the token it last handed out, the init, ``created_seq``),
  only where there is none, so a later resume works as before.
- the worker notes a gateway that died without detaching (``note_gateway_gone``), pauses the
  session while it is detached, gives its slot back after ``resume_slot_hold_s`` and ends it
  after ``resume_grace_s`` (``mark_ended``: a later resume gets ``resume_expired``).

The same record keeps the encoded init control, so a failover can prepare a new worker the same
way (``tasks/duplex.py``).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from enum import StrEnum

import redis
import redis.asyncio as aioredis

from streaming.keys import Keys

ENDED_LINGER_S = 120  # an ended session's record stays this long: a late resume is told expired

_ATTACH = """
-- KEYS: record   ARGV: token_hash, new_hash, mode, gateway, conn, now, grace
if redis.call('EXISTS', KEYS[1]) == 0 then return 'not_found' end
local f = redis.call('HMGET', KEYS[1], 'token', 'mode', 'ended', 'detached_at')
if f[1] ~= ARGV[1] or f[2] ~= ARGV[3] then return 'not_found' end
if f[3] and f[3] ~= '' then return 'expired' end
if f[4] and f[4] ~= '' and tonumber(ARGV[6]) - tonumber(f[4]) > tonumber(ARGV[7]) then
  return 'expired'
end
redis.call('HSET', KEYS[1], 'token', ARGV[2], 'gateway', ARGV[4], 'conn', ARGV[5],
  'detached_at', '')
return 'ok'
"""

_RECLAIM = """
-- KEYS: record   ARGV: conn, gateway
-- Only a detached record that has not ended: a connection that resumed it meanwhile keeps it.
local f = redis.call('HMGET', KEYS[1], 'conn', 'ended')
if f[1] ~= '' or (f[2] and f[2] ~= '') then return 0 end
redis.call('HSET', KEYS[1], 'gateway', ARGV[2], 'conn', ARGV[1], 'detached_at', '')
return 1
"""

_DETACH = """
-- KEYS: record   ARGV: conn (the detaching owner) or '' with gateway, now, gateway
local f = redis.call('HMGET', KEYS[1], 'conn', 'gateway', 'detached_at')
if not f[1] then return 0 end
if ARGV[1] ~= '' and f[1] ~= ARGV[1] then return 0 end
if ARGV[1] == '' and (f[2] ~= ARGV[3] or f[3] ~= '') then return 0 end
redis.call('HSET', KEYS[1], 'gateway', '', 'conn', '', 'detached_at', ARGV[2])
return 1
"""


_REBUILD = """
-- KEYS: record   ARGV: ttl_s, then field, value pairs
-- Only where there is no record: one that exists (written again by another step) is the truth.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 1
"""


class AttachResult(StrEnum):
    """What a resume attempt found."""

    OK = "ok"
    NOT_FOUND = "not_found"  # no such session, another mode, or a wrong token
    EXPIRED = "expired"  # the session ended, or the grace period is over


def new_token() -> str:
    """An unguessable resume token (256 bits)."""
    return secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """What the record stores of a token."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_conn_id() -> str:
    """The id of one client connection (owner of a session's record)."""
    return secrets.token_hex(8)


@dataclass(frozen=True, slots=True)
class Attachment:
    """The record as a worker reads it."""

    gateway: str  # "" while detached
    detached_at: float | None
    ended: bool


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else value


class ResumeStore:
    """Gateway side (asyncio client)."""

    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self.redis = client
        self.keys = keys
        self._attach = client.register_script(_ATTACH)
        self._detach = client.register_script(_DETACH)
        self._reclaim = client.register_script(_RECLAIM)
        self._rebuild = client.register_script(_REBUILD)

    async def create(
        self,
        session_id: str,
        *,
        token: str,
        mode: str,
        gateway: str,
        conn: str,
        created_seq: int,
        deadline: float,
        init: bytes,
        ttl_s: float,
    ) -> None:
        """Write a new session's record (when its client gets ``session.created``)."""
        key = self.keys.session_resume(session_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(
                key,
                mapping={
                    "token": token_hash(token),
                    "mode": mode,
                    "gateway": gateway,
                    "conn": conn,
                    "detached_at": "",
                    "created_seq": created_seq,
                    "deadline": deadline,
                    "init": init,
                    "ended": "",
                },
            )
            pipe.expire(key, max(1, int(ttl_s)))
            await pipe.execute()

    async def attach(
        self,
        session_id: str,
        token: str,
        new_token: str,
        mode: str,
        gateway: str,
        conn: str,
        grace_s: float,
    ) -> AttachResult:
        """Take a session over with its token (see the module docstring)."""
        got = await self._attach(
            keys=[self.keys.session_resume(session_id)],
            args=[
                token_hash(token),
                token_hash(new_token),
                mode,
                gateway,
                conn,
                time.time(),
                grace_s,
            ],
        )
        return AttachResult(_text(got))

    async def fields(self, session_id: str) -> dict[str, str]:
        """The record's text fields (``init`` left out)."""
        raw = await self.redis.hgetall(self.keys.session_resume(session_id))
        return {_text(k): _text(v) for k, v in raw.items() if _text(k) != "init"}

    async def restartable(self, session_id: str) -> bool:
        """Whether a failover can prepare the session again (its record and init are there:
        a Redis that restarted empty has neither)."""
        init, ended = await self.redis.hmget(
            self.keys.session_resume(session_id), ["init", "ended"]
        )
        return bool(init) and not ended

    async def note(self, session_id: str, name: str, value: str | int) -> None:
        """Keep one more field of the session in its record (chat: ``inputs``, the number of
        accepted ``input.append`` events, so a resumed connection continues the numbering)."""
        await self.redis.hset(self.keys.session_resume(session_id), name, value)

    async def owner(self, session_id: str) -> str | None:
        """The connection that relays the session now ("" detached; None: no record)."""
        got = await self.redis.hget(self.keys.session_resume(session_id), "conn")
        return None if got is None else _text(got)

    async def detach(self, session_id: str, conn: str) -> bool:
        """The owner's client is gone: start the grace period (False: not the owner)."""
        got = await self._detach(
            keys=[self.keys.session_resume(session_id)], args=[conn, time.time(), ""]
        )
        return bool(got)

    async def reclaim(self, session_id: str, conn: str, gateway: str) -> bool:
        """Attach a detached session again to the connection that still relays it: its worker
        took this gateway for gone (frozen past its lease) and would give the slot back."""
        got = await self._reclaim(keys=[self.keys.session_resume(session_id)], args=[conn, gateway])
        return bool(got)

    async def rebuild(self, session_id: str, fields: dict[str, str | bytes], ttl_s: float) -> bool:
        """Write a lost record again from its owner's copy (``fields``, the token as its hash),
        unless one exists; True when written (see the module docstring)."""
        args: list[str | bytes | int] = [max(1, int(ttl_s))]
        for name, value in fields.items():
            args += [name, value]
        got = await self._rebuild(keys=[self.keys.session_resume(session_id)], args=args)
        return bool(got)

    async def init(self, session_id: str) -> bytes:
        """The encoded init control the session was prepared with (b"" when none)."""
        got = await self.redis.hget(self.keys.session_resume(session_id), "init")
        if not got:
            return b""
        return got if isinstance(got, bytes) else str(got).encode()

    async def mark_ended(self, session_id: str) -> None:
        """The session is over; a late resume is told ``resume_expired``."""
        await end_record(self.redis, self.keys, session_id)


async def end_record(client: aioredis.Redis, keys: Keys, session_id: str) -> None:
    """Mark a record ended, if it exists (asyncio)."""
    key = keys.session_resume(session_id)
    if await client.exists(key):
        async with client.pipeline(transaction=False) as pipe:
            pipe.hset(key, "ended", "1")
            pipe.expire(key, ENDED_LINGER_S)
            await pipe.execute()


class WorkerResume:
    """Worker side (synchronous client) of one session's record."""

    def __init__(self, client: redis.Redis, keys: Keys, session_id: str) -> None:
        self.client = client
        self.key = keys.session_resume(session_id)
        self._detach = client.register_script(_DETACH)

    def attachment(self) -> Attachment | None:
        """The record now (None: the session has none, e.g. before ``session.created``)."""
        raw = self.client.hmget(self.key, ["gateway", "detached_at", "ended"])
        gateway, detached, ended = (_text(v) if v is not None else None for v in raw)
        if gateway is None and detached is None:
            return None
        return Attachment(
            gateway=gateway or "",
            detached_at=float(detached) if detached else None,
            ended=bool(ended),
        )

    def note_gateway_gone(self, gateway: str) -> None:
        """The attached gateway died without detaching: the grace period starts now."""
        self._detach(keys=[self.key], args=["", time.time(), gateway])

    def init(self) -> bytes | None:
        """The encoded init control the session was prepared with."""
        got = self.client.hget(self.key, "init")
        if not got:
            return None
        return got if isinstance(got, bytes) else str(got).encode()

    def mark_ended(self) -> None:
        """The session is over (a late resume is told ``resume_expired``)."""
        if not self.client.exists(self.key):
            return
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hset(self.key, "ended", "1")
            pipe.expire(self.key, ENDED_LINGER_S)
            pipe.execute()
