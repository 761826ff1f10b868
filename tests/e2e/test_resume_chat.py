"""Resume of a chat-mode session: the turn in flight is replayed, on any gateway.

Real processes: a private Redis, two uvicorn gateways, a Celery worker with the scripted backend
(which streams ``Reply with exactly: ...`` word by word, ``token_delay_s`` apart).
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from tests.support.client import Client
from tests.support.fault_harness import wait_for
from tests.support.stack import Stack

WORDS = " ".join(f"w{i}" for i in range(1, 31))  # 30 text deltas, 0.1 s apart


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def numbered(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in frames if "seq" in f]


def text_of(frames: list[dict[str, Any]]) -> str:
    return "".join(
        f["text"] for f in frames if f["type"] == "response.output.delta" and f["kind"] == "text"
    )


def tokens(messages: list[dict[str, str]]) -> int:
    """The scripted backend's input token count of a text conversation."""
    return sum(4 + len(m["content"].split()) for m in messages)


async def resume(
    url: str, session_id: str, token: str, last_seq: int, mode: str = "chat"
) -> Client:
    return await Client.resume(url, session_id, token, last_seq, mode)


async def test_drop_mid_answer_resume_on_second_gateway(stack: Stack) -> None:
    """Every delta of the streaming turn exactly once and in order across the drop; the next
    turn continues the input numbering and the seq, and its worker gets the conversation."""
    stack.start_worker(OMNISERVE_SCRIPTED_TOKEN_DELAY_S="0.1")
    stack.start_gateway()
    stack.start_gateway()
    first = await Client.connect(stack.url(0), query="?mode=chat")
    created = await first.init()
    token, sid = created["resume_token"], created["session_id"]
    assert isinstance(token, str) and len(token) >= 32 and "seq" not in created
    conversation = [user(f"Reply with exactly: {WORDS}")]
    await first.send({"type": "input.append", "input": {"messages": conversation}})
    while text_of(first.received).count("w") < 3:
        await first.recv()
    await first.ws.close()  # mid-answer: 27 more words to come
    got = numbered(first.received)
    assert got and got[0]["seq"] == 1

    second = await resume(stack.url(1), sid, token, got[-1]["seq"])
    resumed = await second.until("session.resumed")
    assert second.received == [resumed]  # first, and no queue events
    assert resumed["last_seq"] == got[-1]["seq"] and resumed["resume_token"] != token
    done = await second.until("response.done", timeout=30)
    later = numbered(second.received[1:])
    seqs = [f["seq"] for f in got + later]
    assert seqs == list(range(1, len(seqs) + 1)), seqs  # each once, in order, no gap
    assert text_of(got) + text_of(later) == WORDS == done["text"]
    assert {f["input_id"] for f in got + later if "input_id" in f} == {"input_1"}

    conversation += [{"role": "assistant", "content": WORDS}, user("Reply with exactly: ok")]
    await second.send({"type": "input.append", "input": {"messages": conversation}})
    start = len(second.received)
    done2 = await second.until("response.done", timeout=30)
    turn2 = numbered(second.received[start:])
    assert [f["seq"] for f in turn2] == list(range(seqs[-1] + 1, seqs[-1] + 1 + len(turn2)))
    assert {f["input_id"] for f in turn2 if "input_id" in f} == {"input_2"}
    assert done2["text"] == "ok" and done2["metrics"]["input_tokens"] == tokens(conversation)
    await second.send({"type": "session.close"})
    closed = await second.until("session.closed")
    assert closed["reason"] == "user_stop" and closed["seq"] == turn2[-1]["seq"] + 1
    assert await second.closed() == 1000
    stack.wait_free(1)
    late = await resume(stack.url(0), sid, resumed["resume_token"], closed["seq"])
    assert (await late.until("error"))["error"]["code"] == "resume_expired"


async def test_second_resume_replaces_the_first(stack: Stack) -> None:
    stack.start_worker()
    stack.start_gateway()
    client = await Client.connect(stack.url(), query="?mode=chat")
    created = await client.init()
    second = await resume(stack.url(), created["session_id"], created["resume_token"], 0)
    resumed = await second.until("session.resumed")
    closed = await client.until("session.closed")
    assert closed["reason"] == "replaced" and "seq" not in closed
    assert await client.closed() == 1000
    await second.send({"type": "input.append", "input": {"messages": [user("hi")]}})
    done = await second.until("response.done", timeout=30)
    assert done["seq"] >= 1 and resumed["resume_token"] != created["resume_token"]
    await second.send({"type": "session.close"})
    await second.until("session.closed")
    stack.wait_free(1)


