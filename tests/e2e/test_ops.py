"""Operations against real processes: health and readiness, the drain of workers (SIGTERM and
``omniserve drain``) and gateways, and what Celery's own events (Flower's source) say of each
session.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from omniserve.redis_server import free_port
from tests.support.celery_events import TaskEvents, ended
from tests.support.client import Client, silence, speech
from tests.support.fault_harness import await_for, kill9, pool_pids
from tests.support.stack import ROOT, Proc, Stack

pytestmark = pytest.mark.asyncio


def claimed_by(stack: Stack, session_id: str) -> str:
    """The worker id that claimed a session (its claim key)."""
    raw = stack.redis().get(stack.keys.session_claim(session_id))
    return raw.decode() if raw else ""


def sigterm(proc: Proc) -> None:
    """SIGTERM a whole process group (as a terminal or a process manager does), not waiting."""
    os.killpg(proc.popen.pid, signal.SIGTERM)


async def open_duplex(url: str) -> tuple[Client, str]:
    c = await Client.connect(url, query="?mode=audio")
    created = await c.init()
    return c, created["session_id"]


async def speaks(c: Client) -> bool:
    """One spoken exchange still works (speech, then silence until the answer)."""
    frames = await c.step(speech())
    for _ in range(3):
        frames += await c.step(silence())
    return any(f.get("kind") == "audio" for f in frames if f["type"] == "response.output.delta")


# --------------------------------------------------------------------------- health


async def test_healthz_alive_readyz_needs_redis_and_a_live_slot(stack: Stack) -> None:
    port = stack.start_gateway()
    base = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"{base}/healthz")).status_code == 200
        not_ready = await http.get(f"{base}/readyz")
        assert not_ready.status_code == 503
        assert not_ready.json() == {
            "ready": False,
            "redis": True,
            "redis_writable": True,
            "live_slots": 0,
            "draining": False,
            "at_connection_limit": False,
        }
        await asyncio.to_thread(stack.start_worker)
        ready = await http.get(f"{base}/readyz")
        assert ready.status_code == 200 and ready.json()["live_slots"] == 1


# --------------------------------------------------------------------------- worker drain


@pytest.mark.slow
async def test_sigterm_lets_the_running_session_finish_new_ones_go_elsewhere(
    stack: Stack,
) -> None:
    stack.env["OMNISERVE_DRAIN_GRACE_S"] = "120"
    old = stack.start_worker()
    stack.start_gateway()
    a, a_id = await open_duplex(stack.url())
    old_id = claimed_by(stack, a_id)
    # the Celery parent only, as Kubernetes (through tini) or a process manager sends it: the
    # pool process running the session learns of the drain through Redis
    os.kill(old.popen.pid, signal.SIGTERM)
    await await_for(lambda: stack.free_slots() == 0, 10, "the drained slot out of the pool")
    new = await asyncio.to_thread(stack.start_worker, wait=False)
    await await_for(lambda: stack.free_slots() == 1, 60, "the new worker's slot")
    b, b_id = await open_duplex(stack.url())
    assert claimed_by(stack, b_id) not in ("", old_id)
    assert await speaks(a)  # the draining worker still serves its session
    await a.send({"type": "session.close"})
    assert (await a.until("session.closed"))["reason"] == "user_stop"
    await asyncio.to_thread(old.popen.wait, 30)  # then it exits
    assert await speaks(b)
    await b.send({"type": "session.close"})
    await b.until("session.closed")
    assert new.alive()


@pytest.mark.slow
async def test_drain_grace_ends_sessions_with_server_shutdown(stack: Stack) -> None:
    stack.env["OMNISERVE_DRAIN_GRACE_S"] = "2"
    worker = stack.start_worker()
    stack.start_gateway()
    c, _ = await open_duplex(stack.url())
    t0 = time.monotonic()
    await asyncio.to_thread(sigterm, worker)
    closed = await c.until("session.closed", timeout=20)
    assert closed["reason"] == "server_shutdown"
    assert time.monotonic() - t0 >= 1.5  # not before the grace
    await asyncio.to_thread(worker.popen.wait, 30)


@pytest.mark.slow
async def test_omniserve_drain_command(stack: Stack) -> None:
    worker = stack.start_worker(OMNISERVE_WORKER_NAME="drainme@test")
    stack.start_gateway()
    c, _ = await open_duplex(stack.url())

    def drain(node: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "omniserve", "drain", node, "--grace", "1"],
            env=stack.base_env(**env),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )

    unknown = await asyncio.to_thread(drain, "nobody@nowhere")
    assert unknown.returncode == 1 and "drainme@test" in unknown.stdout
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    away = await asyncio.to_thread(drain, "drainme@test", OMNISERVE_REDIS_URL=nowhere)
    assert away.returncode == 1 and "Traceback" not in away.stderr, away.stderr
    assert f"omniserve drain: cannot reach Redis at {nowhere}" in away.stderr
    done = await asyncio.to_thread(drain, "drainme@test")
    assert done.returncode == 0, done.stdout + done.stderr
    closed = await c.until("session.closed", timeout=20)
    assert closed["reason"] == "server_shutdown"
    await await_for(lambda: stack.free_slots() == 0, 10, "no slot offered")
    assert worker.alive()  # drained, not stopped
    refused = await Client.connect(stack.url(), query="?mode=audio")
    assert (await refused.until("error", timeout=20))["error"]["code"] == "service_unavailable"


# --------------------------------------------------------------------------- gateway drain


@pytest.mark.slow
async def test_gateway_drain_refuses_new_clients_and_lets_sessions_finish(stack: Stack) -> None:
    stack.start_worker(slots=2)
    port = stack.start_gateway(OMNISERVE_DRAIN_GRACE_S="120")
    proc = stack.gateways[0][0]
    c, _ = await open_duplex(stack.url())
    await asyncio.to_thread(sigterm, proc)
    base = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient() as http:

        async def draining() -> bool:
            r = await http.get(f"{base}/readyz")
            return r.status_code == 503 and r.json()["draining"] is True

        deadline = time.monotonic() + 10
        while not await draining():
            assert time.monotonic() < deadline, "readyz never said draining"
            await asyncio.sleep(0.1)
    late = await Client.connect(stack.url(), query="?mode=audio")
    assert (await late.until("error"))["error"]["code"] == "service_unavailable"
    assert await speaks(c)
    await c.send({"type": "session.close"})
    assert (await c.until("session.closed"))["reason"] == "user_stop"
    await asyncio.to_thread(proc.popen.wait, 30)


# --------------------------------------------------------------------------- Celery events


@pytest.mark.slow
async def test_celery_events_tell_each_sessions_truth(
    stack: Stack, task_events: TaskEvents
) -> None:
    # resume and failover off: a vanished client ends its session, a killed one is closed
    stack.env["OMNISERVE_RESUME_GRACE_S"] = "0"
    stack.env["OMNISERVE_FAILOVER_WAIT_S"] = "0"
    metrics_port = free_port()
    worker = stack.start_worker(
        OMNISERVE_WORKER_METRICS_PORT=str(metrics_port), OMNISERVE_WORKER_METRICS_HOST="127.0.0.1"
    )
    stack.start_gateway()
    # a worker heartbeat proves the receiver listens before any session starts
    assert await asyncio.to_thread(task_events.heard_worker.wait, 30)

    done, done_id = await open_duplex(stack.url())
    await done.send({"type": "session.close"})
    await done.until("session.closed")
    ok = await ended(task_events, done_id)
    assert "task-succeeded" in ok and "task-started" in ok

    gone, gone_id = await open_duplex(stack.url())
    await gone.close()  # the client vanishes
    abandoned = await ended(task_events, gone_id)
    assert "client_closed" in abandoned["task-failed"]["exception"]

    killed, killed_id = await open_duplex(stack.url())
    (pid,) = pool_pids(stack, worker)
    kill9(pid)
    assert (await killed.until("session.closed", timeout=20))["reason"] == "backend_error"
    lost = await ended(task_events, killed_id)
    # billiard's own record of the kill (its exception field is a wrapper; the traceback names it)
    assert "WorkerLostError" in lost["task-failed"]["traceback"]
    assert "SIGKILL" in lost["task-failed"]["traceback"]

    # the replacement pool process serves the node's counts, the killed session included
    def outcomes() -> dict[str, float]:
        text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2).text
        return {
            s.labels["outcome"]: s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == "omniserve_worker_sessions_total"
        }

    def counted() -> bool:
        try:
            return outcomes().get("killed") == 1
        except httpx.HTTPError:
            return False  # the new pool process is not serving yet

    await await_for(counted, 30, "the killed session counted by the next pool process")
    assert outcomes() == {"completed": 1, "abandoned": 1, "killed": 1}


@pytest.mark.slow
async def test_a_parked_session_is_a_failure_and_its_resume_a_task_of_its_own(
    stack: Stack, task_events: TaskEvents
) -> None:
    stack.env["OMNISERVE_RESUME_SLOT_HOLD_S"] = "0.5"
    stack.start_worker()
    stack.start_gateway()
    assert await asyncio.to_thread(task_events.heard_worker.wait, 30)
    c = await Client.connect(stack.url(), query="?mode=audio")
    created = await c.init()
    sid, token = created["session_id"], created["resume_token"]
    await c.close()  # the client drops: detached, then parked (its slot given back)
    parked = await ended(task_events, sid)
    assert "resumable" in parked["task-failed"]["exception"]
    back = await Client.connect(stack.url(), query="?mode=audio")
    await back.send(
        {"type": "session.resume", "session_id": sid, "resume_token": token, "last_seq": 0}
    )
    await back.until("session.resumed")
    # restarted on a slot, as a task of its own
    await await_for(lambda: "task-started" in task_events.of(f"{sid}.r1"), 30, "the restart")
    await back.send({"type": "session.close"})
    await back.until("session.closed")
    resumed = await ended(task_events, f"{sid}.r1")
    assert "task-succeeded" in resumed


# --------------------------------------------------------------------------- logs


def json_lines(proc: Proc) -> list[dict[str, Any]]:
    """The JSON log lines of a process (Celery's start banner is plain text, skipped)."""
    return [
        orjson.loads(line)
        for line in proc.log.read_text(errors="replace").splitlines()
        if line.startswith("{")
    ]


async def test_json_logs_name_the_session_and_end_it_in_one_line(stack: Stack) -> None:
    stack.env["OMNISERVE_LOG_FORMAT"] = "json"
    worker = stack.start_worker()
    stack.start_gateway()
    gateway = stack.gateways[0][0]
    c, sid = await open_duplex(stack.url())
    await c.send({"type": "session.close"})
    await c.until("session.closed")

    def ended() -> list[dict[str, Any]]:
        return [e for e in json_lines(gateway) if e.get("event") == "session_end"]

    await await_for(lambda: ended(), 10, "the session-end line")
    (end,) = ended()
    assert end["session_id"] == sid and end["mode"] == "audio" and end["reason"] == "user_stop"
    assert end["worker"] == claimed_by(stack, sid) or end["worker"].startswith("omni-")
    assert end["duration_s"] >= end["active_s"] >= 0 and end["queued_s"] >= 0
    for proc in (gateway, worker):
        lines = json_lines(proc)
        assert lines and all({"ts", "level", "logger", "msg"} <= set(e) for e in lines)
        about = [e for e in lines if sid in e["msg"]]
        assert about, proc.name
        assert all(e.get("session_id") == sid for e in about), about
