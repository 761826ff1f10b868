"""streaming/slots.py against a real Redis: a worker's registration, heartbeat and slots."""

from __future__ import annotations

import orjson
import redis

from streaming.keys import Keys
from streaming.slots import WorkerRegistry, withdraw_idle_of_node


def test_register_heartbeat_hold_release_unregister(sync_redis: redis.Redis, keys: Keys) -> None:
    reg = WorkerRegistry(sync_redis, keys, "w#1", lease_ttl_s=30)
    slots = reg.slot_ids(2)
    assert slots == ["w#1|0", "w#1|1"]
    reg.register({"slots": 2, "backend": {"backend": "scripted"}})
    info = orjson.loads(sync_redis.hget(keys.workers, "w#1") or b"{}")
    assert info["worker_id"] == "w#1" and info["slots"] == 2
    assert sync_redis.exists(keys.worker_alive("w#1"))

    reg.heartbeat(slots, {})
    reg.heartbeat(slots, {})  # offering twice adds nothing
    assert sorted(sync_redis.lrange(keys.free_slots, 0, -1)) == [b"w#1|0", b"w#1|1"]

    sync_redis.lrem(keys.free_slots, 0, "w#1|0")  # dispatch took it
    sync_redis.sadd(keys.busy_slots, "w#1|0")
    sync_redis.set(keys.slot_hold("w#1|0"), "rt_1")  # its session's claim held it
    reg.heartbeat(["w#1|1"], {"w#1|0": "rt_1"})
    assert sync_redis.get(keys.session_lease("rt_1")) == b"w#1"
    assert sync_redis.get(keys.slot_hold("w#1|0")) == b"rt_1"

    assert reg.release("w#1|0") is True
    assert reg.release("w#1|0") is False
    assert not sync_redis.exists(keys.slot_hold("w#1|0"))
    assert sorted(sync_redis.lrange(keys.free_slots, 0, -1)) == [b"w#1|0", b"w#1|1"]

    reg.unregister(slots)
    assert sync_redis.llen(keys.free_slots) == 0
    assert not sync_redis.hexists(keys.workers, "w#1")
    assert not sync_redis.exists(keys.worker_alive("w#1"))


def test_withdraw_and_hold_times(sync_redis: redis.Redis, keys: Keys) -> None:
    reg = WorkerRegistry(sync_redis, keys, "w#2", lease_ttl_s=30)
    reg.register({"slots": 1})
    reg.heartbeat(reg.slot_ids(1), {})
    reg.withdraw(reg.slot_ids(1))  # draining: no new work, still registered
    assert sync_redis.llen(keys.free_slots) == 0 and sync_redis.hexists(keys.workers, "w#2")
    reg.record_hold(10.0)
    reg.record_hold(20.0)
    stats = sync_redis.hgetall(keys.duration_stats)
    assert float(stats[b"ema_s"]) == 12.0 and float(stats[b"last_s"]) == 20.0


def test_withdraw_idle_of_node_takes_only_that_nodes_idle_slots(
    sync_redis: redis.Redis, keys: Keys
) -> None:
    sync_redis.rpush(keys.free_slots, "a@h#1|0", "b@h#2|0", "a@h#1|1", "ab@h#3|0")
    sync_redis.sadd(keys.busy_slots, "a@h#1|2")  # running a session: not idle, left alone
    assert withdraw_idle_of_node(sync_redis, keys, "a@h") == 2
    assert sync_redis.lrange(keys.free_slots, 0, -1) == [b"b@h#2|0", b"ab@h#3|0"]
    assert sync_redis.smembers(keys.busy_slots) == {b"a@h#1|2"}
