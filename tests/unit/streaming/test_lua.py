"""streaming/lua.py: the edge cases of the admission scripts, called directly."""

from __future__ import annotations

import pytest
import redis

from streaming import lua
from streaming.keys import Keys
from tests.support.script_slots import CrossSlotScript, slots_of


def test_offer_takes_back_a_slot_whose_hold_expired(sync_redis: redis.Redis, keys: Keys) -> None:
    offer = sync_redis.register_script(lua.OFFER)
    k = keys
    args = [k.admission, "w#1|0"]
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
    done = release(keys=k.release_keys("w#9|0"), args=["w#9|0", k.admission])
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


def test_a_script_call_that_crosses_slots_is_caught(sync_redis: redis.Redis, keys: Keys) -> None:
    """The suite's check of every script call (tests/support/script_slots.py): a call whose
    keys hash to two slots fails where it is made, on a single Redis too, before Redis sees it;
    the admission scripts' keys, and a session's, keep to one."""
    end_lease = sync_redis.register_script(lua.END_LEASE)
    two_sessions = [keys.session_lease("rt_1_aa"), keys.input_audio("rt_1_bb")]
    with pytest.raises(CrossSlotScript):
        end_lease(keys=two_sessions, args=["w#1|0"])
    mixed = [keys.session_lease("rt_1_aa"), keys.slot_hold("w#1|0")]
    with pytest.raises(CrossSlotScript):
        end_lease(keys=mixed, args=["w#1|0"])
    session = keys.session_keys("rt_1_aa")
    assert end_lease(keys=session, args=["w#1|0"]) == 1
    assert len(slots_of(keys.release_keys("w#1|0"))) == 1
