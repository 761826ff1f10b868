"""A slot's worker process killed (SIGKILL) after its slot was handed out and before it started
the task: the session, or the chat turn, starts on another slot (api/relay/retry.py).

To hold the task in the node's queue until the kill, the worker's Celery parent is frozen
(SIGSTOP) first (``admitted_to_a_dying_worker``); once thawed, it hands the task to the
replacement pool process, which does not own the dead process's slot and ignores it. The
gateway finds the slot's worker gone, abandons that attempt and takes the replacement's slot at
the head of the queue. With failovers off (``OMNISERVE_FAILOVER_WAIT_S=0``) the client is told
``worker_connect_failed`` instead (tests/faults/test_worker_death.py).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from tests.support.client import Client, silence, speech
from tests.support.fault_harness import (
    admitted_to_a_dying_worker,
    await_for,
    forked_children,
    kill9,
    kill9_group,
    log_text,
    served_end_to_end,
    wait_for,
)
from tests.support.stack import Stack


def errors(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in frames if f["type"] == "error"]


@pytest.mark.parametrize("claimed", [False, True], ids=["unclaimed", "claimed"])
async def test_a_session_whose_worker_dies_before_it_starts_starts_on_another_slot(
    stack: Stack, claimed: bool
) -> None:
    """The client, which sent ``session.init`` meanwhile, gets ``session.created`` from the
    replacement and is served, with no error; the claim is the session's second attempt.
    ``claimed``: the pool process dies after its claim and before its ``Started``: the gateway
    cannot abandon the task, finds its lease lapsed and nothing in the log, and starts it on
    the replacement's slot all the same."""
    client, _worker, child = await admitted_to_a_dying_worker(stack, claimed=claimed)
    created = await client.until("session.created", "error", timeout=50)
    assert created["type"] == "session.created", created
    sid = created["session_id"]
    r = stack.redis()
    first_claim = f"omni@test#{child}".encode() if claimed else b"abandoned"
    assert r.get(stack.keys.session_claim(sid)) == first_claim  # the first attempt
    assert r.get(stack.keys.session_claim(f"{sid}.r1")) not in (None, b"abandoned")
    frames = []
    for audio_in in (speech(), silence(), silence()):
        frames += await client.step(audio_in)
    kinds = {f.get("kind") for f in frames if f["type"] == "response.output.delta"}
    assert {"text", "audio"} <= kinds, frames
    await client.send({"type": "session.close"})
    closed = await client.until("session.closed")
    assert closed["reason"] == "user_stop"
    assert await client.closed() == 1000
    assert not errors(client.received), errors(client.received)
    detail = "died before starting it" if claimed else "the session did not start"
    assert f"{detail}; starting it on another slot" in log_text(stack.gateways[0][0])
    stack.wait_free(1, timeout=30)


@pytest.mark.parametrize("claimed", [False, True], ids=["unclaimed", "claimed"])
async def test_a_chat_turn_whose_worker_dies_before_it_starts_is_answered_elsewhere(
    stack: Stack, claimed: bool
) -> None:
    """The turn's task waits in the frozen node's queue when its pool process is killed; the
    client gets its answer, from the replacement, and no error. ``claimed``: the process dies
    after its claim took the turn's request (the claim step's writes made here as the worker
    makes them, the one stand-in): the request is written again with the next attempt."""
    worker = stack.start_worker(slots=1)
    stack.start_gateway(OMNISERVE_TASK_START_TIMEOUT_S="60")
    stack.wait_free(1)
    [child] = forked_children(worker)
    client = await Client.connect(stack.url(), query="?mode=chat")
    await client.until("session.queue_done")
    await client.send({"type": "session.init", "payload": {}})
    created = await client.until("session.created")
    turn = f"{created['session_id']}_t1"
    r = stack.redis()
    os.kill(worker.popen.pid, signal.SIGSTOP)
    try:
        await client.send(
            {
                "type": "input.append",
                "input": {"messages": [{"role": "user", "content": "Reply with exactly: moved"}]},
            }
        )
        # the turn's request is written with its task, in one transaction
        wait_for(lambda: r.exists(stack.keys.chat_request(turn)), 10, "the turn's task")
        if claimed:
            with r.pipeline(transaction=True) as pipe:  # as streaming/session_claim.py claims
                pipe.set(stack.keys.session_claim(turn), f"omni@test#{child}", ex=60)
                pipe.set(stack.keys.session_lease(turn), f"omni@test#{child}", px=1500)
                pipe.getdel(stack.keys.chat_request(turn))
                pipe.execute()
        kill9(child)
    finally:
        os.kill(worker.popen.pid, signal.SIGCONT)
    done = await client.until("response.done", "error", timeout=50)
    assert done["type"] == "response.done", done
    assert done["text"] == "moved"
    first_claim = f"omni@test#{child}".encode() if claimed else b"abandoned"
    assert r.get(stack.keys.session_claim(turn)) == first_claim
    assert r.get(stack.keys.session_claim(f"{turn}.r1")) not in (None, b"abandoned")
    assert not errors(client.received), errors(client.received)
    await client.close()
    stack.wait_free(1, timeout=30)


