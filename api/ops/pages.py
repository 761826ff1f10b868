"""The gateway's own web pages: the browser client at ``/``, the operator page at ``/ops``.

With ``OMNISERVE_STATIC_DIR`` set, that directory (the official demo's static files) takes over
``/`` and the demo's page routes (``api/official/static_site.py``); omniserve's own client stays at
``/web/``. Assets are served from the package directory ``api/web/`` under ``/web/``: plain ES
modules, no build step, nothing loaded from another host.

Small endpoints exist only because the pages need them:

- ``GET /web/config``: what the client cannot learn from the protocol (duration limits, whether
  an API key is required).
- ``GET /web/protocol.js``: the protocol's event types, error codes and close reasons as an ES
  module the client imports, and ``GET /v1/protocol``, the same as JSON for any client
  (``api/protocol/catalog.py``): the pages keep no copy of their own.
- ``GET /v1/admin/overview``: workers with the state of each slot, the global queue, live
  sessions and the latest recordings, for the operator page. It is behind the admin guard
  (``api.security.policy.require_admin``: ``Authorization: Bearer <admin token>``; without a token,
  open on a loopback bind only). The pages themselves hold no data; a recording's details come
  from ``/v1/recordings`` (``api/recordings/routes.py``).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from api.gateway.state import Gateway
from api.protocol.catalog import catalog, javascript_module
from api.security.policy import require_admin
from omnicore import __version__
from omnicore.settings import Settings
from streaming.keys import slot_worker

WEB_DIR = Path(__file__).resolve().parent.parent / "web"
MODES = ("chat", "video", "audio")
CONTEXT_TOKENS = 8192  # spec/04: fixed duplex context window
RECORDINGS_LISTED = 50
_NO_CACHE = {"Cache-Control": "no-cache"}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def slot_states(gateway: Gateway) -> list[dict[str, Any]]:
    """Every registered worker with its alive flag and the state of each of its slots."""
    k = gateway.keys
    async with gateway.redis.pipeline(transaction=False) as pipe:
        pipe.hgetall(k.workers)
        pipe.lrange(k.free_slots, 0, -1)
        pipe.smembers(k.busy_slots)
        raw, free, busy = await pipe.execute()
    free_ids = {_text(s) for s in free}
    busy_ids = {_text(s) for s in busy}
    workers = {_text(w): orjson.loads(info) for w, info in raw.items()}
    slot_ids = {
        wid: [f"{wid}|{i}" for i in range(int(info.get("slots", 1)))]
        for wid, info in workers.items()
    }
    all_slots = [s for ids in slot_ids.values() for s in ids]
    async with gateway.redis.pipeline(transaction=False) as pipe:
        for wid in workers:
            pipe.exists(k.worker_alive(wid))
        for slot in all_slots:
            pipe.get(k.slot_hold(slot))
        answers = await pipe.execute()
    alive = dict(zip(workers, answers[: len(workers)], strict=True))
    holds = dict(zip(all_slots, answers[len(workers) :], strict=True))
    out = []
    for wid, info in workers.items():
        slots = []
        for slot in slot_ids[wid]:
            hold = holds.get(slot)
            if not alive[wid]:
                state = "offline"
            elif slot in busy_ids:
                state = "busy"
            elif slot in free_ids:
                state = "idle"
            else:
                state = "withdrawn"  # neither offered nor handed out (draining, starting)
            slots.append({"slot_id": slot, "state": state, "holder": _text(hold) if hold else None})
        out.append({**info, "worker_id": wid, "alive": bool(alive[wid]), "slot_states": slots})
    # busy slots of workers that are no longer registered (reaped soon)
    out.extend(
        {
            "worker_id": slot_worker(slot),
            "alive": False,
            "slot_states": [{"slot_id": slot, "state": "busy", "holder": None}],
        }
        for slot in sorted(busy_ids - set(all_slots))
    )
    return out


def live_sessions(gateway: Gateway) -> list[dict[str, Any]]:
    """The sessions this gateway relays now (other gateways' sessions appear as slot holders)."""
    now = time.time()
    out = []
    for sid, handler in list(gateway.sessions.items()):
        out.append(
            {
                "session_id": sid,
                "mode": handler.public_mode,
                "state": str(handler.state),
                "dialect": str(handler.dialect) if handler.dialect else None,
                "slot_id": handler.slot_id,
                "elapsed_s": round(now - handler.connected_at, 1),
                "limit_s": round(handler.deadline - handler.connected_at, 1),
            }
        )
    return out


def create_router(settings: Settings) -> APIRouter:
    """The page routes and the endpoints behind them."""
    router = APIRouter(include_in_schema=False)

    if not settings.static_dir:  # else "/" is the static directory's (api/official/static_site.py)

        @router.get("/")
        async def index() -> FileResponse:
            return FileResponse(WEB_DIR / "index.html", headers=_NO_CACHE)

    @router.get("/ops")
    async def ops() -> FileResponse:
        return FileResponse(WEB_DIR / "ops.html", headers=_NO_CACHE)

    @router.get("/web/config")
    async def client_config(request: Request) -> JSONResponse:
        required = bool(settings.api_keys) or settings.require_api_key
        if not required:  # a named key exists (omniserve keys)
            gateway: Gateway = request.app.state.gateway
            try:
                required = await gateway.metering.keystore.any_keys()
            except Exception:  # noqa: BLE001 - Redis away: no client is served anyway
                required = False
        return JSONResponse(
            {
                "version": __version__,
                "api_key_required": required,
                "duration_limits_s": {m: settings.duration_limit(m) for m in MODES},
                "context_tokens": CONTEXT_TOKENS,
                "max_video_frames": settings.max_video_frames,
            },
            headers=_NO_CACHE,
        )

    @router.get("/v1/protocol")
    async def protocol() -> JSONResponse:
        return JSONResponse(catalog())

    @router.get("/web/protocol.js")
    async def protocol_module() -> Response:
        return Response(javascript_module(), media_type="text/javascript", headers=_NO_CACHE)

    @router.get("/v1/admin/overview", dependencies=[Depends(require_admin)])
    async def overview(request: Request) -> JSONResponse:
        gateway: Gateway = request.app.state.gateway
        snap = await gateway.admission.snapshot()
        store = gateway.recorder.store
        metas = await asyncio.to_thread(store.metas) if store else []
        recordings = metas[:RECORDINGS_LISTED]
        body = {
            "gateway": {
                "gateway_id": gateway.gateway_id,
                "version": __version__,
                "uptime_s": round(time.time() - gateway.started_at, 1),
                "shutting_down": gateway.shutting_down,
            },
            "workers": await slot_states(gateway),
            "queue": {
                "length": snap.length,
                "live_slots": snap.live_slots,
                "mean_hold_s": round(snap.mean_hold_s, 1),
                "waiting_here": len(gateway.queue.waiters),
                "tickets": [
                    {"ticket_id": t, "position": p, "estimated_wait_s": snap.estimated_wait_s(p)}
                    for t, p in sorted(snap.order.items(), key=lambda kv: kv[1])[:100]
                ],
            },
            "sessions": live_sessions(gateway),
            "recordings": {"enabled": store is not None, "items": recordings},
            "counters": gateway.metrics.totals(),
        }
        return JSONResponse(body, headers=_NO_CACHE)

    return router


def install_pages(app: FastAPI, settings: Settings) -> None:
    """Add the pages, their JSON endpoints and the ``/web`` assets to the gateway app (with
    ``OMNISERVE_STATIC_DIR`` set, ``api/official/static_site.py`` serves ``/`` instead)."""
    app.include_router(create_router(settings))
    # html=True: omniserve's own client also answers at /web/ (needed when "/" is another's)
    app.mount("/web", StaticFiles(directory=WEB_DIR, html=True), name="web")
