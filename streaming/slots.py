"""The worker's side of the slot pool and registry (redis-py, synchronous).

A worker registers as soon as its process starts, in state ``loading`` (coming capacity: clients
queue instead of being refused), and becomes ``ready`` with its slots offered once its backend
has loaded. Every heartbeat rewrites what the worker owns, so an emptied Redis (a restart without
persistence, a failover) is rebuilt within one heartbeat interval.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis
from redis.exceptions import NoScriptError

from streaming import lua
from streaming.codec import dumps
from streaming.keys import Keys, slot_worker
from streaming.outage import REDIS_ERRORS, is_outage
from streaming.redis_url import is_cluster
from streaming.wait_estimate import HOLD_EMA_ALPHA


class WorkerRegistry:
    """Registers a worker and its slots, keeps its alive key, and gives slots back."""

    LOADING_TTL_MS = 30_000  # a loading process may stall on imports; it holds no session

    def __init__(self, client: redis.Redis, keys: Keys, worker_id: str, lease_ttl_s: float) -> None:
        self.client = client
        self.keys = keys
        self.worker_id = worker_id
        self.lease_ttl_ms = int(lease_ttl_s * 1000)
        self.info: dict[str, Any] = {}
        self._release = client.register_script(lua.RELEASE)
        self._offer = client.register_script(lua.OFFER)
        self._withdraw = client.register_script(lua.WITHDRAW)
        self._renew = client.register_script(lua.TAKE_LEASE)

    def slot_ids(self, count: int) -> list[str]:
        """The ids of this worker's slots."""
        return [f"{self.worker_id}|{i}" for i in range(count)]

    def register(self, info: dict[str, Any]) -> None:
        """Describe the worker in the registry (``info["state"]``: loading or ready); alive."""
        self.info = {**info, "worker_id": self.worker_id, "registered_at": time.time()}
        self._write_entry()

    def update(self, **fields: Any) -> None:
        """Change fields of the registry entry (e.g. ``state="ready"``) and write it."""
        self.info.update(fields)
        self._write_entry()

    @property
    def _alive_ttl_ms(self) -> int:
        if self.info.get("state") == "loading":
            return max(self.lease_ttl_ms, self.LOADING_TTL_MS)
        return self.lease_ttl_ms

    def _write_entry(self) -> None:
        k = self.keys
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hset(k.workers, self.worker_id, dumps(self.info))
            pipe.set(k.worker_alive(self.worker_id), b"1", px=self._alive_ttl_ms)
            pipe.execute()

    def heartbeat(self, idle_slots: list[str], active: dict[str, str]) -> tuple[bool, list[str]]:
        """Renew the alive key, every session lease and slot hold; (re)offer idle slots.

        ``active`` maps slot id -> session id for the sessions running here now. Returns
        whether the registry entry had vanished (Redis restarted empty) and was written again,
        and the slots whose session's lease another slot holds now: its gateway took this one
        for lost (this process was frozen or cut off past the lease) and restarted the session
        there. That lease is left to its holder (a lease names its slot, ``CLAIM_SESSION``).
        """
        k = self.keys
        results = self._beat(active)
        rewritten = results[1] == 1  # (the entry written again by this beat, whatever follows)
        if any(isinstance(r, NoScriptError) for r in results):  # Redis lost its scripts
            self.client.script_load(lua.TAKE_LEASE)  # (on a cluster: on every primary)
            results = self._beat(active)
        for reply in results:
            if isinstance(reply, Exception):
                raise reply
        if idle_slots:
            self._offer(
                keys=[k.busy_slots, k.free_slots, k.queue_events, k.running_slots],
                args=[k.admission, *idle_slots],
            )
        renewed = results[2::2]
        taken = [slot for slot, ok in zip(active, renewed, strict=True) if not ok]
        return rewritten or results[1] == 1, taken

    def _beat(self, active: dict[str, str]) -> list[Any]:
        """``heartbeat``'s writes in one pipeline; the replies, errors among them.

        On a Redis Cluster a shard that cannot be reached (its primary failing over, a link cut)
        fails the whole pipeline before anything is sent: the writes are then made again in
        one pipeline per shard, at once, so that the leases on the other shards are renewed
        (their sessions never notice) and the unreachable shard's replies are its error."""
        writes = self._beat_writes(active)
        try:
            return _pipelined(self.client, writes)
        except REDIS_ERRORS as exc:
            if not is_cluster(self.client) or not is_outage(exc):
                raise
        return _pipelined_by_shard(self.client, writes)

    def _beat_writes(self, active: dict[str, str]) -> list[_Write]:
        k = self.keys
        ttl_ms = self.lease_ttl_ms
        alive = k.worker_alive(self.worker_id)
        writes: list[_Write] = [
            (alive, "set", (alive, b"1"), {"px": self._alive_ttl_ms}),
            (k.workers, "hsetnx", (k.workers, self.worker_id, dumps(self.info)), {}),
        ]
        for slot, sid in active.items():
            # EVALSHA as a plain command: a Script object in a pipeline costs a SCRIPT EXISTS
            # round trip on every execute, and a cluster pipeline refuses it
            lease, hold = k.session_lease(sid), k.slot_hold(slot)
            renew = ("EVALSHA", self._renew.sha, 1, lease, slot, ttl_ms, "")
            writes.append((lease, "execute_command", renew, {}))
            writes.append((hold, "set", (hold, sid), {"px": ttl_ms}))
        return writes

    def release(self, slot_id: str, held_s: float | None = None) -> bool:
        """Give one slot back to the pool (idempotent). ``held_s``: a session ran on it, and
        its hold time goes into the moving averages of the wait estimates in the same step
        (measured from the dispatch when Redis knows it, else ``held_s``)."""
        k = self.keys
        record: list[str | float] = [] if held_s is None else [f"{held_s:.3f}", HOLD_EMA_ALPHA]
        return bool(
            self._release(keys=k.release_keys(slot_id), args=[slot_id, k.admission, *record])
        )

    def withdraw(self, slot_ids: list[str]) -> None:
        """Take slots out of the pool (idle or being released) without leaving the registry."""
        if slot_ids:
            k = self.keys
            self._withdraw(
                keys=[k.busy_slots, k.free_slots, k.queue_events, k.running_slots], args=slot_ids
            )

    def unregister(self, slot_ids: list[str]) -> None:
        """Leave the registry (clean shutdown)."""
        forget_worker(self.client, self.keys, self.worker_id, slot_ids)