async def test_a_failover_whose_new_worker_dies_before_it_starts_recovers_elsewhere(
    stack: Stack,
) -> None:
    """A failover's attempt that meets the same fate is followed by another failover attempt
    (the conversation recovered, the sequence going on), not by a fresh start: the worker
    running the session is killed (its whole node), the failover's task waits in the frozen
    queue of the other node, whose pool process is then killed too; the client gets
    ``session.recovered`` from that node's replacement, in sequence, and no error."""
    workers = [stack.start_worker(slots=1), stack.start_worker(slots=1)]
    stack.start_gateway(OMNISERVE_TASK_START_TIMEOUT_S="60")
    stack.wait_free(2)
    client = await Client.connect(stack.url(), query="?mode=audio")
    created = await client.init()
    sid = created["session_id"]
    r = stack.redis()
    owner = r.get(stack.keys.session_claim(sid))
    assert owner
    pid = int(owner.decode().rsplit("#", 1)[1])
    [running] = [w for w in workers if pid in forked_children(w)]
    [other] = [w for w in workers if w is not running]
    [child] = forked_children(other)
    await client.step(speech())
    os.kill(other.popen.pid, signal.SIGSTOP)
    try:
        kill9_group(running)
        recovering = await client.until("session.recovering", timeout=10)
        # the failover's attempt 1 is submitted to the frozen node right after its number
        wait_for(lambda: r.get(stack.keys.session_attempts(sid)) == b"1", 10, "attempt 1")
        time.sleep(0.5)
        kill9(child)
    finally:
        os.kill(other.popen.pid, signal.SIGCONT)
    recovered = await client.until("session.recovered", "error", timeout=50)
    assert recovered["type"] == "session.recovered", recovered
    assert recovered["seq"] == recovering["seq"] + 1
    assert r.get(stack.keys.session_claim(f"{sid}.r1")) == b"abandoned"
    assert r.get(stack.keys.session_claim(f"{sid}.r2")) not in (None, b"abandoned")
    frames = await client.step(speech())
    seqs = [f["seq"] for f in frames if f["type"] == "response.output.delta"]
    assert seqs and min(seqs) > recovered["seq"], frames
    assert not errors(client.received), errors(client.received)
    await client.close()


async def closed_while_waiting_for_a_slot(stack: Stack, client: Client) -> None:
    """Once the task waits at the head of the queue, the client's ``session.close`` ends the
    wait and the session within seconds (``user_stop``, 1000, no error), its ticket leaves the
    queue, and a worker started afterwards serves the next client."""
    r = stack.redis()
    await await_for(lambda: r.zcard(stack.keys.queue) == 1, 30, "the wait for a slot")
    asked = time.monotonic()
    await client.send({"type": "session.close"})
    closed = await client.until("session.closed", timeout=10)
    assert time.monotonic() - asked < 5  # not the 60 s wait
    assert closed["reason"] == "user_stop", closed
    assert await client.closed() == 1000
    assert not errors(client.received), errors(client.received)
    assert r.zcard(stack.keys.queue) == 0
    stack.start_worker()
    await served_end_to_end(stack.url())


async def test_a_close_while_the_session_waits_for_another_slot_ends_it_at_once(
    stack: Stack,
) -> None:
    """The whole node (Celery parent and pool process) is killed while the session's task waits
    in its queue, so no other slot comes: the session waits at the head of the queue (up to
    60 s here) until the client's ``session.close`` (``closed_while_waiting_for_a_slot``); no
    ``worker_connect_failed``."""
    stack.env["OMNISERVE_FAILOVER_WAIT_S"] = "60"
    worker = stack.start_worker(slots=1)
    stack.start_gateway(OMNISERVE_TASK_START_TIMEOUT_S="60")
    stack.wait_free(1)
    os.kill(worker.popen.pid, signal.SIGSTOP)
    client = await Client.connect(stack.url(), query="?mode=audio")
    await client.until("session.queue_done", timeout=10)
    await client.send({"type": "session.init", "payload": {}})
    kill9_group(worker)
    await closed_while_waiting_for_a_slot(stack, client)


async def test_a_close_while_a_chat_turn_waits_for_another_slot_ends_it_at_once(
    stack: Stack,
) -> None:
    """The same for a chat turn: its node is killed whole while the turn's task waits in its
    queue, the turn waits at the head of the queue, and the client's ``session.close`` ends the
    wait and the session (``user_stop``, 1000) within seconds, with no error."""
    stack.env["OMNISERVE_FAILOVER_WAIT_S"] = "60"
    worker = stack.start_worker(slots=1)
    stack.start_gateway(OMNISERVE_TASK_START_TIMEOUT_S="60")
    stack.wait_free(1)
    client = await Client.connect(stack.url(), query="?mode=chat")
    await client.until("session.queue_done")
    await client.send({"type": "session.init", "payload": {}})
    created = await client.until("session.created")
    r = stack.redis()
    os.kill(worker.popen.pid, signal.SIGSTOP)
    await client.send(
        {"type": "input.append", "input": {"messages": [{"role": "user", "content": "hi"}]}}
    )
    turn = f"{created['session_id']}_t1"
    wait_for(lambda: r.exists(stack.keys.chat_request(turn)), 10, "the turn's task")
    kill9_group(worker)
    await closed_while_waiting_for_a_slot(stack, client)
