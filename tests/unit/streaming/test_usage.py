"""streaming/usage.py: usage records and the per-key hourly and daily aggregates."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import redis.asyncio as aioredis

from streaming.keys import Keys
from streaming.usage import HOUR_S, Usage, UsageLedger, pcm_b64_seconds, usage_report


def test_pcm_seconds_without_decoding() -> None:
    for n in (0, 1, 2, 3, 24000, 36001):
        b64 = base64.b64encode(np.zeros(n, dtype=np.float32).tobytes()).decode()
        assert pcm_b64_seconds(b64) == pytest.approx(n / 24000)
    assert pcm_b64_seconds(base64.b64encode(b"\0" * 64000).decode(), 16000) == 1.0


def test_records_add_up() -> None:
    a = Usage(audio_in_s=1.5, text_tokens_out=3, sessions=1)
    a.add(Usage(audio_in_s=0.25, text_tokens_out=2, responses=1))
    assert a.as_dict()["audio_in_s"] == 1.75 and a.as_dict()["text_tokens_out"] == 5
    assert a.minus(Usage(audio_in_s=1.75)).audio_in_s == 0
    assert Usage().is_empty() and not a.is_empty()


async def test_aggregates_by_hour_and_day(async_redis: aioredis.Redis, keys: Keys) -> None:
    ledger = UsageLedger(async_redis, keys)
    t0 = 1_800_000_000.0  # an hour boundary plus 0
    t0 -= t0 % HOUR_S
    await ledger.record("acme", Usage(audio_in_s=2.0, sessions=1), t0 + 10)
    await ledger.record("acme", Usage(audio_in_s=1.0, worker_s=0.5), t0 + 20)
    await ledger.record("acme", Usage(audio_in_s=4.0), t0 + HOUR_S + 5)
    await ledger.record("beta", Usage(session_s=60.0), t0 + 5)
    await ledger.record("beta", Usage(), t0 + 5)  # nothing: nothing written
    assert await ledger.names() == ["acme", "beta"]
    hours = await ledger.buckets("acme", "hour", int(t0 // HOUR_S), int(t0 // HOUR_S) + 2)
    assert [(n - int(t0 // HOUR_S), u.audio_in_s) for n, u in hours] == [(0, 3.0), (1, 4.0)]
    assert await ledger.day_session_s("beta", t0) == 60.0
    report = await usage_report(ledger, None, "day", t0, t0 + HOUR_S)
    acme = report["keys"]["acme"]  # type: ignore[index]
    assert acme["total"]["audio_in_s"] == 7.0 and acme["total"]["sessions"] == 1
    assert await async_redis.ttl(keys.usage_hour("acme", int(t0 // HOUR_S))) > 0
