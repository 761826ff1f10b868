"""The HTTP API the official demo's pages call, in the official gateway's shapes.

Operators who already run the official MiniCPM-o demo keep its web pages and point them at
omniserve (``OMNISERVE_STATIC_DIR``, ``api/official/static_site.py``). The pages poll and fetch
these endpoints; each answers from omniserve's real state (``api/official/state.py``) or files
(``api/official/assets.py``). docs/FRONTEND.md lists every endpoint and what backs it.

Public (the pages a user opens): ``/status``, ``/api/apps``, ``/api/presets``,
``/api/presets/{page}/{id}/audio``, ``/api/default_ref_audio``, ``/api/frontend_defaults``, and
``POST /api/streaming/stop`` (the turn-based page's stop button: 501, it names no turn).

The official gateway's older client API, let in like every client connection (API keys,
origins, per-client and per-gateway limits): ``POST /api/chat`` (``api/official/chat_http.py``)
and ``WS /ws/duplex/{session_id}`` (``api/official/duplex_ws.py``).

Admin (the demo's ``/admin`` page), behind ``require_admin`` like every operator endpoint:
``/workers``, ``/api/queue``, ``/sessions``, ``/api/config/eta`` (``GET`` and ``PUT``,
``api/official/eta.py``), ``/api/assets/ref_audio`` (list, ``POST`` upload, ``DELETE``,
``api/official/ref_audio.py``), ``/api/admin/apps``. The other writes the admin page offers
change things omniserve keeps elsewhere (apps are the protocols it serves, the queue belongs to
the gateways holding the tickets); they answer **501** with a JSON ``detail`` saying so, never
404.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from fastapi import APIRouter, Depends, Request, WebSocket
from fastapi.responses import JSONResponse
from starlette.status import WS_1013_TRY_AGAIN_LATER

from api.gateway.state import Gateway
from api.metrics import telemetry
from api.official import eta as eta_settings
from api.official import ref_audio as uploads
from api.official.assets import (
    AssetError,
    default_voice,
    list_voices,
    load_presets,
    preset_audio,
)
from api.official.chat_http import BodyRefused, HttpChat, detail, read_json
from api.official.duplex_frames import official_error
from api.official.duplex_ws import OfficialDuplex
from api.official.state import OfficialView
from api.realtime.connection import refuse
from api.security.policy import EntryDenied, SecurityPolicy, let_in, require_admin
from omnicore.settings import Settings
from streaming.events import ErrorCode

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
    "ref_audio_external": (
        "voices are the files of OMNISERVE_VOICES_DIR; upload one with POST "
        "/api/assets/ref_audio (the gateway fetches no URL)"
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


_UNSAFE_ID = re.compile(r"[^a-zA-Z0-9_\-]")
#: a denied connection's HTTP status, by the error the WebSockets answer with
_DENIED_STATUS = {
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.ORIGIN_NOT_ALLOWED: 403,
    ErrorCode.TOO_MANY_CONNECTIONS: 429,
}


def client_session_id(session_id: str) -> str:
    """The client's name for its session, as the official gateway keeps it: letters, digits,
    ``_`` and ``-``, anything else replaced by ``_`` (it only names the session in logs)."""
    return _UNSAFE_ID.sub("_", session_id)[:128] or "_"


def _denied(gateway: Gateway, denied: EntryDenied) -> JSONResponse:
    telemetry.rejected(gateway.metrics, denied.code)
    return _json({"detail": denied.message}, _DENIED_STATUS.get(denied.code, 503))


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

    # ------------------------------------------------------------------ the older client API
    @router.post("/api/chat")
    async def chat(request: Request) -> JSONResponse:
        gateway: Gateway = request.app.state.gateway
        state = request.app.state
        security: SecurityPolicy = state.security
        async with let_in(request, security, state.connections, state.connection_cap) as denied:
            if denied is not None:
                return _denied(gateway, denied)
            if gateway.shutting_down:
                telemetry.rejected(gateway.metrics, "shutting_down")
                return detail(503, "Service not ready")
            try:
                body = await read_json(request, settings.max_frame_bytes)
            except BodyRefused as exc:
                return detail(exc.status, exc.message)
            return await HttpChat(gateway, request).answer(body)

    @router.websocket("/ws/duplex/{session_id}")
    async def duplex(ws: WebSocket, session_id: str) -> None:
        gateway: Gateway = ws.app.state.gateway
        await ws.accept()
        state = ws.app.state
        async with let_in(ws, state.security, state.connections, state.connection_cap) as denied:
            if denied is not None:
                telemetry.rejected(gateway.metrics, denied.code)
                return await refuse(ws, official_error(denied.message), denied.close_code)
            if gateway.shutting_down:
                telemetry.rejected(gateway.metrics, "shutting_down")
                return await refuse(
                    ws, official_error("Service not ready"), WS_1013_TRY_AGAIN_LATER
                )
            await OfficialDuplex(gateway, ws, client_session_id(session_id)).serve()

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
        gateway: Gateway = request.app.state.gateway
        snap = await gateway.admission.snapshot()
        return _json(await eta_settings.status(gateway, snap))

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
    async def set_eta(request: Request, config: eta_settings.EtaConfig) -> JSONResponse:
        gateway: Gateway = request.app.state.gateway
        await eta_settings.store(gateway, config)
        snap = await gateway.admission.snapshot()
        return _json(await eta_settings.status(gateway, snap))

    @router.post("/api/assets/ref_audio", dependencies=admin)
    async def upload_voice(body: uploads.UploadRefAudio) -> JSONResponse:
        limits = (settings.ref_audio_max_bytes, settings.ref_audio_max_s)
        try:
            ref_id = await asyncio.to_thread(uploads.upload, voices, body, *limits)
            return _json(await asyncio.to_thread(uploads.uploaded, ref_id, body.name, voices))
        except AssetError as exc:
            return _asset_error(exc)

    @router.delete("/api/assets/ref_audio/{ref_id:path}", dependencies=admin)
    async def delete_voice(ref_id: str) -> JSONResponse:
        try:
            await asyncio.to_thread(uploads.delete, voices, ref_id)
        except AssetError as exc:
            return _asset_error(exc)
        return _json({"success": True, "id": ref_id, "name": None, "message": "Deleted"})

    @router.post("/api/assets/ref_audio/external", dependencies=admin)
    async def external_voice() -> JSONResponse:
        return not_supported("ref_audio_external")

    @router.delete("/api/queue/{ticket_id}", dependencies=admin)
    async def cancel_ticket(ticket_id: str) -> JSONResponse:
        return not_supported("queue")

    @router.delete("/sessions/{session_id}", dependencies=admin)
    async def end_session(session_id: str) -> JSONResponse:
        return not_supported("sessions")

    return router
