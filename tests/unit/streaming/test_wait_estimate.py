"""streaming/wait_estimate.py through QueueSnapshot: waits of crafted queues, mode by mode."""

from __future__ import annotations

import math

from streaming.admission import QueueSnapshot
from streaming.wait_estimate import DEFAULT_HOLD_S, OVERDUE_MIN_S, HoldTimes, Running, Waiting

MEANS = {"chat": 4.0, "audio": 20.0, "video": 120.0}


def snapshot(
    running: list[Running],
    waiting: list[Waiting],
    slots: int = 1,
    means: dict[str, float] | None = None,
    overall: float = 4.0,
    loading: int = 0,
    load_left_s: float = 0.0,
) -> QueueSnapshot:
    return QueueSnapshot(
        order={f"t{i}": i + 1 for i in range(len(waiting))},
        length=len(waiting),
        live_slots=slots,
        mean_hold_s=overall,
        loading_slots=loading,
        load_left_s=load_left_s,
        running=running,
        waiting=waiting,
        mode_hold_s=MEANS if means is None else means,
    )


def test_a_chat_turn_behind_an_audio_session_waits_for_what_the_session_has_left() -> None:
    """The slot's audio session is 10 s into a typical 20 s hold: the chat turn at the head
    waits about 10 s, not the mean of all holds (4 s, chat turns outnumbering sessions); the
    chat turn behind it waits for that turn too."""
    snap = snapshot([Running("audio", 10.0)], [Waiting("chat"), Waiting("chat")])
    assert snap.estimated_wait_s(1) == 10
    assert snap.estimated_wait_s(2) == 14


def test_tickets_ahead_take_slots_as_they_free_and_hold_them_for_their_own_mode() -> None:
    """Two slots: a chat turn 1 s into 4 s (3 s left), a video session 100 s into 120 s (20 s
    left). The audio ticket at the head takes the first slot to free (at 3 s) for 20 s; the next
    one gets the video's slot at 20 s; the third the audio's at 23 s."""
    snap = snapshot(
        [Running("chat", 1.0), Running("video", 100.0)],
        [Waiting("audio"), Waiting("chat"), Waiting("chat")],
        slots=2,
    )
    assert [snap.estimated_wait_s(p) for p in (1, 2, 3)] == [3, 20, 23]


def test_an_overdue_session_runs_a_little_longer_never_past_its_limit() -> None:
    overdue = snapshot([Running("audio", 45.0)], [Waiting("chat")])
    assert overdue.estimated_wait_s(1) == max(OVERDUE_MIN_S, 0.1 * MEANS["audio"])
    capped = snapshot([Running("video", 10.0, cap_left_s=6.0)], [Waiting("chat")])
    assert capped.estimated_wait_s(1) == 6  # its duration limit ends it before its mean
    # a ticket whose own limit runs out while it waits leaves without holding the slot
    leaves = snapshot([Running("chat", 0.0)], [Waiting("audio", cap_left_s=2.0), Waiting("chat")])
    assert leaves.estimated_wait_s(2) == 4


def test_idle_slots_serve_at_once_and_a_mode_without_history_has_its_default() -> None:
    snap = snapshot([Running("audio", 0.0)], [Waiting("chat"), Waiting("chat")], slots=2, means={})
    assert snap.estimated_wait_s(1) == 0  # the second slot is idle (a dispatch is under way)
    assert snap.estimated_wait_s(2) == DEFAULT_HOLD_S["chat"]  # the chat turn's, then free
    assert snapshot([Running("audio", 0.0)], [Waiting("chat")], means={}).estimated_wait_s(
        1
    ) == round(DEFAULT_HOLD_S["audio"])
    # a ticket of no known mode holds a slot for the mean of all holds
    unknown = snapshot([Running("", 0.0)], [Waiting(), Waiting()], overall=7.0, means={})
    assert [unknown.estimated_wait_s(p) for p in (1, 2)] == [7, 14]


def test_while_workers_load_their_load_time_comes_first() -> None:
    snap = snapshot([], [Waiting("chat")] * 3, slots=0, loading=2, load_left_s=12.0)
    assert [snap.estimated_wait_s(p) for p in (1, 2, 3)] == [12, 12, 16]
    # no capacity at all: nothing to wait for but the queue itself
    none = snapshot([], [Waiting("chat")], slots=0)
    assert none.estimated_wait_s(1) == 0


def test_positions_past_the_known_queue_and_an_infinite_limit() -> None:
    snap = snapshot([Running("chat", 2.0, math.inf)], [], overall=5.0)
    assert [snap.estimated_wait_s(p) for p in (1, 2)] == [2, 7]


def test_an_operator_baseline_stands_in_until_the_mode_is_measured() -> None:
    holds = HoldTimes({"chat": 4.0}, 30.0, base={"chat": 99.0, "video": 42.0})
    assert holds.of("chat") == 4.0  # measured wins
    assert holds.of("video") == 42.0  # the baseline, before any video session ended
    assert holds.of("audio") == DEFAULT_HOLD_S["audio"]
