"""``omniserve probe``: a small command-line client of the Realtime API."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import websockets
from websockets.exceptions import (
    ConnectionClosed,
    InvalidHandshake,
    InvalidStatus,
    InvalidURI,
    WebSocketException,
)

from api.protocol.events import ClientEvent, DeltaKind, ServerEvent
from omnicore.audio import b64_to_pcm, pcm_to_b64, read_audio, resample, wav_bytes

RECV_TIMEOUT_S = 120.0
QUEUE_TIMEOUT_S = 600.0

# what a probe can fail with that is the service's answer or the operator's input, not a bug:
# told in one line (``explain``), not as a traceback
FAILURES = (OSError, WebSocketException)


class GatewayRefused(Exception):
    """The gateway sent an ``error`` instead of serving (its code and message)."""


def ws_url(url: str) -> str:
    """The gateway's WebSocket base URL: ``http(s)://`` (as ``up`` prints it) taken as
    ``ws(s)://``, without a trailing slash."""
    for http, ws in (("http://", "ws://"), ("https://", "wss://")):
        if url.startswith(http):
            url = ws + url[len(http) :]
    return url.rstrip("/")


def explain(url: str, exc: BaseException) -> str:
    """One line for a failed probe (``FAILURES`` or ``GatewayRefused``)."""
    if isinstance(exc, FileNotFoundError):
        return f"{exc.filename}: no such file"
    if isinstance(exc, ConnectionRefusedError):
        return f"nothing answers at {url}: is the gateway running there (omniserve up)?"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host of {url}"
    if isinstance(exc, TimeoutError):
        return f"no answer from {url} in time"
    if isinstance(exc, OSError):
        return f"cannot reach {url}: {exc.strerror or exc}"
    if isinstance(exc, InvalidURI):
        return f"{url} is not a gateway URL: use ws://host:port (wss:// behind TLS)"
    if isinstance(exc, InvalidStatus):
        status = exc.response.status_code
        hint = " (send a key with --api-key)" if status in (401, 403) else ""
        return f"the gateway at {url} refused the connection: HTTP {status}{hint}"
    if isinstance(exc, InvalidHandshake):  # something else listens there
        return f"what answers at {url} is not a gateway: {exc}"
    if isinstance(exc, ConnectionClosed) and exc.rcvd is not None:
        return f"the gateway closed the connection: {exc.rcvd.code} {exc.rcvd.reason}".rstrip()
    return str(exc) or type(exc).__name__


async def _recv(ws: websockets.ClientConnection) -> dict[str, Any]:
    async with asyncio.timeout(RECV_TIMEOUT_S):
        frame: dict[str, Any] = orjson.loads(await ws.recv())
    return frame


async def _wait_queue(ws: websockets.ClientConnection) -> None:
    while True:
        async with asyncio.timeout(QUEUE_TIMEOUT_S):
            ev = orjson.loads(await ws.recv())
        kind = ev["type"]
        if kind in (ServerEvent.SESSION_QUEUED, ServerEvent.SESSION_QUEUE_UPDATE):
            print(
                f"[queued: position {ev['position']}, ~{ev['estimated_wait_s']} s]", file=sys.stderr
            )
        elif kind == ServerEvent.SESSION_QUEUE_DONE:
            return
        elif kind == ServerEvent.ERROR:
            raise GatewayRefused(f"{ev['error']['code']}: {ev['error']['message']}")


