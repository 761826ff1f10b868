"""tasks/runtime.py: a slot is marked taken (its session runs on another slot now: it ends here
silently) only while that session still runs on it.

The partition test caught it (tests/faults/test_partition.py, a worker cut off): two beats in a
row found the cut worker's sessions restarted elsewhere; one of those sessions ended between the
second beat's snapshot and its reply, and the reply marked the slot again after ``end`` had
cleared it. The mark stayed: every later session given that slot was ended at once as taken
(``backend_error`` for its client). Here the session ends while a real beat is on its way.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from omnicore.settings import Settings
from tasks.runtime import WorkerRuntime


@pytest.fixture
def runtime(redis_server: str) -> Iterator[WorkerRuntime]:
    rt = WorkerRuntime("taken-node", slots=1, settings=Settings(
        redis_url=redis_server, key_prefix="u" + uuid.uuid4().hex[:8]
    ))  # fmt: skip
    try:
        yield rt
    finally:
        client = redis.Redis.from_url(redis_server)
        stale = list(client.scan_iter(f"{rt.keys.prefix}:*"))
        if stale:
            client.delete(*stale)
        client.close()


def _restarted_elsewhere(rt: WorkerRuntime, session_id: str) -> None:
    """The session's lease now names another slot (its gateway restarted it there)."""
    rt.redis.set(rt.keys.session_lease(session_id), "elsewhere|0", px=60_000)


def test_a_session_that_ends_during_the_beat_leaves_its_slot_unmarked(
    runtime: WorkerRuntime,
) -> None:
    rt, slot = runtime, runtime.slot_ids[0]
    rt.begin(slot, "s1")
    _restarted_elsewhere(rt, "s1")
    beat = rt.registry.heartbeat

    def beat_while_the_session_ends(
        idle: list[str], active: dict[str, str]
    ) -> tuple[bool, list[str]]:
        got = beat(idle, active)
        rt.end(slot, "s1", held_s=0.0)  # it ended (as taken) while the beat's reply was on its way
        return got

    rt.registry.heartbeat = beat_while_the_session_ends  # type: ignore[method-assign]
    rt.beat_once()
    assert not rt.was_taken(slot)  # the slot's next session runs
    rt.registry.heartbeat = beat  # type: ignore[method-assign]
    rt.begin(slot, "s2")  # the next session there, restarted elsewhere in its turn
    _restarted_elsewhere(rt, "s2")
    rt.beat_once()
    assert rt.was_taken(slot)
    rt.end(slot, "s2", held_s=0.0)
    assert not rt.was_taken(slot)
