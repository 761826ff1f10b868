"""Usage: what one response, one session and one key consumed, and its aggregates in Redis.

``Usage`` is the record (the same fields in ``response.done``, ``session.closed``, a
recording's metadata, the Prometheus counters and the usage API). ``UsageLedger`` adds records
to one hash per key name per UTC hour and per UTC day (``HINCRBYFLOAT`` in one ``MULTI``), so
the aggregates outlive any gateway; a Redis restart loses what its persistence had not written
(docs/OPERATIONS.md, "Usage and quotas").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields

import redis.asyncio as aioredis

from streaming.keys import Keys

HOUR_S = 3600
DAY_S = 86400
INPUT_RATE = 16000  # client audio in (float32 PCM)
OUTPUT_RATE = 24000  # speech out (float32 PCM)


@dataclass(slots=True)
class Usage:
    """One record of usage; every figure adds up across records."""

    audio_in_s: float = 0.0  # client audio the gateway took (16 kHz)
    audio_out_s: float = 0.0  # speech sent to the client (24 kHz)
    text_tokens_in: float = 0.0  # prompt tokens (chat: the request; duplex: none counted)
    text_tokens_out: float = 0.0  # generated text tokens
    frames_in: float = 0.0  # images and video frames the client sent
    queue_wait_s: float = 0.0  # connect (chat: a turn's request) to its worker slot
    worker_s: float = 0.0  # the backend's compute time (GPU seconds on a GPU backend)
    session_s: float = 0.0  # wall time of the session (what the minutes quota counts)
    sessions: float = 0.0
    responses: float = 0.0

    def add(self, other: Usage) -> None:
        for name in FIGURES:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def minus(self, other: Usage) -> Usage:
        out = Usage()
        for name in FIGURES:
            setattr(out, name, getattr(self, name) - getattr(other, name))
        return out

    def copy(self) -> Usage:
        return Usage(**asdict(self))

    def is_empty(self) -> bool:
        return not any(getattr(self, name) for name in FIGURES)

    def as_dict(self) -> dict[str, float | int]:
        """The record as clients see it: counts as integers, seconds to the millisecond."""
        out: dict[str, float | int] = {}
        for name in FIGURES:
            v = getattr(self, name)
            out[name] = round(v) if name in COUNTS else round(v, 3)
        return out

    @classmethod
    def of(cls, raw: dict[str, float]) -> Usage:
        return cls(**{k: float(v) for k, v in raw.items() if k in FIGURES})


COUNTS = frozenset({"text_tokens_in", "text_tokens_out", "frames_in", "sessions", "responses"})
FIGURES = tuple(f.name for f in fields(Usage))


def pcm_b64_seconds(b64: str, rate: int = OUTPUT_RATE) -> float:
    """Seconds of float32 PCM in a base64 string, without decoding it."""
    if not b64:
        return 0.0
    pad = 2 if b64.endswith("==") else 1 if b64.endswith("=") else 0
    return (len(b64) * 3 // 4 - pad) / 4 / rate


class UsageLedger:
    """The per-key hourly and daily aggregates."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, retention_days: int = 400) -> None:
        self.redis = redis
        self.keys = keys
        self.retention_s = retention_days * DAY_S

    async def record(self, name: str, usage: Usage, at: float) -> None:
        """Add ``usage`` to ``name``'s hour and day of unix time ``at`` (one transaction)."""
        if usage.is_empty():
            return
        hour_key = self.keys.usage_hour(name, int(at // HOUR_S))
        day_key = self.keys.usage_day(name, int(at // DAY_S))
        async with self.redis.pipeline(transaction=True) as pipe:
            for figure, value in asdict(usage).items():
                if value:
                    pipe.hincrbyfloat(hour_key, figure, value)
                    pipe.hincrbyfloat(day_key, figure, value)
            pipe.expire(hour_key, self.retention_s)
            pipe.expire(day_key, self.retention_s)
            pipe.sadd(self.keys.usage_names, name)
            await pipe.execute()

    async def names(self) -> list[str]:
        raw = await self.redis.smembers(self.keys.usage_names)
        return sorted(n.decode() if isinstance(n, bytes) else str(n) for n in raw)

    async def buckets(
        self, name: str, granularity: str, start: int, end: int
    ) -> list[tuple[int, Usage]]:
        """``name``'s non-empty buckets from ``start`` to ``end`` (inclusive, in hours or days
        since the epoch, as ``granularity`` says: ``hour`` | ``day``)."""
        key_of = self.keys.usage_hour if granularity == "hour" else self.keys.usage_day
        span = list(range(start, end + 1))
        async with self.redis.pipeline(transaction=False) as pipe:
            for n in span:
                pipe.hgetall(key_of(name, n))
            raws: Iterable[dict[bytes | str, bytes | str]] = await pipe.execute()
        out = []
        for n, raw in zip(span, raws, strict=True):
            if raw:
                out.append((n, Usage.of({_s(k): float(v) for k, v in raw.items()})))
        return out

    async def day_session_s(self, name: str, at: float) -> float:
        """Session seconds recorded for ``name`` on the UTC day of ``at``."""
        raw = await self.redis.hget(self.keys.usage_day(name, int(at // DAY_S)), "session_s")
        return float(raw) if raw else 0.0


def _s(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


async def usage_report(
    ledger: UsageLedger,
    names: list[str] | None,
    granularity: str,
    since: float,
    until: float,
) -> dict[str, object]:
    """Usage per key name and per hour or day between two unix times (inclusive buckets):
    what ``GET /v1/admin/usage`` and ``omniserve usage`` show. ``names`` None: every key with
    usage recorded."""
    size = HOUR_S if granularity == "hour" else DAY_S
    start, end = int(since // size), int(until // size)
    if end - start > 24 * 400:
        raise ValueError("at most 9600 buckets at once")
    out: dict[str, object] = {}
    for name in names if names is not None else await ledger.names():
        total = Usage()
        rows = []
        for n, usage in await ledger.buckets(name, granularity, start, end):
            total.add(usage)
            rows.append({"start": n * size, **usage.as_dict()})
        out[name] = {"buckets": rows, "total": total.as_dict()}
    return {
        "granularity": granularity,
        "since": start * size,
        "until": (end + 1) * size,
        "keys": out,
    }
