"""Redis refusing writes for 8 s under running duplex sessions and a chat turn: full
(``maxmemory`` reached, ``noeviction``: every write that could grow it refused), ``MISCONF``
(an RDB save failed, as when the disk of Redis's host fills up: every write refused) or
``READONLY`` (made a replica of a primary nobody runs: Sentinel demoting it, an operator's
``REPLICAOF``). Redis answers every read on time meanwhile.

The workers cannot renew their session leases meanwhile: a gateway whose own lease renewal is
refused reads leases as held until its writes go through again (``streaming/stalls.py``), so it
takes no worker for dead; it refuses new clients with the reason and says so on ``/health``; a
stop Redis refused (a client's close, a record's end) is written again until it takes it
(``api/gateway/worker_stops.py``), so every slot comes back. Output Redis refuses is held and
written whole once it takes writes (``streaming/outage.refuses_writes``).

The role change of ``readonly`` ends every blocking read with ``UNBLOCKED``; such a read is made
again (``streaming/redis_connection.unblocked``).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
import redis

from omniserve.redis_server import free_port
from tests.support.chat_turn import WORDS, start_chat_turn
from tests.support.client import Client
from tests.support.fault_harness import (
    DuplexProbe,
    RestartableRedis,
    all_slots_back,
    await_for,
    log_text,
    wait_for,
)
from tests.support.stack import Stack

FULL_S = 8.0  # past the session leases (1.5 s) and the gateway's own (6 s)


def health(stack: Stack) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{stack.gateways[0][1]}/health", timeout=5)


def refuse_writes(server: RestartableRedis, r: redis.Redis, refusal: str) -> None:
    """Make Redis refuse writes: ``maxmemory`` below what it uses already (writes that could
    grow it refused; ``DEL``, ``SREM`` still taken), or ``misconf``: an RDB save that failed
    with save points set (``stop-writes-on-bgsave-error``, the default: every write and even
    ``PING`` answered ``MISCONF``, as when the disk of Redis's host fills up), or ``readonly``:
    a replica of a primary that does not answer (it keeps its data, serves reads, refuses writes
    with ``READONLY``)."""
    if refusal == "maxmemory":
        r.config_set("maxmemory", "1")
        return
    if refusal == "readonly":
        r.replicaof("127.0.0.1", str(free_port()))  # a master nobody runs: its data kept
        return
    assert server.server is not None
    target = Path(server.server.workdir) / r.config_get("dbfilename")["dbfilename"]
    target.mkdir()  # the save's final rename onto a non-empty directory fails
    (target / "in-the-way").touch()
    r.config_set("save", "3600 1")
    r.bgsave()
    wait_for(lambda: r.info("persistence")["rdb_last_bgsave_status"] == "err", 10, "save fails")


def take_writes(r: redis.Redis, refusal: str) -> None:
    """Undo ``refuse_writes``: no memory limit; no save points (a failed save stops writes only
    while some are set); a primary again."""
    if refusal == "maxmemory":
        r.config_set("maxmemory", "0")
    elif refusal == "readonly":
        r.replicaof("NO", "ONE")
    else:
        r.config_set("save", "")


@pytest.mark.slow
@pytest.mark.parametrize("refusal", ["maxmemory", "misconf", "readonly"])
async def test_sessions_ride_through_a_redis_refusing_writes(
    own_redis: RestartableRedis, own_stack: Stack, refusal: str
) -> None:
    stack = own_stack
    slow = {"OMNISERVE_BACKEND_OPTIONS": '{"token_delay_s": 0.3}'}  # (chat turns only)
    workers = [stack.start_worker(slots=6, **slow), stack.start_worker(**slow)]
    stack.start_gateway()
    riders = [await DuplexProbe.open(stack.url()) for _ in range(3)]
    closer = await DuplexProbe.open(stack.url())  # sends session.close while Redis is full
    leaver = await DuplexProbe.open(stack.url())  # its connection drops while Redis is full
    probes = [*riders, closer, leaver]
    chat = await start_chat_turn(stack.url())  # 40 words, one every 0.3 s: across the refusals
    # a 60 s turn whose client closes while Redis refuses writes: its worker must stop it once
    # Redis takes the close, not generate on for nobody with the slot held
    quitter = await start_chat_turn(stack.url(), words=200)
    r = stack.redis()
    try:
        await await_for(lambda: all(p.deltas_after(0) > 0 for p in probes), 30, "first deltas")
        full = time.monotonic()
        refuse_writes(own_redis, r, refusal)
        try:
            await await_for(
                lambda: health(stack).json()["redis_writable"] is False, 5, "/health to say it"
            )
            answer = health(stack)
            body = answer.json()
            assert answer.status_code == 503 and body["status"] == "degraded", body
            assert any("Redis refuses writes" in note for note in body["notes"]), body
            ready = httpx.get(f"http://127.0.0.1:{stack.gateways[0][1]}/readyz", timeout=5)
            assert ready.status_code == 503 and ready.json()["redis_writable"] is False
            # a new client is refused with the reason, not told that no worker is up
            late = await Client.connect(stack.url(), query="?mode=audio")
            refused = await late.until("error", timeout=10)
            assert refused["error"]["code"] == "service_unavailable", refused
            assert "Redis refuses writes" in refused["error"]["message"], refused
            await late.close()
            await closer.client.send({"type": "session.close"})
            leaver.client.ws.transport.abort()
            await quitter.send({"type": "session.close"})
            await asyncio.sleep(max(0.0, full + FULL_S - time.monotonic()))
        finally:
            take_writes(r, refusal)
        refilled = time.monotonic()
        # the chat turn's deltas wait for Redis, and the turn ends whole
        frames = await chat.collect_until("response.done", "error", timeout=60)
        deltas = "".join(f["text"] for f in chat.received if f["type"] == "response.output.delta")
        assert frames[-1]["type"] == "response.done", frames[-1]
        assert frames[-1]["text"] == deltas == " ".join(["word"] * WORDS)
        # the two ended sessions' and the closed turn's workers hear of it now and give their
        # slots back (and the other turn, done)
        await await_for(lambda: stack.free_slots() == 4, 15, "the ended sessions' and turn's slots")
        # and the closed chat session's record says so: no resume lets it in again
        created = next(f for f in quitter.received if f["type"] == "session.created")
        sid, token = created["session_id"], created["resume_token"]
        late = await Client.resume(stack.url(), sid, token, 0, mode="chat")
        assert (await late.until("error"))["error"]["code"] == "resume_expired"
        await late.close()
        await asyncio.sleep(max(0.0, refilled + 4.0 - time.monotonic()))
        for p in riders:
            seen = [(round(t - full, 2), f) for t, f in p.frames if t > full]
            kinds = [f["type"] for _, f in seen]
            assert p.closed_at is None, seen
            assert "session.recovering" not in kinds and "session.closed" not in kinds, kinds
            assert p.deltas_after(refilled + 2.0) > 0, kinds  # the session goes on answering
            lost = [f["error"] for _, f in seen if f["type"] == "error"]
            assert len(lost) == 1, lost  # one report for the run of chunks Redis refused
            assert lost[0]["code"] == "inference_error", lost
            assert "was not queued" in lost[0]["message"], lost
        assert closer.closed_reason() == "user_stop", closer.frames[-3:]
        assert health(stack).status_code == 200
    finally:
        for p in probes:
            await p.close()
        await chat.close()
        await quitter.close()
    all_slots_back(stack, 7)
    # (MISCONF answers the consumer's BRPOP too: Celery took that error for fatal, and each
    # worker exited with its sessions)
    assert all(worker.alive() for worker in workers)
    gateway_log = log_text(stack.gateways[0][0])
    assert "Redis refuses writes" in gateway_log
    assert "went through at try" in gateway_log  # the stops Redis refused at first
