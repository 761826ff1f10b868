"""Clients that stop keeping up, for real: a client process frozen with SIGSTOP, a client that goes
silent, a client that never reads its output among clients that do.

Each asserts what the clients saw, that the slot came back (within 10 s of the freeze for the
frozen one), the reason in the gateway's log and metrics, and that the next client is served.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.client import Client, speech
from tests.support.fault_harness import (
    DuplexProbe,
    await_for,
    log_text,
    served_end_to_end,
    wait_for,
)
from tests.support.stack import ROOT, Stack

SLOT_BACK_S = 10.0  # the promise: a frozen client's slot is free within 10 s


class ClientProcess:
    """``bench/fault_client.py`` in its own process."""

    def __init__(self, url: str, *args: str) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "bench.fault_client", url, *args],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def wait_active(self, timeout: float = 60) -> str:
        """The session id, once the client's session was created."""
        assert self.popen.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.popen.stdout.readline()
            if line.startswith("ACTIVE "):
                return line.split()[1]
            if not line and self.popen.poll() is not None:
                break
        raise AssertionError(f"client process did not get a session (exit {self.popen.poll()})")

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.popen.pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGKILL)
        self.popen.wait(timeout=10)


@contextlib.contextmanager
def client_process(url: str, *args: str) -> Iterator[ClientProcess]:
    proc = ClientProcess(url, *args)
    try:
        yield proc
    finally:
        proc.kill()


def dropped(stack: Stack, reason: str, i: int = 0) -> float:
    """The gateway's omniserve_clients_dropped_total for ``reason``."""
    text = httpx.get(f"http://127.0.0.1:{stack.gateways[i][1]}/metrics", timeout=5).text
    m = re.search(rf'omniserve_clients_dropped_total\{{reason="{reason}"\}} (\S+)', text)
    return float(m.group(1)) if m else 0.0


def gateway_log(stack: Stack, i: int = 0) -> str:
    return log_text(stack.gateways[i][0])


@pytest.mark.parametrize("resume", ["default", "off"])
async def test_frozen_client_process_slot_back_within_10s(stack: Stack, resume: str) -> None:
    """SIGSTOP of a streaming client process: its slot is back within 10 s, the log and the
    metric say why, and the next client is served on that slot. With the default settings the
    client's silence ends it first (client_idle, 6 s); with resume off as well, so that a client
    found by the pings instead would not be detached for a resume and keep its slot
    OMNISERVE_RESUME_SLOT_HOLD_S longer."""
    stack.start_worker(slots=1)
    stack.start_gateway(**({"OMNISERVE_RESUME_GRACE_S": "0"} if resume == "off" else {}))
    with client_process(stack.url()) as proc:
        session_id = proc.wait_active()
        assert stack.free_slots() == 0
        time.sleep(1.0)  # streaming for a while
        t_freeze = time.monotonic()
        proc.signal(signal.SIGSTOP)
        took = wait_for(lambda: stack.free_slots() == 1, 30, "the frozen client's slot")
        print(f"frozen client: slot back {took:.2f} s after SIGSTOP")
        assert time.monotonic() - t_freeze <= SLOT_BACK_S
        text = gateway_log(stack)
        line = next(ln for ln in text.splitlines() if session_id in ln and "ending the" in ln)
        assert "(client_idle)" in line or "(ping_timeout)" in line, line
        reason = "client_idle" if "(client_idle)" in line else "ping_timeout"
        assert dropped(stack, reason) == 1
        frames = await served_end_to_end(stack.url())
        assert any(f.get("kind") == "text" for f in frames)


async def test_silent_client_is_ended_with_client_idle(stack: Stack) -> None:
    """A client that stops sending (but still reads) gets session.closed client_idle; a client
    that keeps sending is untouched; one whose init is being prepared is not counted idle."""
    stack.start_worker(slots=2)
    stack.start_gateway(OMNISERVE_CLIENT_IDLE_TIMEOUT_S="2")
    talker = await DuplexProbe.open(stack.url())
    quiet = await Client.connect(stack.url(), query="?mode=audio")
    try:
        await quiet.init()
        await quiet.send({"type": "input.append", "input": {"audio": speech()}})
        t_last = time.monotonic()
        closed = await quiet.until("session.closed", timeout=20)
        silent_for = time.monotonic() - t_last
        assert closed["reason"] == "client_idle"
        assert await quiet.closed() == 1000
        assert silent_for >= 2.0
        print(f"silent client ended {silent_for:.2f} s after its last chunk")
        stack.wait_free(1, timeout=10)
        mark = time.monotonic()
        await await_for(lambda: talker.deltas_after(mark) >= 2, 20, "the talker streaming")
        assert talker.closed_at is None
    finally:
        await talker.close()
        await quiet.close()
    assert dropped(stack, "client_idle") == 1
    assert "ending the session (client_idle)" in gateway_log(stack)


