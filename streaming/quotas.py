"""Per-key quotas at admission: concurrent sessions and session-minutes per UTC day.

A key's open sessions are a ZSET (``Keys.key_sessions``): session id -> the Redis time its hold
lapses. ``ADMIT`` is one Lua step: it drops lapsed holds, lets a session already held through
(a resumed or failed-over session keeps its one place: never counted twice), refuses at the
key's limit or once the day's recorded session seconds reach its allowance, else adds the
session. Each gateway renews its holds every ``RENEW_EVERY_S`` (``ZADD XX``: a hold released
meanwhile is not brought back); a hold whose gateway died lapses after ``HOLD_S``, so a crash
never leaks a place and a count can never go below zero (a ZSET has no negative size).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from enum import IntEnum

import redis.asyncio as aioredis

from omnicore.aio import cancel_and_wait
from streaming.keys import Keys
from streaming.keystore import KeyQuota
from streaming.usage import DAY_S

log = logging.getLogger("omniserve.gateway")

HOLD_S = 15.0
RENEW_EVERY_S = 5.0

ADMIT = """
-- KEYS: the key's sessions ZSET, the key's usage hash of today
-- ARGV: session id, max sessions ('' none), day allowance in seconds ('' none), hold_s, claim
-- claim = '1': a resumed session taking its place back, never refused.
-- Returns 1 (held), -1 (at the concurrent limit), -2 (the day's minutes are used up).
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local hold = tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if ARGV[5] ~= '1' and not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  local limit = tonumber(ARGV[2])
  if limit and redis.call('ZCARD', KEYS[1]) >= limit then
    return -1
  end
  local allowance = tonumber(ARGV[3])
  if allowance then
    local used = tonumber(redis.call('HGET', KEYS[2], 'session_s') or '0')
    if used >= allowance then
      return -2
    end
  end
end
redis.call('ZADD', KEYS[1], now + hold, ARGV[1])
redis.call('EXPIRE', KEYS[1], math.ceil(hold * 4))
return 1
"""

RENEW = """
-- KEYS: the key's sessions ZSET   ARGV: hold_s, session ids...
local t = redis.call('TIME')
local until_ = tonumber(t[1]) + tonumber(t[2]) / 1e6 + tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', until_, ARGV[i])
end
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[1]) * 4))
return 1
"""


class Refusal(IntEnum):
    """Why ``admit`` said no."""

    SESSIONS = -1
    MINUTES = -2


class QuotaHolds:
    """This gateway's holds on its keys' session places, renewed while they live."""

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        # (key name, session id) -> the connections here that hold it (a resume on this
        # gateway holds it twice for a moment)
        self.held: Counter[tuple[str, str]] = Counter()
        self._admit = redis.register_script(ADMIT)
        self._renew = redis.register_script(RENEW)
        self._task: asyncio.Task[None] | None = None

    async def admit(
        self, name: str, session_id: str, quota: KeyQuota, at: float, claim: bool = False
    ) -> Refusal | None:
        """Take a place for ``session_id`` under ``name``; the refusal, or None (held).

        ``claim``: the session is resumed here and keeps the place it has (never refused).
        Without a concurrent or minutes quota nothing is held (no Redis traffic).
        """
        if quota.max_sessions is None and quota.minutes_per_day is None:
            return None
        allowance = quota.minutes_per_day * 60 if quota.minutes_per_day is not None else ""
        got = await self._admit(
            keys=[self.keys.key_sessions(name), self.keys.usage_day(name, int(at // DAY_S))],
            args=[
                session_id,
                quota.max_sessions if quota.max_sessions is not None else "",
                allowance,
                HOLD_S,
                "1" if claim else "0",
            ],
        )
        if int(got) < 0:
            return Refusal(int(got))
        self.held[(name, session_id)] += 1
        return None

    async def release(self, name: str, session_id: str) -> None:
        """The session ended: its place is free (idempotent; Redis away: it lapses)."""
        self.forget(name, session_id)
        try:
            await self.redis.zrem(self.keys.key_sessions(name), session_id)
        except Exception:  # noqa: BLE001 - Redis away: the hold lapses within HOLD_S
            log.warning("quota hold of %s not released; it lapses", session_id)

    def forget(self, name: str, session_id: str) -> None:
        """One connection here stops renewing a hold (the session went on without it)."""
        self.held[(name, session_id)] -= 1
        if self.held[(name, session_id)] <= 0:
            del self.held[(name, session_id)]

    async def renew(self) -> None:
        by_name: dict[str, list[str]] = {}
        for name, sid in list(self.held):
            by_name.setdefault(name, []).append(sid)
        for name, sids in by_name.items():
            await self._renew(keys=[self.keys.key_sessions(name)], args=[HOLD_S, *sids])

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="quota-holds")

    async def stop(self) -> None:
        if self._task:
            await cancel_and_wait(self._task)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(RENEW_EVERY_S)
            try:
                await self.renew()
            except asyncio.CancelledError:
                raise
            except Exception:  # Redis away: next round
                log.debug("quota hold renewal failed", exc_info=True)
