"""streaming/keys.py: key names and the ids they are built from."""

from __future__ import annotations

from streaming.keys import Keys, base_session, slot_worker, ticket_gateway, worker_queue
from tests.support.script_slots import slots_of


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
    assert k.output_log("rt_1") == "p:s:{rt_1}:log"


def test_a_sessions_keys_share_its_slot_and_admission_has_its_own() -> None:
    """Whatever id a key is built from (the session, a chat turn of it, a restart's claim), it
    carries the session's hash tag; the admission keys carry the prefix's."""
    k = Keys("p")
    sid = "rt_1764000000000_00ab12cd34"
    turn, claim = f"{sid}_t3", f"{sid}_o2.r1"
    own = [*k.session_keys(sid), k.output_channel(sid), k.session_resume(sid)]
    own += [k.session_history(sid), k.session_attempts(turn), k.chat_frames(sid)]
    own += [k.chat_turn_lease(sid), k.chat_request(turn), k.session_claim(claim)]
    own += [k.session_lease(turn), k.output_channel(turn), k.session_attempts(claim)]
    assert slots_of(own) == slots_of([f"{{{sid}}}"])
    admission = [k.queue, k.queue_events, k.free_slots, k.busy_slots, k.running_slots]
    admission += [*k.release_keys("w#1|0"), k.slot_hold("w#1|0"), k.assignment("ticket_g_1")]
    admission += [k.workers, k.gateway_alive("g"), k.api_keys, k.key_sessions("acme")]
    admission += [k.usage_day("acme", 1), k.client_connections("::1"), k.drain("n")]
    assert slots_of(admission) == slots_of([f"{k.admission}:anything"]) == slots_of(["{p}"])
    assert k.chat_request(turn) == "p:s:{rt_1764000000000_00ab12cd34}_t3:request"


def test_base_session() -> None:
    assert base_session("rt_1_ab") == "rt_1_ab"
    assert base_session("rt_1_ab_t12") == "rt_1_ab"
    assert base_session("sess_ab_o2.r3") == "sess_ab"
    assert base_session("chat_ab.r1") == "chat_ab"
    assert base_session("_t1") == "_t1"  # nothing left: the id itself


def test_id_helpers() -> None:
    assert slot_worker("omni-1@host#42|3") == "omni-1@host#42"
    assert worker_queue("omni-1@host#42") == "omni.w.omni-1@host"
    assert ticket_gateway("ticket_abc123_7") == "abc123"
