"""streaming/input.py against a real Redis: the silent drop, and controls that are never dropped."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
import redis
import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.retry import Retry

from omniserve.redis_server import free_port
from streaming.controls import CloseControl, ForceListenControl, InitControl
from streaming.input import AudioChunk, InputReader, InputWriter
from streaming.keys import Keys

SID = "rt_in"


Writers = Callable[[int], InputWriter]


@pytest.fixture
async def writers(async_redis: aioredis.Redis, keys: Keys) -> AsyncIterator[Writers]:
    """Makes gateway-side writers (``max_pending`` given); their input links close after."""
    made: list[InputWriter] = []

    def make(max_pending: int) -> InputWriter:
        made.append(InputWriter(async_redis, keys, max_pending=max_pending, ttl_s=60))
        return made[-1]

    yield make
    for writer in made:
        await writer.aclose()


async def append(writer: InputWriter, c: AudioChunk) -> None:
    """Write a chunk and wait until Redis took it."""
    await writer.append(SID, c)


def chunk(seq: int, samples: int = 16000, **kw: object) -> AudioChunk:
    audio = b"\0" * 4 * samples  # float32 PCM, 16 kHz
    return AudioChunk(seq=seq, input_id=f"input_{seq}", audio=audio, **kw)  # type: ignore[arg-type]


async def test_the_oldest_pending_chunks_are_dropped_and_counted(
    writers: Writers, sync_redis: redis.Redis, keys: Keys
) -> None:
    writer = writers(2)
    reader = InputReader(sync_redis, keys, SID)
    await append(writer, chunk(1, frames=[b"jpeg0", b"jpeg1"], max_slice_nums=3))
    first = reader.read(block_ms=100)
    assert [c.seq for c in first.chunks] == [1] and first.dropped == 0
    assert first.chunks[0].frames == [b"jpeg0", b"jpeg1"] and first.chunks[0].max_slice_nums == 3
    # faster than the worker reads, and none waited for before the next goes out
    written = [writer.append(SID, chunk(seq)) for seq in range(2, 7)]
    await asyncio.gather(*written)
    batch = reader.read(block_ms=100)
    assert [c.seq for c in batch.chunks] == [5, 6]  # the newest are kept
    assert batch.dropped == 3
    assert sync_redis.ttl(keys.input_audio(SID)) > 0


async def test_chunks_read_leave_redis_with_the_next_read(
    writers: Writers, sync_redis: redis.Redis, keys: Keys
) -> None:
    writer = writers(2)
    reader = InputReader(sync_redis, keys, SID)
    key = keys.input_audio(SID)
    for seq in (1, 2):
        await append(writer, chunk(seq))
    assert [c.seq for c in reader.read(block_ms=100).chunks] == [1, 2]
    assert sync_redis.xlen(key) == 2  # read, still held until the next read
    await append(writer, chunk(3))
    assert [c.seq for c in reader.read(block_ms=100).chunks] == [3]
    assert sync_redis.xlen(key) == 1  # 1 and 2 went in the same round trip as that read
    assert reader.read(block_ms=10).chunks == []
    assert sync_redis.xlen(key) == 0
    await append(writer, chunk(5))  # numbering still tells what was dropped
    batch = reader.read(block_ms=100)
    assert [c.seq for c in batch.chunks] == [5] and batch.dropped == 1


async def test_a_redis_refusing_writes_still_gives_the_read(
    writers: Writers, sync_redis: redis.Redis, keys: Keys
) -> None:
    writer = writers(4)
    reader = InputReader(sync_redis, keys, SID)
    for seq in (1, 2):
        await append(writer, chunk(seq))
    assert [c.seq for c in reader.read(block_ms=100).chunks] == [1, 2]
    await append(writer, chunk(3))
    sync_redis.config_set("min-replicas-to-write", 1)  # writes refused: NOREPLICAS
    try:
        assert [c.seq for c in reader.read(block_ms=100).chunks] == [3]
        assert sync_redis.xlen(keys.input_audio(SID)) == 3  # nothing trimmed meanwhile
    finally:
        sync_redis.config_set("min-replicas-to-write", 0)
    assert reader.read(block_ms=10).chunks == []
    assert sync_redis.xlen(keys.input_audio(SID)) == 0  # trimmed once Redis takes writes


async def test_the_bound_is_seconds_of_audio_whatever_the_chunk_length(
    writers: Writers, sync_redis: redis.Redis, keys: Keys
) -> None:
    """Two seconds pending: twenty 100 ms chunks, two 1 s chunks, two 1.5 s chunks."""
    writer = writers(2)
    assert [writer.pending_bound(n) for n in (1600, 4000, 6000, 16000, 24000)] == [20, 8, 6, 2, 2]
    assert writer.pending_bound(1) == 256  # tiny chunks: a bounded stream all the same
    reader = InputReader(sync_redis, keys, SID)
    for seq in range(1, 31):
        await append(writer, chunk(seq, samples=1600))
    batch = reader.read(block_ms=100)
    assert [c.seq for c in batch.chunks] == list(range(11, 31)) and batch.dropped == 10


async def test_controls_are_never_dropped_and_come_first(
    writers: Writers, sync_redis: redis.Redis, keys: Keys
) -> None:
    writer = writers(1)
    reader = InputReader(sync_redis, keys, SID)
    await writer.control(SID, InitControl(system_prompt="hi"))
    for seq in range(1, 4):
        await append(writer, chunk(seq, force_listen=seq == 2))
    await writer.control(SID, CloseControl(reason="user_stop"))
    batch = reader.read(block_ms=100)
    assert batch.controls == [
        InitControl(system_prompt="hi"),
        ForceListenControl(input_id="input_2"),  # written beside its chunk, so it survives
        CloseControl(reason="user_stop"),
    ]
    assert [c.seq for c in batch.chunks] == [3] and not batch.chunks[0].force_listen


async def test_poll_controls_and_malformed_controls(
    writers: Writers, sync_redis: redis.Redis, keys: Keys
) -> None:
    writer = writers(2)
    reader = InputReader(sync_redis, keys, SID)
    assert reader.poll_controls() == []
    sync_redis.xadd(keys.input_control(SID), {"e": b'{"type": "reboot"}'})  # not a control
    await writer.control(SID, CloseControl())
    assert reader.poll_controls() == [CloseControl()]
    assert reader.poll_controls() == []


def test_discard_deletes_both_streams(sync_redis: redis.Redis, keys: Keys) -> None:
    sync_redis.xadd(keys.input_audio(SID), {"seq": 1})
    sync_redis.xadd(keys.input_control(SID), {"e": b"{}"})
    InputReader(sync_redis, keys, SID).discard()
    assert not sync_redis.exists(keys.input_audio(SID), keys.input_control(SID))


async def test_the_gateway_discards_both_streams_after_what_it_wrote_before(
    writers: Writers, sync_redis: redis.Redis, keys: Keys
) -> None:
    """A failover's delete goes after the chunks already written, answered or not."""
    writer = writers(2)
    await writer.control(SID, CloseControl())
    written = writer.append(SID, chunk(1))  # not waited for before the delete goes out
    await writer.discard(SID)
    assert written.done()
    assert not sync_redis.exists(keys.input_audio(SID), keys.input_control(SID))


def test_a_stalled_redis_reads_as_no_input_and_a_refused_connection_raises(
    redis_server: str, sync_redis: redis.Redis, keys: Keys
) -> None:
    """A worker's read while Redis holds the connection but answers nothing (a stall past the
    client's timeout) returns no input and the session goes on; a refused connection (Redis
    restarted, its state most likely gone) still raises, and the session ends."""
    once = Retry(NoBackoff(), 1)
    stalled = redis.Redis.from_url(redis_server, socket_timeout=0.3, retry=once)
    reader = InputReader(stalled, keys, SID)
    sync_redis.client_pause(1_500, all=True)
    try:
        batch = reader.read(100)
    finally:
        sync_redis.client_unpause()
    assert (batch.controls, batch.chunks, reader.unanswered) == ([], [], True)
    sync_redis.xadd(keys.input_control(SID), {"e": b"x"})  # (not a control: skipped)
    assert reader.read(100).controls == [] and not reader.unanswered  # answered again
    stalled.close()
    sync_redis.delete(keys.input_control(SID))
    refused = redis.Redis(port=free_port(), socket_timeout=0.3, retry=once)
    with pytest.raises(redis.ConnectionError):
        InputReader(refused, keys, SID).read(100)
