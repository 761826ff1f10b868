"""streaming/keys.py: key names and the ids they are built from."""

from __future__ import annotations

from streaming.keys import Keys, slot_worker, ticket_gateway, worker_queue


def test_every_key_is_under_the_prefix() -> None:
    k = Keys("p")
    names = [k.queue, k.queue_seq, k.queue_events, k.free_slots, k.busy_slots, k.workers]
    names += [k.slot_hold("w#1|0"), k.assignment("t"), k.gateway_alive("g")]
    names += [k.worker_alive("w"), k.duration_stats, *k.session_keys("rt_1")]
    names += [k.session_claim("rt_1"), k.output_channel("rt_1")]
    names += [k.session_resume("rt_1"), k.chat_frames("rt_1"), k.chat_turn_lease("rt_1")]
    names += [k.api_keys, k.api_key_names, k.usage_names, k.key_sessions("acme")]
    names += [k.usage_hour("acme", 1), k.usage_day("acme", 1)]
    assert all(n.startswith("p:") for n in names)
    assert len(set(names)) == len(names)
    assert k.output_log("rt_1") == "p:s:rt_1:log"


def test_id_helpers() -> None:
    assert slot_worker("omni-1@host#42|3") == "omni-1@host#42"
    assert worker_queue("omni-1@host#42") == "omni.w.omni-1@host"
    assert ticket_gateway("ticket_abc123_7") == "abc123"
