"""streaming/stalls.py: a round trip that ends a Redis stall starts a settling period.

Real time (a few tenths of a second); the end-to-end case, Redis frozen with SIGSTOP while
sessions run, is tests/faults/test_redis_stall.py.
"""

from __future__ import annotations

import time

from streaming.stalls import STALL_S, StallWatch

EVERY_S = 0.1
SETTLE_S = 0.3


def on_time(watch: StallWatch, n: int = 3) -> None:
    """``n`` round trips answered at once, ``EVERY_S`` apart."""
    for _ in range(n):
        assert watch.answered(time.monotonic()) is False
        time.sleep(EVERY_S)
    watch.answered(time.monotonic())


def test_answers_on_time_are_believed() -> None:
    watch = StallWatch(EVERY_S, SETTLE_S)
    assert not watch.settled()  # nothing answered yet
    on_time(watch)
    assert watch.settled()


def test_a_slow_answer_settles_first() -> None:
    watch = StallWatch(EVERY_S, SETTLE_S)
    on_time(watch)
    assert watch.answered(time.monotonic() - STALL_S - 0.1) is True  # Redis held it
    assert not watch.settled()
    t0 = time.monotonic()
    while not watch.settled():
        time.sleep(EVERY_S / 2)
        watch.answered(time.monotonic())
    assert time.monotonic() - t0 >= SETTLE_S - 0.01


def test_a_late_round_trip_and_a_failed_one_end_a_stall() -> None:
    late = StallWatch(EVERY_S, SETTLE_S)
    on_time(late)
    time.sleep(EVERY_S + STALL_S + 0.05)  # this process (or its thread) was held up
    assert late.answered(time.monotonic()) is True
    assert not late.settled()
    failed = StallWatch(EVERY_S, SETTLE_S)
    on_time(failed)
    failed.failed()
    assert not failed.settled()
    assert failed.answered(time.monotonic()) is True  # fast, but Redis was away before
    assert not failed.settled()


def test_no_answer_for_a_while_is_not_settled() -> None:
    watch = StallWatch(EVERY_S, SETTLE_S)
    on_time(watch)
    time.sleep(EVERY_S + STALL_S + 0.05)  # the round trip now in flight is held up
    assert not watch.settled()


def test_a_pause_on_purpose_is_no_stall() -> None:
    watch = StallWatch(EVERY_S, SETTLE_S)
    on_time(watch)
    watch.paused()  # nothing to read for a while
    time.sleep(EVERY_S + STALL_S + 0.05)
    assert watch.answered(time.monotonic()) is False
    assert watch.settled()


def test_redis_clock_tells_a_redis_stall_from_the_readers_own() -> None:
    """With Redis's clock given, only a read that Redis ran late starts a settling period; a
    reader that was itself held up (its answer waited, or it sent late) reads on as usual."""
    watch = StallWatch(EVERY_S, SETTLE_S)
    t, server = time.monotonic(), 1_000.0  # Redis's clock has an offset of its own
    assert watch.answered(t, server) is False
    # the reader froze for 5 s after sending: Redis ran the read at once, the answer waited
    assert watch.answered(t + 0.5, server + 0.5) is False
    assert watch.settled()
    # the reader sent 5 s late (its loop was held up): both clocks moved on together
    assert watch.answered(t + 5.5, server + 5.5) is False
    assert watch.settled()
    # Redis ran the next read 4 s after it was sent: Redis stalled
    assert watch.answered(t + 6.0, server + 10.0) is True
    assert not watch.settled()


def test_refused_writes_hold_every_lease_until_writes_go_through_and_settle() -> None:
    """Redis full or read-only answers reads on time; no lease can be renewed meanwhile."""
    watch = StallWatch(EVERY_S, SETTLE_S)
    on_time(watch)
    watch.writes_accepted()  # (a write that goes through with none refused changes nothing)
    assert watch.settled() and not watch.refusing
    watch.writes_refused()
    assert watch.refusing
    on_time(watch)  # the reads keep coming on time
    assert not watch.settled()
    watch.writes_accepted()
    t0 = time.monotonic()
    while not watch.settled():
        time.sleep(EVERY_S / 2)
        watch.answered(time.monotonic())
    assert time.monotonic() - t0 >= SETTLE_S - 0.01
