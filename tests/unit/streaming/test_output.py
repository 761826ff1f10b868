"""streaming/output.py against a real Redis: ordered delivery, replay from the log, and gaps.

The worker side (``OutputPublisher``, a thread with a synchronous client) and the gateway side
(``OutputBus`` / ``SessionOutput``, asyncio) run in this process, talking through Redis.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import numpy as np
import pybase64
import pytest
import redis
import redis.asyncio as aioredis

from streaming.events import Event, Gap, Listen, Speak, TextDelta, encode_event
from streaming.keys import Keys
from streaming.output import OutputBus, SessionOutput, read_log
from streaming.output_publisher import LogBound, OutputPublisher
from streaming.output_writer import OutputWriter

SID = "rt_unit"
LONG_S = 30.0  # a wait that only an event (or a cancel) ends within the test


@pytest.fixture(params=["script", "pipeline"])
def publisher(
    sync_redis: redis.Redis, keys: Keys, request: pytest.FixtureRequest
) -> Iterator[OutputPublisher]:
    """A publisher writing one way or the other (``output_write``)."""
    pub = OutputPublisher(sync_redis, keys, SID, log_maxlen=64, ttl_s=60, write=request.param)
    try:
        yield pub
    finally:
        pub.finish(linger_s=1)


def text(n: int) -> TextDelta:
    return TextDelta(text=f"t{n}")


async def emit(pub: OutputPublisher, *events: Event) -> None:
    for ev in events:
        pub.emit(ev)
    assert await asyncio.to_thread(pub.flush)


async def opened(
    bus: OutputBus,
    session_id: str,
    after: int = 0,
    on_overflow: Callable[[], None] | None = None,
) -> SessionOutput:
    """``bus.open``, then wait until Redis has taken its SUBSCRIBE (``PUBSUB NUMSUB``): redis-py
    sends it without waiting, and an event the worker publishes before Redis has taken it
    reaches no reader (a gateway opens the channel before the session's task is submitted)."""
    out = await bus.open(session_id, after, on_overflow)
    channel = bus.keys.output_channel(session_id)
    deadline = time.monotonic() + LONG_S
    while (await bus.redis.pubsub_numsub(channel))[0][1] < 1:
        assert time.monotonic() < deadline, f"{channel} never subscribed"
        await asyncio.sleep(0.01)
    return out


async def collect(out: SessionOutput, until_seq: int) -> list[Event]:
    got: list[Event] = []
    while not got or got[-1].seq < until_seq:
        got += await out.get(timeout=10)
    return got


async def test_live_events_arrive_in_order_numbered_and_stamped(
    bus: OutputBus, publisher: OutputPublisher
) -> None:
    out = await opened(bus, SID)
    before = time.time()
    await emit(publisher, text(1), text(2), Listen(input_id="input_1", kv_cache_length=5))
    got = await collect(out, 3)
    assert [e.seq for e in got] == [1, 2, 3]
    assert [type(e) for e in got] == [TextDelta, TextDelta, Listen]
    assert all(before <= e.emitted_at <= time.time() for e in got)
    assert out.gaps == 0


async def test_a_late_reader_gets_the_earlier_events_from_the_log(
    bus: OutputBus, publisher: OutputPublisher
) -> None:
    await emit(publisher, text(1), text(2), text(3))  # nobody is listening yet
    out = await opened(bus, SID)
    await emit(publisher, text(4))
    got = await collect(out, 4)
    assert [e.seq for e in got] == [1, 2, 3, 4]  # 1..3 from the log, 4 live
    assert [e.text for e in got if isinstance(e, TextDelta)] == ["t1", "t2", "t3", "t4"]


async def test_a_resumed_reader_starts_after_what_it_had(
    bus: OutputBus, publisher: OutputPublisher
) -> None:
    first = await opened(bus, SID)
    await emit(publisher, text(1))
    assert [e.seq for e in await collect(first, 1)] == [1]
    await bus.close(SID)  # the reader goes away (its gateway, its client)
    await emit(publisher, text(2), text(3))  # published to nobody
    resumed = await opened(bus, SID, after=1)
    await emit(publisher, text(4))
    assert [e.seq for e in await collect(resumed, 4)] == [2, 3, 4]


async def test_replay_overlapping_the_live_channel_delivers_each_event_once(
    bus: OutputBus, publisher: OutputPublisher
) -> None:
    out = await opened(bus, SID)
    await emit(publisher, text(1), text(2))
    assert [e.seq for e in await out.catch_up()] == [1, 2]  # e.g. a lease check read the log
    assert await out.get(timeout=10) == []  # the live copies of 1 and 2 are dropped
    assert await out.get(timeout=10) == []
    await emit(publisher, text(3))
    assert [e.seq for e in await out.get(timeout=10)] == [3]


async def test_events_the_log_no_longer_holds_become_a_gap(
    bus: OutputBus, sync_redis: redis.Redis, keys: Keys
) -> None:
    # A log capped at one event keeps only the newest, so a late reader finds the others gone.
    pub = OutputPublisher(sync_redis, keys, SID, log_maxlen=1, ttl_s=60)
    n = 300
    try:
        await emit(pub, *(text(i) for i in range(1, n + 1)))
        out = await opened(bus, SID)
        await emit(pub, text(n + 1))
        got = await collect(out, n + 1)
    finally:
        pub.finish(linger_s=1)
    held = await read_log(bus.redis, keys, SID, 1)  # as the reader found it: nothing was added
    assert 1 < held[0].seq <= n + 1  # trimmed
    assert got[0] == Gap(first=1, last=held[0].seq - 1)
    assert [e.seq for e in got[1:]] == list(range(held[0].seq, n + 2))
    assert out.gaps == held[0].seq - 1


async def test_a_message_that_is_not_an_event_is_reported_as_a_gap(
    bus: OutputBus, publisher: OutputPublisher, sync_redis: redis.Redis, keys: Keys
) -> None:
    out = await opened(bus, SID)
    await emit(publisher, text(1))
    assert [e.seq for e in await collect(out, 1)] == [1]
    # event 2 arrives corrupted, on the channel and in the log
    sync_redis.xadd(keys.output_log(SID), {"e": b"{corrupt"}, id="2-1")
    sync_redis.publish(keys.output_channel(SID), b"{corrupt")
    publisher.seq = 2
    await emit(publisher, text(3))
    got = await collect(out, 3)
    assert got == [Gap(first=2, last=2), got[1]] and got[1].seq == 3


async def test_finish_flushes_and_lets_the_log_expire(sync_redis: redis.Redis, keys: Keys) -> None:
    pub = OutputPublisher(sync_redis, keys, SID, log_maxlen=64, ttl_s=600)
    for i in range(1, 101):
        pub.emit(text(i))
    pub.finish(linger_s=30)
    assert sync_redis.xlen(keys.output_log(SID)) >= 64
    last = sync_redis.xrevrange(keys.output_log(SID), count=1)[0][0]
    assert last == b"100-1"
    assert 0 < sync_redis.ttl(keys.output_log(SID)) <= 30


async def test_undelivered_output_is_bounded(
    async_redis: aioredis.Redis, keys: Keys, sync_redis: redis.Redis
) -> None:
    """A reader that does not keep up: past the event cap everything waiting is dropped, nothing
    more is kept, and the session is told once; a reader that keeps up never is."""
    bus = OutputBus(async_redis, keys, max_events=5, max_bytes=1 << 20)
    await bus.start()
    told: list[str] = []
    try:
        slow = await opened(bus, "rt_slow", on_overflow=lambda: told.append("slow"))
        fast = await opened(bus, "rt_fast", on_overflow=lambda: told.append("fast"))
        pubs = [OutputPublisher(sync_redis, keys, s, 64, 60) for s in ("rt_slow", "rt_fast")]
        for n in range(1, 21):
            for pub in pubs:
                pub.emit(text(n))
            assert await asyncio.to_thread(pubs[1].flush)
            assert [ev.seq for ev in await fast.get(timeout=10)] == [n]
        await asyncio.to_thread(pubs[0].flush)
        deadline = time.monotonic() + 10
        while not told and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert told == ["slow"]
        assert slow.overflowed and not slow.items and slow.pending_bytes == 0
        for pub in pubs:
            pub.finish(linger_s=1)
    finally:
        await bus.stop()


async def test_undelivered_bytes_are_counted_until_read(
    async_redis: aioredis.Redis, keys: Keys, publisher: OutputPublisher
) -> None:
    bus = OutputBus(async_redis, keys, max_events=100, max_bytes=400)
    await bus.start()
    told: list[bool] = []
    try:
        out = await opened(bus, SID, on_overflow=lambda: told.append(True))
        await emit(publisher, text(1), text(2))
        deadline = time.monotonic() + 10
        while len(out.items) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        waiting = out.pending_bytes
        assert 0 < waiting <= 400 and not told
        await out.get(timeout=5)
        assert 0 < out.pending_bytes < waiting  # what was read no longer counts
        await emit(publisher, TextDelta(text="x" * 500))  # one big event passes the byte cap
        deadline = time.monotonic() + 10
        while not told and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert told == [True] and not out.items
    finally:
        await bus.stop()


async def test_sessions_that_share_a_writer_keep_their_own_order(
    sync_redis: redis.Redis, async_redis: aioredis.Redis, keys: Keys, bus: OutputBus
) -> None:
    """A slot's writer thread serves one session after another (and, interleaved, two): each
    session's events reach its own channel and log in order, and finishing a session leaves
    the shared writer running for the next."""
    writer = OutputWriter("out-test-slot")
    first, second = await opened(bus, "rt_first"), await opened(bus, "rt_second")
    pubs = [
        OutputPublisher(sync_redis, keys, s, 64, 60, writer=writer)
        for s in ("rt_first", "rt_second")
    ]
    thread = writer._thread
    for n in range(1, 41):
        pubs[n % 2].emit(text(n))
    assert await asyncio.to_thread(pubs[0].flush)
    assert [ev.seq for ev in await collect(first, 20)] == list(range(1, 21))
    assert [ev.seq for ev in await collect(second, 20)] == list(range(1, 21))
    pubs[0].finish(linger_s=1)
    assert writer._thread is thread and thread is not None and thread.is_alive()
    pubs[1].emit(text(41))
    assert await asyncio.to_thread(pubs[1].flush)
    assert [ev.seq for ev in await second.get(timeout=10)] == [21]
    logged = await read_log(async_redis, keys, "rt_second", 1)
    assert [ev.text for ev in logged if isinstance(ev, TextDelta)] == [
        f"t{n}" for n in range(1, 42) if n % 2 == 1
    ]
    pubs[1].finish(linger_s=1)
    writer.stop()
    assert not thread.is_alive()


async def test_events_emitted_together_go_out_in_one_write(
    publisher: OutputPublisher, async_redis: aioredis.Redis, keys: Keys, bus: OutputBus
) -> None:
    """One duplex step's text and audio are held until the step's block ends and then written
    in one round trip (one ``write``), in order; events outside such a block go out at once."""
    out = await opened(bus, SID)
    batches: list[list[int]] = []
    real_write = publisher.write

    def spy(batch: list[tuple[int, bytes]]) -> None:
        batches.append([seq for seq, _ in batch])
        real_write(batch)

    publisher.write = spy  # type: ignore[method-assign]
    await emit(publisher, text(1))
    with publisher.together():
        publisher.emit(text(2))
        with publisher.together():  # a nested block joins the outer one
            publisher.emit(Listen(input_id="input_1", kv_cache_length=0))
        assert await asyncio.to_thread(publisher.flush)
        assert [ev.seq for ev in await read_log(async_redis, keys, SID, 1)] == [1]  # held
    assert await asyncio.to_thread(publisher.flush)
    assert batches == [[1], [2, 3]]
    assert [ev.seq for ev in await collect(out, 3)] == [1, 2, 3]
    assert [ev.seq for ev in await read_log(async_redis, keys, SID, 1)] == [1, 2, 3]


async def test_a_batch_written_again_still_arrives_once_and_is_logged_once(
    publisher: OutputPublisher,
    async_redis: aioredis.Redis,
    keys: Keys,
    bus: OutputBus,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each event is published and logged in one step. A batch written twice (a retry after
    a lost reply) is logged once (the log refuses the id it has, which the writer takes as done,
    with no retry and no warning) and published twice, which the reader skips by seq."""
    out = await opened(bus, SID)
    await emit(publisher, text(1))
    assert [ev.seq for ev in await out.get(timeout=10)] == [1]
    publisher.write([(1, encode_event(TextDelta(text="again", seq=1)))])  # the retry
    assert "failed" not in caplog.text
    await emit(publisher, text(2))
    got = await collect(out, 2)
    assert [(ev.seq, ev.text) for ev in got if isinstance(ev, TextDelta)] == [(2, "t2")]
    assert out.gaps == 0
    logged = await read_log(async_redis, keys, SID, 1)
    assert [(ev.seq, ev.text) for ev in logged if isinstance(ev, TextDelta)] == [
        (1, "t1"),
        (2, "t2"),
    ]


async def test_an_event_the_log_refuses_is_still_delivered_and_the_failure_reported(
    sync_redis: redis.Redis,
    publisher: OutputPublisher,
    keys: Keys,
    bus: OutputBus,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A log write that fails for another reason than a retried id (here the key holds a
    string) is not swallowed by the script: the writer retries and warns, as for a lost
    connection, and the event still reaches the live reader once."""
    out = await opened(bus, SID)
    sync_redis.set(keys.output_log(SID), "not a stream")
    await emit(publisher, text(1))
    assert [ev.seq for ev in await out.get(timeout=10)] == [1]
    assert "publishing 1 event(s) of rt_unit failed (try 3)" in caplog.text
    again: list[Event] = []
    quiet_until = time.monotonic() + 1.0
    while time.monotonic() < quiet_until:
        again += await out.get(timeout=0.3)
    assert again == []  # the retries' copies (published again) are skipped by seq


@pytest.mark.parametrize("write", ["script", "pipeline"])
async def test_a_batch_redis_is_too_full_to_log_is_held_until_it_takes_writes(
    sync_redis: redis.Redis, async_redis: aioredis.Redis, keys: Keys, bus: OutputBus, write: str
) -> None:
    """At ``maxmemory`` (``noeviction``) a batch's log writes are refused (``OOM``) and its
    publishes taken: in the script, only the first event's (the script ends at the refusal).
    The writer holds the batch, as through an outage, and writes it whole once Redis takes
    writes again. Dropped after three tries, the script's later events would be lost."""
    pub = OutputPublisher(
        sync_redis, keys, SID, log_maxlen=64, ttl_s=60, outage_grace_s=30, write=write
    )
    out = await opened(bus, SID)
    try:
        sync_redis.config_set("maxmemory", "1")
        try:
            with pub.together():
                pub.emit(text(1))
                pub.emit(text(2))
            held: list[Event] = []
            quiet_until = time.monotonic() + 1.0  # three tries and more
            while time.monotonic() < quiet_until:
                held += await out.get(timeout=0.2)
            assert [ev.seq for ev in held] in ([], [1], [1, 2])  # what was published
        finally:
            sync_redis.config_set("maxmemory", "0")
        got = (
            held
            if held[-1:] and held[-1].seq == 2
            else held + await asyncio.wait_for(collect(out, 2), 20)
        )
        assert [ev.seq for ev in got] == [1, 2] and out.gaps == 0
        assert await asyncio.to_thread(pub.flush)  # (a pipeline's copies came while held)
        assert [ev.seq for ev in await read_log(async_redis, keys, SID, 1)] == [1, 2]
    finally:
        pub.finish(linger_s=1)


async def test_a_wait_that_times_out_returns_nothing_and_a_cancelled_one_loses_nothing(
    bus: OutputBus,
) -> None:
    """``SessionOutput.get``: a timeout is an empty answer, not an exception (the relay loop
    waits so every half second); a wait cancelled just as an event arrives leaves the event
    for the next ``get``; an event pushed during a wait ends it at once."""
    out = await opened(bus, SID)
    started = time.monotonic()
    assert await out.get(timeout=0.05) == []
    assert time.monotonic() - started < 5

    def stamped(seq: int) -> TextDelta:
        ev = text(seq)
        ev.seq = seq
        return ev

    waiting = asyncio.create_task(out.get(timeout=10))
    await asyncio.sleep(0.01)
    out.push(stamped(1))
    waiting.cancel()  # before it ran again: the event stays
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert [ev.seq for ev in await out.get(timeout=0.05)] == [1]

    waiting = asyncio.create_task(out.get(timeout=10))
    await asyncio.sleep(0.01)
    out.push(stamped(2))
    assert [ev.seq for ev in await asyncio.wait_for(waiting, 2)] == [2]
    assert out.pending_bytes == 0 and not out.items


def numbered(seq: int) -> TextDelta:
    """An event as the bus hands it over, with its sequence number."""
    ev = text(seq)
    ev.seq = seq
    return ev


async def wait_until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_the_next_event_goes_to_direct_while_the_reader_waits(
    bus: OutputBus, publisher: OutputPublisher
) -> None:
    """``SessionOutput.direct``: while ``get`` waits, each next event in order is handed over by
    the bus's reader itself, and the waiting reader is not woken; what ``direct`` declines is
    queued for ``get``, in order, and nothing is delivered twice."""
    out = await opened(bus, SID)
    taken: list[int] = []
    decline = {3}

    async def direct(ev: Event) -> bool:
        if ev.seq in decline:
            return False
        taken.append(ev.seq)
        return True

    out.direct = direct
    waiting = asyncio.create_task(out.get(timeout=LONG_S))
    await asyncio.sleep(0.01)
    await emit(publisher, text(1), text(2))
    await wait_until(lambda: taken == [1, 2])
    assert not waiting.done() and not out.items and out.expected == 3
    assert out.direct_count == 2
    # (handed in by this task, so that the waiting reader cannot run in between)
    await out.arrive(numbered(3))  # declined: queued for ``get``, which it wakes
    await out.arrive(numbered(4))  # queued behind it: ``direct`` would overtake it
    assert [ev.seq for ev in await asyncio.wait_for(waiting, 10)] == [3]
    assert [ev.seq for ev in await out.get(timeout=10)] == [4]
    assert taken == [1, 2]
    waiting = asyncio.create_task(out.get(timeout=LONG_S))
    await asyncio.sleep(0.01)
    await out.arrive(numbered(5))
    assert taken == [1, 2, 5] and not waiting.done()
    waiting.cancel()
    assert out.expected == 6 and out.gaps == 0


async def test_nothing_goes_to_direct_while_the_reader_holds_an_event(
    bus: OutputBus, publisher: OutputPublisher
) -> None:
    """A reader that is not waiting may still be sending what it took: later events queue
    behind it (``direct`` would overtake it)."""
    out = await opened(bus, SID)
    taken: list[int] = []

    async def direct(ev: Event) -> bool:
        taken.append(ev.seq)
        return True

    out.direct = direct
    await emit(publisher, text(1), text(2), text(3))
    await wait_until(lambda: len(out.items) == 3)
    assert taken == [] and [ev.seq for ev in await collect(out, 3)] == [1, 2, 3]


async def test_a_direct_that_fails_is_dropped_and_its_event_still_delivered(
    bus: OutputBus, publisher: OutputPublisher, caplog: pytest.LogCaptureFixture
) -> None:
    """A ``direct`` that raises is logged and never used again; its event and the ones after it
    reach ``get``."""
    out = await opened(bus, SID)
    calls: list[int] = []

    async def direct(ev: Event) -> bool:
        calls.append(ev.seq)
        raise RuntimeError("mapping failed")

    out.direct = direct
    waiting = asyncio.create_task(out.get(timeout=LONG_S))
    await asyncio.sleep(0.01)
    await emit(publisher, text(1))
    assert [ev.seq for ev in await asyncio.wait_for(waiting, 10)] == [1]
    assert out.direct is None and calls == [1]
    assert "delivering event 1 failed" in caplog.text
    waiting = asyncio.create_task(out.get(timeout=LONG_S))
    await asyncio.sleep(0.01)
    await emit(publisher, text(2))
    assert [ev.seq for ev in await asyncio.wait_for(waiting, 10)] == [2]
    assert calls == [1]


def speech(n: int) -> Speak:
    """One second of 24 kHz speech (96,000 raw bytes in Redis)."""
    return Speak(response_id="r", input_id=f"input_{n}", audio=pybase64.b64encode(PCM_1S).decode())


PCM_1S = np.zeros(24000, dtype=np.float32).tobytes()


@pytest.mark.parametrize("write", ["script", "pipeline"])
async def test_the_log_keeps_the_newest_events_that_fit_its_bytes(
    bus: OutputBus, sync_redis: redis.Redis, keys: Keys, write: str
) -> None:
    size = len(encode_event(speech(1)))  # (stamped, each is a few bytes larger)
    pub = OutputPublisher(
        sync_redis, keys, SID, log_maxlen=64, ttl_s=600, log_max_bytes=3 * size + 200, write=write
    )
    out = await opened(bus, SID)
    try:
        await emit(pub, *(speech(i) for i in range(1, 11)))
        got = await collect(out, 10)
    finally:
        pub.finish(linger_s=30)
    assert [e.seq for e in got] == list(range(1, 11))  # live: every one, audio intact
    assert all(isinstance(e, Speak) and e.audio == speech(0).audio for e in got)
    held = sync_redis.xrange(keys.output_log(SID))
    assert [k for k, _ in held] == [b"8-1", b"9-1", b"10-1"]
    assert all(size <= len(f[b"e"]) < size + 60 for _, f in held)  # the audio raw, once
    assert 0 < sync_redis.ttl(keys.output_log(SID)) <= 30


def test_a_log_bound_keeps_the_newest_events_within_bytes_seconds_and_count() -> None:
    bound = LogBound(max_bytes=100, max_s=10.0, max_events=3)
    bound.add(1, 40, now=0.0)
    bound.add(2, 40, now=1.0)
    assert bound.minid == ""  # nothing had to go yet: nothing is trimmed
    bound.add(3, 40, now=2.0)  # 120 bytes: the oldest goes
    assert bound.minid == "2-1"
    bound.add(3, 40, now=2.0)  # the same event written again is counted once
    assert bound.minid == "2-1"
    for seq in range(4, 8):  # small events: the count bounds them
        bound.add(seq, 1, now=3.0)
    assert bound.minid == "5-1"
    bound.add(8, 1, now=13.5)  # past max_s: the older events go
    assert bound.minid == "8-1"
    bound.add(9, 500, now=14.0)  # larger than max_bytes: the newest always stays
    assert bound.minid == "9-1"


async def test_a_gap_the_log_cannot_fill_while_redis_is_away_is_filled_once_it_answers(
    bus: OutputBus, publisher: OutputPublisher
) -> None:
    """An event that shows a hole while Redis is away (a failover) is kept, not raised: the
    reader gets nothing for now, and the hole filled from the log once Redis answers."""
    from omniserve.redis_server import free_port

    await emit(publisher, text(1), text(2), text(3))
    third = (await read_log(bus.redis, bus.keys, SID, 3))[0]
    out = SessionOutput(bus, SID)
    out.push(third, 10)
    answering, bus.redis = bus.redis, aioredis.Redis(port=free_port(), socket_connect_timeout=1)
    try:
        assert await out.get(timeout=1) == []
        assert out.pending_bytes == 10 and len(out.items) == 1
    finally:
        await bus.redis.aclose()
        bus.redis = answering
    assert [e.seq for e in await out.get(timeout=1)] == [1, 2, 3]
    assert out.gaps == 0
