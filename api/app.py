"""The FastAPI application: the gateway's lifespan, its middleware and every feature's routes.

Each feature keeps its routes next to it (``create_router`` in ``api/realtime/routes.py``,
``api/ops/``, ``api/recordings/routes.py``, ``api/official/routes.py``); this module only builds
the app, starts the process state in the lifespan and includes them.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from api.gateway.state import Gateway
from api.official.routes import create_official_router
from api.official.static_site import install_static_site
from api.openai_realtime.session import OpenAIRealtime
from api.ops import admin, health, keys, usage
from api.ops.access_log import AccessLog
from api.ops.pages import install_pages
from api.realtime import routes as realtime
from api.recordings.routes import create_recordings_router
from api.security.connection_cap import ConnectionCap
from api.security.policy import SecurityPolicy
from omnicore import __version__
from omnicore.settings import Settings, get_settings
from streaming.connections import ClientConnections

log = logging.getLogger("omniserve.gateway")


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
        gateway = Gateway(settings)
        await gateway.start()
        security.keystore = gateway.metering.keystore
        conns = ClientConnections(
            gateway.redis, gateway.keys, gateway.gateway_id, settings.max_connections_per_client
        )
        await conns.start()
        app.state.gateway = gateway
        app.state.connections = conns
        app.state.connection_cap = cap
        try:
            yield
        finally:
            await conns.stop()
            await gateway.stop()

    app = FastAPI(title="omniserve gateway", version=__version__, lifespan=lifespan)
    app.state.security = security
    # outermost first: the client address from a trusted proxy, then the access line with it
    app.add_middleware(AccessLog)
    app.add_middleware(
        ProxyHeadersMiddleware,
        trusted_hosts=security.trusted_proxies,
    )

    app.include_router(realtime.create_router(security, OpenAIRealtime))
    app.include_router(health.create_router())
    app.include_router(admin.create_router())
    app.include_router(keys.create_router())
    app.include_router(usage.create_router())
    app.include_router(create_recordings_router())
    install_pages(app, settings)
    # the official demo's HTTP API, and its pages when an operator points at them
    app.include_router(create_official_router(settings))
    if settings.static_dir:
        install_static_site(app, settings.static_dir)
    return app
