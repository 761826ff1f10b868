"""The broker connection of a worker: reconnect quickly after Redis comes back.

kombu retries a lost broker connection with a back-off that grows to 30 s, and Celery's
consumer gives up after ``broker_connection_max_retries`` (100) attempts. After a Redis restart
that back-off alone could keep a worker from receiving sessions for up to 30 s, so the worker
retries every 0.5-2 s, forever (``broker_connection_max_retries=None`` in ``celery_app``).
"""

from __future__ import annotations

from typing import Any

from celery.app.amqp import AMQP
from kombu import Connection

RETRY_START_S = 0.5
RETRY_STEP_S = 0.5
RETRY_MAX_S = 2.0


class QuickReconnect(Connection):
    """A kombu connection whose default retry schedule is short and flat."""

    def ensure_connection(self, *args: Any, **kwargs: Any) -> Connection:
        if len(args) <= 2:  # the caller left the intervals to us
            kwargs.setdefault("interval_start", RETRY_START_S)
            kwargs.setdefault("interval_step", RETRY_STEP_S)
            kwargs.setdefault("interval_max", RETRY_MAX_S)
        return super().ensure_connection(*args, **kwargs)


class WorkerAMQP(AMQP):
    """Celery's AMQP helper with the quickly reconnecting connection class."""

    Connection = QuickReconnect
