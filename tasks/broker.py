"""The broker connection of a worker: reconnect quickly after Redis comes back.

kombu retries a lost broker connection with a back-off that grows to 30 s, and Celery's
consumer gives up after ``broker_connection_max_retries`` (100) attempts. After a Redis restart
that back-off alone could keep a worker from receiving sessions for up to 30 s, so the worker
retries every 0.5-2 s, forever (``broker_connection_max_retries=None`` in ``celery_app``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Self

from celery.app.amqp import AMQP
from kombu import Connection

RETRY_START_S = 0.5
RETRY_STEP_S = 0.5
RETRY_MAX_S = 2.0


class QuickReconnect(Connection):
    """A kombu connection whose default retry schedule is short and flat."""

    def ensure_connection(
        self,
        errback: Callable[[Exception, float], None] | None = None,
        max_retries: int | None = None,
        interval_start: float = RETRY_START_S,
        interval_step: float = RETRY_STEP_S,
        interval_max: float = RETRY_MAX_S,
        callback: Callable[[], None] | None = None,
        reraise_as_library_errors: bool = True,
        timeout: float | None = None,
    ) -> Self:
        """kombu's own, with this module's retry schedule for intervals the caller leaves out.

        kombu takes float seconds and ``max_retries=None`` ("forever"); kombu-stubs types them
        as int, hence the ``arg-type`` ignores on exactly those arguments.
        """
        return super().ensure_connection(
            errback,
            max_retries,  # type: ignore[arg-type]
            interval_start,  # type: ignore[arg-type]
            interval_step,  # type: ignore[arg-type]
            interval_max,  # type: ignore[arg-type]
            callback,
            reraise_as_library_errors,
            timeout,  # type: ignore[arg-type]
        )


class WorkerAMQP(AMQP):
    """Celery's AMQP helper with the quickly reconnecting connection class."""

    Connection = QuickReconnect
