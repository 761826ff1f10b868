"""api/gateway/metering.py: one connection's usage from its input and its worker's events."""

from __future__ import annotations

import base64
import time

import numpy as np
import pytest
import redis.asyncio as aioredis

from api.gateway.metering import MAX_LABELS, OTHER, Metering, request_usage
from api.metrics.registry import GatewayMetrics
from omnicore.settings import Settings
from streaming.events import Done, Listen, Speak
from streaming.keys import Keys
from streaming.keystore import KeyIdentity, KeyQuota, KeyStore
from streaming.usage import HOUR_S


def pcm(seconds: float, rate: int = 24000) -> str:
    return base64.b64encode(np.zeros(int(seconds * rate), dtype=np.float32).tobytes()).decode()


def metering(r: aioredis.Redis, keys: Keys) -> tuple[Metering, GatewayMetrics]:
    metrics = GatewayMetrics()
    return Metering(Settings(), KeyStore(r, keys), metrics), metrics


def counter(metrics: GatewayMetrics, key: str, figure: str) -> float:
    value = metrics.registry.get_sample_value(
        "omniserve_key_usage_total", {"key": key, "figure": figure}
    )
    return value or 0.0


async def test_a_duplex_sessions_usage(async_redis: aioredis.Redis, keys: Keys) -> None:
    m, metrics = metering(async_redis, keys)
    meter = m.open(KeyIdentity("acme"), time.time())
    assert await meter.admit("rt_1") is None  # no quota: nothing held, but a session now
    meter.queue_wait(0.5)
    meter.input(16000, 2)  # one second of audio, two frames
    meter.input(8000, 0)
    assert meter.event(Listen(input_id="input_1", kv_cache_length=5, worker_s=0.1)) is None
    assert (
        meter.event(Speak(response_id="r", input_id="i", text="a b", worker_s=0.2, text_tokens=2))
        is None
    )
    done = meter.event(Speak(response_id="r", input_id="i", audio=pcm(1.5), end_of_turn=True))
    assert done is not None and done.responses == 1 and done.audio_out_s == 1.5
    assert done.text_tokens_out == 2 and done.audio_in_s == 1.5 and done.frames_in == 2
    await meter.flush()
    total = await meter.close(session_goes_on=False)
    assert total.sessions == 1 and total.worker_s == pytest.approx(0.3)
    hour = int(time.time() // HOUR_S)
    [(_, stored)] = await m.ledger.buckets("acme", "hour", hour - 1, hour)
    assert stored.audio_in_s == 1.5 and stored.audio_out_s == 1.5 and stored.sessions == 1
    assert stored.queue_wait_s == 0.5 and stored.responses == 1 and stored.session_s > 0
    assert counter(metrics, "acme", "audio_in_s") == 1.5  # the counters match the aggregates
    assert counter(metrics, "acme", "sessions") == 1


async def test_a_chat_turn_and_a_connection_that_goes_on(
    async_redis: aioredis.Redis, keys: Keys
) -> None:
    m, _ = metering(async_redis, keys)
    meter = m.open(KeyIdentity("beta"), time.time())
    await meter.admit("rt_2")
    request = {
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "user",
                "content": [
                    {"type": "audio", "data": pcm(2.0, 16000)},
                    {"type": "image", "data": "x"},
                ],
            },
        ]
    }
    meter.add(request_usage(request))
    done = meter.event(
        Done(text="ok", input_tokens=7, generated_tokens=3, last_audio=pcm(0.5), worker_s=0.4)
    )
    assert done is not None
    assert (done.audio_in_s, done.frames_in, done.text_tokens_in, done.text_tokens_out) == (
        2.0,
        1,
        7,
        3,
    )
    assert done.audio_out_s == 0.5 and done.worker_s == 0.4
    total = await meter.close(session_goes_on=True)  # detached: the session is not counted here
    assert total.sessions == 0


async def test_labels_are_bounded(async_redis: aioredis.Redis, keys: Keys) -> None:
    m, _ = metering(async_redis, keys)
    names = [m.label(f"k{i}") for i in range(MAX_LABELS + 5)]
    assert names[:MAX_LABELS] == [f"k{i}" for i in range(MAX_LABELS)]
    assert set(names[MAX_LABELS:]) == {OTHER}
    assert m.label("k0") == "k0"


async def test_admission_holds_one_place_per_session(
    async_redis: aioredis.Redis, keys: Keys
) -> None:
    m, _ = metering(async_redis, keys)
    one = KeyIdentity("gamma", KeyQuota(max_sessions=1))
    first, second = m.open(one, time.time()), m.open(one, time.time())
    assert await first.admit("s1") is None
    assert await second.admit("s2") is not None  # over quota: nothing held for it
    assert await second.admit("s1", claim=True) is None  # a resume of s1 keeps s1's place
    assert await async_redis.zcard(keys.key_sessions("gamma")) == 1
    await first.close(session_goes_on=True)  # the connection that lost it stops renewing it
    await second.close(session_goes_on=False)
    assert await async_redis.zcard(keys.key_sessions("gamma")) == 0


async def test_a_connection_refused_at_admission_is_no_session(
    async_redis: aioredis.Redis, keys: Keys
) -> None:
    m, _ = metering(async_redis, keys)
    none = KeyIdentity("eps", KeyQuota(max_sessions=1))
    holder, refused = m.open(none, time.time()), m.open(none, time.time())
    assert await holder.admit("s1") is None
    assert await refused.admit("s2") is not None
    usage = await refused.close(session_goes_on=False)
    assert usage.sessions == 0 and usage.session_s == 0
    assert (await holder.close(session_goes_on=False)).sessions == 1
