"""A worker, or one of its pool processes, killed with SIGKILL while it serves.

What the clients saw, that the dead capacity left the pool at once, that it came back, and that
the next client was served.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.support.client import Client
from tests.support.fault_harness import (
    DuplexProbe,
    admitted_to_a_dying_worker,
    await_for,
    forked_children,
    held_at_fork,
    kill9,
    kill9_group,
    log_text,
    pool_pids,
    registry,
    served_end_to_end,
    wait_for,
)
from tests.support.stack import Stack

NOTICE_S = 3.0  # the promise: a dead worker's clients are told within 3 s
# tasks/prefork.py looks for a dead pool process every 0.25 s; Celery's own pool, every 5 s
# (and, through the dying process's sentinel, often too early to reap it)
REPLACED_S = 2.0
SLOW_LOAD = '{"load_delay_s": 6}'  # longer than Celery's default 4 s wait for a new process


@pytest.fixture(autouse=True)
def _without_failover(stack: Stack) -> None:
    """These tests check the ending when a session is not failed over (failover off); with it
    on, tests/e2e/test_failover.py."""
    stack.env["OMNISERVE_FAILOVER_WAIT_S"] = "0"


def told(probe: DuplexProbe, since: float) -> float:
    """Seconds from ``since`` until the client had both error backend_error and session.closed."""
    err = probe.first("error", since, code="backend_error")
    closed = probe.first("session.closed", since)
    assert err is not None and closed is not None, probe.frames[-5:]
    assert probe.closed_reason() == "backend_error"
    return max(err, closed) - since


async def test_kill9_worker_clients_told_and_pool_refills(stack: Stack) -> None:
    """kill -9 of one of two workers: its clients told within 3 s, the others keep streaming."""
    doomed = stack.start_worker(slots=2)
    stack.start_worker(slots=2)
    stack.start_gateway()
    probes = [await DuplexProbe.open(stack.url()) for _ in range(4)]
    try:
        await await_for(lambda: all(p.deltas_after(0) > 0 for p in probes), 30, "first deltas")
        t_kill = kill9_group(doomed)
        await await_for(
            lambda: sum(p.closed_at is not None for p in probes) >= 2, 15, "2 sessions ended"
        )
        lost = [p for p in probes if p.closed_at is not None]
        alive = [p for p in probes if p.closed_at is None]
        assert len(lost) == 2 and len(alive) == 2
        delays = [told(p, t_kill) for p in lost]
        print(f"worker kill -9: clients told after {', '.join(f'{d:.2f}' for d in delays)} s")
        assert max(delays) <= NOTICE_S, delays
        assert all(p.close_code == 1011 for p in lost)
        # its slots left the pool: only the other worker's two are live
        assert stack.live_slots() == 2
        mark = time.monotonic()
        await await_for(lambda: all(p.deltas_after(mark) >= 2 for p in alive), 20, "streaming")
    finally:
        for p in probes:
            await p.close()
    stack.start_worker(slots=2)
    stack.wait_free(4, timeout=30)
    frames = await served_end_to_end(stack.url())
    assert any(f["type"] == "response.output.delta" and f.get("kind") == "text" for f in frames)


@pytest.mark.slow
async def test_kill9_pool_process_during_session_recovers(stack: Stack) -> None:
    """kill -9 of the prefork pool process mid-session (a model crash, an OOM kill).

    The Celery parent tells the client at once, the slot leaves the pool, the replacement
    process loads the (slow) model again without being killed for it, a client arriving
    meanwhile is queued with a position and an estimate, and is served once the model is loaded.
    """
    worker = stack.start_worker(OMNISERVE_BACKEND_OPTIONS=SLOW_LOAD)
    stack.start_gateway()
    [child] = pool_pids(stack, worker)
    probe = await DuplexProbe.open(stack.url())
    try:
        await await_for(lambda: probe.deltas_after(0) > 0, 30, "first delta")
        t_kill = kill9(child)
        await await_for(lambda: probe.closed_at is not None, 10, "the session to end")
        print(f"pool process kill -9: client told after {told(probe, t_kill):.2f} s")
        assert told(probe, t_kill) <= NOTICE_S
        # the dead process's slot left the pool at once; its replacement registers as loading
        assert stack.live_slots() == 0
        await await_for(lambda: stack.live_slots("loading") == 1, 20, "the new process")
        assert stack.free_slots() == 0
        # a client arriving now waits in the queue for the coming capacity
        waiting = await Client.connect(stack.url(), query="?mode=audio")
        queued = await waiting.until("session.queued", "session.queue_done", timeout=15)
        assert queued["type"] == "session.queued", queued
        assert queued["position"] == 1 and queued["estimated_wait_s"] >= 1
        done = await waiting.until("session.queue_done", timeout=60)
        assert done["session_id"]
        await waiting.send({"type": "session.init", "payload": {}})
        await waiting.until("session.created", timeout=15)
        await waiting.send({"type": "session.close"})
        await waiting.until("session.closed", timeout=15)
        await waiting.close()
    finally:
        await probe.close()
    stack.wait_free(1, timeout=30)
    [new_child] = pool_pids(stack, worker)
    assert new_child != child
    assert worker.alive()
    text = log_text(worker)
    assert "Timed out waiting for UP message" not in text
    assert f"pool process {child} died" in text
    await served_end_to_end(stack.url())


@pytest.mark.slow
async def test_kill9_pool_process_while_loading(stack: Stack) -> None:
    """kill -9 of a pool process that is still loading its (slow) model: the next one loads."""
    worker = stack.start_worker(OMNISERVE_BACKEND_OPTIONS=SLOW_LOAD, wait=False)
    stack.start_gateway()
    wait_for(lambda: stack.live_slots("loading") == 1, 30, "the loading registration")
    [child] = pool_pids(stack, worker)
    kill9(child)
    wait_for(lambda: child not in pool_pids(stack, worker), 10, "the dead process to leave")
    stack.wait_slots(1, worker, timeout=60)
    [new_child] = pool_pids(stack, worker)
    assert new_child != child
    assert "Timed out waiting for UP message" not in log_text(worker)
    await served_end_to_end(stack.url())


@pytest.mark.slow
async def test_kill9_pool_process_while_its_worker_starts(stack: Stack) -> None:
    """kill -9 of a loading pool process before its parent's consumer has started: Celery's one
    look at the pool then (``did_start_ok``) took it for a pool that cannot start and ended the
    whole worker (a CI run killed one in that window). The parent is held with SIGSTOP from its
    fork until the kill, so the kill lands in the window every time."""
    worker = stack.start_worker(OMNISERVE_BACKEND_OPTIONS=SLOW_LOAD, wait=False)
    parent = worker.popen.pid
    child = held_at_fork(worker)
    try:
        assert " ready." not in log_text(worker), "the parent started before it was held"
        wait_for(lambda: stack.live_slots("loading") == 1, 30, "the loading registration")
        kill9(child)
        wait_for(lambda: child not in forked_children(worker), 10, "the killed process to die")
    finally:
        os.kill(parent, signal.SIGCONT)
    stack.start_gateway()
    stack.wait_slots(1, worker, timeout=60)
    [new_child] = pool_pids(stack, worker)
    assert new_child != child
    text = log_text(worker)
    assert "Could not start worker processes" not in text
    assert f"pool process {child} died" in text
    await served_end_to_end(stack.url())


async def test_client_during_model_load_is_queued_then_served(stack: Stack) -> None:
    """A worker registered but still loading is coming capacity, not "no worker"."""
    stack.start_gateway()
    worker = stack.start_worker(OMNISERVE_BACKEND_OPTIONS='{"load_delay_s": 5}', wait=False)
    wait_for(lambda: stack.live_slots("loading") == 1, 30, "the loading registration")
    client = await Client.connect(stack.url(), query="?mode=chat")
    try:
        await client.until("session.queue_done")
        await client.send({"type": "session.init", "payload": {}})
        await client.until("session.created")
        await client.send(
            {
                "type": "input.append",
                "input": {"messages": [{"role": "user", "content": "Reply with exactly: loaded"}]},
            }
        )
        queued = await client.until("response.queued", "response.done", timeout=30)
        assert queued["type"] == "response.queued" and queued["position"] == 1
        done = await client.until("response.done", timeout=60)
        assert done["text"] == "loaded"
    finally:
        await client.close()
    assert worker.alive()


async def test_no_worker_ready_within_capacity_wait(stack: Stack) -> None:
    """Waiting for loading workers is bounded: service_unavailable after capacity_wait_s."""
    stack.start_gateway(OMNISERVE_CAPACITY_WAIT_S="2")
    stack.start_worker(OMNISERVE_BACKEND_OPTIONS='{"load_delay_s": 120}', wait=False)
    wait_for(lambda: stack.live_slots("loading") == 1, 30, "the loading registration")
    client = await Client.connect(stack.url(), query="?mode=audio")
    try:
        await client.until("session.queued", timeout=15)
        err = await client.until("error", timeout=20)
        assert err["error"]["code"] == "service_unavailable"
        assert "no worker became ready" in err["error"]["message"]
        assert await client.closed() == 1013
    finally:
        await client.close()
    wait_for(lambda: stack.redis().zcard(stack.keys.queue) == 0, 10, "the ticket to go")


async def test_no_worker_at_all_is_refused(stack: Stack) -> None:
    """With no worker registered at all, a client is refused at once (as before)."""
    stack.start_gateway()
    client = await Client.connect(stack.url(), query="?mode=audio")
    err = await client.until("error")
    assert err["error"]["code"] == "service_unavailable"
    assert await client.closed() == 1013


async def test_a_frozen_worker_that_never_starts_the_session_frees_its_slot(stack: Stack) -> None:
    """A worker whose Celery parent is frozen (SIGSTOP) as a session is handed to it never
    starts the task, while its pool process stays alive (its presence key renewed): after
    ``task_start_timeout_s`` the client gets ``worker_connect_failed`` (close 1013) from the
    relay loop's start deadline (the test stacks' loops have no other wake-up within the test),
    and once thawed the worker finds the task abandoned: the slot serves the next client."""
    worker = stack.start_worker(slots=1)
    stack.start_gateway(OMNISERVE_TASK_START_TIMEOUT_S="2")
    stack.wait_free(1)
    os.kill(worker.popen.pid, signal.SIGSTOP)
    try:
        client = await Client.connect(stack.url(), query="?mode=audio")
        await client.until("session.queue_done", timeout=10)
        await client.send({"type": "session.init", "payload": {}})
        err = await client.until("error", timeout=15)
        assert err["error"]["code"] == "worker_connect_failed", err
        assert "did not start" in err["error"]["message"], err
        assert "worker process" not in err["error"]["message"], err
        assert await client.closed() == 1013
    finally:
        os.kill(worker.popen.pid, signal.SIGCONT)
    stack.wait_free(1, timeout=30)
    frames = await served_end_to_end(stack.url())
    assert any(f["type"] == "response.output.delta" and f.get("kind") == "text" for f in frames)


async def test_killed_pool_processes_are_replaced_at_once_and_leave_no_slot(stack: Stack) -> None:
    """kill -9 of the pool process, six times: three times once it serves, three times as soon
    as it is forked (before the parent's supervisor has looked at it). Each time the Celery
    parent forks the replacement within ``REPLACED_S`` (0.1-0.3 s here); with Celery's own pool
    a kill whose process is not yet reapable when its sentinel pipe closes waits for the pool's
    next 5 s look (every kill on an H100, where a CUDA context's teardown lies between; one in
    three here). Every dead process is handled, the short-lived ones too: no slot of theirs stays
    in the pool, where it would take a client that no process serves."""
    worker = stack.start_worker(slots=1)
    stack.start_gateway()
    stack.wait_free(1)
    waits, killed = [], []
    for round_ in range(6):
        [child] = forked_children(worker)
        kill9(child)
        killed.append(child)
        waits.append(
            wait_for(lambda c=child: forked_children(worker) not in ([], [c]), 10, "a new one")
        )
        if round_ < 3:
            wait_for(lambda c=child: f"pool process {c} died" in log_text(worker), 10, "cleanup")
            stack.wait_free(1, timeout=30)
    print("pool process replaced after " + ", ".join(f"{w:.2f}" for w in waits) + " s")
    assert max(waits) <= REPLACED_S, waits
    for pid in killed:
        wait_for(lambda p=pid: f"pool process {p} died" in log_text(worker), 10, f"{pid} cleaned")
    stack.wait_free(1, timeout=30)
    [live] = forked_children(worker)
    wait_for(lambda: pool_pids(stack, worker) == [live], 10, "the live process's registration")
    assert [int(e["pid"]) for e in registry(stack).values()] == [live]
    assert stack.free_slots() == 1
    assert worker.alive()
    await served_end_to_end(stack.url())  # the one slot in the pool serves


@pytest.mark.parametrize("claimed", [False, True], ids=["unclaimed", "claimed"])
async def test_a_session_whose_pool_process_dies_before_it_starts_ends_at_once(
    stack: Stack, claimed: bool
) -> None:
    """The pool process of a handed-out slot dies before the session's task reaches it (its
    Celery parent is frozen with SIGSTOP meanwhile, so the task waits in the node's queue; when
    thawed, the parent withdraws the dead process and hands the task to the replacement, which
    does not own that slot). The client gets ``worker_connect_failed`` (close 1013) within a
    liveness tick of the withdrawal, not at ``task_start_timeout_s`` (60 s here), and the
    replacement's slot serves the next client.

    ``claimed``: the process dies after it claimed the session and before its ``Started`` went
    out (the claim written as the worker writes it). The gateway cannot abandon the claimed
    task, watches its lease instead, and when it lapses with nothing in the log tells the
    client the same, within seconds (with failovers on, both start elsewhere:
    tests/faults/test_start_elsewhere.py)."""
    client, worker, child = await admitted_to_a_dying_worker(stack, claimed=claimed)
    thawed = time.monotonic()
    err = await client.until("error", timeout=50)
    waited = time.monotonic() - thawed
    print(f"pool process dead before its session started (claimed: {claimed}): {waited:.2f} s")
    assert err["error"]["code"] == "worker_connect_failed", err
    detail = "died before starting it" if claimed else "worker process of its slot is gone"
    assert detail in err["error"]["message"], err
    assert await client.closed() == 1013
    assert waited < 30, waited  # not the start deadline
    wait_for(lambda: f"pool process {child} died" in log_text(worker), 10, "its cleanup")
    stack.wait_free(1, timeout=30)
    await served_end_to_end(stack.url())
