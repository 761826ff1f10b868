"""tasks/broker.py: the worker's broker connection retries on its own short schedule.

Against a port where nothing listens (a real refused connection); kombu reports each retry's
interval to the errback before it sleeps.
"""

from __future__ import annotations

import pytest
from kombu.exceptions import OperationalError

from omniserve.redis_server import free_port
from tasks.broker import RETRY_MAX_S, RETRY_START_S, RETRY_STEP_S, QuickReconnect


def retries(**intervals: float) -> list[float]:
    seen: list[float] = []
    conn = QuickReconnect(f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(OperationalError):
        conn.ensure_connection(lambda _exc, interval: seen.append(interval), 2, **intervals)
    return seen


def test_intervals_left_to_the_connection_are_short() -> None:
    assert retries() == [RETRY_START_S, RETRY_START_S + RETRY_STEP_S]
    assert RETRY_START_S + RETRY_STEP_S <= RETRY_MAX_S


def test_intervals_the_caller_gives_are_kept() -> None:
    assert retries(interval_start=0.1, interval_step=0.0, interval_max=0.1) == [0.1, 0.1]
