"""The HTTP API the official demo's pages call, in the official gateway's shapes.

Operators who already run the official MiniCPM-o demo keep its web pages and point them at
omniserve (``OMNISERVE_STATIC_DIR``, ``api/official/static_site.py``). The pages poll and fetch
these endpoints; each answers from omniserve's real state (``api/official/state.py``) or files
(``api/official/assets.py``). docs/FRONTEND.md lists every endpoint and what backs it.

Public (the pages a user opens): ``/status``, ``/api/apps``, ``/api/presets``,
``/api/presets/{page}/{id}/audio``, ``/api/default_ref_audio``, ``/api/frontend_defaults``, and
``POST /api/streaming/stop`` (the turn-based page's stop button: 501, it names no turn).

Admin (the demo's ``/admin`` page), behind ``require_admin`` like every operator endpoint:
``/workers``, ``/api/queue``, ``/sessions``, ``/api/config/eta``, ``/api/assets/ref_audio``,
``/api/admin/apps``. The writes the admin page offers change things omniserve keeps elsewhere
(apps are the protocols it serves, waits are measured, voices are the operator's directory, the
queue belongs to the gateways holding the tickets); they answer **501** with a JSON ``detail``
saying so, never 404.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from api.gateway.state import Gateway
from api.official.assets import (
    AssetError,
    default_voice,
    list_voices,
    load_presets,
    preset_audio,
)
from api.official.state import OfficialView
from api.security.policy import require_admin
from omnicore.settings import Settings
from streaming.wait_estimate import HOLD_EMA_ALPHA, HoldTimes

_NO_CACHE = {"Cache-Control": "no-cache"}
VIEW_TTL_S = 0.5

#: the demo's apps that omniserve serves (its half-duplex pages use a protocol omniserve lacks)
APPS = (
    {"app_id": "turnbased", "name": "Turn-based Chat", "route": "/turnbased"},
    {"app_id": "omni", "name": "Omni Full-Duplex", "route": "/omni"},
    {"app_id": "audio_duplex", "name": "Audio Full-Duplex", "route": "/audio_duplex"},
    {"app_id": "realtime", "name": "Realtime API", "route": "/realtime"},
)

NOT_SUPPORTED = {
    "apps": "omniserve serves every app it lists; apps are not switched at run time",
    "eta": (
        "omniserve estimates waits from the measured slot hold times (one moving average over "
        "all gateways); there are no per-mode ETA settings to change"
    ),
    "ref_audio": (
        "voices are the files of OMNISERVE_VOICES_DIR; add or remove files there "
        "(no uploads through the gateway)"
    ),
    "queue": (
        "a ticket belongs to the gateway whose client holds it; the client leaves the queue "
        "by closing its connection or sending session.close"
    ),
    "sessions": "a session ends when its client closes it or at its duration limit",
    "stop": "a /ws/chat turn runs to its end; close its WebSocket to stop it",
}


def _json(body: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=_NO_CACHE)


def not_supported(what: str) -> JSONResponse:
    """The documented answer to an admin write omniserve does not support."""
    return _json({"detail": NOT_SUPPORTED[what], "supported": False}, 501)


def _asset_error(exc: AssetError) -> JSONResponse:
    return _json({"detail": exc.detail}, exc.status)


class ViewCache:
    """The last ``OfficialView``, reused for ``VIEW_TTL_S``: every open page polls ``/status``
    (the duplex pages every 10 s), and one read costs a few Redis round trips."""

    def __init__(self) -> None:
        self.view: OfficialView | None = None
        self.read_at = 0.0

    async def get(self, request: Request) -> OfficialView:
        now = time.monotonic()
        if self.view is None or now - self.read_at > VIEW_TTL_S:
            gateway: Gateway = request.app.state.gateway
            self.view = await OfficialView.read(gateway)
            self.read_at = now
        return self.view


def create_official_router(settings: Settings) -> APIRouter:
    """The official pages' endpoints (public and admin)."""
    router = APIRouter(include_in_schema=False)
    admin = [Depends(require_admin)]
    voices = settings.voices_dir
    views = ViewCache()
    _view = views.get

    # ------------------------------------------------------------------ public
    @router.get("/status")
    async def status(request: Request) -> JSONResponse:
        return _json((await _view(request)).status())

    @router.get("/api/apps")
    async def apps() -> JSONResponse:
        return _json({"apps": [dict(a) for a in APPS]})

    @router.get("/api/frontend_defaults")
    async def frontend_defaults() -> JSONResponse:
        return _json({"playback_delay_ms": settings.playback_delay_ms})

    @router.get("/api/presets")
    async def presets() -> JSONResponse:
        return _json(await asyncio.to_thread(load_presets, settings.presets_dir, voices))

    @router.get("/api/presets/{page}/{preset_id}/audio")
    async def preset_audio_of(page: str, preset_id: str) -> JSONResponse:
        found = await asyncio.to_thread(load_presets, settings.presets_dir, voices)
        try:
            return _json(await asyncio.to_thread(preset_audio, found, page, preset_id, voices))
        except AssetError as exc:
            return _asset_error(exc)

    @router.get("/api/default_ref_audio")
    async def default_ref_audio() -> JSONResponse:
        try:
            return _json(await asyncio.to_thread(default_voice, voices, settings.default_voice))
        except AssetError as exc:
            return _asset_error(exc)

    @router.post("/api/streaming/stop")
    async def stop_streaming() -> JSONResponse:
        # the turn-based page's stop button; it names no turn, so nothing can be stopped safely
        return not_supported("stop")

    # ------------------------------------------------------------------ admin: reads
    @router.get("/workers", dependencies=admin)
    async def workers(request: Request) -> JSONResponse:
        return _json((await _view(request)).worker_list())

    @router.get("/api/queue", dependencies=admin)
    async def queue(request: Request) -> JSONResponse:
        return _json((await _view(request)).queue())

    @router.get("/sessions", dependencies=admin)
    @router.get("/api/sessions", dependencies=admin)
    async def sessions(request: Request) -> JSONResponse:
        return _json((await _view(request)).sessions())

    @router.get("/api/config/eta", dependencies=admin)
    async def eta(request: Request) -> JSONResponse:
        snap = (await _view(request)).snap
        holds = HoldTimes(snap.mode_hold_s, snap.mean_hold_s)
        # the official modes by ours (the admin page also reads a "streaming" figure:
        # turn-based streaming chat)
        ours = {
            "chat": "chat",
            "streaming": "chat",
            "half_duplex": "audio",
            "audio_duplex": "audio",
            "omni_duplex": "video",
        }
        mean = {m: round(holds.of(mode), 1) for m, mode in ours.items()}
        return _json(
            {
                "config": {**{f"eta_{m}_s": mean[m] for m in ours}, "ema_alpha": None},
                "ema_alpha": HOLD_EMA_ALPHA,  # the RELEASE script's moving averages
                **{f"ema_{m}_s": mean[m] for m in ours},
                **{f"ema_{m}_samples": 0 for m in ours},  # samples are not counted
            }
        )

    @router.get("/api/assets/ref_audio", dependencies=admin)
    async def ref_audios() -> JSONResponse:
        return _json(await asyncio.to_thread(list_voices, voices))

    @router.get("/api/admin/apps", dependencies=admin)
    async def admin_apps() -> JSONResponse:
        return _json({"apps": [{**a, "enabled": True} for a in APPS]})

    # ------------------------------------------------------------------ admin: writes
    @router.put("/api/admin/apps/{app_id}", dependencies=admin)
    async def toggle_app(app_id: str) -> JSONResponse:
        return not_supported("apps")

    @router.put("/api/config/eta", dependencies=admin)
    async def set_eta() -> JSONResponse:
        return not_supported("eta")

    @router.post("/api/assets/ref_audio", dependencies=admin)
    @router.post("/api/assets/ref_audio/external", dependencies=admin)
    @router.delete("/api/assets/ref_audio/{ref_id:path}", dependencies=admin)
    async def change_voices() -> JSONResponse:
        return not_supported("ref_audio")

    @router.delete("/api/queue/{ticket_id}", dependencies=admin)
    async def cancel_ticket(ticket_id: str) -> JSONResponse:
        return not_supported("queue")

    @router.delete("/sessions/{session_id}", dependencies=admin)
    async def end_session(session_id: str) -> JSONResponse:
        return not_supported("sessions")

    return router
