"""Resume: a session outlives its connection, on any gateway.

Real processes: a private Redis, two uvicorn gateways, Celery workers with the scripted backend.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson

from tests.support.client import Client, silence, speech
from tests.support.fault_harness import kill9_group, wait_for
from tests.support.resumable_session import REPLY, open_on_the_first_of_two, text_of
from tests.support.stack import Stack


def deltas(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in frames if f["type"] == "response.output.delta"]


async def speak_until_text(client: Client) -> None:
    """Speech, then silence until the scripted answer's first text delta arrived."""
    await client.step(speech())
    while not any(f.get("kind") == "text" for f in deltas(client.received)):
        await client.step(silence())


async def resume(url: str, session_id: str, token: str, last_seq: int) -> Client:
    return await Client.resume(url, session_id, token, last_seq)


async def test_drop_mid_answer_resume_on_second_gateway(stack: Stack) -> None:
    """Every delta exactly once and in order across the drop; seq 1, 2, 3 ... throughout."""
    first, created = await open_on_the_first_of_two(stack)
    token, sid = created["resume_token"], created["session_id"]
    assert isinstance(token, str) and len(token) >= 32 and "seq" not in created
    await speak_until_text(first)
    await first.ws.close()  # mid-answer: the reply has more steps to go
    got = [f for f in first.received if "seq" in f]
    last = got[-1]["seq"]

    second = await resume(stack.url(1), sid, token, last)
    resumed = await second.until("session.resumed")
    assert second.received == [resumed]  # first, and no queueing
    assert resumed["session_id"] == sid and resumed["last_seq"] == last
    assert resumed["resume_token"] != token
    start = len(second.received)
    while "twelve" not in text_of(second.received[start:]):
        await second.step(silence())
    await second.send({"type": "session.close"})
    closed = await second.until("session.closed")
    later = [f for f in second.received[start:] if "seq" in f]

    seqs = [f["seq"] for f in got + later]
    assert seqs == list(range(1, len(seqs) + 1)), seqs  # each once, in order, no gap
    assert text_of(got) + text_of(later) == REPLY
    assert closed["reason"] == "user_stop" and closed["seq"] == seqs[-1]
    stack.wait_free(1)


async def test_second_resume_replaces_the_first(stack: Stack) -> None:
    stack.start_worker()
    stack.start_gateway()
    first = await Client.connect(stack.url(), query="?mode=audio")
    created = await first.init()
    second = await resume(stack.url(), created["session_id"], created["resume_token"], 0)
    resumed = await second.until("session.resumed")
    assert second.received == [resumed]
    closed = await first.until("session.closed")
    assert closed["reason"] == "replaced"
    assert await first.closed() == 1000
    # the token rotated: the first token no longer works
    third = await resume(stack.url(), created["session_id"], created["resume_token"], 0)
    err = await third.until("error")
    assert err["error"]["code"] == "session_not_found"
    assert await third.closed() == 1008
    # the session goes on for the second connection
    frames = await second.step(speech())
    assert deltas(frames), frames
    third2 = await resume(stack.url(), created["session_id"], resumed["resume_token"], 0)
    await third2.until("session.resumed")
    assert (await second.until("session.closed"))["reason"] == "replaced"
    await third2.send({"type": "session.close"})
    await third2.until("session.closed")
    stack.wait_free(1)


async def test_unknown_wrong_and_expired(stack: Stack) -> None:
    """Wrong token / unknown id: session_not_found; after the grace: resume_expired."""
    stack.env.update({"OMNISERVE_RESUME_GRACE_S": "1.5", "OMNISERVE_RESUME_SLOT_HOLD_S": "0.5"})
    stack.start_worker()
    stack.start_gateway()
    client = await Client.connect(stack.url(), query="?mode=audio")
    created = await client.init()
    sid = created["session_id"]
    for bad_sid, bad_token in ((sid, "x" * 43), ("rt_0_nope", created["resume_token"])):
        wrong = await resume(stack.url(), bad_sid, bad_token, 0)
        err = await wrong.until("error")
        assert err["error"]["code"] == "session_not_found", err
        assert await wrong.closed() == 1008
    await client.ws.close()
    stack.wait_free(1)  # the slot goes back after the slot hold, not the whole grace
    r = stack.redis()
    wait_for(
        lambda: r.hget(stack.keys.session_resume(sid), "detached_at") not in (None, b""),
        10,
        "the detach",
    )
    detached_at = float(r.hget(stack.keys.session_resume(sid), "detached_at") or 0)
    wait_for(lambda: time.time() > detached_at + 2.0, 10, "the grace to pass")
    late = await resume(stack.url(), sid, created["resume_token"], 0)
    err = await late.until("error")
    assert err["error"]["code"] == "resume_expired", err
    assert await late.closed() == 1008


