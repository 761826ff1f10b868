"""Celery's task events as Flower receives them, for tests that check what operators see."""

from __future__ import annotations

import threading
from typing import Any

from celery import Celery

from tests.support.fault_harness import await_for


class TaskEvents:
    """Celery's task events from the broker, as Flower receives them."""

    def __init__(self, redis_url: str) -> None:
        self.app = Celery("omniserve-test-events", broker=redis_url)
        self.events: list[dict[str, Any]] = []
        self.heard_worker = threading.Event()
        self.receiver: Any = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _on_event(self, event: dict[str, Any]) -> None:
        if event["type"].startswith("worker-"):
            self.heard_worker.set()
        else:
            self.events.append(event)

    def _run(self) -> None:
        # one capture for the whole test: each capture subscribes to the fanout and unsubscribes
        # when it returns, so a loop of short captures loses what is published in between
        with self.app.connection() as conn:
            self.receiver = self.app.events.Receiver(conn, handlers={"*": self._on_event})
            self.receiver.capture(limit=None, timeout=None, wakeup=False)

    def stop(self) -> None:
        if self.receiver is not None:
            self.receiver.should_stop = True  # seen within capture's 1 s drain interval
        self._thread.join(timeout=5)

    def of_type(self, kind: str, name: str | None = None) -> list[dict[str, Any]]:
        """The task events of one type (``name``: only those of tasks so named, as told by
        their ``task-received``)."""
        events = list(self.events)
        tasks = {e["uuid"]: e["name"] for e in events if e.get("name")}
        return [
            e
            for e in events
            if e["type"] == kind and (name is None or tasks.get(e.get("uuid")) == name)
        ]

    def of(self, task_id: str) -> dict[str, dict[str, Any]]:
        """The events of one task by type (task-received, task-started, task-failed ...)."""
        return {e["type"]: e for e in list(self.events) if e.get("uuid") == task_id}


async def ended(events: TaskEvents, task_id: str) -> dict[str, dict[str, Any]]:
    """The events of a task once its last one (succeeded or failed) came, within 30 s."""
    await await_for(
        lambda: {"task-succeeded", "task-failed"} & set(events.of(task_id)),
        30,
        f"the end of task {task_id}",
    )
    return events.of(task_id)
