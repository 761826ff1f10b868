"""Calls that outlive the context window: rollover, ``context_full`` without it, the duration
limit per deployment and per API key, and the opt-in ``session.expiring`` notice.

A real gateway and scripted worker; the scripted backend counts 16 tokens per step, so a small
KV budget (``OMNISERVE_ROLLOVER_KV_TOKENS``) makes a call of a few dozen steps roll over several
times.
"""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest
import websockets

from tests.support.client import Client, silence, speech
from tests.support.stack import Stack

pytestmark = pytest.mark.asyncio

REPLY = "one two three four five six"  # two speaking steps of three words


async def duplex(url: str, payload: dict | None = None, query: str = "") -> tuple[Client, dict]:
    c = await Client.connect(url, query=f"?mode=audio{query}")
    await c.until("session.queue_done", timeout=30)
    await c.send({"type": "session.init", "payload": payload or {}})
    return c, await c.until("session.created")


def kv_of(frame: dict) -> int | None:
    if frame.get("type") == "response.output.delta" and "kv_cache_length" in frame["metrics"]:
        return int(frame["metrics"]["kv_cache_length"])
    return None


async def test_a_long_call_rolls_over_instead_of_filling_its_context(
    stack: Stack, tmp_path: Path
) -> None:
    log = tmp_path / "prompts.jsonl"
    stack.start_worker(
        OMNISERVE_ROLLOVER_KV_TOKENS="200",
        OMNISERVE_ROLLOVER_PRIME_TOKENS="40",
        OMNISERVE_SCRIPTED_REPLY=REPLY,
        OMNISERVE_BACKEND_OPTIONS=orjson.dumps(
            {"prompt_log": str(log), "transcript": "hello there"}
        ).decode(),
    )
    stack.start_gateway()
    c, created = await duplex(stack.url(), {"system_prompt": "Be brief."})
    # a conversation: speech, a pause the model answers in two steps, and so on (~30 turns)
    for _ in range(30):
        for audio in (speech(), silence(), silence(), silence()):
            frames = await c.step(audio)
            assert not [f for f in frames if f["type"] in ("error", "session.closed")], frames
    rollovers = [f for f in c.received if f["type"] == "session.rollover"]
    assert len(rollovers) >= 3, [f["type"] for f in c.received]
    kvs = [kv for kv in map(kv_of, c.received) if kv is not None]
    assert max(kvs) < 8192 and max(kvs) <= 200 + 16 * 3  # never near the model's limit
    for r in rollovers:
        assert r["session_id"] == created["session_id"]
        assert r["kv_cache_length"] < r["metrics"]["kv_cache_length_before"]
        assert r["metrics"]["history_turns"] >= 1
    # after each rollover the next delta's cache starts from the prime, far below the budget
    for i, f in enumerate(c.received):
        if f["type"] == "session.rollover":
            after = next(kv for kv in map(kv_of, c.received[i + 1 :]) if kv is not None)
            assert after <= f["kv_cache_length"] + 16
    # seq stays gapless across the extension events (resume replays them like any other)
    seqs = [f["seq"] for f in c.received if "seq" in f]
    assert seqs == list(range(1, len(seqs) + 1))
    # the prime: the system prompt first, then the newest turns the prime budget holds
    prompts = [orjson.loads(line)["prompt"] for line in log.read_bytes().splitlines()]
    assert len(prompts) == 1 + len(rollovers)
    for p in prompts[1:]:
        assert p.startswith("Be brief.") and "Assistant: one two three four five six" in p
        assert "User: hello there" in p
        assert len(p.split()) <= 2 + 40  # the prime budget (scripted: a token per word)
    # each one counted for Prometheus in the node's persisted counters
    counted = 0.0
    for key in stack.redis().scan_iter(match=stack.keys.node_counters("*")):
        value = stack.redis().hget(key, "omniserve_duplex_rollovers_total|scripted")
        counted += float(value or 0)
    assert counted == len(rollovers)
    await c.send({"type": "session.close"})
    assert (await c.until("session.closed"))["reason"] == "user_stop"
    stack.wait_free(1, timeout=10)


