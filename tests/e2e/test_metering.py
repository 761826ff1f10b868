"""Metering against real gateways and a scripted worker: usage records per response, session and
key (``response.done`` / ``session.closed`` ``usage``, the usage API, the CLI, the Prometheus
counters) summed over several sessions against what the client sent and received; named keys
created, rotated and revoked live and refused on another gateway within a second; quotas that
refuse before admission with no slot held, and a per-call cap announced by ``session.expiring``;
a resumed or failed-over session that keeps its one place and counts as one session.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from websockets.exceptions import ConnectionClosed

from tests.support.client import Client, decode_audio, jpeg_b64, silence, speech
from tests.support.fault_harness import kill9
from tests.support.stack import ROOT, Stack

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


def http(stack: Stack, i: int = 0) -> str:
    return f"http://127.0.0.1:{stack.gateways[i][1]}"


def create_key(stack: Stack, name: str, **quota: Any) -> str:
    r = httpx.post(f"{http(stack)}/v1/admin/keys", json={"name": name, "quota": quota}, timeout=10)
    assert r.status_code == 201, r.text
    assert r.json()["name"] == name and r.json()["state"] == "active"
    return str(r.json()["key"])


def cli(stack: Stack, *args: str) -> Any:
    """``omniserve ARGS --json`` against the stack's Redis; its JSON answer."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNISERVE_")}
    env.update(OMNISERVE_REDIS_URL=stack.redis_url, OMNISERVE_KEY_PREFIX=stack.prefix)
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(
        [sys.executable, "-m", "omniserve", *args, "--json"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return orjson.loads(out.stdout)


class Tally:
    """What a client sent and received, in the usage record's figures."""

    def __init__(self) -> None:
        self.audio_in_s = 0.0
        self.audio_out_s = 0.0
        self.frames_in = 0
        self.responses = 0
        self.sessions = 0
        self.response_usage: list[dict[str, Any]] = []  # duplex: each response's own record

    def received(self, frames: list[dict[str, Any]]) -> None:
        for f in frames:
            if f["type"] == "response.output.delta" and f["kind"] == "audio":
                self.audio_out_s += len(decode_audio(f["audio"])) / 24000
            if f["type"] == "response.output.delta" and f.get("metrics", {}).get("end_of_turn"):
                self.responses += 1
                self.response_usage.append(f["metrics"]["usage"])
            if f["type"] == "response.done":
                self.responses += 1


async def duplex_call(url: str, mode: str, key: str, tally: Tally) -> dict[str, Any]:
    """One spoken exchange (speech, then silence until the response ends); session.closed."""
    c = await Client.connect(url, query=f"?mode={mode}&api_key={key}")
    created = await c.init()
    frames_per_chunk = 2 if mode == "video" else 0
    extra = {"video_frames": [jpeg_b64()] * frames_per_chunk} if frames_per_chunk else {}
    chunks = [speech(1.0), silence(1.0)] + [silence(1.0)] * 8
    for chunk in chunks:
        got = await c.step(chunk, **extra)
        tally.audio_in_s += len(decode_audio(chunk)) / 16000
        tally.frames_in += frames_per_chunk
        tally.received(got)
        if any(f.get("metrics", {}).get("end_of_turn") for f in got):
            break
    await c.send({"type": "session.close"})
    rest = await c.collect_until("session.closed", timeout=20)
    tally.received(rest)
    tally.sessions += 1
    closed = rest[-1]
    assert closed["reason"] == "user_stop" and closed["session_id"] == created["session_id"]
    return {**closed["usage"], "session_id": closed["session_id"]}


async def chat_call(url: str, key: str, tally: Tally) -> dict[str, Any]:
    """One chat turn with text to say back; its response.done."""
    c = await Client.connect(url, query=f"?mode=chat&api_key={key}")
    await c.until("session.queue_done", timeout=30)
    await c.send({"type": "session.init", "payload": {}})
    await c.until("session.created")
    message = {"role": "user", "content": "Reply with exactly: one two three"}
    await c.send({"type": "input.append", "input": {"messages": [message]}})
    frames = await c.collect_until("response.done", timeout=30)
    tally.received(frames)
    await c.send({"type": "session.close"})
    await c.until("session.closed")
    tally.sessions += 1
    return dict(frames[-1])


async def talk_until_closed(c: Client) -> dict[str, Any]:
    """Silence until the session ends; its session.closed (the server may close between two
    chunks: then the frame is still there to read)."""
    while True:
        try:
            got = await c.step(silence())
        except ConnectionClosed:
            return await c.until("session.closed")
        if got[-1]["type"] == "session.closed":
            return got[-1]


async def eventually(check: Any, timeout: float = 20.0) -> Any:
    """``check()`` until it returns something true (the last flush follows the socket's close)."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, "not within the deadline"
        await asyncio.sleep(0.2)


async def test_usage_adds_up_over_sessions(stack: Stack, tmp_path: Path) -> None:
    stack.start_worker(slots=1)
    stack.start_gateway(OMNISERVE_RECORDINGS="true", OMNISERVE_RECORDINGS_URL=tmp_path.as_uri())
    key = create_key(stack, "acme")
    url = stack.url()
    tally = Tally()
    closed = [
        await duplex_call(url, "audio", key, tally),
        await duplex_call(url, "video", key, tally),
    ]
    done = await chat_call(url, key, tally)
    assert done["text"] == "one two three"
    per_response = done["usage"]  # the turn's own record: what it generated, what it took
    assert per_response["responses"] == 1 and per_response["text_tokens_out"] >= 3
    assert per_response["worker_s"] > 0 and per_response["text_tokens_in"] > 0
    for usage in closed:  # each session's record: what its client sent and received
        assert usage["sessions"] == 1 and usage["worker_s"] > 0 and usage["session_s"] > 0
        assert usage["audio_out_s"] > 0 and usage["text_tokens_out"] > 0
    assert sum(u["audio_in_s"] for u in closed) == pytest.approx(tally.audio_in_s, abs=0.01)
    assert sum(u["audio_out_s"] for u in closed) == pytest.approx(tally.audio_out_s, abs=0.01)
    assert sum(u["frames_in"] for u in closed) == tally.frames_in == closed[1]["frames_in"]
    # each duplex response's own record, on its last delta; they add up to what was sent
    assert len(tally.response_usage) == 2 and all(u["responses"] == 1 for u in tally.response_usage)
    assert sum(u["audio_out_s"] for u in tally.response_usage) == pytest.approx(
        sum(u["audio_out_s"] for u in closed), abs=0.01
    )
    # the recording's metadata has the session's record, and its own count of the audio agrees
    for usage in closed:

        def meta(sid: str = usage["session_id"]) -> dict[str, Any] | None:
            r = httpx.get(f"{http(stack)}/v1/recordings/{sid}", timeout=10)
            return r.json()["meta"] if r.status_code == 200 else None

        recorded = await eventually(meta)
        assert recorded["key"] == "acme"
        assert recorded["usage"]["audio_in_s"] == usage["audio_in_s"]
        assert recorded["usage"]["audio_out_s"] == usage["audio_out_s"]
        assert recorded["input"]["audio_s"] == pytest.approx(usage["audio_in_s"], abs=0.01)
        assert recorded["output"]["audio_s"] == pytest.approx(usage["audio_out_s"], abs=0.01)

    def totals() -> dict[str, Any] | None:
        r = httpx.get(f"{http(stack)}/v1/admin/usage", params={"key": "acme"}, timeout=10)
        total: dict[str, Any] = r.json()["keys"]["acme"]["total"]
        return total if total["sessions"] == tally.sessions else None

    total = await eventually(totals)
    assert total["audio_in_s"] == pytest.approx(tally.audio_in_s, abs=0.01)
    assert total["audio_out_s"] == pytest.approx(tally.audio_out_s, abs=0.01)
    assert total["frames_in"] == tally.frames_in
    assert total["responses"] == tally.responses
    assert (
        total["text_tokens_out"]
        == sum(u["text_tokens_out"] for u in closed) + (per_response["text_tokens_out"])
    )
    # the same figures by the day, from the CLI, and as Prometheus counters
    report = cli(stack, "usage", "--day", "--key", "acme")
    assert report["keys"]["acme"]["total"] == total
    metrics = httpx.get(f"{http(stack)}/metrics", timeout=10).text
    line = next(
        ln
        for ln in metrics.splitlines()
        if ln.startswith('omniserve_key_usage_total{figure="audio_in_s",key="acme"}')
    )
    assert float(line.split()[-1]) == pytest.approx(tally.audio_in_s, abs=0.01)
    # a gateway restarted reads the same aggregates
    stack.gateways[0][0].stop()
    stack.start_gateway()
    r = httpx.get(f"{http(stack, 1)}/v1/admin/usage", params={"key": "acme"}, timeout=10)
    assert r.json()["keys"]["acme"]["total"] == total


async def test_keys_are_checked_live_on_every_gateway(stack: Stack) -> None:
    stack.start_gateway()
    stack.start_gateway()
    made = cli(stack, "keys", "create", "beta")
    key = made["key"]
    second = stack.url(1)

    async def first_frame(query: str) -> tuple[dict[str, Any], int | None]:
        c = await Client.connect(second, query=f"?mode=chat{query}")
        frame = await c.recv(timeout=20)
        if frame["type"] == "error":
            return frame, await c.closed()
        await c.close()
        return frame, None

    assert (await first_frame(f"&api_key={key}"))[0]["type"] == "session.queue_done"
    assert httpx.get(f"{http(stack, 1)}/web/config", timeout=10).json()["api_key_required"]
    for query, why in [
        ("", "missing or invalid API key"),  # a named key exists: a key is required
        ("&api_key=osk_nope", "missing or invalid API key"),
        ("&api_key=" + "x" * 300, "malformed API key"),
    ]:
        frame, close = await first_frame(query)
        assert frame["error"]["code"] == "unauthorized" and frame["error"]["message"] == why
        assert close == 1008
    # bad requests to the admin endpoints get their status, and change nothing
    base = f"{http(stack)}/v1/admin"
    assert httpx.post(f"{base}/keys", json={"name": "Bad Name"}).status_code == 422
    assert httpx.post(f"{base}/keys", json={"name": "settings"}).status_code == 422
    assert httpx.post(f"{base}/keys", json={"name": "beta"}).status_code == 409
    assert httpx.post(f"{base}/keys/nobody/rotate").status_code == 404
    bad_quota = {"max_sessions": -1}
    assert httpx.put(f"{base}/keys/beta/quota", json=bad_quota).status_code == 422
    assert httpx.get(f"{base}/usage", params={"granularity": "week"}).status_code == 422
    assert httpx.get(f"{base}/usage", params={"since": 10, "until": 5}).status_code == 422
    # rotated on the first gateway: the old key is refused on the second within a second
    rotated = httpx.post(f"{http(stack)}/v1/admin/keys/beta/rotate", timeout=10).json()["key"]
    await asyncio.sleep(1.0)
    assert (await first_frame(f"&api_key={key}"))[0]["error"]["code"] == "unauthorized"
    assert (await first_frame(f"&api_key={rotated}"))[0]["type"] == "session.queue_done"
    revoked = cli(stack, "keys", "revoke", "beta")
    assert revoked["state"] == "revoked"
    await asyncio.sleep(1.0)
    frame, close = await first_frame(f"&api_key={rotated}")
    assert frame["error"] == {
        "code": "unauthorized",
        "message": "API key revoked",
        "type": "client_error",
    }
    assert close == 1008
    listing = cli(stack, "keys", "ls")["keys"]
    assert [(k["name"], k["state"]) for k in listing] == [("beta", "revoked")]
    assert "digest" not in listing[0] and key not in orjson.dumps(listing).decode()


async def test_quotas_refuse_before_admission(stack: Stack) -> None:
    stack.start_worker(slots=2, OMNISERVE_EXPIRING_NOTICE_S="1")
    stack.start_gateway(OMNISERVE_USAGE_FLUSH_S="0.5")
    key = create_key(stack, "gamma", max_sessions=1, max_session_s=4)
    first = await Client.connect(stack.url(), query=f"?mode=audio&api_key={key}")
    await first.init({"extensions": ["session.expiring"]})
    # a second session of the key: refused at once, nothing held (one slot busy, one free)
    over = await Client.connect(stack.url(), query=f"?mode=audio&api_key={key}")
    frame = await over.recv(timeout=20)
    assert frame["type"] == "error" and frame["error"]["code"] == "quota_exceeded", frame
    assert frame["error"]["type"] == "client_error"
    assert await over.closed() == 1008
    assert stack.free_slots() == 1
    assert stack.redis().zcard(stack.keys.queue) == 0
    assert stack.redis().zcard(stack.keys.key_sessions("gamma")) == 1
    # the key's longest session: announced, then ended at its own cap, not before
    expiring = None
    while expiring is None:
        got = await first.step(silence())
        assert got[-1]["type"] != "session.closed", got
        expiring = next((f for f in got if f["type"] == "session.expiring"), None)
    assert expiring["reason"] == "duration" and expiring["time_left_ms"] <= 1000
    closed = await talk_until_closed(first)
    assert closed["reason"] == "timeout" and closed["usage"]["session_s"] == pytest.approx(
        4, abs=1.5
    )
    stack.wait_free(2)
    assert stack.redis().zcard(stack.keys.key_sessions("gamma")) == 0  # released, not negative
    # session-minutes per day: the 4 s used are over an allowance of 3 s
    r = httpx.put(
        f"{http(stack)}/v1/admin/keys/gamma/quota", json={"minutes_per_day": 0.05}, timeout=10
    )
    assert r.status_code == 200 and r.json()["quota"]["minutes_per_day"] == 0.05
    await asyncio.sleep(1.0)  # (the gateways' key cache)
    over = await Client.connect(stack.url(), query=f"?mode=audio&api_key={key}")
    frame = await over.recv(timeout=20)
    assert (
        frame["error"]["code"] == "quota_exceeded"
        and "session-minutes" in frame["error"]["message"]
    )
    assert await over.closed() == 1008
    assert stack.free_slots() == 2


async def test_a_resumed_session_keeps_its_one_place(stack: Stack) -> None:
    """A session resumed on another gateway is not refused by its key's concurrent limit, is
    counted once there, and is counted as one session in the key's usage."""
    stack.start_worker(slots=2)
    stack.start_gateway()
    stack.start_gateway()
    key = create_key(stack, "delta", max_sessions=1)
    first = await Client.connect(stack.url(0), query=f"?mode=audio&api_key={key}")
    created = await first.init()
    await first.step(speech())
    await first.ws.close()  # the client vanishes; the session waits for its resume
    last = max((f["seq"] for f in first.received if "seq" in f), default=0)
    second = await Client.connect(stack.url(1), query=f"?mode=audio&api_key={key}")
    await second.send(
        {
            "type": "session.resume",
            "session_id": created["session_id"],
            "resume_token": created["resume_token"],
            "last_seq": last,
        }
    )
    resumed = await second.until("session.resumed", "error")
    assert resumed["type"] == "session.resumed", resumed
    assert stack.redis().zrange(stack.keys.key_sessions("delta"), 0, -1) == [
        created["session_id"].encode()
    ]
    third = await Client.connect(stack.url(0), query=f"?mode=audio&api_key={key}")
    frame = await third.recv(timeout=20)
    assert frame["type"] == "error" and frame["error"]["code"] == "quota_exceeded"
    await second.step(silence())
    await second.send({"type": "session.close"})
    closed = await second.until("session.closed")
    assert closed["usage"]["sessions"] == 1
    stack.wait_free(2)
    assert stack.redis().zcard(stack.keys.key_sessions("delta")) == 0

    def usage() -> dict[str, Any] | None:
        r = httpx.get(f"{http(stack)}/v1/admin/usage", params={"key": "delta"}, timeout=10)
        total: dict[str, Any] = r.json()["keys"].get("delta", {}).get("total", {})
        return total if total.get("sessions") == 1 else None

    total = await eventually(usage)
    # both connections' parts: the two chunks sent, one on each
    assert total["audio_in_s"] == pytest.approx(2.0, abs=0.01)


async def test_a_failed_over_session_is_counted_once(stack: Stack) -> None:
    """The worker of a session of a key at its concurrent limit dies: the session goes on on
    another worker without being refused or counted again, and its usage is one session."""
    stack.start_worker()
    stack.start_worker()
    stack.start_gateway()
    key = create_key(stack, "zeta", max_sessions=1)
    client = await Client.connect(stack.url(), query=f"?mode=audio&api_key={key}")
    created = await client.init()
    await client.step(speech())
    owner = stack.redis().get(stack.keys.session_claim(created["session_id"]))
    assert owner, "the session was not claimed"
    kill9(int(owner.decode().rsplit("#", 1)[1]))
    await client.until("session.recovering", timeout=10)
    await client.until("session.recovered", timeout=30)
    await client.step(speech())
    assert stack.redis().zcard(stack.keys.key_sessions("zeta")) == 1
    await client.send({"type": "session.close"})
    closed = await client.until("session.closed")
    assert closed["reason"] == "user_stop" and closed["usage"]["sessions"] == 1
    assert closed["usage"]["audio_in_s"] == pytest.approx(2.0, abs=0.01)

    def usage() -> dict[str, Any] | None:
        r = httpx.get(f"{http(stack)}/v1/admin/usage", params={"key": "zeta"}, timeout=10)
        total: dict[str, Any] = r.json()["keys"].get("zeta", {}).get("total", {})
        return total if total.get("sessions") else None

    assert (await eventually(usage))["sessions"] == 1
    assert stack.redis().zcard(stack.keys.key_sessions("zeta")) == 0


async def legacy_turn(stack: Stack, key: str, text: str) -> list[dict[str, Any]]:
    """One ``/ws/chat`` request under ``key``: every frame until the socket closes."""
    c = await Client.connect(stack.url(), path="/ws/chat", query=f"?api_key={key}")
    await c.send({"messages": [{"role": "user", "content": text}]})
    frames: list[dict[str, Any]] = []
    while True:
        try:
            frames.append(await c.recv(20))
        except Exception:
            return frames


async def test_ws_chat_is_metered_and_its_quota_refuses(stack: Stack) -> None:
    stack.start_worker(slots=1)
    stack.start_gateway(OMNISERVE_USAGE_FLUSH_S="0.5")
    key = create_key(stack, "legacy", max_sessions=1)
    frames = await legacy_turn(stack, key, "Reply with exactly: one two three")
    assert frames[-1]["type"] == "done", frames

    def usage() -> dict[str, Any] | None:
        r = httpx.get(f"{http(stack)}/v1/admin/usage", params={"key": "legacy"}, timeout=10)
        total: dict[str, Any] = r.json()["keys"].get("legacy", {}).get("total", {})
        return total if total.get("responses") == 1 and total.get("sessions") == 1 else None

    total = await eventually(usage)
    assert total["text_tokens_out"] > 0 and total["text_tokens_in"] > 0, total
    stack.wait_free(1)
    assert stack.redis().zcard(stack.keys.key_sessions("legacy")) == 0  # the place given back
    # a second connection of the key while one is open: refused before any slot is asked for
    held = await Client.connect(stack.url(), query=f"?mode=audio&api_key={key}")
    await held.init()
    frames = await legacy_turn(stack, key, "hello")
    assert frames[-1]["type"] == "error" and "quota exceeded" in frames[-1]["error"], frames
    assert stack.redis().zcard(stack.keys.queue) == 0
    await held.send({"type": "session.close"})
    await held.until("session.closed")


async def test_the_official_older_api_is_metered_and_its_quota_refuses(stack: Stack) -> None:
    stack.start_worker(slots=2)
    stack.start_gateway(OMNISERVE_USAGE_FLUSH_S="0.5")
    key = create_key(stack, "older", max_sessions=1)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=http(stack), timeout=60) as h:
        r = await h.post(
            "/api/chat",
            json={"messages": [{"role": "user", "content": "Reply with exactly: one two"}]},
            headers=headers,
        )
        assert r.status_code == 200, r.text
    d = await Client.connect(stack.url(), f"/ws/duplex/adx_metered?api_key={key}")
    await d.until("queue_done")
    await d.send({"type": "prepare", "system_prompt": "Be brief."})
    assert (await d.until("prepared", "error"))["type"] == "prepared"
    for _ in range(3):
        await d.send({"type": "audio_chunk", "audio_base64": silence(1.0)})
        assert (await d.recv())["type"] == "result"
    # the key's one session is open: both older endpoints refuse before asking for a slot
    async with httpx.AsyncClient(base_url=http(stack), timeout=60) as h:
        r = await h.post(
            "/api/chat", json={"messages": [{"role": "user", "content": "hi"}]}, headers=headers
        )
        assert r.status_code == 429 and "quota exceeded" in r.json()["detail"], r.text
    over = await Client.connect(stack.url(), f"/ws/duplex/adx_over?api_key={key}")
    frame = await over.recv(timeout=20)
    assert frame["type"] == "error" and "quota exceeded" in frame["error"], frame
    assert await over.closed() == 1008
    assert stack.redis().zcard(stack.keys.queue) == 0
    await d.send({"type": "stop"})
    await d.until("stopped")
    await d.close()

    def usage() -> dict[str, Any] | None:
        r = httpx.get(f"{http(stack)}/v1/admin/usage", params={"key": "older"}, timeout=10)
        total: dict[str, Any] = r.json()["keys"].get("older", {}).get("total", {})
        # both sessions' last flushes in (the count has been read before the last chunk's seconds)
        done = total.get("sessions") == 2 and total.get("audio_in_s", 0) >= 2.99
        return total if done else None

    total = await eventually(usage)
    assert total["audio_in_s"] == pytest.approx(3.0, abs=0.01), total
    assert total["text_tokens_out"] > 0 and total["responses"] >= 1, total
    stack.wait_free(2)
    assert stack.redis().zcard(stack.keys.key_sessions("older")) == 0