async def test_client_not_answering_pings_is_dropped(stack: Stack) -> None:
    """With the idle rule off, a frozen client is found by the WebSocket pings alone."""
    stack.start_worker(slots=1)
    stack.start_gateway(
        OMNISERVE_CLIENT_IDLE_TIMEOUT_S="0",
        OMNISERVE_WS_PING_INTERVAL_S="1",
        OMNISERVE_WS_PING_TIMEOUT_S="1",
        OMNISERVE_RESUME_GRACE_S="0",  # found by pings, a resumable session would wait for resume
    )
    with client_process(stack.url()) as proc:
        session_id = proc.wait_active()
        proc.signal(signal.SIGSTOP)
        took = wait_for(lambda: stack.free_slots() == 1, 20, "the frozen client's slot")
        print(f"frozen client (pings only): slot back {took:.2f} s after SIGSTOP")
        wait_for(lambda: dropped(stack, "ping_timeout") == 1, 10, "the ping_timeout count")
        assert f"{session_id}: the client stopped answering WebSocket pings" in gateway_log(stack)
    await served_end_to_end(stack.url())


@pytest.mark.slow
async def test_client_that_never_reads_ends_alone(stack: Stack) -> None:
    """A client that never reads (tiny receive buffer) among clients that do: only its session
    ends, with output_backpressure; its slot is back at once; the others keep their pace."""
    stack.start_worker(slots=3, OMNISERVE_BACKEND_OPTIONS='{"trigger": "always"}')
    stack.start_gateway(
        OMNISERVE_OUTPUT_MAX_PENDING_EVENTS="40",
        OMNISERVE_OUTPUT_MAX_PENDING_BYTES=str(1024 * 1024),
        OMNISERVE_WS_PING_INTERVAL_S="600",  # only the output cap may end it
    )
    readers = [await DuplexProbe.open(stack.url()) for _ in range(2)]
    try:
        await await_for(lambda: all(p.deltas_after(0) > 2 for p in readers), 30, "streaming")
        with client_process(stack.url(), "--no-read") as proc:
            # (threads: the readers' event loop must go on streaming meanwhile)
            session_id = await asyncio.to_thread(proc.wait_active)
            t0 = time.monotonic()
            await await_for(
                lambda: dropped(stack, "output_backpressure") == 1, 60, "the backpressure drop"
            )
            print(f"never-reading client dropped {time.monotonic() - t0:.1f} s after its start")
            assert f"{session_id}: the client did not read its output" in gateway_log(stack)
            await await_for(lambda: stack.free_slots() == 1, 5, "its slot")
            exit_code = await asyncio.to_thread(proc.popen.wait, 20)
            assert exit_code == 0  # its connection was torn down: it noticed and left
            window = (t0, time.monotonic())
        mark = time.monotonic()
        await await_for(lambda: all(p.deltas_after(mark) >= 3 for p in readers), 20, "streaming")
        for p in readers:
            assert p.closed_at is None
            assert not any(f["type"] == "error" for _, f in p.frames)
            times = [t for t, f in p.frames if f["type"] == "response.output.delta"]
            during = [b - a for a, b in itertools.pairwise(times) if a >= window[0]]
            print(f"neighbour: longest wait between deltas meanwhile {max(during):.2f} s")
            assert max(during) < 3.0
    finally:
        for p in readers:
            await p.close()
    stack.wait_free(3, timeout=20)
    await served_end_to_end(stack.url())


async def test_chat_turns_beyond_the_cap_are_refused(stack: Stack) -> None:
    """Chat mode: turns queued beyond max_chat_turns_queued get turn_queue_full; the session goes
    on and runs the turns it accepted."""
    stack.start_worker(slots=1, OMNISERVE_SCRIPTED_TOKEN_DELAY_S="0.2")
    stack.start_gateway(OMNISERVE_MAX_CHAT_TURNS_QUEUED="2")
    client = await Client.connect(stack.url(), query="?mode=chat")
    try:
        await client.until("session.queue_done")
        await client.send({"type": "session.init", "payload": {}})
        await client.until("session.created")
        turn = {"type": "input.append", "input": {"messages": [{"role": "user", "content": "hi"}]}}
        for _ in range(6):
            await client.send(turn)
        errors = []
        done = 0
        while done + len(errors) < 6:
            ev = await client.until("error", "response.done", timeout=60)
            if ev["type"] == "error":
                errors.append(ev["error"])
            else:
                done += 1
        # two waiting (and a third running if it started before the rest arrived); the rest
        # refused
        assert 2 <= done <= 3 and len(errors) == 6 - done, (done, errors)
        assert all(e["code"] == "turn_queue_full" and e["type"] == "client_error" for e in errors)
        await client.send(turn)  # the session goes on
        await client.until("response.done", timeout=30)
    finally:
        await client.close()
    stack.wait_free(1)
