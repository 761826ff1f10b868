"""The FastAPI application: WebSocket endpoints, health and metrics."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
from fastapi import Depends, FastAPI, WebSocket
from fastapi.responses import JSONResponse, Response
from starlette.status import WS_1008_POLICY_VIOLATION, WS_1013_TRY_AGAIN_LATER
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from api.gateway.state import Gateway
from api.metrics import telemetry
from api.metrics.registry import CONTENT_TYPE
from api.official.routes import create_official_router
from api.official.static_site import install_static_site
from api.ops.access_log import AccessLog
from api.ops.pages import install_pages
from api.protocol.dialects import legacy_error
from api.realtime.chat import ChatSession
from api.realtime.connection import choose_subprotocol, refuse, refuse_with_error
from api.realtime.duplex import DuplexSession
from api.realtime.legacy_chat import LegacyChat
from api.recordings.routes import create_recordings_router
from api.security.connection_cap import ConnectionCap
from api.security.policy import SecurityPolicy, admitted, require_admin
from omnicore import __version__
from omnicore.settings import Settings, get_settings
from streaming.connections import ClientConnections
from streaming.events import ErrorCode

log = logging.getLogger("omniserve.gateway")

MODES = {"chat", "video", "audio"}


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the gateway app (one Gateway per process, started in the lifespan)."""
    settings = settings or get_settings()
    security = SecurityPolicy(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        for warning in security.startup_warnings():
            log.warning("%s", warning)
        cap = ConnectionCap.for_gateway(settings)  # raises the open-files limit first
        log.info("at most %d client connections (open-files limit %d)", cap.limit, cap.open_files)
        gw = Gateway(settings)
        await gw.start()
        conns = ClientConnections(
            gw.redis, gw.keys, gw.gateway_id, settings.max_connections_per_client
        )
        await conns.start()
        app.state.gateway = gw
        app.state.connections = conns
        app.state.connection_cap = cap
        try:
            yield
        finally:
            await conns.stop()
            await gw.stop()

    app = FastAPI(title="omniserve gateway", version=__version__, lifespan=lifespan)
    app.state.security = security
    # outermost first: the client address from a trusted proxy, then the access line with it
    app.add_middleware(AccessLog)
    app.add_middleware(
        ProxyHeadersMiddleware,
        trusted_hosts=security.trusted_proxies,
    )

    @app.websocket("/v1/realtime")
    async def realtime(ws: WebSocket, mode: str = "video") -> None:
        gw: Gateway = ws.app.state.gateway
        await ws.accept(subprotocol=choose_subprotocol(ws))
        state = ws.app.state
        async with admitted(ws, security, state.connections, state.connection_cap) as refusal:
            if refusal is not None:
                code, message, close_code = refusal.code, refusal.message, refusal.close_code
                telemetry.rejected(gw.metrics, code)
                return await refuse_with_error(ws, code, message, close_code)
            await _realtime(ws, gw, mode)

    async def _realtime(ws: WebSocket, gw: Gateway, mode: str) -> None:
        if mode not in MODES:
            telemetry.rejected(gw.metrics, "invalid_mode")
            return await refuse_with_error(
                ws,
                ErrorCode.INVALID_PAYLOAD,
                "mode must be chat, video or audio",
                WS_1008_POLICY_VIOLATION,
                field="mode",
            )
        if gw.shutting_down:
            telemetry.rejected(gw.metrics, "shutting_down")
            return await refuse_with_error(
                ws,
                ErrorCode.SERVICE_UNAVAILABLE,
                "server is shutting down",
                WS_1013_TRY_AGAIN_LATER,
            )
        session = ChatSession(gw, ws) if mode == "chat" else DuplexSession(gw, ws, mode)
        await session.serve()

    @app.websocket("/ws/chat")
    async def legacy_chat(ws: WebSocket) -> None:
        gw: Gateway = ws.app.state.gateway
        await ws.accept(subprotocol=choose_subprotocol(ws))
        state = ws.app.state
        async with admitted(ws, security, state.connections, state.connection_cap) as refusal:
            if refusal is not None:
                telemetry.rejected(gw.metrics, refusal.code)
                return await refuse(ws, legacy_error(refusal.message), refusal.close_code)
            await LegacyChat(gw, ws).serve()

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        """Liveness: the process serves HTTP (nothing else is checked: a restart fixes nothing
        that Redis or the workers lack)."""
        return JSONResponse({"status": "alive", "gateway_id": app.state.gateway.gateway_id})

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        """Readiness: Redis answers and at least one worker slot is live, and this gateway is
        not draining; 503 otherwise (a load balancer then sends no new clients here)."""
        gw: Gateway = app.state.gateway
        try:
            await gw.redis.ping()
            slots = await gw.worker_count()
            redis_ok = True
        except Exception:  # noqa: BLE001 - Redis unreachable: not ready
            slots, redis_ok = 0, False
        writable = gw.writes_refused is None
        full = app.state.connection_cap.full  # new clients would be refused here
        ready = redis_ok and writable and slots > 0 and not gw.shutting_down and not full
        body = {
            "ready": ready,
            "redis": redis_ok,
            "redis_writable": writable,
            "live_slots": slots,
            "draining": gw.shutting_down,
            "at_connection_limit": full,
        }
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/health")
    async def health() -> JSONResponse:
        gw: Gateway = app.state.gateway
        try:
            await gw.redis.ping()
            cap = await gw.admission.capacity()
            snap = await gw.admission.snapshot()
            redis_ok = True
        except Exception:  # noqa: BLE001 - Redis unreachable: not ready
            cap, redis_ok, snap = None, False, None
        ready = cap.ready if cap else 0
        loading = cap.loading if cap else 0
        writable = gw.writes_refused is None
        if not writable:
            status = "degraded"  # Redis answers but takes no write: nothing can be admitted
        elif ready:
            status = "ok"
        elif loading:
            status = "loading"  # clients are queued until a worker has loaded its model
        else:
            status = "degraded"
        notes = list(cap.notes) if cap else []
        if not writable:
            notes.append(f"Redis refuses writes: {gw.writes_refused}")
        notes.extend(gw.redis_unmet)
        clients = app.state.connection_cap
        if clients.full:
            notes.append(f"at its connection limit ({clients.limit}): new clients are refused")
        body = {
            "status": status,
            "gateway_id": gw.gateway_id,
            "redis": redis_ok,
            "redis_writable": writable,
            "worker_slots": ready,
            "loading_slots": loading,
            "queue_length": snap.length if snap else None,
            "sessions": len(gw.sessions),
            "connections": clients.open,
            "connection_limit": clients.limit,
            "notes": notes,
            "version": __version__,
        }
        return JSONResponse(body, status_code=200 if redis_ok and writable else 503)

    @app.get("/v1/workers", dependencies=[Depends(require_admin)])
    async def workers() -> JSONResponse:
        gw: Gateway = app.state.gateway
        raw = await gw.redis.hgetall(gw.keys.workers)
        out = []
        for wid, info in raw.items():
            wid_s = wid.decode() if isinstance(wid, bytes) else str(wid)
            alive = bool(await gw.redis.exists(gw.keys.worker_alive(wid_s)))
            out.append({**orjson.loads(info), "alive": alive})
        return JSONResponse({"workers": out})

    @app.get("/metrics", dependencies=[Depends(require_admin)])
    async def metrics() -> Response:
        gw: Gateway = app.state.gateway
        try:
            waiting: int | None = (await gw.admission.snapshot()).length
        except Exception:  # noqa: BLE001 - Redis unreachable: the gauge keeps its last value
            waiting = None
        gw.metrics.refresh(((s.public_mode, s.state) for s in gw.sessions.values()), waiting)
        return Response(gw.metrics.exposition(), media_type=CONTENT_TYPE)

    app.include_router(create_recordings_router())
    install_pages(app, settings)
    # the official demo's HTTP API, and its pages when an operator points at them
    app.include_router(create_official_router(settings))
    if settings.static_dir:
        install_static_site(app, settings.static_dir)
    return app
