"""A backend step that never returns (a hung model): the per-step watchdog.

The stand-in is the scripted backend's own fault option (``hang_after_steps``): its Nth duplex
step blocks. The session ends with ``backend_error``, the operator sees why in the log, the
counter goes up, the slot is not reused until the backend is known healthy (a prefork process is
restarted and reloads; a threads-pool slot returns when the stuck call does), and the next
client is served.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

from tasks.watchdog import EXIT_HUNG_STEP
from tests.support.client import Client
from tests.support.fault_harness import (
    DuplexProbe,
    await_for,
    log_text,
    pool_pids,
    served_end_to_end,
    wait_for,
)
from tests.support.stack import Stack

HANG = '{"hang_after_steps": 3, "load_delay_s": 1}'
STEP_TIMEOUT = "2"


def step_timeouts(stack: Stack) -> int:
    raw = stack.redis().hget(stack.keys.worker_counters, "backend_step_timeouts_total")
    return int(raw or 0)


async def test_hung_step_restarts_the_pool_process(stack: Stack) -> None:
    worker = stack.start_worker(
        OMNISERVE_BACKEND_OPTIONS=HANG, OMNISERVE_STEP_TIMEOUT_S=STEP_TIMEOUT
    )
    stack.start_gateway()
    [child] = pool_pids(stack, worker)
    probe = await DuplexProbe.open(stack.url())
    try:
        await await_for(lambda: probe.closed_at is not None, 30, "the watchdog to end it")
        assert probe.first("error", code="backend_error") is not None
        assert probe.closed_reason() == "backend_error"
        assert probe.chunks_sent >= 3
    finally:
        await probe.close()
    assert step_timeouts(stack) == 1
    # the hung process is replaced (its slot never served meanwhile), then serves again
    wait_for(lambda: child not in pool_pids(stack, worker), 15, "the hung process to go")
    stack.wait_free(1, timeout=30)
    [new_child] = pool_pids(stack, worker)
    assert new_child != child
    text = log_text(worker)
    assert "has not returned after" in text and "step_timeout_s=2" in text
    assert "restarting this worker process to reload the backend" in text
    await served_end_to_end(stack.url())  # two steps: below the third-step hang


async def test_hung_chat_turn_in_threads_pool_withholds_its_slot(stack: Stack) -> None:
    """Threads pool: the stuck slot is withheld until its call returns; the others serve."""
    stack.start_worker(
        slots=2,
        OMNISERVE_BACKEND_OPTIONS='{"hang_on_text": "[hang]", "hang_s": 8}',
        OMNISERVE_STEP_TIMEOUT_S=STEP_TIMEOUT,
    )
    stack.start_gateway()
    client = await Client.connect(stack.url(), query="?mode=chat")
    try:
        await client.until("session.queue_done")
        await client.send({"type": "session.init", "payload": {}})
        await client.until("session.created")
        turn = {"messages": [{"role": "user", "content": "please [hang]"}], "streaming": True}
        await client.send({"type": "input.append", "input": turn})
        err = await client.until("error", timeout=20)
        assert err["error"]["code"] == "inference_error"
        assert "did not answer within 2 s" in err["error"]["message"]
        t_err = time.monotonic()
        # the connection goes on: the next turn runs on the other slot
        nxt = {"messages": [{"role": "user", "content": "Reply with exactly: still here"}]}
        await client.send({"type": "input.append", "input": nxt})
        done = await client.until("response.done", timeout=20)
        assert done["text"] == "still here"
        stack.wait_free(1, timeout=10)
        if time.monotonic() - t_err < 4:  # the hung call has not returned yet (hang_s = 8)
            assert stack.free_slots() == 1  # the stuck slot is withheld
    finally:
        await client.close()
    assert step_timeouts(stack) == 1
    stack.wait_free(2, timeout=20)  # the stuck call returned: the slot serves again


async def test_a_stopping_worker_does_not_wait_for_a_hung_turn(stack: Stack) -> None:
    """SIGTERM to a threads-pool worker whose chat turn is stuck in the backend for an hour
    (the step limit is 10 minutes): its warm shutdown must not wait for that thread. The turn
    is ended a few seconds after the drain (the client is told), and the worker leaves the pool
    and exits on its own."""
    worker = stack.start_worker(
        slots=2,
        OMNISERVE_BACKEND_OPTIONS='{"hang_on_text": "[hang]", "hang_s": 3600}',
        OMNISERVE_STEP_TIMEOUT_S="600",
    )
    stack.start_gateway()
    client = await Client.connect(stack.url(), query="?mode=chat")
    try:
        await client.init()
        turn = {"messages": [{"role": "user", "content": "please [hang]"}]}
        await client.send({"type": "input.append", "input": turn})
        wait_for(lambda: stack.free_slots() == 1, 10, "the turn to take a slot")
        time.sleep(0.5)  # the turn is in the backend's call
        os.killpg(worker.popen.pid, signal.SIGTERM)
        err = await client.until("error", timeout=30)
        assert err["error"]["code"] == "inference_error"
        assert "the worker is stopping" in err["error"]["message"]
    finally:
        await client.close()
    code = await asyncio.to_thread(worker.popen.wait, 30)
    assert code == EXIT_HUNG_STEP, log_text(worker)[-3000:]
    text = log_text(worker)
    assert "the worker is stopping: 5 s after its drain ended" in text
    assert "its only sessions left hung in the backend" in text
    assert stack.live_slots() == 0 and stack.free_slots() == 0  # its slots left the pool


async def test_a_stopping_prefork_worker_does_not_wait_for_a_hung_step(stack: Stack) -> None:
    """The same with a prefork worker and a duplex step stuck for an hour: the pool process
    ends the session and exits; its parent, stopping, does not replace it, and exits too."""
    worker = stack.start_worker(
        OMNISERVE_BACKEND_OPTIONS='{"hang_after_steps": 3, "hang_s": 3600}',
        OMNISERVE_STEP_TIMEOUT_S="600",
    )
    stack.start_gateway()
    probe = await DuplexProbe.open(stack.url())
    try:
        await await_for(lambda: probe.chunks_sent >= 5, 20, "the third step to hang")
        os.killpg(worker.popen.pid, signal.SIGTERM)
        await await_for(lambda: probe.closed_at is not None, 30, "the session to end")
        errors = [f["error"] for _, f in probe.frames if f["type"] == "error"]
        assert [e["code"] for e in errors] == ["backend_error"], errors
        assert "the worker is stopping" in errors[0]["message"]
    finally:
        await probe.close()
    await asyncio.to_thread(worker.popen.wait, 30)
    assert "the worker is stopping: 5 s after its drain ended" in log_text(worker)
    assert stack.live_slots() == 0 and stack.free_slots() == 0
