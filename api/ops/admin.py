"""The operator's machine-readable endpoints: ``/v1/workers`` (the worker registry) and
``/metrics`` (Prometheus), both behind the admin guard (``require_admin``)."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from api.gateway.state import Gateway
from api.metrics.registry import CONTENT_TYPE
from api.security.policy import require_admin


def create_router() -> APIRouter:
    """``/v1/workers`` and ``/metrics``, reading the gateway from the app."""
    router = APIRouter()

    @router.get("/v1/workers", dependencies=[Depends(require_admin)])
    async def workers(request: Request) -> JSONResponse:
        gateway: Gateway = request.app.state.gateway
        raw = await gateway.redis.hgetall(gateway.keys.workers)
        out = []
        for wid, info in raw.items():
            wid_s = wid.decode() if isinstance(wid, bytes) else str(wid)
            alive = bool(await gateway.redis.exists(gateway.keys.worker_alive(wid_s)))
            out.append({**orjson.loads(info), "alive": alive})
        return JSONResponse({"workers": out})

    @router.get("/metrics", dependencies=[Depends(require_admin)])
    async def metrics(request: Request) -> Response:
        gateway: Gateway = request.app.state.gateway
        try:
            waiting: int | None = (await gateway.admission.snapshot()).length
        except Exception:  # noqa: BLE001 - Redis unreachable: the gauge keeps its last value
            waiting = None
        gateway.metrics.refresh(
            ((s.public_mode, s.state) for s in gateway.sessions.values()), waiting
        )
        return Response(gateway.metrics.exposition(), media_type=CONTENT_TYPE)

    return router
