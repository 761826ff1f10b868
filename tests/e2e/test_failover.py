"""Failover: a duplex session whose worker dies goes on on another worker.

Real processes; the worker running the session is killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson

from tests.support.client import Client, silence, speech
from tests.support.fault_harness import kill9, kill9_group, served_end_to_end
from tests.support.stack import Stack


def deltas(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in frames if f["type"] == "response.output.delta"]


def running_pid(stack: Stack, session_id: str) -> int:
    """The process that claimed the session (worker ids are ``<node>#<pid>``)."""
    owner = stack.redis().get(stack.keys.session_claim(session_id))
    assert owner, "the session was not claimed"
    return int(owner.decode().rsplit("#", 1)[1])


def prompts(path: Path) -> list[str]:
    with open(path, "rb") as fh:
        return [orjson.loads(line)["prompt"] for line in fh]


async def test_worker_killed_mid_session_recovers_with_the_conversation(
    stack: Stack, tmp_path: Path
) -> None:
    log = tmp_path / "prompts.jsonl"
    stack.env.update(
        {
            "OMNISERVE_SCRIPTED_REPLY": "the sky is blue today",
            "OMNISERVE_BACKEND_OPTIONS": orjson.dumps({"prompt_log": str(log)}).decode(),
        }
    )
    stack.start_worker()
    stack.start_worker()
    stack.start_gateway()
    client = await Client.connect(stack.url(), query="?mode=audio")
    created = await client.init({"system_prompt": "You are terse."})
    await client.step(speech())
    while "today" not in "".join(f.get("text", "") for f in deltas(client.received)):
        await client.step(silence())
    kill9(running_pid(stack, created["session_id"]))

    recovering = await client.until("session.recovering", timeout=10)
    recovered = await client.until("session.recovered", timeout=20)
    assert recovering["reason"] == "worker_lost"
    assert recovered["session_id"] == created["session_id"]
    assert recovered["seq"] == recovering["seq"] + 1
    assert recovered["metrics"]["history_turns"] == 1
    # the new worker's first prompt carries the earlier conversation (and the same init)
    first, restart = prompts(log)
    assert "the sky is blue today" not in first
    assert "You are terse." in restart and "the sky is blue today" in restart
    # input resumes on the new worker, the sequence goes on
    frames = await client.step(speech())
    assert deltas(frames) and all(f["seq"] > recovered["seq"] for f in deltas(frames))
    await client.send({"type": "session.close"})
    closed = await client.until("session.closed")
    assert closed["reason"] == "user_stop"
    assert await client.closed() == 1000


async def recovering_with_no_worker_left(stack: Stack, wait_s: int) -> Client:
    """A session whose only worker node is killed for good (SIGKILL to its process group),
    waiting up to ``wait_s`` at the head of the queue; returns its client (``recovering`` read)."""
    stack.env["OMNISERVE_FAILOVER_WAIT_S"] = str(wait_s)
    worker = stack.start_worker()
    stack.start_gateway()
    client = await Client.connect(stack.url(), query="?mode=audio")
    await client.init()
    await client.step(speech())
    kill9_group(worker)
    await client.until("session.recovering", timeout=10)
    return client


async def test_no_slot_within_failover_wait_ends_with_backend_error(stack: Stack) -> None:
    client = await recovering_with_no_worker_left(stack, wait_s=1)
    err = await client.until("error", timeout=15)
    assert err["error"]["code"] == "backend_error"
    closed = await client.until("session.closed", timeout=5)
    assert closed["reason"] == "backend_error"
    assert await client.closed() == 1011
    # the failover's ticket left the queue
    assert stack.redis().zcard(stack.keys.queue) == 0


async def test_a_close_while_the_failover_waits_for_a_slot_ends_the_session_at_once(
    stack: Stack,
) -> None:
    """The client's ``session.close`` while its session waits at the head of the queue for a
    new worker (none comes: the only one is gone, the wait is 60 s) ends the wait: the session
    closes as asked (``user_stop``, 1000) within seconds, with no ``backend_error``, and its
    ticket has left the queue; a worker started afterwards serves the next client at once."""
    client = await recovering_with_no_worker_left(stack, wait_s=60)
    await asyncio.sleep(0.5)  # waiting in the queue
    assert stack.redis().zcard(stack.keys.queue) == 1
    asked = time.monotonic()
    await client.send({"type": "session.close"})
    closed = await client.until("session.closed", timeout=10)
    assert time.monotonic() - asked < 5  # not the 60 s wait
    assert closed["reason"] == "user_stop"
    assert await client.closed() == 1000
    assert not [f for f in client.received if f["type"] == "error"], client.received
    assert stack.redis().zcard(stack.keys.queue) == 0
    stack.start_worker()
    await served_end_to_end(stack.url())