async def test_resume_after_slot_hold_restarts_with_history(stack: Stack, tmp_path: Path) -> None:
    """Away longer than the slot hold: the slot went back; the resume restarts the session on a
    slot (recovering, recovered) with the conversation so far in the new prompt."""
    log = str(tmp_path / "prompts.jsonl")
    stack.env.update(
        {
            "OMNISERVE_RESUME_SLOT_HOLD_S": "0.5",
            "OMNISERVE_SCRIPTED_REPLY": "alpha beta gamma",
            "OMNISERVE_BACKEND_OPTIONS": orjson.dumps({"prompt_log": log}).decode(),
        }
    )
    stack.start_worker()
    stack.start_gateway()
    client = await Client.connect(stack.url(), query="?mode=audio")
    created = await client.init({"system_prompt": "be brief"})
    await client.step(speech())
    while "gamma" not in text_of(client.received):
        await client.step(silence())
    last = [f for f in client.received if "seq" in f][-1]["seq"]
    await client.ws.close()
    stack.wait_free(1)
    back = await resume(stack.url(), created["session_id"], created["resume_token"], last)
    await back.until("session.resumed")
    start = len(back.received)
    recovering = await back.until("session.recovering")
    recovered = await back.until("session.recovered")
    # what the first connection had not read yet (this answer's audio), then the restart
    seqs = [f["seq"] for f in back.received[start:]]
    assert seqs == list(range(last + 1, recovered["seq"] + 1)), seqs
    assert recovered["seq"] == recovering["seq"] + 1
    assert recovered["metrics"]["history_turns"] == 1
    with open(log, "rb") as fh:
        prompts = [orjson.loads(line)["prompt"] for line in fh]
    assert len(prompts) == 2 and "alpha beta gamma" in prompts[1] and "be brief" in prompts[1]
    frames = await back.step(speech())
    assert deltas(frames) and all(f["seq"] > recovered["seq"] for f in deltas(frames))
    await back.send({"type": "session.close"})
    await back.until("session.closed")
    stack.wait_free(1)


async def test_second_restart_is_a_new_attempt(stack: Stack) -> None:
    """Away past the slot hold twice: each resume restarts the session on a slot, and the second
    restart is a new attempt (a reused claim would be ignored by the worker: no session.recovered).
    """
    stack.env.update({"OMNISERVE_RESUME_SLOT_HOLD_S": "0.5"})
    stack.start_worker()
    stack.start_gateway()
    client = await Client.connect(stack.url(), query="?mode=audio")
    created = await client.init({})
    session_id, token = created["session_id"], created["resume_token"]
    for _ in range(2):
        await client.step(speech())
        last = [f for f in client.received if "seq" in f][-1]["seq"]
        await client.ws.close()
        stack.wait_free(1)
        client = await resume(stack.url(), session_id, token, last)
        token = (await client.until("session.resumed"))["resume_token"]
        await client.until("session.recovered")
    frames = await client.step(speech())
    assert deltas(frames)
    await client.send({"type": "session.close"})
    await client.until("session.closed")
    stack.wait_free(1)


async def test_gateway_killed_client_resumes_on_another(stack: Stack) -> None:
    """The relaying gateway dies (kill -9): the client resumes on another one and the answer
    goes on where it stopped."""
    first, created = await open_on_the_first_of_two(stack)
    await speak_until_text(first)
    kill9_group(stack.gateways[0][0])
    await first.closed()
    got = [f for f in first.received if "seq" in f]
    second = await resume(
        stack.url(1), created["session_id"], created["resume_token"], got[-1]["seq"]
    )
    await second.until("session.resumed")
    start = len(second.received)
    while "twelve" not in text_of(second.received[start:]):
        await second.step(silence())
    later = [f for f in second.received[start:] if "seq" in f]
    seqs = [f["seq"] for f in got + later]
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    assert text_of(got) + text_of(later) == REPLY
    await second.send({"type": "session.close"})
    await second.until("session.closed")
    stack.wait_free(1)


async def test_replay_log_no_longer_holds_them_resync_required(stack: Stack) -> None:
    """What the replay log lost is announced (session.resync_required), never skipped silently;
    what it still holds follows, then the live stream."""
    stack.env["OMNISERVE_SCRIPTED_REPLY"] = REPLY
    stack.start_worker()
    stack.start_gateway()
    first = await Client.connect(stack.url(), query="?mode=audio")
    created = await first.init()
    sid = created["session_id"]
    await speak_until_text(first)
    await first.ws.close()
    r = stack.redis()
    log_key = stack.keys.output_log(sid)
    wait_for(lambda: r.xlen(log_key) >= 4, 10, "the answer in the log")
    newest = int(r.xrevrange(log_key, count=1)[0][0].decode().split("-")[0])
    r.xtrim(log_key, maxlen=1, approximate=False)  # the log lost all but its newest event
    second = await resume(stack.url(), sid, created["resume_token"], 0)
    await second.until("session.resumed")
    resync = await second.until("session.resync_required")
    created_seq = int(r.hget(stack.keys.session_resume(sid), "created_seq") or 0)
    assert resync["first_missing_seq"] == 1
    assert resync["last_missing_seq"] == newest - created_seq - 1
    kept = await second.recv()
    assert kept["seq"] == newest - created_seq  # the one event the log still held
    frames = await second.step(silence())  # then live, in sequence
    seqs = [f["seq"] for f in frames if "seq" in f]
    assert seqs and seqs[0] == kept["seq"] + 1
    await second.send({"type": "session.close"})
    await second.until("session.closed")
