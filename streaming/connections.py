"""Concurrent connections per client address, counted across every gateway.

Why across all gateways and not per gateway: gateways scale out (2 to 20 under the HPA) behind a
load balancer without sticky sessions, so a per-gateway count would let one address hold
``limit`` times the number of gateways, a number that changes with load. The count lives in
Redis, one hash per client address: gateway id -> that gateway's open connections from it.

- ACQUIRE (one Lua step) drops the entries of gateways whose alive key is gone (a crashed gateway
  never leaks a count), sums the rest, and refuses at the limit.
- RELEASE decrements this gateway's entry.
- Every ``SYNC_EVERY_S`` each gateway rewrites its own entries from its local counts (and
  refreshes the TTL): a release that failed while Redis was away, or a Redis restarted empty, is
  corrected within seconds, as the heartbeats rebuild everything else.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import redis.asyncio as aioredis

from omnicore.aio import cancel_and_wait
from streaming.keys import Keys

log = logging.getLogger("omniserve.gateway")

SYNC_EVERY_S = 5.0
KEY_TTL_S = 60  # refreshed by every sync; only a forgotten address lets its hash expire

ACQUIRE = """
-- KEYS: the client's hash   ARGV: prefix, gateway_id, limit, ttl_s
-- Returns the address's connection count with this one, or -1 when it is at the limit.
local total = 0
local entries = redis.call('HGETALL', KEYS[1])
for i = 1, #entries, 2 do
  local gw = entries[i]
  if gw ~= ARGV[2] and redis.call('EXISTS', ARGV[1] .. ':gw:' .. gw .. ':alive') == 0 then
    redis.call('HDEL', KEYS[1], gw)
  else
    total = total + tonumber(entries[i + 1])
  end
end
if total >= tonumber(ARGV[3]) then
  return -1
end
redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
return total + 1
"""

RELEASE = """
-- KEYS: the client's hash   ARGV: gateway_id
local n = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
if n <= 0 then
  redis.call('HDEL', KEYS[1], ARGV[1])
end
return n
"""


class TooManyConnections(Exception):
    """The client address holds ``limit`` connections already."""


class ClientConnections:
    """This gateway's view of the per-address limit (``limit`` 0: no limit, no Redis traffic)."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, gateway_id: str, limit: int) -> None:
        self.redis = redis
        self.keys = keys
        self.gateway_id = gateway_id
        self.limit = limit
        self.local: Counter[str] = Counter()  # address -> this gateway's open connections
        self._dirty: set[str] = set()  # addresses whose Redis entry may be wrong
        self._acquire = redis.register_script(ACQUIRE)
        self._release = redis.register_script(RELEASE)
        self._task: asyncio.Task[None] | None = None

    async def acquire(self, address: str) -> None:
        """Count one more connection from ``address``; TooManyConnections at the limit.

        Redis errors propagate (the caller refuses the client: nothing can be served then).
        """
        if self.limit <= 0:
            return
        # counted here first: a sync running meanwhile overcounts for a moment, never under
        self.local[address] += 1
        try:
            total = await self._acquire(
                keys=[self.keys.client_connections(address)],
                args=[self.keys.admission, self.gateway_id, self.limit, KEY_TTL_S],
            )
        except BaseException:  # Redis error or cancelled: counted or not, the sync will know
            self._forget(address)
            self._dirty.add(address)
            raise
        if int(total) < 0:
            self._forget(address)
            raise TooManyConnections(address)

    async def release(self, address: str) -> None:
        """One connection from ``address`` ended (Redis errors are left to the next sync)."""
        if self.limit <= 0:
            return
        # forgotten locally only afterwards: a sync running meanwhile overcounts, never under
        try:
            await self._release(
                keys=[self.keys.client_connections(address)], args=[self.gateway_id]
            )
        except asyncio.CancelledError:
            self._dirty.add(address)
            raise
        except Exception:  # noqa: BLE001 - Redis away: the next sync writes the true count
            self._dirty.add(address)
        finally:
            self._forget(address)

    def _forget(self, address: str) -> None:
        self.local[address] -= 1
        if self.local[address] <= 0:
            del self.local[address]

    async def sync(self) -> None:
        """Rewrite this gateway's entries from its local counts (after lost releases, an
        emptied Redis)."""
        addresses = set(self.local) | self._dirty
        if not addresses:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for address in addresses:
                key = self.keys.client_connections(address)
                if self.local.get(address, 0) > 0:
                    pipe.hset(key, self.gateway_id, self.local[address])
                    pipe.expire(key, KEY_TTL_S)
                else:
                    pipe.hdel(key, self.gateway_id)
            await pipe.execute()
        self._dirty -= addresses

    async def start(self) -> None:
        """Start the periodic sync (only when a limit is set)."""
        if self.limit > 0:
            self._task = asyncio.create_task(self._sync_loop(), name="client-connections")

    async def stop(self) -> None:
        if self._task:
            await cancel_and_wait(self._task)

    async def _sync_loop(self) -> None:
        while True:
            await asyncio.sleep(SYNC_EVERY_S)
            try:
                await self.sync()
            except asyncio.CancelledError:
                raise
            except Exception:  # Redis away: try again next round
                log.debug("client connection sync failed", exc_info=True)