def _headers(api_key: str | None) -> dict[str, str]:
    """The key as the SDK sends it (a header: it stays out of URLs and access logs)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def chat(url: str, text: str, tts_out: str | None = None, api_key: str | None = None) -> int:
    """Send one chat turn and print the streamed answer."""
    async with websockets.connect(
        f"{url}/v1/realtime?mode=chat", max_size=None, additional_headers=_headers(api_key)
    ) as ws:
        await _wait_queue(ws)
        await ws.send(orjson.dumps({"type": ClientEvent.SESSION_INIT, "payload": {}}).decode())
        created = await _recv(ws)
        if created["type"] != ServerEvent.SESSION_CREATED:
            print(created, file=sys.stderr)
            return 1
        await ws.send(
            orjson.dumps(
                {
                    "type": ClientEvent.INPUT_APPEND,
                    "input": {
                        "messages": [{"role": "user", "content": text}],
                        "streaming": True,
                        "tts": {"enabled": bool(tts_out)},
                    },
                }
            ).decode()
        )
        audio: list[np.ndarray] = []
        while True:
            ev = await _recv(ws)
            if ev["type"] in (
                ServerEvent.RESPONSE_QUEUED,
                ServerEvent.RESPONSE_QUEUE_UPDATE,
            ):  # the turn waits
                print(
                    f"[queued: position {ev['position']}, ~{ev['estimated_wait_s']} s]",
                    file=sys.stderr,
                )
            elif ev["type"] == ServerEvent.RESPONSE_OUTPUT_DELTA and ev["kind"] == DeltaKind.TEXT:
                print(ev["text"], end="", flush=True)
            elif ev["type"] == ServerEvent.RESPONSE_OUTPUT_DELTA and ev["kind"] == DeltaKind.AUDIO:
                audio.append(b64_to_pcm(ev["audio"]))
            elif ev["type"] == ServerEvent.RESPONSE_DONE:
                print()
                break
            elif ev["type"] == ServerEvent.ERROR:
                print(f"\nerror: {ev['error']}", file=sys.stderr)
                return 1
        await ws.send(
            orjson.dumps({"type": ClientEvent.SESSION_CLOSE, "reason": "user_stop"}).decode()
        )
    if tts_out and audio:
        await asyncio.to_thread(Path(tts_out).write_bytes, wav_bytes(np.concatenate(audio), 24_000))
        print(f"speech written to {tts_out}", file=sys.stderr)
    return 0


async def audio(
    url: str,
    wav_in: str,
    wav_out: str,
    mode: str = "audio",
    realtime: bool = True,
    tail_s: float = 8.0,
    api_key: str | None = None,
) -> int:
    """Play a WAV file into a duplex session (1 s chunks), then silence; save the spoken reply."""
    samples, rate = read_audio(await asyncio.to_thread(Path(wav_in).read_bytes))
    pcm = resample(samples, rate, 16_000)
    chunks = [pcm[i : i + 16_000] for i in range(0, pcm.size, 16_000)]
    chunks = [np.pad(c, (0, 16_000 - c.size)) for c in chunks]
    chunks += [np.zeros(16_000, dtype=np.float32)] * int(tail_s)
    out: list[np.ndarray] = []
    text: list[str] = []
    async with websockets.connect(
        f"{url}/v1/realtime?mode={mode}", max_size=None, additional_headers=_headers(api_key)
    ) as ws:
        await _wait_queue(ws)
        await ws.send(
            orjson.dumps(
                {
                    "type": ClientEvent.SESSION_INIT,
                    "payload": {"system_prompt": "You are a helpful assistant."},
                }
            ).decode()
        )
        created = await _recv(ws)
        if created["type"] != ServerEvent.SESSION_CREATED:
            print(created, file=sys.stderr)
            return 1

        async def reader() -> None:
            async for raw in ws:
                ev = orjson.loads(raw)
                if ev["type"] == ServerEvent.RESPONSE_OUTPUT_DELTA:
                    if ev["kind"] == DeltaKind.TEXT:
                        text.append(ev["text"])
                        print(ev["text"], end="", flush=True)
                    elif ev["kind"] == DeltaKind.AUDIO:
                        out.append(b64_to_pcm(ev["audio"]))
                elif ev["type"] == ServerEvent.ERROR:
                    print(f"\nerror: {ev['error']}", file=sys.stderr)
                elif ev["type"] == ServerEvent.SESSION_CLOSED:
                    return

        task = asyncio.create_task(reader())
        t0 = time.monotonic()
        for i, chunk in enumerate(chunks):
            if realtime:
                await asyncio.sleep(max(0.0, t0 + i - time.monotonic()))
            await ws.send(
                orjson.dumps(
                    {
                        "type": ClientEvent.INPUT_APPEND,
                        "input": {"audio": pcm_to_b64(chunk)},
                    }
                ).decode()
            )
        await asyncio.sleep(1.0)
        await ws.send(
            orjson.dumps({"type": ClientEvent.SESSION_CLOSE, "reason": "user_stop"}).decode()
        )
        try:
            await asyncio.wait_for(task, 30)
        except TimeoutError:
            task.cancel()
    print()
    reply = np.concatenate(out) if out else np.zeros(0, dtype=np.float32)
    await asyncio.to_thread(Path(wav_out).write_bytes, wav_bytes(reply, 24_000))
    print(f"{reply.size / 24_000:.1f} s of speech written to {wav_out}", file=sys.stderr)
    return 0
