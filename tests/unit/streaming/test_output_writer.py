"""``OutputWriter.write_now`` / ``OutputPublisher.together(now=True)``: a duplex step's batch
written by the emitting thread when the writer is idle, and never ahead of anything handed over
before it (against the run's real Redis)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aioredis

from streaming.events import Listen, TextDelta
from streaming.keys import Keys
from streaming.output import read_log
from streaming.output_publisher import OutputPublisher
from streaming.output_writer import OutputWriter

SID = "rt_write_now"


class Recorder(OutputPublisher):
    """A real publisher that notes which thread wrote each batch, and can be held mid-write."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.writes: list[tuple[list[int], str]] = []
        self.hold = threading.Event()
        self.hold.set()
        self.writing = threading.Event()

    def write(self, batch: list[tuple[int, bytes]]) -> None:
        self.writing.set()
        assert self.hold.wait(10)
        self.writes.append(([seq for seq, _ in batch], threading.current_thread().name))
        super().write(batch)


@pytest.fixture
def recorder(sync_redis: redis.Redis, keys: Keys) -> Iterator[Recorder]:
    pub = Recorder(sync_redis, keys, SID, log_maxlen=64, ttl_s=60)
    try:
        yield pub
    finally:
        pub.hold.set()
        pub.finish(linger_s=1)


def step(pub: OutputPublisher, n: int) -> None:
    """One duplex step's output, as tasks/duplex.py emits it."""
    with pub.together(now=True):
        pub.emit(TextDelta(text=f"t{n}"))
        pub.emit(Listen(input_id=f"input_{n}", kv_cache_length=0))


async def test_an_idle_writers_batch_is_written_by_the_emitting_thread_before_it_goes_on(
    recorder: Recorder, async_redis: aioredis.Redis, keys: Keys
) -> None:
    step(recorder, 1)
    # (no flush: the block returned once the batch was in Redis)
    assert [ev.seq for ev in await read_log(async_redis, keys, SID, 1)] == [1, 2]
    assert recorder.writes == [([1, 2], threading.current_thread().name)]
    with recorder.together():  # without ``now``: the writer thread's, as before
        recorder.emit(TextDelta(text="queued"))
    assert recorder.flush()
    assert recorder.writes[-1] == ([3], recorder.writer.name)


async def test_a_batch_waits_behind_what_the_writer_has_not_written_yet(
    recorder: Recorder, async_redis: aioredis.Redis, keys: Keys
) -> None:
    recorder.hold.clear()
    recorder.emit(TextDelta(text="first"))  # queued; its write is held
    assert recorder.writing.wait(5)
    step(recorder, 1)  # the writer is busy: queued behind, not written ahead
    assert [ev.seq for ev in await read_log(async_redis, keys, SID, 1)] == []
    recorder.hold.set()
    assert recorder.flush()
    assert [seqs for seqs, _ in recorder.writes] == [[1], [2, 3]]
    assert {name for _, name in recorder.writes} == {recorder.writer.name}
    assert [ev.seq for ev in await read_log(async_redis, keys, SID, 1)] == [1, 2, 3]


async def test_a_batch_handed_over_during_a_callers_write_goes_after_it(
    recorder: Recorder, async_redis: aioredis.Redis, keys: Keys
) -> None:
    recorder.hold.clear()
    stepping = threading.Thread(target=step, args=(recorder, 1), name="session")
    stepping.start()
    assert recorder.writing.wait(5)  # the session thread is writing its step's batch
    other = threading.Thread(target=recorder.emit, args=(TextDelta(text="late"),))
    other.start()  # (a watchdog's event): it waits for the write in progress
    other.join(0.3)
    assert other.is_alive()
    recorder.hold.set()
    stepping.join(5)
    other.join(5)
    assert recorder.flush()
    assert recorder.writes == [([1, 2], "session"), ([3], recorder.writer.name)]
    assert [ev.seq for ev in await read_log(async_redis, keys, SID, 1)] == [1, 2, 3]


def test_a_writer_of_its_own_also_writes_now() -> None:
    """The pending count goes back to zero once the writer thread has written a batch."""
    written: list[list[int]] = []

    class Target:
        def write(self, batch: list[tuple[int, bytes]]) -> None:
            written.append([seq for seq, _ in batch])

    writer = OutputWriter("out-test-now")
    target = Target()
    writer.put(target, [(1, b"a")])
    assert writer.flush()
    assert writer.write_now(target, [(2, b"b")])
    writer.stop()
    assert written == [[1], [2]]
