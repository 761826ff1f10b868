"""A ``session.close`` followed at once by the socket closing ends the session as asked.

A client that sends ``session.close`` and closes its WebSocket in the same breath (as
``omniserve probe chat`` does) never reads ``session.closed``; the gateway must still honour the
close it received: the session counted under the close's reason, its end logged, its recording
closed with that reason, and its resume record ended (a short linger, not the detached session's
full time). Real gateway, real scripted worker, raw ``websockets`` clients, every mode.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import websockets

from streaming.resume import ENDED_LINGER_S
from tests.support.client import speech
from tests.support.metrics_scrape import scrape, total, wait_for
from tests.support.stack import Stack

ROUNDS = 20  # sessions per case: one lost close among them fails the test


@pytest.fixture(scope="module")
def rec_stack(redis_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    store = tmp_path_factory.mktemp("store")
    s = Stack(redis_server)
    try:
        s.start_worker(slots=2)
        s.start_gateway(OMNISERVE_RECORDINGS="true", OMNISERVE_RECORDINGS_URL=str(store))
        s.env["store"] = str(store)  # for the test's own reads (not passed to processes)
        yield s
    finally:
        s.stop()


async def until(ws: websockets.ClientConnection, kind: str, timeout: float = 30.0) -> Any:
    """Read frames until one of type ``kind``; returns it."""
    while True:
        frame = orjson.loads(await asyncio.wait_for(ws.recv(), timeout))
        if frame["type"] == kind:
            return frame


async def close_and_leave(stack: Stack, mode: str, before_close: list[Any]) -> str:
    """One session: init, the ``before_close`` events, ``session.close`` and at once the
    socket's close, without reading anything more. Returns the session id."""
    ws = await websockets.connect(f"{stack.url()}/v1/realtime?mode={mode}", max_size=None)
    await until(ws, "session.queue_done")
    await ws.send(json.dumps({"type": "session.init", "payload": {}}))
    created = await until(ws, "session.created")
    assert created.get("resume_token") and created.get("recording_id"), created
    for event in before_close:
        await ws.send(json.dumps(event))
    await ws.send(json.dumps({"type": "session.close"}))
    await ws.close()
    return str(created["session_id"])


def ended_as_asked(stack: Stack, sid: str) -> list[str]:
    """What is wrong with the end of session ``sid`` (empty: nothing)."""
    wrong = []
    meta_file = Path(stack.env["store"]) / sid / "meta.json"
    if not meta_file.is_file():
        wrong.append("no recording")
    elif (reason := json.loads(meta_file.read_text())["close_reason"]) != "user_stop":
        wrong.append(f"recorded as {reason}")
    r = stack.redis()
    record = stack.keys.session_resume(sid)
    if r.hget(record, "ended") != b"1":
        wrong.append("resume record not ended")
    if not 0 < r.ttl(record) <= ENDED_LINGER_S:
        wrong.append(f"resume record TTL {r.ttl(record)} s")
    if f"session {sid} ended:" not in stack.gateways[0][0].log.read_text(errors="replace"):
        wrong.append("no session-end line")
    return wrong


# what each case sends between session.created and session.close ("chat_turn": a turn that is
# queued or running when the close comes)
CASES = {
    "chat": [],
    "chat_turn": [
        {"type": "input.append", "input": {"messages": [{"role": "user", "content": "hi"}]}}
    ],
    "audio": [],
    "video": [{"type": "input.append", "input": {"audio": speech(0.5)}}],
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_close_right_before_the_socket_closes_is_honoured(
    rec_stack: Stack, case: str
) -> None:
    mode = case.split("_")[0]
    url = f"http://127.0.0.1:{rec_stack.gateways[0][1]}/metrics"
    before = await asyncio.to_thread(scrape, url)
    counted = total(before, "omniserve_session_closes_total", mode=mode, reason="user_stop")
    sids = [await close_and_leave(rec_stack, mode, CASES[case]) for _ in range(ROUNDS)]

    def all_counted(s: Any) -> bool:
        closes = total(s, "omniserve_session_closes_total", mode=mode)
        return closes >= total(before, "omniserve_session_closes_total", mode=mode) + ROUNDS

    after = await wait_for(url, all_counted, timeout=30)
    assert (
        total(after, "omniserve_session_closes_total", mode=mode, reason="user_stop") - counted
        == ROUNDS
    ), {k: v for k, v in after.items() if k[0] == "omniserve_session_closes_total"}
    deadline = time.monotonic() + 30
    while wrong := {sid: w for sid in sids if (w := ended_as_asked(rec_stack, sid))}:
        assert time.monotonic() < deadline, wrong
        await asyncio.sleep(0.2)
    rec_stack.wait_free(2)  # no slot kept for a resume that cannot come