async def talk_until(c: Client, kind: str, timeout: float = 20) -> dict:
    """Step silence (a client that sends nothing is ended as idle) until a ``kind`` frame."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for f in await c.step(silence()):
            if f["type"] == kind:
                return f
            assert f["type"] != "session.closed", f
    raise AssertionError(f"no {kind} within {timeout} s")


async def test_with_rollover_off_the_context_fills_and_the_session_ends(stack: Stack) -> None:
    stack.start_worker(OMNISERVE_ROLLOVER="false", OMNISERVE_SCRIPTED_TOKENS_PER_STEP="1000")
    stack.start_gateway()
    c, _ = await duplex(stack.url(), {"extensions": ["session.expiring"]})
    while (await c.step(silence()))[-1]["metrics"]["kv_cache_length"] < 8192:
        pass
    assert (await c.until("session.closed"))["reason"] == "context_full"
    assert not [f for f in c.received if f["type"] == "session.rollover"]
    # the opt-in notice told the context's end ahead (1000 tokens a second: ~8 s of context)
    expiring = [f for f in c.received if f["type"] == "session.expiring"]
    assert [e["reason"] for e in expiring] == ["context"]
    assert 0 <= expiring[0]["time_left_ms"] <= 30_000


async def test_expiring_comes_the_lead_before_the_duration_end(stack: Stack) -> None:
    stack.start_worker(OMNISERVE_EXPIRING_NOTICE_S="2")
    stack.start_gateway(OMNISERVE_AUDIO_DURATION_S="6")
    t0 = time.time()
    c, _ = await duplex(stack.url(), {"extensions": ["session.expiring"]})
    expiring = await talk_until(c, "session.expiring")
    told_at = time.time()
    assert expiring["reason"] == "duration"
    assert 1_000 <= expiring["time_left_ms"] <= 2_000
    frames = await c.collect_until("session.closed", timeout=15)
    assert frames[-1]["reason"] == "timeout"
    ended_at = time.time()
    assert ended_at - told_at == pytest.approx(expiring["time_left_ms"] / 1000, abs=1.0)
    assert ended_at - t0 == pytest.approx(6, abs=1.5)


async def test_a_spec_only_client_never_sees_the_notice(stack: Stack) -> None:
    stack.start_worker(OMNISERVE_EXPIRING_NOTICE_S="5")
    stack.start_gateway(OMNISERVE_AUDIO_DURATION_S="4")
    c, _ = await duplex(stack.url())
    await talk_until_closed(c)
    assert c.received[-1]["reason"] == "timeout"
    assert not [f for f in c.received if f["type"] == "session.expiring"]


async def talk_until_closed(c: Client, timeout: float = 20) -> None:
    """Step silence until ``session.closed``: the session may end between two steps, its
    connection closed before the next chunk goes out (the frames it sent are still read)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            frames = await c.step(silence())
        except websockets.ConnectionClosed:
            frames = await c.collect_until("session.closed", timeout=5)
        if frames[-1]["type"] == "session.closed":
            return
    raise AssertionError(f"not closed within {timeout} s")


async def test_an_api_key_has_its_own_duration_limit(stack: Stack) -> None:
    keys = orjson.dumps(["short-key", "plain-key"]).decode()
    durations = orjson.dumps([{"key": "short-key", "audio_s": 3}]).decode()
    stack.start_worker(OMNISERVE_EXPIRING_NOTICE_S="1")
    stack.start_gateway(
        OMNISERVE_API_KEYS=keys,
        OMNISERVE_API_KEY_DURATIONS=durations,
        OMNISERVE_AUDIO_DURATION_S="60",
    )
    t0 = time.time()
    short, _ = await duplex(stack.url(), {"extensions": ["session.expiring"]}, "&api_key=short-key")
    expiring = await talk_until(short, "session.expiring")
    assert expiring["reason"] == "duration" and expiring["time_left_ms"] <= 1_000
    await talk_until_closed(short)
    assert short.received[-1]["reason"] == "timeout"
    assert time.time() - t0 == pytest.approx(3, abs=1.5)
    stack.wait_free(1, timeout=10)
    # another key keeps the deployment's limit: its session goes on past the other's end
    plain, _ = await duplex(stack.url(), {"extensions": ["session.expiring"]}, "&api_key=plain-key")
    start = time.time()
    while time.time() - start < 4.5:
        frames = await plain.step(silence())
        assert not [f for f in frames if f["type"] in ("session.closed", "session.expiring")]
    await plain.close()