_Write = tuple[str, str, tuple[Any, ...], dict[str, Any]]
"""One write of a pipeline: its key (where it goes on a cluster), the pipeline's method that
queues it and that method's arguments."""


def _pipelined(client: redis.Redis, writes: list[_Write]) -> list[Any]:
    """``writes`` in one pipeline; their replies (errors among them)."""
    with client.pipeline(transaction=False) as pipe:
        for _, method, args, kwargs in writes:
            getattr(pipe, method)(*args, **kwargs)
        return list(pipe.execute(raise_on_error=False))


def _pipelined_by_shard(client: redis.Redis, writes: list[_Write]) -> list[Any]:
    """``writes`` in one pipeline per cluster shard, all at once (threads: the client is
    synchronous); each reply in its write's place, a shard's error in place of its replies."""
    shards: Any = client
    groups: dict[str, list[int]] = {}
    replies: list[Any] = [None] * len(writes)
    for i, (key, *_) in enumerate(writes):
        try:
            node = shards.get_node_from_key(key)
        except REDIS_ERRORS as exc:  # (no node serves the slot now)
            replies[i] = exc
            continue
        groups.setdefault(node.name, []).append(i)

    def run(indices: list[int]) -> None:
        try:
            got = _pipelined(client, [writes[i] for i in indices])
        except REDIS_ERRORS as exc:
            got = [exc] * len(indices)
        for i, reply in zip(indices, got, strict=True):
            replies[i] = reply

    with ThreadPoolExecutor(max_workers=max(1, len(groups))) as pool:
        list(pool.map(run, groups.values()))
    return replies


def forget_worker(client: redis.Redis, keys: Keys, worker_id: str, slot_ids: list[str]) -> None:
    """Take a worker's slots out of the pool and its entry out of the registry, at once.

    Used on a clean shutdown and by the Celery parent when one of its pool processes died.
    """
    if slot_ids:
        client.register_script(lua.WITHDRAW)(
            keys=[keys.busy_slots, keys.free_slots, keys.queue_events, keys.running_slots],
            args=slot_ids,
        )
    with client.pipeline(transaction=False) as pipe:
        pipe.hdel(keys.workers, worker_id)
        pipe.delete(keys.worker_alive(worker_id))
        pipe.execute()


def withdraw_idle_of_node(client: redis.Redis, keys: Keys, node: str) -> int:
    """Take a worker node's idle slots out of the pool (its pool processes' slots that are in
    the free list now); returns how many. Used by the Celery parent of a draining prefork worker,
    which holds no runtime: ``LREM`` removes a slot only while it is idle, so a slot dispatched
    meanwhile is left alone."""
    taken = 0
    for raw in client.lrange(keys.free_slots, 0, -1):
        slot = raw.decode() if isinstance(raw, bytes) else str(raw)
        if slot_worker(slot).rsplit("#", 1)[0] == node:
            taken += int(client.lrem(keys.free_slots, 0, slot))
    return taken


def record_load_time(client: redis.Redis, keys: Keys, backend: str, seconds: float) -> None:
    """Remember how long a backend took to load (the next load's wait estimate)."""
    client.hset(keys.load_stats, backend, f"{seconds:.1f}")


def expected_load_s(client: redis.Redis, keys: Keys, backend: str) -> float | None:
    """How long the last load of ``backend`` took, if known."""
    raw = client.hget(keys.load_stats, backend)
    return float(raw) if raw else None
