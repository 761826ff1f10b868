"""``GET /v1/recordings``: list, metadata, files and zip of the recorded sessions (admin only).

Every id and file name is checked against the store's strict patterns (``store.check_id``)
before a path is built, so a request cannot reach anything outside the store: a malformed id is
``400``, an unknown one ``404``.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.background import BackgroundTask

from api.recordings.store import BadName, RecordingStore, check_file_name, check_id
from api.security.policy import require_admin

MEDIA_TYPES = {
    ".wav": "audio/wav",
    ".jpg": "image/jpeg",
    ".png": "image/png",
    ".json": "application/json",
    ".jsonl": "application/x-ndjson",
    ".txt": "text/plain; charset=utf-8",
}
NO_CACHE = {"Cache-Control": "no-store"}


def _store(request: Request) -> RecordingStore:
    store: RecordingStore | None = request.app.state.gateway.recorder.store
    if store is None:
        raise HTTPException(404, "recordings are off (OMNISERVE_RECORDINGS)")
    return store


def _id(recording_id: str) -> str:
    try:
        return check_id(recording_id)
    except BadName:
        raise HTTPException(400, "invalid recording id") from None


async def _meta(store: RecordingStore, recording_id: str) -> dict[str, Any]:
    meta = await asyncio.to_thread(store.meta, _id(recording_id))
    if meta is None:
        raise HTTPException(404, "no such recording")
    return meta


async def _zip(store: RecordingStore, recording_id: str) -> FileResponse:
    await _meta(store, recording_id)
    fd, path = tempfile.mkstemp(prefix="omniserve-recording-", suffix=".zip")
    try:
        with os.fdopen(fd, "wb") as out:
            await asyncio.to_thread(store.write_zip, recording_id, out)
    except BaseException:
        os.unlink(path)
        raise
    return FileResponse(
        path,
        media_type="application/zip",
        filename=f"{recording_id}.zip",
        headers=NO_CACHE,
        background=BackgroundTask(os.unlink, path),
    )


def create_recordings_router() -> APIRouter:
    """The routes; the store is the gateway's (``app.state.gateway.recorder.store``)."""
    router = APIRouter(dependencies=[Depends(require_admin)])

    @router.get("/v1/recordings")
    async def list_recordings(
        request: Request, limit: int = Query(100, ge=1, le=10_000)
    ) -> JSONResponse:
        recorder = request.app.state.gateway.recorder
        store: RecordingStore | None = recorder.store
        metas = await asyncio.to_thread(store.metas) if store else []
        body = {
            "enabled": store is not None,
            "total": len(metas),
            "recordings": metas[:limit],
            # this gateway's writer: recordings stored, media items dropped (it fell behind),
            # finished recordings the store has refused so far (retried every minute)
            "writer": {
                "written": recorder.written,
                "dropped": recorder.dropped,
                "unstored": recorder.unstored,
            },
        }
        return JSONResponse(body, headers=NO_CACHE)

    @router.get("/v1/recordings/{recording_id}.zip")
    async def recording_zip(request: Request, recording_id: str) -> FileResponse:
        return await _zip(_store(request), recording_id)

    @router.get("/v1/recordings/{recording_id}", response_model=None)
    async def recording(
        request: Request, recording_id: str, format: str = Query("json", pattern="^(json|zip)$")
    ) -> Response:
        store = _store(request)
        if format == "zip":
            return await _zip(store, recording_id)
        meta = await _meta(store, recording_id)
        names = await asyncio.to_thread(store.file_names, recording_id)
        files = [{"name": n, "url": f"/v1/recordings/{recording_id}/files/{n}"} for n in names]
        return JSONResponse({"id": recording_id, "meta": meta, "files": files}, headers=NO_CACHE)

    @router.get("/v1/recordings/{recording_id}/files/{name}")
    async def recording_file(request: Request, recording_id: str, name: str) -> Response:
        store = _store(request)
        try:
            check_file_name(name)
        except BadName:
            raise HTTPException(400, "invalid file name") from None
        try:
            data = await asyncio.to_thread(store.read, _id(recording_id), name)
        except FileNotFoundError:
            raise HTTPException(404, "no such file") from None
        media = MEDIA_TYPES.get(os.path.splitext(name)[1], "application/octet-stream")
        return Response(data, media_type=media, headers=NO_CACHE)

    @router.delete("/v1/recordings/{recording_id}")
    async def delete_recording(request: Request, recording_id: str) -> JSONResponse:
        store = _store(request)
        if not await asyncio.to_thread(store.remove, _id(recording_id)):
            raise HTTPException(404, "no such recording")
        return JSONResponse({"id": recording_id, "deleted": True})

    return router
