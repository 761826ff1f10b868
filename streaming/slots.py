"""The worker's side of the slot pool and registry (redis-py, synchronous)."""

from __future__ import annotations

import time
from typing import Any

import redis

from streaming import lua
from streaming.codec import dumps
from streaming.keys import Keys


class WorkerRegistry:
    """Registers a worker and its slots, keeps its alive key, and gives slots back."""

    def __init__(self, client: redis.Redis, keys: Keys, worker_id: str, lease_ttl_s: float) -> None:
        self.client = client
        self.keys = keys
        self.worker_id = worker_id
        self.lease_ttl_ms = int(lease_ttl_s * 1000)
        self._release = client.register_script(lua.RELEASE)
        self._offer = client.register_script(lua.OFFER)
        self._withdraw = client.register_script(lua.WITHDRAW)

    def slot_ids(self, count: int) -> list[str]:
        """The ids of this worker's slots."""
        return [f"{self.worker_id}|{i}" for i in range(count)]

    def register(self, info: dict[str, Any]) -> None:
        """Describe the worker in the registry and mark it alive."""
        k = self.keys
        info = {**info, "worker_id": self.worker_id, "registered_at": time.time()}
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hset(k.workers, self.worker_id, dumps(info))
            pipe.set(k.worker_alive(self.worker_id), b"1", px=self.lease_ttl_ms)
            pipe.execute()

    def heartbeat(self, idle_slots: list[str], active: dict[str, str]) -> None:
        """Renew the alive key, every session lease and slot hold; (re)offer idle slots.

        ``active`` maps slot id -> session id for the sessions running here now.
        """
        k = self.keys
        with self.client.pipeline(transaction=False) as pipe:
            pipe.set(k.worker_alive(self.worker_id), b"1", px=self.lease_ttl_ms)
            for slot, sid in active.items():
                pipe.set(k.session_lease(sid), self.worker_id, px=self.lease_ttl_ms)
                pipe.set(k.slot_hold(slot), sid, px=self.lease_ttl_ms)
            pipe.execute()
        if idle_slots:
            self._offer(
                keys=[k.busy_slots, k.free_slots, k.queue_events], args=[k.prefix, *idle_slots]
            )

    def hold(self, slot_id: str, session_id: str) -> None:
        """Mark a slot as held by a running session and renew the session's lease."""
        k = self.keys
        with self.client.pipeline(transaction=False) as pipe:
            pipe.set(k.slot_hold(slot_id), session_id, px=self.lease_ttl_ms)
            pipe.set(k.session_lease(session_id), self.worker_id, px=self.lease_ttl_ms)
            pipe.execute()

    def release(self, slot_id: str) -> bool:
        """Give one slot back to the pool (idempotent)."""
        k = self.keys
        return bool(
            self._release(
                keys=[k.busy_slots, k.free_slots, k.worker_alive(self.worker_id), k.queue_events],
                args=[slot_id, k.prefix],
            )
        )

    def withdraw(self, slot_ids: list[str]) -> None:
        """Take slots out of the pool (idle or being released) without leaving the registry."""
        if slot_ids:
            k = self.keys
            self._withdraw(keys=[k.busy_slots, k.free_slots, k.queue_events], args=slot_ids)

    def unregister(self, slot_ids: list[str]) -> None:
        """Leave the registry (clean shutdown)."""
        k = self.keys
        if slot_ids:
            self._withdraw(keys=[k.busy_slots, k.free_slots, k.queue_events], args=slot_ids)
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hdel(k.workers, self.worker_id)
            pipe.delete(k.worker_alive(self.worker_id))
            pipe.execute()

    def record_hold(self, seconds: float, alpha: float = 0.2) -> None:
        """Fold one slot hold time into the moving average used for wait estimates."""
        k = self.keys
        old = self.client.hget(k.duration_stats, "ema_s")
        ema = seconds if old is None else (1 - alpha) * float(old) + alpha * seconds
        self.client.hset(k.duration_stats, mapping={"ema_s": ema, "last_s": seconds})
