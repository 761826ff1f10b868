"""Optional recordings of chat turns (request and answer as JSON) for later inspection."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


async def record_turn(
    directory: str | None, recording_id: str, request: dict[str, Any], answer: dict[str, Any]
) -> Path | None:
    """Write ``<directory>/<recording_id>.json`` when recordings are enabled."""
    if not directory:
        return None
    path = Path(directory) / f"{recording_id}.json"
    data = orjson.dumps({"id": recording_id, "request": request, "answer": answer})
    await asyncio.to_thread(_write, path, data)
    return path
