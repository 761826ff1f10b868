"""The waiting room in Flower: Celery task events for the sessions that wait for a worker slot.

Why: a waiting session is no task yet. Admission sends its task to the queue of its slot's worker
only once a slot is free, so that no worker ever reserves a waiting session (Celery's prefetch
trap), and Flower, which knows tasks from their events only, showed none of them.
The gateway publishes Celery's own ``task-sent`` event for a session as it is told it is queued,
under the task id it will run with: Flower shows it PENDING from then on, and the worker's events
take the same task on (STARTED, SUCCESS). A session that leaves the queue without a slot gets
``task-revoked`` (REVOKED). The events name the task and nothing else: their args and kwargs are
empty (no prompts, media or keys; the worker's ``task-received`` shows the task's real kwargs).

They go out through a Celery event dispatcher on the broker's event exchange, from one thread of
their own (kombu is synchronous; the event loop only hands them over), in the order they were
asked for. A publish that fails is logged and dropped: Flower is a view, the session goes on.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from celery import Celery

log = logging.getLogger("omniserve.gateway")


@dataclass(eq=False, slots=True)
class WaitingTask:
    """The task a waiting session will run as, and what Flower was told of it."""

    task_id: str  # the Celery task id it is submitted with once admitted
    name: str  # the task's name (``streaming/jobs.py``)
    queued: bool = False  # its task-sent was asked for
    admitted: bool = False  # a slot came: a task-sent not yet out is not sent at all
    left: bool = False  # the wait ended without the task being submitted
    published: bool = False  # its task-sent went out (set in the publishing thread)
    revoked: bool = False  # its task-revoked went out (the same)


class WaitingEvents:
    """Publishes the waiting room's task events (see the module docstring)."""

    def __init__(self, app: Celery, gateway_id: str) -> None:
        self.app = app
        # the sender Flower names as the task's client (Celery's "<name>@<host>")
        self.hostname = f"gateway-{gateway_id}@{socket.gethostname()}"
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="waiting-events")
        self._connection: Any = None
        self._dispatcher: Any = None

    # ------------------------------------------------------------------ from the event loop
    def queued(self, task: WaitingTask) -> None:
        """The session was told it waits: Flower shows its task as sent (PENDING)."""
        if task.queued or task.admitted or task.left:
            return
        task.queued = True
        self._submit(self._send_sent, task)

    def admitted(self, task: WaitingTask) -> None:
        """A slot came: the task is submitted next, and the worker's events go on from here."""
        task.admitted = True

    def left(self, task: WaitingTask) -> None:
        """The wait ended without the task being submitted: Flower shows it revoked."""
        if task.left:
            return
        task.left = True
        if task.queued:
            self._submit(self._send_revoked, task)

    def close(self) -> None:
        """Send what was asked for, then close the broker connection (blocks: call in a
        thread)."""
        self._executor.shutdown(wait=True)
        self._reset()

    def _submit(self, send: Callable[[WaitingTask], None], task: WaitingTask) -> None:
        try:
            self._executor.submit(send, task)
        except RuntimeError:  # closed: the gateway stops, and its Flower view with it
            log.debug("%s of %s not published: closed", send.__name__, task.task_id)

    # ------------------------------------------------------------------ publishing thread
    def _send_sent(self, task: WaitingTask) -> None:
        if task.admitted or task.left:
            return  # it did not wait after all, or has stopped waiting
        # the fields of Celery's own task-sent (app/amqp.py); the queue is the slot's worker's,
        # known only once admitted
        sent = self._send(
            "task-sent",
            uuid=task.task_id,
            root_id=task.task_id,
            parent_id=None,
            name=task.name,
            args="()",
            kwargs="{}",
            retries=0,
            eta=None,
            expires=None,
            queue=None,
            exchange=None,
            routing_key=None,
        )
        task.published = sent

    def _send_revoked(self, task: WaitingTask) -> None:
        if not task.published or task.revoked:
            return
        # the fields of the worker's task-revoked for a task that never ran
        task.revoked = self._send(
            "task-revoked", uuid=task.task_id, terminated=False, signum=None, expired=False
        )

    def _send(self, event_type: str, **fields: Any) -> bool:
        try:
            if self._dispatcher is None:
                # no publisher confirms for a view (the task submissions have theirs): a
                # broker that stopped answering must not hold this thread, or the gateway's stop
                self._connection = self.app.connection_for_write(
                    transport_options={"confirm_publish": False}
                )
                self._dispatcher = self.app.events.Dispatcher(
                    self._connection,
                    hostname=self.hostname,
                    enabled=True,
                    buffer_while_offline=False,  # a failed publish raises (logged below)
                )
            self._dispatcher.send(event_type, **fields)
            return True
        except Exception:
            log.warning("could not publish %s of %s", event_type, fields["uuid"], exc_info=True)
            self._reset()
            return False

    def _reset(self) -> None:
        dispatcher, connection = self._dispatcher, self._connection
        self._dispatcher = self._connection = None
        for closing in (dispatcher, connection):
            if closing is not None:
                try:
                    closing.close()
                except Exception:
                    log.debug("closing the waiting events' connection failed", exc_info=True)


__all__ = ["WaitingEvents", "WaitingTask"]
