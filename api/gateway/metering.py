"""What each connection uses, counted where the gateway sees it, and the key's quota places.

``SessionMeter`` adds up one connection's usage (``streaming/usage.py``): the input the client
sent, the output it was sent, and the worker's figures that ride on the typed events (step and
turn compute time, tokens). It gives each response its record (``response.done.usage``) and the
session its own (``session.closed.usage``, the recording's metadata), and hands what is new to
the key's aggregates in Redis and to the Prometheus counters, every ``usage_flush_s`` and when
the connection ends: a gateway that dies loses at most that much of its live sessions' usage.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict
from typing import Any

from api.metrics.registry import GatewayMetrics
from omnicore.aio import cancel_and_wait
from omnicore.settings import Settings
from streaming.events import AudioDelta, Done, Event, Listen, Speak
from streaming.keystore import KeyIdentity, KeyStore
from streaming.quotas import QuotaHolds, Refusal
from streaming.usage import INPUT_RATE, Usage, UsageLedger, pcm_b64_seconds

log = logging.getLogger("omniserve.gateway")

MAX_LABELS = 200  # distinct key names a gateway labels its counters with; then ``other``
OTHER = "other"


def request_usage(request: dict[str, Any]) -> Usage:
    """The input of one chat turn (a validated request): its audio, images and videos (a
    video counts as one frame: the gateway does not decode it)."""
    out = Usage()
    for message in request.get("messages", []):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for item in content:
            kind, data = item.get("type"), item.get("data")
            if kind == "audio" and isinstance(data, str):
                out.audio_in_s += pcm_b64_seconds(data, INPUT_RATE)
            elif kind in ("image", "video"):
                out.frames_in += 1
    return out


class Metering:
    """One gateway's usage accounting and quota holds."""

    def __init__(self, settings: Settings, store: KeyStore, metrics: GatewayMetrics) -> None:
        self.keystore = store
        self.ledger = UsageLedger(store.redis, store.keys, settings.usage_retention_days)
        self.holds = QuotaHolds(store.redis, store.keys)
        self.metrics = metrics
        self.flush_s = settings.usage_flush_s
        self.meters: set[SessionMeter] = set()
        self._labels: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def label(self, name: str) -> str:
        """The counters' label for a key name: bounded, whatever keys are created."""
        if name in self._labels:
            return name
        if len(self._labels) < MAX_LABELS:
            self._labels.add(name)
            return name
        return OTHER

    def open(self, identity: KeyIdentity, connected_at: float) -> SessionMeter:
        meter = SessionMeter(self, identity, connected_at)
        self.meters.add(meter)
        return meter

    async def start(self) -> None:
        await self.holds.start()
        self._task = asyncio.create_task(self._flush_loop(), name="usage-flush")

    async def stop(self) -> None:
        if self._task:
            await cancel_and_wait(self._task)
        await self.holds.stop()
        for meter in list(self.meters):
            await meter.flush()

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self.flush_s)
            for meter in list(self.meters):
                try:
                    await meter.flush()
                except Exception:  # a meter's trouble must not end every other meter's flushes
                    log.warning("usage flush failed", exc_info=True)