async def test_unknown_wrong_mode_and_expired(stack: Stack) -> None:
    """Wrong token, unknown id, another mode: session_not_found; after the grace:
    resume_expired; each closes with 1008."""
    stack.env["OMNISERVE_RESUME_GRACE_S"] = "1.5"
    stack.start_worker()
    stack.start_gateway()
    client = await Client.connect(stack.url(), query="?mode=chat")
    created = await client.init()
    sid, token = created["session_id"], created["resume_token"]
    for bad_sid, bad_token, mode in (
        (sid, "x" * 43, "chat"),
        ("rt_0_nope", token, "chat"),
        (sid, token, "audio"),
    ):
        wrong = await resume(stack.url(), bad_sid, bad_token, 0, mode)
        err = await wrong.until("error")
        assert err["error"]["code"] == "session_not_found", err
        assert await wrong.closed() == 1008
    await client.ws.close()
    r = stack.redis()
    key = stack.keys.session_resume(sid)
    wait_for(lambda: r.hget(key, "detached_at") not in (None, b""), 10, "the detach")
    detached_at = float(r.hget(key, "detached_at") or 0)
    wait_for(lambda: time.time() > detached_at + 2.0, 10, "the grace to pass")
    late = await resume(stack.url(), sid, token, 0)
    err = await late.until("error")
    assert err["error"]["code"] == "resume_expired", err
    assert await late.closed() == 1008
    stack.wait_free(1)


async def test_log_no_longer_holds_them_resync_required(stack: Stack) -> None:
    """The turn ended while the client was away and the frame log (8 frames) dropped the start of
    what it missed: session.resync_required names the lost range, then what the log holds, in
    order, then the session goes on."""
    stack.env["OMNISERVE_OUTPUT_LOG_MAXLEN"] = "8"
    stack.start_worker(OMNISERVE_SCRIPTED_TOKEN_DELAY_S="0.05")
    stack.start_gateway()
    first = await Client.connect(stack.url(), query="?mode=chat")
    created = await first.init()
    sid = created["session_id"]
    await first.send(
        {"type": "input.append", "input": {"messages": [user(f"Reply with exactly: {WORDS}")]}}
    )
    while not numbered(first.received):
        await first.recv()
    await first.ws.close()
    last = numbered(first.received)[-1]["seq"]
    r = stack.redis()
    key = stack.keys.chat_frames(sid)

    def newest() -> dict[str, Any]:
        entries = r.xrevrange(key, "+", "-", count=1)
        return orjson.loads(entries[0][1][b"f"]) if entries else {}

    wait_for(lambda: newest().get("type") == "response.done", 30, "the turn to end unrelayed")
    end = newest()["seq"]
    assert end == 31  # 30 text deltas and response.done

    back = await resume(stack.url(), sid, created["resume_token"], last)
    await back.until("session.resumed")
    resync = await back.recv()
    assert resync["type"] == "session.resync_required", resync
    first_held = end - 8 + 1
    assert (resync["first_missing_seq"], resync["last_missing_seq"]) == (last + 1, first_held - 1)
    replayed = [await back.recv() for _ in range(8)]
    assert [f["seq"] for f in replayed] == list(range(first_held, end + 1))
    assert replayed[-1]["type"] == "response.done" and replayed[-1]["text"] == WORDS
    await back.send(
        {"type": "input.append", "input": {"messages": [user("Reply with exactly: ok")]}}
    )
    done = await back.until("response.done", timeout=30)
    assert done["text"] == "ok"
    turn2 = numbered(back.received[10:])
    assert [f["seq"] for f in turn2] == list(range(end + 1, end + 1 + len(turn2)))
    assert {f["input_id"] for f in turn2 if "input_id" in f} == {"input_2"}
    await back.send({"type": "session.close"})
    await back.until("session.closed")
    stack.wait_free(1)


async def test_a_turn_waits_for_a_lease_held_elsewhere_without_keeping_a_slot(
    stack: Stack,
) -> None:
    """A turn asks for the turn lease and a slot at once (one round trip). While another
    connection holds the lease (a resume elsewhere finishing its turn) the slot goes back to the
    pool at once, the input count is in the record already, and the turn runs once the lease is
    free."""
    stack.start_worker()
    stack.start_gateway()
    client = await Client.connect(stack.url(), query="?mode=chat")
    sid = (await client.init())["session_id"]
    r = stack.redis()
    lease = stack.keys.chat_turn_lease(sid)
    r.set(lease, "another-connection", px=60_000)
    await client.send(
        {"type": "input.append", "input": {"messages": [user("Reply with exactly: ok")]}}
    )
    wait_for(lambda: r.hget(stack.keys.session_resume(sid), "inputs") == b"1", 10, "the count")
    wait_for(lambda: stack.free_slots() == 1, 5, "the slot back in the pool")
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:  # and staying there while the turn waits
        assert stack.free_slots() == 1
        time.sleep(0.05)
    assert not [f for f in client.received if f["type"] == "response.output.delta"]
    r.delete(lease)
    done = await client.until("response.done", timeout=30)
    assert done["text"] == "ok"
    await client.send({"type": "session.close"})
    await client.until("session.closed")
    stack.wait_free(1)


