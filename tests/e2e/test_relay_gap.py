"""Output lost between worker and gateway, caused for real: replayed from the log, or reported.

The gateway is frozen (SIGSTOP) and its pub/sub connection killed in Redis while a worker
streams a chat turn or steps queued duplex input, so every event published meanwhile is lost on
the channel and exists only in the session's replay log. When the gateway resumes it reconnects,
finds the hole by sequence number (or when the worker's lease is gone) and fills it from the
log. When the log's own cap has trimmed part of it, the hole cannot be filled: the client must
then be told (``output_gap``), with the exact range."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from streaming.events import event_head
from tests.support.client import Client, silence
from tests.support.stack import Stack

psutil = pytest.importorskip("psutil")

pytestmark = pytest.mark.asyncio

LOG_MAXLEN = 64  # the default replay log length (OMNISERVE_OUTPUT_LOG_MAXLEN)
LEASE_S = 60  # the leases of these tests: a gateway frozen for seconds must not look dead
# A chat turn that ended while its gateway was deaf is finished by the gateway when it reads the
# turn's lease gone. A freeze that lands inside the gateway's liveness read (after its start
# was stamped, before it was sent) looks like a Redis stall, and gone leases then read as held
# for one lease TTL (api/gateway/liveness.py, streaming/stalls.py): 60 s here, where the default is
# 1.5 s. The client waits that long and more (a CI run hit exactly that at a 60 s wait).
AFTER_THAW_S = LEASE_S + 30
SHORT = " ".join(f"w{i}" for i in range(1, 41))  # 43 events: the log keeps them all
LONG = " ".join(f"w{i}" for i in range(1, 401))  # 403 events: the log keeps the last ~100


def start(stack: Stack, token_delay_s: float) -> None:
    """Long leases: a gateway frozen for seconds must not look dead to the worker (its own
    alive key has a TTL of its own since the heal lane: ``gateway_lease_ttl_s``)."""
    stack.start_worker(
        OMNISERVE_LEASE_TTL_S=str(LEASE_S), OMNISERVE_SCRIPTED_TOKEN_DELAY_S=str(token_delay_s)
    )
    stack.start_gateway(
        OMNISERVE_LEASE_TTL_S=str(LEASE_S), OMNISERVE_GATEWAY_LEASE_TTL_S=str(LEASE_S)
    )


def _kill_pubsub(stack: Stack) -> None:
    """Drop the gateway's pub/sub connection in Redis (found by its local port)."""
    proc, _ = stack.gateways[0]
    ports = {c.laddr.port for c in psutil.Process(proc.popen.pid).net_connections("tcp")}
    r = stack.redis()
    victims = [
        c["id"]
        for c in r.client_list()
        if int(c.get("sub", 0)) + int(c.get("psub", 0)) > 0
        and int(c["addr"].rsplit(":", 1)[1]) in ports
    ]
    assert len(victims) == 1, victims
    r.client_kill_filter(_id=victims[0])


def _log(stack: Stack) -> list[dict]:
    r = stack.redis()
    # every session's log and every chat turn's (``{SESSION}_t<n>``: its session's tag)
    keys = r.keys(stack.keys.output_log("*").replace("{*}", "*"))
    return [orjson.loads(event_head(f[b"e"])) for k in keys for _, f in r.xrange(k)]


