"""Health for load balancers and operators: ``/healthz`` (liveness), ``/readyz`` (readiness),
``/health`` (what is missing, in words).

Open to everyone: they tell no more than whether this gateway can take clients.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from api.gateway.state import Gateway
from omnicore import __version__
from streaming.redis_url import topology


def create_router() -> APIRouter:
    """The three health endpoints, reading the gateway and its connection cap from the app."""
    router = APIRouter()

    @router.get("/healthz")
    async def healthz(request: Request) -> JSONResponse:
        """Liveness: the process serves HTTP (nothing else is checked: a restart fixes nothing
        that Redis or the workers lack)."""
        return JSONResponse({"status": "alive", "gateway_id": request.app.state.gateway.gateway_id})

    @router.get("/readyz")
    async def readyz(request: Request) -> JSONResponse:
        """Readiness: Redis answers and at least one worker slot is live, and this gateway is
        not draining; 503 otherwise (a load balancer then sends no new clients here)."""
        gateway: Gateway = request.app.state.gateway
        try:
            await gateway.redis.ping()
            slots = await gateway.worker_count()
            redis_ok = True
        except Exception:  # noqa: BLE001 - Redis unreachable: not ready
            slots, redis_ok = 0, False
        writable = gateway.writes_refused is None
        full = request.app.state.connection_cap.full  # new clients would be refused here
        ready = redis_ok and writable and slots > 0 and not gateway.shutting_down and not full
        body = {
            "ready": ready,
            "redis": redis_ok,
            "redis_writable": writable,
            "live_slots": slots,
            "draining": gateway.shutting_down,
            "at_connection_limit": full,
        }
        return JSONResponse(body, status_code=200 if ready else 503)

    @router.get("/health")
    async def health(request: Request) -> JSONResponse:
        gateway: Gateway = request.app.state.gateway
        try:
            await gateway.redis.ping()
            cap = await gateway.admission.capacity()
            snap = await gateway.admission.snapshot()
            redis_ok = True
        except Exception:  # noqa: BLE001 - Redis unreachable: not ready
            cap, redis_ok, snap = None, False, None
        ready = cap.ready if cap else 0
        loading = cap.loading if cap else 0
        writable = gateway.writes_refused is None
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
            notes.append(f"Redis refuses writes: {gateway.writes_refused}")
        notes.extend(gateway.redis_unmet)
        clients = request.app.state.connection_cap
        if clients.full:
            notes.append(f"at its connection limit ({clients.limit}): new clients are refused")
        body = {
            "status": status,
            "gateway_id": gateway.gateway_id,
            "redis": redis_ok,
            "redis_writable": writable,
            "broker": gateway.broker_where,  # scheme and host(s), no credentials
            "worker_slots": ready,
            "loading_slots": loading,
            "queue_length": snap.length if snap else None,
            "sessions": len(gateway.sessions),
            "connections": clients.open,
            "connection_limit": clients.limit,
            "notes": notes,
            "redis_topology": redis_topology(gateway),
            "version": __version__,
        }
        return JSONResponse(body, status_code=200 if redis_ok and writable else 503)

    return router


def redis_topology(gateway: Gateway) -> dict[str, Any]:
    """What the gateway's Redis is: ``standalone``, ``sentinel`` or ``cluster``; a cluster's
    nodes as its client knows them now (``host:port`` and ``primary`` or ``replica``)."""
    kind = topology(gateway.settings.redis_url)
    out: dict[str, Any] = {"kind": kind}
    if kind == "cluster":
        shards: Any = gateway.redis
        nodes = shards.get_nodes()
        out["nodes"] = sorted(f"{n.host}:{n.port} {n.server_type}" for n in nodes)
    return out
