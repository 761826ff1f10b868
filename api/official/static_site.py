"""``OMNISERVE_STATIC_DIR``: a frontend directory served same-origin with the gateway.

Pointed at the official demo's ``static/`` directory, its pages open at the routes the official
gateway serves them on and reach ``/v1/realtime``, ``/ws/chat`` and the HTTP API
(``api/official/routes.py``) on the same origin, so the browser needs no CORS and no origin
allow-list. Any directory with an ``index.html`` works at ``/`` (omniserve's own client,
``api/web/``, stays at ``/web/``).

Only the files named below and what ``StaticFiles`` serves under ``/static`` (which stays inside
the directory and follows no symlink out of it) can be read.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from fastapi import APIRouter, FastAPI, HTTPException
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles

#: page route -> the file of the official demo's static/ directory that it serves
PAGES = {
    "/": "index.html",
    "/turnbased": "turnbased.html",
    "/omni": "omni/omni.html",
    "/audio_duplex": "audio-duplex/audio_duplex.html",
    "/realtime": "realtime/realtime.html",
    "/admin": "admin.html",
}
_NO_CACHE = {"Cache-Control": "no-cache"}


def _page_route(router: APIRouter, route: str, file: Path) -> None:
    async def page() -> FileResponse:
        if not await asyncio.to_thread(file.is_file):
            raise HTTPException(404, f"{file.name} is not in OMNISERVE_STATIC_DIR")
        return FileResponse(file, headers=_NO_CACHE)

    router.add_api_route(route, page, methods=["GET", "HEAD"], include_in_schema=False)


def install_static_site(app: FastAPI, static_dir: str) -> None:
    """Serve ``static_dir``'s pages at the official routes and its files under ``/static``."""
    root = Path(static_dir).resolve()
    if not root.is_dir():
        raise ValueError(f"OMNISERVE_STATIC_DIR {static_dir!r} is not a directory")
    router = APIRouter()
    for route, name in PAGES.items():
        _page_route(router, route, root / name)
    favicon = root / "favicon.ico"

    @router.get("/favicon.ico", include_in_schema=False)
    async def icon() -> Response:
        """The directory's icon, else 204: the demo's pages name none and browsers ask anyway."""
        if await asyncio.to_thread(favicon.is_file):
            return FileResponse(favicon)
        return Response(status_code=204)

    app.include_router(router)
    app.mount("/static", StaticFiles(directory=root), name="static")
