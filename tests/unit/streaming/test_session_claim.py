"""streaming/session_claim.py against a real Redis: a worker starts a session in one step, and a
task whose claim fails changes nothing."""

from __future__ import annotations

import redis

from streaming.chat_requests import chat_request_value
from streaming.keys import Keys
from streaming.session_claim import Claimed, SessionClaimer

REQUEST = {"messages": [{"role": "user", "content": "hi"}]}


def claimer(client: redis.Redis, keys: Keys, worker: str = "w#1") -> SessionClaimer:
    return SessionClaimer(client, keys, worker, claim_ttl_s=60, lease_ttl_s=5)


def test_claim_leases_the_session_in_one_command_then_holds_the_slot(
    sync_redis: redis.Redis, keys: Keys
) -> None:
    c = claimer(sync_redis, keys)
    c.claim("warm", "w#1|1", "warm")  # loads the script once
    sent: list[str] = []  # what the worker sent (MONITOR marks what its script ran as "lua")
    with sync_redis.monitor() as monitor:
        assert c.claim("rt_1", "w#1|0", "rt_1") == Claimed()
        while True:
            cmd = monitor.next_command()
            if keys.prefix not in cmd["command"]:
                continue
            if cmd["client_type"] != "lua":
                sent.append(cmd["command"].split()[0])
                if keys.slot_hold("w#1|0") in cmd["command"]:
                    break  # the last command
    assert sent == ["EVALSHA", "SET"]  # the session's keys, then the slot's hold
    assert sync_redis.get(keys.session_claim("rt_1")) == b"w#1"
    assert 0 < sync_redis.ttl(keys.session_claim("rt_1")) <= 60
    assert sync_redis.get(keys.slot_hold("w#1|0")) == b"rt_1"
    assert sync_redis.get(keys.session_lease("rt_1")) == b"w#1|0"  # the slot holding it
    assert 0 < sync_redis.pttl(keys.session_lease("rt_1")) <= 5000


def test_a_second_claim_changes_nothing(sync_redis: redis.Redis, keys: Keys) -> None:
    """A re-delivered or stale task (or another worker) finds the claim taken: no hold, no
    lease of its own, and a chat turn's request is not consumed."""
    for key, (value, ttl) in chat_request_value(keys, "t_1", REQUEST, 15).items():
        sync_redis.set(key, value, ex=ttl)
    sync_redis.set(keys.session_claim("t_1"), "w#0")
    assert claimer(sync_redis, keys).claim("t_1", "w#1|0", "t_1", chat_turn=True) is None
    assert not sync_redis.exists(keys.slot_hold("w#1|0"))
    assert not sync_redis.exists(keys.session_lease("t_1"))
    assert sync_redis.get(keys.session_claim("t_1")) == b"w#0"
    assert sync_redis.exists(keys.chat_request("t_1"))


def test_chat_turn_reads_its_request_once(sync_redis: redis.Redis, keys: Keys) -> None:
    for key, (value, ttl) in chat_request_value(keys, "t_2", REQUEST, 15).items():
        sync_redis.set(key, value, ex=ttl)
    c = claimer(sync_redis, keys)
    assert c.claim("t_2", "w#1|0", "t_2", chat_turn=True) == Claimed(REQUEST)
    assert not sync_redis.exists(keys.chat_request("t_2"))
    assert c.claim("t_2", "w#1|0", "t_2", chat_turn=True) is None  # once
    # a turn whose request expired (or Redis lost it) is claimed without one
    assert c.claim("t_3", "w#1|1", "t_3", chat_turn=True) == Claimed(None)


def test_a_failover_attempt_claims_its_own_id(sync_redis: redis.Redis, keys: Keys) -> None:
    """The session's first attempt and a failover's attempt have different claim ids; the
    lease is the session's either way."""
    assert claimer(sync_redis, keys, "w#1").claim("rt_4", "w#1|0", "rt_4") is not None
    assert claimer(sync_redis, keys, "w#2").claim("rt_4.r2", "w#2|0", "rt_4") is not None
    assert sync_redis.get(keys.session_lease("rt_4")) == b"w#2|0"
    assert claimer(sync_redis, keys, "w#3").claim("rt_4.r2", "w#3|0", "rt_4") is None
