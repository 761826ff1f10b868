"""uvicorn's server with a graceful drain: sessions hear ``server_shutdown`` before sockets
close."""

from __future__ import annotations

import asyncio
import logging
import socket
from types import FrameType
from typing import cast

import uvicorn

from api.gateway.state import Gateway
from omnicore.gc_pauses import freeze_heap

log = logging.getLogger("omniserve.gateway")

DRAIN_TIMEOUT_S = 5.0


class GatewayServer(uvicorn.Server):
    """On SIGTERM/SIGINT, drain first, then stop uvicorn.

    The drain (``Gateway.drain``): no new connections (``/readyz`` answers 503), running sessions
    may finish for up to ``OMNISERVE_DRAIN_GRACE_S``, then the rest hear ``server_shutdown``. A
    second signal cuts the grace short. (Plain uvicorn closes WebSockets with 1012 before the
    application's shutdown runs, so clients would never see ``session.closed``.)
    """

    _draining = False
    _drain_task: asyncio.Task[None] | None = None
    _grace_task: asyncio.Future[None] | None = None

    def _gateway(self) -> Gateway | None:
        """The app's ``Gateway`` (under whatever middleware wraps the app), once started."""
        app = self.config.loaded_app
        while app is not None:
            gateway = getattr(getattr(app, "state", None), "gateway", None)
            if gateway is not None:
                return cast(Gateway, gateway)
            app = getattr(app, "app", None)
        return None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's startup (the app's lifespan, the listening sockets), then the objects that
        live as long as the process are frozen out of the collector's reach (``gc_freeze``,
        ``omnicore/gc_pauses.py``): a full collection would otherwise walk them all, every
        session waiting."""
        await super().startup(sockets)
        gateway = self._gateway()
        if not self.should_exit and gateway is not None and gateway.settings.gc_freeze:
            log.info("froze %d objects of the started gateway", freeze_heap())

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._draining:
            if self._grace_task is not None and not self._grace_task.done():
                self._grace_task.cancel()  # a second signal: no more grace
                return None
            return super().handle_exit(sig, frame)
        self._draining = True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return super().handle_exit(sig, frame)
        self._drain_task = loop.create_task(self._drain_then_exit(sig, frame))

    async def _drain_then_exit(self, sig: int, frame: FrameType | None) -> None:
        gateway = self._gateway()
        if gateway is not None:
            grace = asyncio.ensure_future(gateway.drain(gateway.settings.drain_grace_s))
            self._grace_task = grace
            try:
                await grace
            except asyncio.CancelledError:
                log.warning("second signal: ending %d session(s) now", len(gateway.sessions))
            except Exception:
                log.warning("drain incomplete", exc_info=True)
            try:
                await asyncio.wait_for(gateway.drain(), DRAIN_TIMEOUT_S)
            except Exception:
                log.warning("drain incomplete", exc_info=True)
        super().handle_exit(sig, frame)
