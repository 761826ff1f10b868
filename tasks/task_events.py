"""The worker's consumer, with Celery's task events (what Flower shows) sent just after a task
starts instead of while it starts.

Celery buffers a worker's task events (``task-received``, ``task-started``, ``task-succeeded``)
and asks its event loop to publish them at its next turn. That turn comes as the task is handed
to the pool: the publish (serialising the batch, a Redis ``PUBLISH``) would run in the consumer's
thread while the pool thread claims the session and begins the turn, and on the threads pool
both want the same interpreter lock (and, where the worker shares a core with Redis, the same
core), so every chat turn's pickup would wait for it (docs/BENCHMARKS.md, "task events after the
start", has the measurement). Here the buffer is published ``FLUSH_DELAY_S`` after the first
event that entered it, in one batch with whatever followed: Flower sees the same events, that
much later.

Set as ``worker_consumer`` (tasks/celery_app.py). The buffer is also published when the
consumer stops, so a warm shutdown loses none of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from celery.worker.consumer import Consumer

FLUSH_DELAY_S = 0.05
"""How long a task event waits in the buffer: past a task's start, short next to Flower's view."""
LOST_AFTER_S = 1.0
"""A scheduled publish this much overdue is taken as lost (see ``_schedule_event_flush``)."""


class DeferredEventsConsumer(Consumer):
    """Celery's consumer; its buffered task events go out ``FLUSH_DELAY_S`` later (see above)."""

    # Celery's own attributes, which celery-types leaves out
    hub: Any  # kombu's event loop (None for the solo pool, which buffers nothing)
    _flush_events: Callable[[], None]

    _flush_due = 0.0  # monotonic time the scheduled publish is due (0: none scheduled)

    # (celery-types has it return a callable; Celery's returns nothing)
    def on_send_event_buffered(self) -> None:  # type: ignore[override]
        """An event entered the buffer (from any thread): have the loop schedule the publish."""
        if self.hub:
            self.hub.call_soon(self._schedule_event_flush)  # thread-safe; the timer is not

    def _schedule_event_flush(self) -> None:
        """One publish scheduled at a time; one overdue by a second is taken as lost (its timer
        cleared with the loop) and scheduled again, so events never stay buffered for good."""
        now = time.monotonic()
        if self._flush_due and now < self._flush_due + LOST_AFTER_S:
            return
        self._flush_due = now + FLUSH_DELAY_S
        self.hub.call_later(FLUSH_DELAY_S, self._deferred_event_flush)

    def _deferred_event_flush(self) -> None:
        self._flush_due = 0.0
        self._flush_events()

    def stop(self) -> None:
        self._flush_events()
        super().stop()

    def shutdown(self) -> None:
        self._flush_events()
        super().shutdown()
