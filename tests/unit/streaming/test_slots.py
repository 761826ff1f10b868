"""streaming/slots.py against a real Redis: a worker's registration, heartbeat and slots."""

from __future__ import annotations

import orjson
import pytest
import redis

from omniserve.redis_server import start_embedded
from streaming import lua
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
    assert reg.heartbeat(["w#1|1"], {"w#1|0": "rt_1"}) == (False, [])
    assert sync_redis.get(keys.session_lease("rt_1")) == b"w#1|0"
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
    slot = "w#2|0"
    for held in (10.0, 20.0):  # a session ran on the slot: its hold goes into the mean
        sync_redis.sadd(keys.busy_slots, slot)
        assert reg.release(slot, held) is True
    stats = sync_redis.hgetall(keys.duration_stats)
    assert float(stats[b"ema_s"]) == 12.0 and float(stats[b"last_s"]) == 20.0
    assert not [f for f in stats if f.startswith(b"ema_s:")]  # no mode known
    # dispatched 5 s ago as an audio session: the hold counts from the dispatch, and goes into
    # the audio mean too; the slot's record goes with the release
    sec, usec = sync_redis.time()
    sync_redis.sadd(keys.busy_slots, slot)
    sync_redis.hset(keys.running_slots, slot, f"audio|0|{sec + usec / 1e6 - 5:.3f}")
    assert reg.release(slot, 1.0) is True
    stats = sync_redis.hgetall(keys.duration_stats)
    assert 5.0 <= float(stats[b"ema_s:audio"]) < 6.0
    assert 10.6 <= float(stats[b"ema_s"]) < 10.8
    assert not sync_redis.hexists(keys.running_slots, slot)
    sync_redis.sadd(keys.busy_slots, slot)
    assert reg.release(slot) is True  # handed back unused: nothing recorded
    assert sync_redis.hgetall(keys.duration_stats) == stats


def test_withdraw_idle_of_node_takes_only_that_nodes_idle_slots(
    sync_redis: redis.Redis, keys: Keys
) -> None:
    sync_redis.rpush(keys.free_slots, "a@h#1|0", "b@h#2|0", "a@h#1|1", "ab@h#3|0")
    sync_redis.sadd(keys.busy_slots, "a@h#1|2")  # running a session: not idle, left alone
    assert withdraw_idle_of_node(sync_redis, keys, "a@h") == 2
    assert sync_redis.lrange(keys.free_slots, 0, -1) == [b"b@h#2|0", b"ab@h#3|0"]
    assert sync_redis.smembers(keys.busy_slots) == {b"a@h#1|2"}


def test_a_lease_another_slot_holds_is_left_to_it(sync_redis: redis.Redis, keys: Keys) -> None:
    """A session restarted on another slot (its gateway took this worker for lost) holds the
    lease there: the heartbeat here neither renews nor overwrites it, and reports the slot;
    its slot hold goes on until the session ends here."""
    reg = WorkerRegistry(sync_redis, keys, "w#5", lease_ttl_s=30)
    reg.register({"slots": 2})
    active = {"w#5|0": "rt_5", "w#5|1": "rt_6"}
    sync_redis.set(keys.session_lease("rt_5"), "w#9|0")  # restarted on w#9
    sync_redis.set(keys.session_lease("rt_6"), "w#5|1")
    assert reg.heartbeat([], active) == (False, ["w#5|0"])
    assert sync_redis.get(keys.session_lease("rt_5")) == b"w#9|0"
    assert sync_redis.get(keys.slot_hold("w#5|0")) == b"rt_5"
    sync_redis.delete(keys.session_lease("rt_6"))  # gone (Redis stalled): taken again
    assert reg.heartbeat([], active) == (False, ["w#5|0"])
    assert sync_redis.get(keys.session_lease("rt_6")) == b"w#5|1"


def test_an_ending_session_drops_its_keys_unless_another_slot_holds_it(
    sync_redis: redis.Redis, keys: Keys
) -> None:
    """``lua.END_LEASE``, as a worker's session ends (``WorkerRuntime.end``): an attempt that
    ended before its heartbeat saw the session restarted elsewhere leaves that attempt's lease,
    input and controls alone."""
    end = sync_redis.register_script(lua.END_LEASE)

    def keys_of(sid: str) -> list[str]:
        return [keys.session_lease(sid), keys.input_audio(sid), keys.input_control(sid)]

    for sid, holder in (("rt_7", "w#5|0"), ("rt_8", "w#9|0"), ("rt_9", None)):
        if holder:
            sync_redis.set(keys.session_lease(sid), holder)
        sync_redis.xadd(keys.input_audio(sid), {"a": "1"})
        sync_redis.xadd(keys.input_control(sid), {"c": "1"})
    assert end(keys=keys_of("rt_7"), args=["w#5|0"]) == 1  # its own: all dropped
    assert sync_redis.exists(*keys_of("rt_7")) == 0
    assert end(keys=keys_of("rt_8"), args=["w#5|0"]) == 0  # another slot's now: all kept
    assert sync_redis.exists(*keys_of("rt_8")) == 3
    assert end(keys=keys_of("rt_9"), args=["w#5|0"]) == 1  # no lease (a quarantined step's)
    assert sync_redis.exists(*keys_of("rt_9")) == 0
    sync_redis.delete(*keys_of("rt_8"))


def test_a_full_redis_still_takes_a_slot_back() -> None:
    """Redis at ``maxmemory`` (``noeviction``) refuses writes that could grow it, yet the
    ``RELEASE`` script still gives the slot back (its first write, ``SREM``, frees memory; a
    script that has written may go on, its hold time too): a session ending while Redis is
    full frees its slot (tests/faults/test_redis_full.py)."""
    server = start_embedded()
    client = redis.Redis.from_url(server.url)
    try:
        keys = Keys("full")
        reg = WorkerRegistry(client, keys, "w#1", lease_ttl_s=30)
        reg.register({"slots": 1})
        client.sadd(keys.busy_slots, "w#1|0")  # dispatched, its session running
        client.set(keys.slot_hold("w#1|0"), "rt_1")
        client.config_set("maxmemory", "1")
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            client.set("anything", "1")
        assert reg.release("w#1|0", 10.0) is True
        assert client.hget(keys.duration_stats, "ema_s") == b"10.000"
        assert client.lrange(keys.free_slots, 0, -1) == [b"w#1|0"]
        assert not client.sismember(keys.busy_slots, "w#1|0")
    finally:
        client.close()
        server.stop()


def test_a_beat_after_redis_lost_its_scripts_renews_and_reports(
    redis_server: str, keys: Keys
) -> None:
    """A Redis restarted empty (or a promoted replica: scripts are not replicated) answers the
    lease renewal NOSCRIPT: the beat loads it and renews all the same, and still reports the
    registry entry it wrote again."""
    own = start_embedded(die_with_parent=True)  # (SCRIPT FLUSH would reach every test's)
    client = redis.Redis.from_url(own.url)
    try:
        reg = WorkerRegistry(client, keys, "w#1", lease_ttl_s=30)
        reg.register({"slots": 1})
        client.flushall()  # empty, its script cache too
        client.script_flush()
        assert reg.heartbeat([], {"w#1|0": "rt_1"}) == (True, [])
        assert client.get(keys.session_lease("rt_1")) == b"w#1|0"
        assert client.exists(keys.workers) and client.exists(keys.worker_alive("w#1"))
    finally:
        client.close()
        own.stop()
