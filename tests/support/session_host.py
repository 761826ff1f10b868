"""A ``/v1/realtime`` session as its resume collaborators see it, and a gateway to give them.

``Host`` is the smallest real session for ``SessionResume`` (``ResumeHost``) and ``ChatResume``
(``ChatResumeHost``): it keeps what they send and the socket's close instead of writing to one.
``gateway_on`` is a real ``Gateway`` on the run's Redis under the test's own key prefix, with
none of its loops running (a test drives what it needs, e.g. ``gateway.liveness.check()``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette import status

from api.gateway.metering import SessionMeter
from api.gateway.state import Gateway
from api.protocol.dialects import Dialect
from api.protocol.errors import Frame, error_frame
from api.realtime.session import SessionState
from omnicore.settings import Settings
from streaming.events import ErrorCode
from streaming.keys import Keys
from streaming.keystore import ANONYMOUS, KeyIdentity


class Host:
    """One session on one connection, without a socket: frames sent are kept in ``sent``."""

    def __init__(
        self,
        session_id: str = "rt_host",
        public_mode: str = "audio",
        dialect: Dialect | None = Dialect.CURRENT,
        lasts_s: float = 300.0,
        gateway: Gateway | None = None,
    ) -> None:
        self.session_id = session_id
        self.public_mode = public_mode
        self.dialect = dialect
        self.deadline = time.time() + lasts_s
        self.gone = asyncio.Event()
        self.superseded = asyncio.Event()
        self.state = SessionState.ACTIVE
        self.closed_sent = False
        self.close_asked = False  # the client sent session.close (a drop is then no vanish)
        self.sent: list[Frame] = []
        self.close_codes: list[int] = []
        self.woken = asyncio.Event()  # wake_relay was called
        self.adopted: list[tuple[str, float]] = []
        self._gateway = gateway
        self._meter: SessionMeter | None = None

    @property
    def meter(self) -> SessionMeter:
        """The session's meter on the gateway's real metering (anonymous key)."""
        if self._meter is None:
            assert self._gateway is not None, "Host(gateway=...) for a metered session"
            self._meter = self._gateway.metering.open(KeyIdentity(ANONYMOUS), time.time())
        return self._meter

    def time_left(self) -> float:
        return max(0.0, self.deadline - time.time())

    def wake_relay(self) -> None:
        self.woken.set()

    def vanished(self) -> bool:
        return self.gone.is_set() and not self.close_asked

    def adopt(self, session_id: str, deadline: float) -> None:
        self.adopted.append((session_id, deadline))
        self.session_id, self.deadline = session_id, deadline
        self.state = SessionState.ACTIVE

    async def send(self, frame: Frame) -> None:
        if not self.gone.is_set():
            self.sent.append(frame)

    async def send_error(self, code: ErrorCode, message: str, field: str | None = None) -> None:
        await self.send(error_frame(code, message, field))

    async def close(self, code: int = status.WS_1000_NORMAL_CLOSURE, reason: str = "") -> None:
        if not self.gone.is_set():
            self.close_codes.append(code)
        self.gone.set()

    def types(self) -> list[str]:
        """The ``type`` of every frame sent, in order."""
        return [str(f["type"]) for f in self.sent]


@asynccontextmanager
async def gateway_on(redis_url: str, keys: Keys, **settings: Any) -> AsyncIterator[Gateway]:
    """A gateway on ``redis_url`` whose keys start with ``keys.prefix`` (removed at the end)."""
    gateway = Gateway(Settings(redis_url=redis_url, key_prefix=keys.prefix, **settings))
    try:
        yield gateway
    finally:
        await gateway.liveness.stop()
        await gateway.stops.aclose()
        await gateway.inputs.aclose()
        stale = [key async for key in gateway.redis.scan_iter(f"{keys.prefix}:*", count=1000)]
        if stale:
            await gateway.redis.delete(*stale)
        await gateway.redis.aclose()
