"""What a Redis restarted empty loses, written again by whoever holds it.

The gateway that relays a duplex session writes its resume record again (the client can still
resume it, on another gateway), the worker writes the conversation so far again, the replay log
starts anew and a client that asks for events from before the restart is told the gap
(``session.resync_required``), and clients waiting in the queue on two gateways are admitted in
the order they arrived.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest

from tests.support.carry_on import PacedSession
from tests.support.client import Client, silence, speech
from tests.support.fault_harness import RestartableRedis, await_for, wait_for
from tests.support.resumable_session import open_on_the_first_of_two, text_of
from tests.support.stack import Stack


async def answer_in_full(client: Client) -> None:
    """Speech, then silence until the scripted reply has been spoken to its end."""
    start = len(client.received)
    await client.step(speech())
    while "twelve" not in text_of(client.received[start:]):
        await client.step(silence())


async def restart_empty(own_redis: RestartableRedis) -> None:
    own_redis.kill()
    await asyncio.sleep(1.5)
    own_redis.start()


@pytest.mark.slow
async def test_resume_on_another_gateway_after_an_empty_restart(
    own_redis: RestartableRedis, own_stack: Stack
) -> None:
    stack = own_stack
    first, created = await open_on_the_first_of_two(stack)
    sid, token = created["session_id"], created["resume_token"]
    await answer_in_full(first)
    before = [f["seq"] for f in first.received if "seq" in f]
    assert before == list(range(1, len(before) + 1))
    await restart_empty(own_redis)
    r = stack.redis()
    record, history = stack.keys.session_resume(sid), stack.keys.session_history(sid)
    # the session carries on: answered again on the new server
    for _ in range(3):
        got = await first.step(silence())
        assert not [f for f in got if f["type"] in ("error", "session.closed")], got
    # its gateway wrote the record again, attached to it; its worker the conversation
    wait_for(lambda: r.hget(record, "conn") not in (None, b""), 10, "the record written again")
    assert r.hget(record, "created_seq") is not None and r.hget(record, "init")
    wait_for(lambda: r.exists(history), 10, "the conversation written again")
    turns = orjson.loads(r.get(history) or b"[]")
    assert any(t["role"] == "assistant" and "twelve" in t["text"] for t in turns), turns
    # the client drops and resumes on the other gateway, asking for everything after seq 1:
    # the events before the restart are no longer in the log, and it is told so
    last = max(f["seq"] for f in first.received if "seq" in f)
    await first.ws.close()
    wait_for(lambda: r.hget(record, "detached_at") not in (None, b""), 10, "the detach")
    second = await Client.resume(stack.url(1), sid, token, 1)
    resumed = await second.until("session.resumed")
    assert resumed["session_id"] == sid and resumed["last_seq"] == 1
    resync = await second.until("session.resync_required", timeout=10)
    print(f"resumed after the restart: last seq {last}, told missing {resync}")
    assert resync["first_missing_seq"] == 2
    assert before[-1] <= resync["last_missing_seq"] <= last
    start = len(second.received)
    await answer_in_full(second)  # and it goes on, in sequence
    later = [f["seq"] for f in second.received[start:] if "seq" in f]
    # what the new log holds (logged after the restart), then live, each once and in order
    assert later == list(range(resync["last_missing_seq"] + 1, later[-1] + 1)), later
    assert later[-1] > last
    await second.send({"type": "session.close"})
    closed = await second.until("session.closed")
    assert closed["reason"] == "user_stop"
    stack.wait_free(1)


@pytest.mark.slow
async def test_queued_clients_keep_their_order_across_an_empty_restart(
    own_redis: RestartableRedis, own_stack: Stack
) -> None:
    stack = own_stack
    stack.start_worker()
    stack.start_gateway()
    stack.start_gateway()
    busy = await PacedSession.open(stack.url(0))
    waiting: list[Client] = []
    served: list[asyncio.Future[dict[str, Any]]] = []
    try:
        for i in range(4):  # arrival order 1..4, alternating between the gateways
            client = await Client.connect(stack.url(i % 2), query="?mode=audio")
            queued = await client.until("session.queued", timeout=15)
            assert queued["position"] == i + 1
            waiting.append(client)
        await restart_empty(own_redis)
        t_back = time.monotonic()
        r = stack.redis()
        # every gateway put its lost tickets back
        await await_for(lambda: r.zcard(stack.keys.queue) == 4, 20, "the tickets back")
        await await_for(lambda: busy.answers_after(t_back) > 0, 20, "the busy session going on")
        await busy.close()
        admitted: list[int] = []
        # one wait per client for the whole run (a wait cancelled as its frame arrives could
        # take the frame with it)
        served += [asyncio.ensure_future(c.until("session.queue_done", 60)) for c in waiting]
        for _ in range(4):
            await asyncio.wait(
                [t for i, t in enumerate(served) if i not in admitted],
                return_when=asyncio.FIRST_COMPLETED,
            )
            which = [i for i, t in enumerate(served) if i not in admitted and t.done()]
            assert len(which) == 1, which
            served[which[0]].result()
            admitted.append(which[0])
            client = waiting[which[0]]
            await client.send({"type": "session.init", "payload": {}})
            await client.until("session.created", timeout=15)
            await client.send({"type": "session.close"})
            await client.until("session.closed", timeout=15)
        print(f"admitted after the restart in the order {[i + 1 for i in admitted]}")
        assert admitted == [0, 1, 2, 3]
    finally:
        for task in served:
            task.cancel()
        await busy.close()
        for client in waiting:
            await client.close()
