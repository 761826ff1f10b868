"""The ``session.expiring`` notices (``ExpiryNotice``)."""

from __future__ import annotations

from streaming.events import ExpiringReason
from tasks.expiry import ExpiryNotice


def test_the_duration_notice_comes_once_the_lead_before_the_deadline() -> None:
    n = ExpiryNotice(lead_s=30, deadline_ts=1000.0, context_limit=None)
    assert n.duration(969.0) is None
    ev = n.duration(970.5)
    assert ev is not None and ev.reason is ExpiringReason.DURATION and ev.time_left_ms == 29_500
    assert n.duration(980.0) is None  # told once
    assert ExpiryNotice(30, 1000.0, None).duration(1001.0).time_left_ms == 0  # type: ignore[union-attr]


def test_the_context_notice_from_the_growth_per_second_of_input() -> None:
    n = ExpiryNotice(lead_s=5, deadline_ts=1e12, context_limit=1000)
    n.started(100)
    assert n.context(200, 1.0) is None  # 100 tokens a second: 8 s left
    ev = n.context(400, 1.0)  # 150 a second: 4 s left
    assert ev is not None and ev.reason is ExpiringReason.CONTEXT and ev.time_left_ms == 4000
    assert n.context(900, 1.0) is None  # told once


def test_no_context_notice_with_rollover_on() -> None:
    n = ExpiryNotice(lead_s=5, deadline_ts=1e12, context_limit=None)
    n.started(100)
    assert n.context(999, 1.0) is None