class SessionMeter:
    """One connection's usage: per response and in all."""

    def __init__(self, metering: Metering, identity: KeyIdentity, connected_at: float) -> None:
        self.metering = metering
        self.identity = identity
        self.connected_at = connected_at
        self.total = Usage()
        self.response = Usage()  # the response under way
        self.flushed = Usage()  # what the aggregates have of ``total`` already
        self.flushed_at = connected_at  # the wall time up to which session_s was counted
        self.hold: str | None = None  # the session id holding a quota place
        self.admitted = False
        self._lock = asyncio.Lock()

    # ------------------------------------------------------------------ counting
    def add(self, usage: Usage) -> None:
        self.total.add(usage)
        self.response.add(usage)

    def input(self, samples: int, frames: int) -> None:
        """One input chunk taken from the client."""
        self.add(Usage(audio_in_s=samples / INPUT_RATE, frames_in=frames))

    def queue_wait(self, seconds: float) -> None:
        self.add(Usage(queue_wait_s=max(0.0, seconds)))

    def event(self, ev: Event) -> Usage | None:
        """One worker event relayed; the finished response's usage when it ends one.

        (On every delta: the figures go straight into both records, no record is built.)
        """
        match ev:
            case Speak():
                out_s = pcm_b64_seconds(ev.audio)
                for u in (self.total, self.response):
                    u.audio_out_s += out_s
                    u.text_tokens_out += ev.text_tokens
                    u.worker_s += ev.worker_s
                return self.end_response() if ev.end_of_turn else None
            case Listen():
                self.total.worker_s += ev.worker_s
                self.response.worker_s += ev.worker_s
            case AudioDelta():
                out_s = pcm_b64_seconds(ev.audio)
                self.total.audio_out_s += out_s
                self.response.audio_out_s += out_s
            case Done():
                self.add(
                    Usage(
                        audio_out_s=pcm_b64_seconds(ev.audio) + pcm_b64_seconds(ev.last_audio),
                        text_tokens_in=ev.input_tokens,
                        text_tokens_out=ev.generated_tokens,
                        worker_s=ev.worker_s,
                    )
                )
                return self.end_response()
        return None

    def end_response(self) -> Usage:
        self.add(Usage(responses=1))
        done, self.response = self.response, Usage()
        return done

    def session_usage(self, now: float | None = None, ended: bool = False) -> Usage:
        """This connection's usage so far (its wall time up to ``now``); ``ended``: as the
        record of a session that ends here (it counts the session). A connection refused before
        admission, or that never asked for a slot, is no session and has no session time."""
        out = self.total.copy()
        if self.admitted:
            out.session_s += max(0.0, (now or time.time()) - self.flushed_at)
            if ended and not out.sessions:
                out.sessions = 1
        return out

    # ------------------------------------------------------------------ quotas
    async def admit(self, session_id: str, claim: bool = False) -> Refusal | None:
        """Take the key's quota place for ``session_id`` (once per connection; ``claim``: a
        resumed session taking its own place back). Redis away: not refused here (the wait
        for a slot reports it)."""
        if self.admitted and not claim:
            return None
        try:
            refused = await self.metering.holds.admit(
                self.identity.name, session_id, self.identity.quota, time.time(), claim
            )
        except Exception:
            log.warning("quota of %s not checked: Redis away", self.identity.name, exc_info=True)
            return None
        if refused is None:
            quota = self.identity.quota
            if quota.max_sessions is None and quota.minutes_per_day is None:
                self.admitted = True  # nothing to hold
                return None
            if self.hold is not None:
                if self.hold != session_id:
                    await self.metering.holds.release(self.identity.name, self.hold)
                else:
                    self.metering.holds.forget(self.identity.name, self.hold)
            self.hold = session_id
            self.admitted = True
        return refused

    def refusal_message(self, refused: Refusal) -> str:
        """What a client over its key's quota is told (``quota_exceeded``)."""
        name, quota = self.identity.name, self.identity.quota
        if refused is Refusal.SESSIONS:
            return f"quota exceeded: key {name!r} has {quota.max_sessions} sessions open"
        return (
            f"quota exceeded: key {name!r} used its {quota.minutes_per_day:g} "
            "session-minutes of today (UTC)"
        )

    # ------------------------------------------------------------------ the aggregates
    async def flush(self) -> None:
        """Hand what is new to the key's aggregates and the counters (Redis away: next time)."""
        async with self._lock:
            now = time.time()
            current = self.session_usage(now)
            delta = current.minus(self.flushed)
            if delta.is_empty():
                return
            try:
                await self.metering.ledger.record(self.identity.name, delta, now)
            except Exception:
                log.debug("usage of %s not recorded yet", self.identity.name, exc_info=True)
                return
            if self.admitted:  # (before admission no time accrues: it is counted from connect)
                self.total.session_s = current.session_s
                self.flushed_at = now
            self.flushed = self.total.copy()
            label = self.metering.label(self.identity.name)
            for figure, value in asdict(delta).items():
                if value > 0:
                    self.metering.metrics.key_usage.labels(label, figure).inc(value)

    async def close(self, session_goes_on: bool) -> Usage:
        """The connection ended: the last flush; the quota place is given back, unless the
        session goes on (detached for a resume: its place lapses unless a resume claims it)."""
        self.metering.meters.discard(self)
        if not session_goes_on and self.admitted:
            self.total.sessions += 1
        final = self.session_usage()
        await self.flush()
        if self.hold is not None:
            if session_goes_on:
                self.metering.holds.forget(self.identity.name, self.hold)
            else:
                await self.metering.holds.release(self.identity.name, self.hold)
            self.hold = None
        return final