async def _wait(check: Callable[[], bool], what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(check):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def _deafen_gateway_until_the_turn_ends(stack: Stack) -> tuple[int, int]:
    """Freeze the gateway, cut its subscription, let the turn finish, then resume it.

    Returns how many events were emitted while it was deaf, and the first seq the log holds.
    """
    proc, _ = stack.gateways[0]
    os.killpg(proc.popen.pid, signal.SIGSTOP)
    try:
        _kill_pubsub(stack)
        cut_at = time.time()
        await _wait(lambda: any(e["type"] == "turn_end" for e in _log(stack)), "the turn's end")
        log = _log(stack)
        return sum(e["emitted_at"] > cut_at for e in log), log[0]["seq"]
    finally:
        os.killpg(proc.popen.pid, signal.SIGCONT)


def _turn(text: str, **extra: object) -> dict:
    return {"messages": [{"role": "user", "content": f"Reply with exactly: {text}"}], **extra}


async def test_legacy_chat_replays_output_lost_on_the_channel(stack: Stack) -> None:
    start(stack, token_delay_s=0.1)  # 4 s of streaming, all of it kept by the log
    c = await Client.connect(stack.url(), path="/ws/chat")
    await c.send(_turn(SHORT, tts={"enabled": False}))
    assert (await c.recv(30))["type"] == "prefill_done"
    deaf, first_held = await _deafen_gateway_until_the_turn_ends(stack)
    assert deaf > 0 and first_held == 1  # events were lost on the channel, none in the log
    frames = await c.collect_until("done", "error", timeout=AFTER_THAW_S)
    assert frames[-1]["type"] == "done", frames[-1]
    chunks = [f["text_delta"] for f in frames if f["type"] == "chunk"]
    assert "".join(chunks) == SHORT  # every delta, in order, none twice
    assert frames[-1]["text"] == SHORT
    assert await c.closed() == 1000


async def test_legacy_chat_reports_output_the_log_no_longer_holds(stack: Stack) -> None:
    start(stack, token_delay_s=0.03)  # the log (64 events, trimmed in whole nodes) drops most
    c = await Client.connect(stack.url(), path="/ws/chat")
    await c.send(_turn(LONG, tts={"enabled": False}))
    assert (await c.recv(30))["type"] == "prefill_done"
    deaf, first_held = await _deafen_gateway_until_the_turn_ends(stack)
    assert deaf > 0 and first_held > LOG_MAXLEN
    frames = await c.collect_until("done", "error", timeout=AFTER_THAW_S)
    chunks = [f["text_delta"] for f in frames if f["type"] == "chunk"]
    # seq 1 started, 2 prefill, then one per word: the hole starts after the last chunk received
    first_lost = 3 + len(chunks)
    assert frames[-1] == {
        "type": "error",
        "error": f"output_gap: output events {first_lost}..{first_held - 1} were lost "
        "and cannot be replayed",
    }
    assert LONG.startswith("".join(chunks))  # what came before the hole came in order
    assert await c.closed() == 1000  # spec/05: an error ends the request


async def test_realtime_chat_reports_the_gap_and_goes_on(stack: Stack) -> None:
    start(stack, token_delay_s=0.03)
    c = await Client.connect(stack.url(), query="?mode=chat")
    await c.init()
    await c.send(
        {"type": "input.append", "input": _turn(LONG, generation={"max_new_tokens": 1000})}
    )
    await c.until("response.output.delta", timeout=30)
    deaf, first_held = await _deafen_gateway_until_the_turn_ends(stack)
    assert deaf > 0 and first_held > LOG_MAXLEN
    frames = await c.collect_until("response.done", timeout=AFTER_THAW_S)
    texts = [f for f in frames if f.get("kind") == "text"]
    (gap,) = [i for i, f in enumerate(frames) if f["type"] == "error"]
    before = [f["text"] for f in texts if frames.index(f) < gap]
    after = [f["text"] for f in texts if frames.index(f) > gap]
    first_lost = 3 + 1 + len(before)  # started, prefill, the first delta (read before the cut)
    assert frames[gap]["error"] == {
        "code": "output_gap",
        "message": f"output events {first_lost}..{first_held - 1} were lost and cannot be replayed",
        "type": "server_error",
    }
    words = len(LONG.split())
    assert 1 + len(before) + (first_held - first_lost) + len(after) == words
    assert LONG.endswith("".join(after).strip())
    assert frames[-1]["text"] == LONG  # response.done carries the whole text
    # the session goes on: the next turn is complete
    await c.send({"type": "input.append", "input": _turn("ok")})
    assert (await c.until("response.done", timeout=30))["text"] == "ok"


async def _duplex_with_output_lost(stack: Stack) -> tuple[list[dict], int]:
    """A duplex session whose worker answers seven chunks while its gateway is deaf.

    Returns the frames after the answer to input_1, up to ``session.closed`` (the client closes
    once the worker is done), and the first seq the replay log still held.
    """
    stack.start_worker(OMNISERVE_LEASE_TTL_S=str(LEASE_S), OMNISERVE_SCRIPTED_STEP_DELAY_S="0.5")
    stack.start_gateway(
        OMNISERVE_LEASE_TTL_S=str(LEASE_S),
        OMNISERVE_GATEWAY_LEASE_TTL_S=str(LEASE_S),
        OMNISERVE_INPUT_MAX_PENDING="16",
    )
    c = await Client.connect(stack.url(), query="?mode=audio")
    await c.init()
    for _ in range(8):  # queued in the input stream (nothing is dropped: 16 may wait)
        await c.send({"type": "input.append", "input": {"audio": silence()}})
    await c.until("response.output.delta")  # input_1 answered: the worker steps the rest
    proc, _ = stack.gateways[0]
    os.killpg(proc.popen.pid, signal.SIGSTOP)
    try:
        _kill_pubsub(stack)
        await _wait(
            lambda: any(e.get("input_id") == "input_8" for e in _log(stack)), "input_8's answer"
        )
    finally:
        os.killpg(proc.popen.pid, signal.SIGCONT)
    await c.send({"type": "session.close"})  # its Closed arrives live, after the hole
    frames = await c.collect_until("session.closed", timeout=30)
    # the log as the gateway read it (Closed, the last event, may have trimmed it further)
    return frames, _log(stack)[0]["seq"]


async def test_duplex_replays_output_lost_on_the_channel(stack: Stack) -> None:
    frames, first_held = await _duplex_with_output_lost(stack)
    assert first_held == 1
    assert not [f for f in frames if f["type"] == "error"]
    listens = [f["input_id"] for f in frames if f.get("kind") == "listen"]
    assert listens == [f"input_{n}" for n in range(2, 9)]  # in order, none twice
    assert frames[-1]["reason"] == "user_stop"


async def test_duplex_reports_output_the_log_no_longer_holds(stack: Stack) -> None:
    # Small stream nodes let the log's own cap (MAXLEN ~ 2) trim it finely.
    r = stack.redis()
    node = r.config_get("stream-node-max-entries")["stream-node-max-entries"]
    r.config_set("stream-node-max-entries", 2)
    stack.env["OMNISERVE_OUTPUT_LOG_MAXLEN"] = "2"
    try:
        frames, first_held = await _duplex_with_output_lost(stack)
    finally:
        r.config_set("stream-node-max-entries", node)
    # seq 1 started, 2 created, 3 input_1's listen (received), 4.. the rest of the listens
    assert first_held > 4
    (gap,) = [f for f in frames if f["type"] == "error"]
    assert gap["error"]["code"] == "output_gap"
    assert gap["error"]["message"].startswith(f"output events 4..{first_held - 1} were lost")
    listens = [f["input_id"] for f in frames if f.get("kind") == "listen"]
    first_kept = first_held - 2  # input_n's listen is seq n + 2
    assert listens == [f"input_{n}" for n in range(first_kept, 9)]
    assert frames.index(gap) < frames.index(next(f for f in frames if f.get("kind") == "listen"))
    # and the gateway's metrics count it, as a gap and as an error sent
    metrics = httpx.get(f"http://127.0.0.1:{stack.gateways[0][1]}/metrics", timeout=5).text
    samples = {
        (s.name, s.labels.get("code")): s.value
        for family in text_string_to_metric_families(metrics)
        for s in family.samples
    }
    assert samples[("omniserve_output_gaps_total", None)] == 1
    assert samples[("omniserve_errors_total", "output_gap")] == 1
    assert frames[-1]["type"] == "session.closed"