async def test_a_queued_turn_whose_lease_is_held_elsewhere_leaves_the_queue(
    stack: Stack,
) -> None:
    """The same with no slot free: the turn's place in the queue is given up with the lease
    race lost, not left behind to take the next free slot for no one (its wait for a slot was
    cancelled, but the queue's acquire went on as a task of its own)."""
    stack.start_worker()
    stack.start_gateway()
    busy = await Client.connect(stack.url(), query="?mode=audio")
    await busy.init()  # the only slot
    wait_for(lambda: stack.free_slots() == 0, 10, "the slot taken")
    client = await Client.connect(stack.url(), query="?mode=chat")
    sid = (await client.init())["session_id"]
    r = stack.redis()
    r.set(stack.keys.chat_turn_lease(sid), "another-connection", px=60_000)
    await client.send(
        {"type": "input.append", "input": {"messages": [user("Reply with exactly: ok")]}}
    )
    wait_for(lambda: r.hget(stack.keys.session_resume(sid), "inputs") == b"1", 10, "the count")
    await busy.send({"type": "session.close"})
    await busy.until("session.closed")
    wait_for(lambda: stack.free_slots() == 1, 10, "the slot back in the pool")
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:  # no ticket left to take it
        assert stack.free_slots() == 1 and r.zcard(stack.keys.queue) == 0
        time.sleep(0.05)
    r.delete(stack.keys.chat_turn_lease(sid))  # the turn runs once the lease is free
    assert (await client.until("response.done", timeout=30))["text"] == "ok"
    await client.send({"type": "session.close"})
    await client.until("session.closed")
    stack.wait_free(1)


async def test_the_next_turns_channel_is_subscribed_ahead_and_closed_with_the_session(
    stack: Stack,
) -> None:
    """While a chat session waits for its next input, the gateway has that turn's output
    channel subscribed already (a turn's start does not wait for it); each turn uses its own,
    and none is left subscribed when the session ends."""
    stack.start_worker()
    stack.start_gateway()
    client = await Client.connect(stack.url(), query="?mode=chat")
    sid = (await client.init())["session_id"]
    r = stack.redis()

    def subscribers(turn: int) -> int:
        return int(r.pubsub_numsub(stack.keys.output_channel(f"{sid}_t{turn}"))[0][1])

    for turn in (1, 2, 3):
        wait_for(lambda: subscribers(turn) == 1, 10, f"turn {turn}'s channel ahead")  # noqa: B023
        await client.send(
            {"type": "input.append", "input": {"messages": [user(f"Reply with exactly: t{turn}")]}}
        )
        assert (await client.until("response.done", timeout=30))["text"] == f"t{turn}"
        wait_for(lambda: subscribers(turn) == 0, 10, f"turn {turn}'s channel closed")  # noqa: B023
    await client.send({"type": "session.close"})
    await client.until("session.closed")
    channels = stack.keys.output_channel(f"{sid}*")
    wait_for(lambda: not r.pubsub_channels(channels), 10, "no channel of the session")
    stack.wait_free(1)


async def test_turns_sent_at_once_run_back_to_back_logged_in_order(stack: Stack) -> None:
    """Inputs sent without waiting run one after another, each as soon as the last one's
    ``response.done`` is out (its turn lease is taken over, not given back and taken again):
    every numbered frame is consecutive and in the log exactly as the client got it, and the
    lease is gone once the session is idle."""
    stack.start_worker()
    stack.start_gateway()
    client = await Client.connect(stack.url(), query="?mode=chat")
    sid = (await client.init())["session_id"]
    for turn in (1, 2, 3):
        message = user(f"Reply with exactly: t{turn}")
        await client.send({"type": "input.append", "input": {"messages": [message]}})
    dones = [(await client.until("response.done", timeout=30)) for _ in range(3)]
    assert [d["text"] for d in dones] == ["t1", "t2", "t3"]
    got = numbered(client.received)
    assert [f["seq"] for f in got] == list(range(1, len(got) + 1))
    r = stack.redis()
    lease = stack.keys.chat_turn_lease(sid)
    wait_for(lambda: not r.exists(lease), 10, "the lease given back")
    logged = [orjson.loads(fields[b"f"]) for _, fields in r.xrange(stack.keys.chat_frames(sid))]
    assert logged == got
    await client.send({"type": "session.close"})
    await client.until("session.closed")
    stack.wait_free(1)
