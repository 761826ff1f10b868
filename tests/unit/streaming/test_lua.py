"""streaming/lua.py: the edge cases of the admission scripts, called directly."""

from __future__ import annotations

import redis

from streaming import lua
from streaming.keys import Keys


def test_offer_takes_back_a_slot_whose_hold_expired(sync_redis: redis.Redis, keys: Keys) -> None:
    offer = sync_redis.register_script(lua.OFFER)
    k = keys
    args = [k.prefix, "w#1|0"]
    sync_redis.sadd(k.busy_slots, "w#1|0")
    sync_redis.set(k.slot_hold("w#1|0"), b"ticket_g_1", px=60_000)
    offer_keys = [k.busy_slots, k.free_slots, k.queue_events, k.running_slots]
    assert offer(keys=offer_keys, args=args) == 0  # held
    sync_redis.delete(k.slot_hold("w#1|0"))  # its gateway vanished before submitting
    assert offer(keys=offer_keys, args=args) == 1
    assert not sync_redis.sismember(k.busy_slots, "w#1|0")
    assert sync_redis.lrange(k.free_slots, 0, -1) == [b"w#1|0"]


def test_release_of_a_dead_workers_slot_does_not_return_it(
    sync_redis: redis.Redis, keys: Keys
) -> None:
    release = sync_redis.register_script(lua.RELEASE)
    k = keys
    sync_redis.sadd(k.busy_slots, "w#9|0")
    done = release(keys=k.release_keys("w#9|0"), args=["w#9|0", k.prefix])
    assert done == 1 and sync_redis.llen(k.free_slots) == 0


def test_enqueue_refuses_beyond_capacity_and_withdraw_clears(
    sync_redis: redis.Redis, keys: Keys
) -> None:
    k = keys
    enqueue = sync_redis.register_script(lua.ENQUEUE)
    withdraw = sync_redis.register_script(lua.WITHDRAW)
    q = [k.queue, k.queue_seq, k.free_slots, k.queue_events, k.queue_info]
    assert enqueue(keys=q, args=["ticket_g_1", 1, "0", "0", "chat", ""]) == 1
    assert enqueue(keys=q, args=["ticket_g_2", 1, "0", "0", "chat", ""]) == -1
    sync_redis.lpush(k.free_slots, "w#1|0", "w#1|1")
    sync_redis.sadd(k.busy_slots, "w#1|2")
    withdraw_keys = [k.busy_slots, k.free_slots, k.queue_events, k.running_slots]
    assert withdraw(keys=withdraw_keys, args=["w#1|0", "w#1|2"]) == 2
    assert sync_redis.lrange(k.free_slots, 0, -1) == [b"w#1|1"]
    assert not sync_redis.smembers(k.busy_slots)
