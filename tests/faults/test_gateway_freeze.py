"""A gateway frozen (SIGSTOP: a long GC pause, a paused VM) past its lease, then thawed.

Its workers take it for gone: a resumable session's record is noted detached, its slot held for
a resume elsewhere (``resume_slot_hold_s``), then given back. The thawed gateway still holds the
clients, yet each failover's new attempt read the record detached again and gave its slot back:
an endless ``session.recovering`` loop every ~2.5 s. The gateway now attaches such a session
again as soon as it reads its record detached (``SessionResume.reclaim``). A session
without a record ends; its client, still there, is told ``error``, not ``client_closed``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from tests.support.client import Client
from tests.support.fault_harness import DuplexProbe, await_for, log_text
from tests.support.stack import Stack

LEASE_S = 2.0  # the gateway's alive key TTL in this test (default 6 s)
FROZEN_S = 7.0  # past the lease and the worker's check of it


@pytest.mark.slow
@pytest.mark.parametrize("hold_s", [10.0, 0.5], ids=["within-the-slot-hold", "past-it"])
async def test_sessions_go_on_after_their_gateway_was_frozen(stack: Stack, hold_s: float) -> None:
    hold = {"OMNISERVE_RESUME_SLOT_HOLD_S": str(hold_s)}
    worker = stack.start_worker(slots=4, **hold)  # (a failover's new attempt needs a free slot)
    stack.start_gateway(OMNISERVE_GATEWAY_LEASE_TTL_S=str(LEASE_S))
    gateway = stack.gateways[0][0]
    probes = [await DuplexProbe.open(stack.url()) for _ in range(2)]
    try:
        await asyncio.wait_for(_first_deltas(probes), 30)
        os.killpg(gateway.popen.pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(FROZEN_S)
        finally:
            os.killpg(gateway.popen.pid, signal.SIGCONT)
        thawed = time.monotonic()
        await asyncio.sleep(8.0)  # (the loop went round three times in this long)
        for p in probes:
            seen = [(round(t - thawed, 2), f["type"]) for t, f in p.frames if t > thawed - 1]
            kinds = [k for _, k in seen if "delta" not in k]
            assert p.closed_at is None and "session.closed" not in kinds, seen
            # within the hold the session never stopped; past it, one failover and no more
            assert kinds.count("session.recovering") == (0 if hold_s > FROZEN_S else 1), kinds
            assert p.deltas_after(thawed + 6.0) > 0, kinds  # and it goes on answering
    finally:
        for p in probes:
            await p.close()
    stack.wait_free(4, timeout=15)
    assert "attached again" in log_text(gateway)
    assert "gone; waiting for a resume" in log_text(worker)  # (the freeze was seen as such)


async def _first_deltas(probes: list[DuplexProbe]) -> None:
    while not all(p.deltas_after(0) > 0 for p in probes):
        await asyncio.sleep(0.1)


@pytest.mark.slow
async def test_a_session_without_a_record_is_told_error_not_client_closed(stack: Stack) -> None:
    """Resume and failover off: the worker ends the session (``client_closed``: its gateway is
    gone), and stops a chat turn, and the thawed gateway relays both to clients that are still
    there, which must not hear that they closed (``client_closed`` is never a client's to see):
    ``error``, and the turn's ``inference_error`` says why."""
    stack.start_worker(slots=2, OMNISERVE_BACKEND_OPTIONS='{"token_delay_s": 0.3}')
    stack.start_gateway(
        OMNISERVE_GATEWAY_LEASE_TTL_S=str(LEASE_S),
        OMNISERVE_RESUME_GRACE_S="0",
        OMNISERVE_FAILOVER_WAIT_S="0",
    )
    gateway = stack.gateways[0][0]
    probe = await DuplexProbe.open(stack.url())
    chat = await Client.connect(stack.url(), query="?mode=chat")
    try:
        await chat.until("session.queue_done")
        await chat.send({"type": "session.init", "payload": {}})
        await chat.until("session.created")
        words = "Reply with exactly: " + " ".join(["word"] * 60)  # ~18 s
        await chat.send(
            {"type": "input.append", "input": {"messages": [{"role": "user", "content": words}]}}
        )
        await chat.until("response.output.delta", timeout=30)
        await asyncio.wait_for(_first_deltas([probe]), 30)
        os.killpg(gateway.popen.pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(FROZEN_S)
        finally:
            os.killpg(gateway.popen.pid, signal.SIGCONT)
        await await_for(lambda: probe.first("session.closed") is not None, 15, "the end")
        [closed] = [f for _, f in probe.frames if f["type"] == "session.closed"]
        assert closed["reason"] == "error", closed
        stopped = await chat.until("error", "response.done", timeout=15)
        assert stopped["type"] == "error", stopped
        assert (
            stopped["error"]["message"] == "turn interrupted: its worker took this gateway for gone"
        )
    finally:
        await probe.close()
        await chat.close()
    stack.wait_free(2, timeout=15)
    assert "its worker took it for gone" in log_text(gateway)
