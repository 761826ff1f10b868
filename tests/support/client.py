"""A small async test client of the Realtime API (real WebSockets)."""

from __future__ import annotations

import asyncio
import base64
import io
from typing import Any

import numpy as np
import orjson
import websockets
from websockets.exceptions import ConnectionClosed

from omnicore.audio import b64_to_pcm, pcm_to_b64


def pcm_b64(samples: np.ndarray) -> str:
    return pcm_to_b64(samples)


def silence(seconds: float = 1.0) -> str:
    return pcm_b64(np.zeros(int(16000 * seconds), dtype=np.float32))


def speech(seconds: float = 1.0, level: float = 0.2) -> str:
    """A loud tone: the scripted backend hears it as speech."""
    t = np.arange(int(16000 * seconds)) / 16000
    return pcm_b64((level * np.sin(2 * np.pi * 220 * t)).astype(np.float32))


def jpeg_b64(color: tuple[int, int, int] = (200, 30, 30)) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (64, 48), color).save(buf, format="JPEG")
    return base64.b64encode(buf.getvalue()).decode()


def decode_audio(b64: str) -> np.ndarray:
    return b64_to_pcm(b64)


class Client:
    """One WebSocket connection with helpers to send events and wait for frames."""

    def __init__(self, ws: websockets.ClientConnection) -> None:
        self.ws = ws
        self.received: list[dict[str, Any]] = []
        self.inputs = 0  # input chunks sent through ``step``

    @classmethod
    async def connect(
        cls, url: str, path: str = "/v1/realtime", query: str = "", **kwargs: Any
    ) -> Client:
        ws = await websockets.connect(f"{url}{path}{query}", max_size=None, **kwargs)
        return cls(ws)

    @classmethod
    async def resume(
        cls, url: str, session_id: str, token: str, last_seq: int, mode: str = "audio"
    ) -> Client:
        """A new connection whose first event is ``session.resume`` (docs/PROTOCOL.md)."""
        client = await cls.connect(url, query=f"?mode={mode}")
        await client.send(
            {
                "type": "session.resume",
                "session_id": session_id,
                "resume_token": token,
                "last_seq": last_seq,
            }
        )
        return client

    async def send(self, event: dict[str, Any] | str) -> None:
        await self.ws.send(event if isinstance(event, str) else orjson.dumps(event).decode())

    async def recv(self, timeout: float = 15.0) -> dict[str, Any]:
        raw = await asyncio.wait_for(self.ws.recv(), timeout)
        ev = orjson.loads(raw)
        self.received.append(ev)
        return ev

    async def until(self, *types: str, timeout: float = 15.0) -> dict[str, Any]:
        """Receive until a frame of one of ``types`` arrives; returns it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            ev = await self.recv(max(0.01, deadline - loop.time()))
            if ev["type"] in types:
                return ev

    async def collect_until(self, *types: str, timeout: float = 15.0) -> list[dict[str, Any]]:
        """All frames up to and including the first of ``types``."""
        start = len(self.received)
        await self.until(*types, timeout=timeout)
        return self.received[start:]

    async def closed(self, timeout: float = 15.0) -> int | None:
        """Drain until the server closes; returns the close code."""
        try:
            while True:
                await self.recv(timeout)
        except ConnectionClosed as exc:
            return exc.rcvd.code if exc.rcvd else None

    async def step(
        self, audio: str, dialect: str = "current", timeout: float = 15.0, **fields: Any
    ) -> list[dict[str, Any]]:
        """Send one duplex input chunk and wait for the worker's answer to it.

        Returns the frames received up to that answer: the first delta naming this chunk's
        ``input_id`` (older dialect: the next ``response.listen`` / ``response.output_audio.delta``,
        one per step), or an ``error`` / ``session.closed``. Pacing input this way keeps at most
        one chunk pending, so the silent drop never removes one and the output is the same on
        a loaded machine as on an idle one.
        """
        self.inputs += 1
        if dialect == "current":
            await self.send({"type": "input.append", "input": {"audio": audio, **fields}})
        else:
            await self.send({"type": "input_audio_buffer.append", "audio": audio, **fields})
        input_id = f"input_{self.inputs}"
        start = len(self.received)
        while True:
            ev = await self.until(
                "response.output.delta",
                "response.listen",
                "response.output_audio.delta",
                "error",
                "session.closed",
                timeout=timeout,
            )
            if ev["type"] != "response.output.delta" or ev.get("input_id") == input_id:
                return self.received[start:]

    async def init(self, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        await self.until("session.queue_done", timeout=30)
        await self.send({"type": "session.init", "payload": payload or {}})
        return await self.until("session.created")

    async def close(self) -> None:
        await self.ws.close()
