"""Finishing a session's output stream on behalf of a worker process that died.

The session's events carry consecutive sequence numbers and go to its replay log and pub/sub
channel. Another process (the dead one's Celery parent) continues the sequence after the last
event the log holds, so the relaying gateway delivers the closing events in order, with no gap.
"""

from __future__ import annotations

import time

import redis
import redis.asyncio as aioredis

from streaming.events import Event, encode_event
from streaming.keys import Keys
from streaming.redis_url import is_cluster


def last_seq(client: redis.Redis, keys: Keys, session_id: str) -> int:
    """The sequence number of the newest event in a session's replay log (0: none)."""
    entries = client.xrevrange(keys.output_log(session_id), "+", "-", count=1)
    if not entries:
        return 0
    raw = entries[0][0]
    entry_id = raw.decode() if isinstance(raw, bytes) else str(raw)
    return int(entry_id.split("-", 1)[0])


def finish_output(
    client: redis.Redis,
    keys: Keys,
    session_id: str,
    events: list[Event],
    log_maxlen: int,
    linger_s: int = 60,
    attempts: int = 3,
) -> int:
    """Append ``events`` after the last logged one and publish them; returns the last seq.

    A write the dead process had already sent may still land first: the log then refuses the
    first id, and the sequence is read again. Nothing is published before the log has it all.
    The events are numbered and stamped here, as ``OutputPublisher.emit`` does for the worker.
    """
    log_key, channel = keys.output_log(session_id), keys.output_channel(session_id)
    now = time.time()
    for ev in events:
        ev.emitted_at = now
    seq = 0
    for attempt in range(attempts):
        seq = last_seq(client, keys, session_id)
        events[0].seq = seq + 1
        try:
            client.xadd(log_key, {"e": encode_event(events[0])}, id=f"{seq + 1}-1")
            break
        except redis.ResponseError:
            if attempt == attempts - 1:
                raise
    for i, ev in enumerate(events, start=seq + 1):
        ev.seq = i
    encoded = [encode_event(ev) for ev in events]
    with client.pipeline(transaction=False) as pipe:
        for i, data in enumerate(encoded[1:], start=seq + 2):
            pipe.xadd(log_key, {"e": data}, id=f"{i}-1", maxlen=log_maxlen, approximate=True)
        pipe.expire(log_key, linger_s)
        for data in encoded:
            if is_cluster(client):
                pipe.spublish(channel, data)
            else:
                pipe.publish(channel, data)
        pipe.execute()
    return seq + len(events)


async def append_output(
    client: aioredis.Redis, keys: Keys, session_id: str, event: Event, log_maxlen: int
) -> int:
    """A gateway appends one event of its own (``Recovering``) after the last logged one and
    publishes it; returns its seq. The session's worker is gone, so nothing else writes."""
    log_key, channel = keys.output_log(session_id), keys.output_channel(session_id)
    event.emitted_at = time.time()
    for attempt in range(3):
        entries = await client.xrevrange(log_key, "+", "-", count=1)
        seq = int(_text(entries[0][0]).split("-", 1)[0]) if entries else 0
        event.seq = seq + 1
        data = encode_event(event)
        try:
            await client.xadd(
                log_key, {"e": data}, id=f"{seq + 1}-1", maxlen=log_maxlen, approximate=True
            )
        except redis.ResponseError:
            if attempt == 2:
                raise
            continue
        if is_cluster(client):
            await client.spublish(channel, data)
        else:
            await client.publish(channel, data)
        return event.seq
    raise AssertionError("unreachable")


def _text(value: bytes | str | None) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
