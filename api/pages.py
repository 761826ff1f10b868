"""The gateway's own web pages: the browser client at ``/``, the operator page at ``/ops``.

All page routing lives here, so a later frontend switch (the official demo's static files) can
take over ``/`` in one place. Assets are served from the package directory ``api/web/`` under
``/web/``: plain ES modules, no build step, nothing loaded from another host.

Two small JSON endpoints exist only because the pages need them:

- ``GET /web/config``: what the client cannot learn from the protocol (duration limits, whether
  an API key is required).
- ``GET /v1/admin/overview`` and ``GET /v1/admin/recordings/{id}``: workers with the state of each
  slot, the global queue, live sessions and chat recordings, for the operator page. Both are
  behind the admin guard (``api.security.require_admin``: ``Authorization: Bearer <admin
  token>``; without a token, open on a loopback bind only). The pages themselves hold no data.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import orjson
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from api.gateway import Gateway
from api.security import require_admin
from omnicore import __version__
from omnicore.settings import Settings
from streaming.keys import slot_worker

WEB_DIR = Path(__file__).resolve().parent / "web"
MODES = ("chat", "video", "audio")
CONTEXT_TOKENS = 8192  # spec/04: fixed duplex context window
RECORDINGS_LISTED = 50
_RECORDING_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_NO_CACHE = {"Cache-Control": "no-cache"}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def slot_states(gw: Gateway) -> list[dict[str, Any]]:
    """Every registered worker with its alive flag and the state of each of its slots."""
    k = gw.keys
    async with gw.redis.pipeline(transaction=False) as pipe:
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
    async with gw.redis.pipeline(transaction=False) as pipe:
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


def live_sessions(gw: Gateway) -> list[dict[str, Any]]:
    """The sessions this gateway relays now (other gateways' sessions appear as slot holders)."""
    now = time.time()
    out = []
    for sid, handler in list(gw.sessions.items()):
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


def _recording_list(directory: str) -> list[dict[str, Any]]:
    files = sorted(Path(directory).glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    out = []
    for path in files[:RECORDINGS_LISTED]:
        st = path.stat()
        out.append({"id": path.stem, "saved_at": st.st_mtime, "bytes": st.st_size})
    return out


def create_router(settings: Settings) -> APIRouter:
    """The page routes and the two JSON endpoints behind them."""
    router = APIRouter(include_in_schema=False)

    @router.get("/")
    async def index() -> FileResponse:
        return FileResponse(WEB_DIR / "index.html", headers=_NO_CACHE)

    @router.get("/ops")
    async def ops() -> FileResponse:
        return FileResponse(WEB_DIR / "ops.html", headers=_NO_CACHE)

    @router.get("/web/config")
    async def client_config() -> JSONResponse:
        return JSONResponse(
            {
                "version": __version__,
                "api_key_required": bool(settings.api_keys),
                "duration_limits_s": {m: settings.duration_limit(m) for m in MODES},
                "context_tokens": CONTEXT_TOKENS,
                "max_video_frames": settings.max_video_frames,
            },
            headers=_NO_CACHE,
        )

    @router.get("/v1/admin/overview", dependencies=[Depends(require_admin)])
    async def overview(request: Request) -> JSONResponse:
        gw: Gateway = request.app.state.gateway
        snap = await gw.admission.snapshot()
        recordings = (
            await asyncio.to_thread(_recording_list, settings.recordings_dir)
            if settings.recordings_dir
            else []
        )
        body = {
            "gateway": {
                "gateway_id": gw.gateway_id,
                "version": __version__,
                "uptime_s": round(time.time() - gw.started_at, 1),
                "shutting_down": gw.shutting_down,
            },
            "workers": await slot_states(gw),
            "queue": {
                "length": snap.length,
                "live_slots": snap.live_slots,
                "mean_hold_s": round(snap.mean_hold_s, 1),
                "waiting_here": len(gw.queue.waiters),
                "tickets": [
                    {"ticket_id": t, "position": p, "estimated_wait_s": snap.estimated_wait_s(p)}
                    for t, p in sorted(snap.order.items(), key=lambda kv: kv[1])[:100]
                ],
            },
            "sessions": live_sessions(gw),
            "recordings": {"enabled": bool(settings.recordings_dir), "items": recordings},
            "counters": dict(gw.counters),
        }
        return JSONResponse(body, headers=_NO_CACHE)

    @router.get("/v1/admin/recordings/{recording_id}", dependencies=[Depends(require_admin)])
    async def recording(recording_id: str) -> Response:
        if not settings.recordings_dir or not _RECORDING_ID.match(recording_id):
            raise HTTPException(404, "no such recording")
        path = Path(settings.recordings_dir) / f"{recording_id}.json"
        if not path.is_file():
            raise HTTPException(404, "no such recording")
        data = await asyncio.to_thread(path.read_bytes)
        return Response(data, media_type="application/json", headers=_NO_CACHE)

    return router


def install_pages(app: FastAPI, settings: Settings) -> None:
    """Add the pages, their JSON endpoints and the ``/web`` assets to the gateway app."""
    app.include_router(create_router(settings))
    app.mount("/web", StaticFiles(directory=WEB_DIR), name="web")
