"""The worker's task events (tasks/task_events.py): sent just after a task starts, all of them,
a warm shutdown's last ones included. Real worker processes on the threads pool (the one where
the events' publish competed with the task's start), a real Celery event receiver."""

from __future__ import annotations

import asyncio
import os
import signal

from kombu.asynchronous import Hub

from tasks.task_events import FLUSH_DELAY_S, LOST_AFTER_S, DeferredEventsConsumer
from tests.support.celery_events import TaskEvents, ended
from tests.support.client import Client
from tests.support.stack import Stack

TURN = {
    "messages": [{"role": "user", "content": "Reply with exactly: one two three"}],
    "streaming": True,
    "tts": {"enabled": False},
}


async def one_turn(url: str) -> str:
    """Run one chat turn to its end; returns its task id."""
    c = await Client.connect(url, query="?mode=chat")
    try:
        created = await c.init()
        await c.send({"type": "input.append", "input": TURN})
        done = await c.until("response.done")
        assert "one two three" in done["text"], done
        return f"{created['session_id']}_t1"
    finally:
        await c.close()


async def test_task_events_all_arrive_each_batch_after_the_delay(
    stack: Stack, task_events: TaskEvents
) -> None:
    stack.start_worker(slots=2)  # the threads pool
    stack.start_gateway()
    assert await asyncio.to_thread(task_events.heard_worker.wait, 30)
    for _ in range(2):
        task_id = await one_turn(stack.url())
        got = await ended(task_events, task_id)
        assert {"task-received", "task-started", "task-succeeded"} <= set(got), got
        # published one delay after the first event of its batch entered the buffer (not at
        # the consumer's next turn, as the task starts); later ones of a batch waited less
        waited = max(e["local_received"] - e["timestamp"] for e in got.values())
        assert waited >= 0.9 * FLUSH_DELAY_S, got


async def test_a_warm_shutdown_sends_the_events_still_buffered(
    stack: Stack, task_events: TaskEvents
) -> None:
    worker = stack.start_worker(slots=2)
    stack.start_gateway()
    assert await asyncio.to_thread(task_events.heard_worker.wait, 30)
    task_id = await one_turn(stack.url())
    # at once: the turn's task-succeeded is still in the buffer (or its task still ending)
    os.kill(worker.popen.pid, signal.SIGTERM)
    got = await ended(task_events, task_id)
    assert "task-succeeded" in got, got
    assert await asyncio.to_thread(worker.popen.wait, 60) is not None


def test_one_publish_is_scheduled_at_a_time_and_a_lost_one_again() -> None:
    """The consumer's scheduling rule on a real kombu event loop (no worker around it)."""
    published: list[int] = []
    consumer = DeferredEventsConsumer.__new__(DeferredEventsConsumer)
    consumer.hub = Hub()
    consumer._flush_events = lambda: published.append(1)
    for _ in range(3):  # three events: one publish scheduled
        consumer._schedule_event_flush()
    assert len(consumer.hub.timer.queue) == 1
    consumer.hub.timer.clear()  # its timer lost: nothing more would ever publish the buffer
    consumer._schedule_event_flush()
    assert len(consumer.hub.timer.queue) == 0  # not yet taken as lost
    consumer._flush_due -= LOST_AFTER_S + FLUSH_DELAY_S
    consumer._schedule_event_flush()
    [entry] = consumer.hub.timer.queue
    consumer.hub.timer.clear()
    entry.entry()  # it fires: the buffer is published, and the next event schedules anew
    assert published == [1]
    consumer._schedule_event_flush()
    assert len(consumer.hub.timer.queue) == 1
