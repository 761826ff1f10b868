"""A mock ``llama-omni-server``: the ``/backend`` WebSocket protocol and
``POST /sessions/{id}/close``.

It follows the C++ server's observable behaviour (llama.cpp-omni ``tools/server``):

- the first frame must be ``session.init`` (``payload.mode`` ``turn_based`` | ``full_duplex``);
  a malformed one, or any connection while a session is active, is closed without a word;
- ``session.created`` carries ``session_id``, ``mode`` and ``metrics.kv_cache_length``;
- every ``input.append`` gets ``response_id = <session_id>_resp_<n>``; replies are
  ``response.output.delta`` (kind text / audio / listen) and ``response.done``; a full-duplex
  chunk ends with a ``listen`` delta (then ``response.done`` if it spoke) or ``response.done``;
- fatal errors send ``session.closed`` with the server's reason and close the socket
  (``unexpected_message_type``, ``invalid_input``, ``mode_mismatch``, ``missing_audio``,
  ``empty_messages``, ``voice_audio_decode_failed``, ``prefill_failed`` ...);
- ``POST /sessions/{id}/close`` sends ``session.closed`` (``client_closed``), closes the socket and
  answers ``{"ok": true, "session_id": ..., "closed": true}``; an unknown id gets 404.

Deterministic model: turns answer ``"echo: <last user text>"``; in duplex the "model" listens until
it has heard a loud chunk (RMS > 0.05) followed by a quiet one, then speaks ``SPEECH`` over
consecutive chunks, ending the turn with a listen.

Test knobs ride in ``session.init`` ``payload.config`` (the real server ignores unknown keys):
``mock_fail_at_chunk`` (send ``session.closed`` ``prefill_failed`` at that chunk),
``mock_silent_chunks`` (list of chunk numbers that get no reply at all),
``mock_late_audio`` (send the last audio of a turn after its listen),
``mock_init_delay_s`` (model "loading" time before ``session.created``),
``mock_kv_per_chunk`` (KV growth per chunk, default 12).

Run it: ``python -m tests.standins.mock_llama_omni_server --port 22500``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextlib
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

SPEECH = ["Hello", " there,", " how can I help?"]
OUT_RATE = 24_000


def _pcm(data: Any) -> np.ndarray:
    if not isinstance(data, str) or not data:
        raise ValueError("missing audio")
    raw = base64.b64decode(data, validate=True)
    if len(raw) % 4:
        raise ValueError("not float32 PCM")
    return np.frombuffer(raw, dtype="<f4")


def _b64(samples: np.ndarray) -> str:
    return base64.b64encode(np.asarray(samples, dtype="<f4").tobytes()).decode("ascii")


def _wave(seconds: float) -> np.ndarray:
    t = np.arange(int(OUT_RATE * seconds), dtype=np.float32) / OUT_RATE
    return (0.2 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


@dataclass
class Session:
    session_id: str
    mode: str
    ws: WebSocket
    config: dict[str, Any]
    kv: int = 0
    chunks: int = 0
    heard_voice: bool = False
    speech_index: int = -1
    closing: bool = False
    log: list[dict[str, Any]] = field(default_factory=list)


class MockLlamaOmniServer:
    def __init__(self) -> None:
        self.active: Session | None = None
        self.counter = 0
        self.lock = asyncio.Lock()
        self.history: list[dict[str, Any]] = []  # every frame received, for tests
        self.closed_sessions: list[tuple[str, str]] = []  # (session_id, reason)
        self.rejected = 0
        self.app = Starlette(
            routes=[
                WebSocketRoute("/backend", self.backend),
                Route("/sessions/{session_id}/close", self.http_close, methods=["POST"]),
                Route("/health", self.health, methods=["GET"]),
            ]
        )

    # -------------------------------------------------------------- helpers

    @staticmethod
    def metrics(session: Session, **extra: Any) -> dict[str, Any]:
        m: dict[str, Any] = {"backend": "mock-llama.cpp-omni"}
        if session.kv > 0:
            m["kv_cache_length"] = session.kv
        m.update({k: v for k, v in extra.items() if v})
        return m

    async def send(self, session: Session, event: dict[str, Any]) -> None:
        event.setdefault("session_id", session.session_id)
        event["server_send_ts"] = time.time()
        await session.ws.send_text(json.dumps(event))

    async def fail(self, session: Session, reason: str) -> None:
        with contextlib.suppress(Exception):
            await self.send(session, {"type": "session.closed", "reason": reason})
        self.closed_sessions.append((session.session_id, reason))
        with contextlib.suppress(Exception):
            await session.ws.close()
        if self.active is session:
            self.active = None

    # -------------------------------------------------------------- HTTP

    async def health(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "engine": "mock"})

    async def http_close(self, request: Request) -> JSONResponse:
        session_id = request.path_params["session_id"]
        session = self.active
        if session is None or session.session_id != session_id or session.closing:
            return JSONResponse(
                {"error": {"message": "session not found", "type": "not_found"}}, status_code=404
            )
        session.closing = True
        self.active = None
        self.closed_sessions.append((session_id, "client_closed"))
        with contextlib.suppress(Exception):
            await self.send(session, {"type": "session.closed", "reason": "client_closed"})
        with contextlib.suppress(Exception):
            await session.ws.close()
        return JSONResponse({"ok": True, "session_id": session_id, "closed": True})

    # -------------------------------------------------------------- WebSocket

    async def backend(self, ws: WebSocket) -> None:
        await ws.accept()
        try:
            raw = await ws.receive_text()
        except (WebSocketDisconnect, RuntimeError, KeyError):
            return
        try:
            msg = json.loads(raw)
        except ValueError:
            await ws.close()
            return
        self.history.append(msg)
        payload = msg.get("payload") if isinstance(msg, dict) else None
        mode = payload.get("mode", "full_duplex") if isinstance(payload, dict) else None
        if (
            msg.get("type") != "session.init"
            or not isinstance(payload, dict)
            or mode not in ("turn_based", "full_duplex")
        ):
            await ws.close()
            return
        async with self.lock:
            if self.active is not None:
                self.rejected += 1
                await ws.close()
                return
            self.counter += 1
            config = payload.get("config") if isinstance(payload.get("config"), dict) else {}
            session = Session(session_id=f"sess_{self.counter}", mode=mode, ws=ws, config=config)
            self.active = session
        voice = payload.get("voice") if isinstance(payload.get("voice"), dict) else {}
        for key, reason in (
            ("ref_audio_base64", "voice_audio_decode_failed"),
            ("tts_ref_audio_base64", "tts_voice_audio_decode_failed"),
        ):
            if voice.get(key):
                try:
                    _pcm(voice[key])
                except (ValueError, binascii.Error):
                    await self.fail(session, reason)
                    return
        delay = float(config.get("mock_init_delay_s") or 0)
        if delay:
            await asyncio.sleep(delay)
        if mode == "full_duplex":
            session.kv = (
                40 + len(str(payload.get("system_prompt") or "").split()) + (20 if voice else 0)
            )
        await self.send(
            session, {"type": "session.created", "mode": mode, "metrics": self.metrics(session)}
        )
        try:
            await self.loop(session)
        except (WebSocketDisconnect, RuntimeError):
            pass
        finally:
            if self.active is session:
                self.active = None
                self.closed_sessions.append((session.session_id, "client_disconnected"))
                with contextlib.suppress(Exception):
                    await self.send(
                        session, {"type": "session.closed", "reason": "client_disconnected"}
                    )

    async def loop(self, session: Session) -> None:
        seq = 0
        while True:
            raw = await session.ws.receive_text()
            if session.closing:
                return
            try:
                msg = json.loads(raw)
            except ValueError:
                await self.fail(session, "invalid_json")
                return
            self.history.append(msg)
            session.log.append(msg)
            if not isinstance(msg, dict) or msg.get("type") != "input.append":
                await self.fail(session, "unexpected_message_type")
                return
            data = msg.get("input")
            if not isinstance(data, dict):
                await self.fail(session, "invalid_input")
                return
            seq += 1
            rid = f"{session.session_id}_resp_{seq}"
            if session.mode == "turn_based":
                if not isinstance(data.get("messages"), list):
                    await self.fail(session, "mode_mismatch")
                    return
                if not await self.turn(session, rid, data):
                    return
            else:
                if "messages" in data:
                    await self.fail(session, "mode_mismatch")
                    return
                if not await self.chunk(session, rid, data):
                    return

    async def turn(self, session: Session, rid: str, data: dict[str, Any]) -> bool:
        messages = data["messages"]
        if not messages:
            await self.fail(session, "empty_messages")
            return False
        last = ""
        for m in messages:
            if isinstance(m, dict) and m.get("role") == "user":
                content = m.get("content")
                if isinstance(content, str):
                    last = content
                elif isinstance(content, list):
                    texts = [
                        p.get("text", "")
                        for p in content
                        if isinstance(p, dict) and p.get("type") == "text"
                    ]
                    last = "\n".join(t for t in texts if t) or last
                    for p in content:
                        if isinstance(p, dict) and p.get("type") == "audio":
                            try:
                                _pcm(p.get("data"))
                            except (ValueError, binascii.Error):
                                await self.fail(session, "invalid_input")
                                return False
        gen = data.get("generation") if isinstance(data.get("generation"), dict) else {}
        max_new = int(gen.get("max_new_tokens", 512))
        streaming = bool(data.get("streaming", True))
        tts = bool(data.get("use_tts_template")) or bool((data.get("tts") or {}).get("enabled"))
        words = f"echo: {last}".split()[:max_new]
        session.kv += 10 + len(last.split())
        prefill_ms = 5.0
        full_audio: list[np.ndarray] = []
        for i, word in enumerate(words):
            delta = word if i == 0 else " " + word
            session.kv += 1
            if streaming:
                await self.send(
                    session,
                    {
                        "type": "response.output.delta",
                        "kind": "text",
                        "response_id": rid,
                        "text": delta,
                        "metrics": self.metrics(session, prefill_ms=prefill_ms),
                    },
                )
        if tts:
            for _ in range(max(1, len(words) // 2)):
                wave = _wave(0.5)
                if streaming:
                    await self.send(
                        session,
                        {
                            "type": "response.output.delta",
                            "kind": "audio",
                            "response_id": rid,
                            "audio": _b64(wave),
                            "metrics": self.metrics(session),
                        },
                    )
                else:
                    full_audio.append(wave)
        await self.send(
            session,
            {
                "type": "response.done",
                "response_id": rid,
                "text": " ".join(words),
                "reason": "turn_end",
                "audio": _b64(np.concatenate(full_audio)) if full_audio else None,
                "metrics": self.metrics(
                    session, prefill_ms=prefill_ms, generate_ms=3.0, n_tokens=len(words)
                ),
            },
        )
        return True

    async def chunk(self, session: Session, rid: str, data: dict[str, Any]) -> bool:
        try:
            audio = _pcm(data.get("audio"))
        except (ValueError, binascii.Error):
            await self.fail(session, "missing_audio" if not data.get("audio") else "invalid_input")
            return False
        session.chunks += 1
        n = session.chunks
        cfg = session.config
        if cfg.get("mock_fail_at_chunk") == n:
            await self.fail(session, "prefill_failed")
            return False
        frames = data.get("video_frames") or []
        session.kv += int(cfg.get("mock_kv_per_chunk", 12)) + 66 * len(frames)
        if n in (cfg.get("mock_silent_chunks") or []):
            return True

        def metrics(**kw):
            return self.metrics(session, prefill_ms=4.0, vision_slices=len(frames) and 1, **kw)

        if data.get("force_listen"):
            session.speech_index = -1
            await self.send(
                session,
                {
                    "type": "response.output.delta",
                    "kind": "listen",
                    "response_id": rid,
                    "metrics": metrics(),
                },
            )
            return True
        rms = float(np.sqrt(np.mean(audio.astype(np.float64) ** 2))) if audio.size else 0.0
        if session.speech_index < 0:
            if rms > 0.05:
                session.heard_voice = True
            elif session.heard_voice:
                session.heard_voice = False
                session.speech_index = 0
        if session.speech_index < 0:
            session.kv += 1
            await self.send(
                session,
                {
                    "type": "response.output.delta",
                    "kind": "listen",
                    "response_id": rid,
                    "metrics": metrics(generate_ms=1.0),
                },
            )
            return True
        text = SPEECH[session.speech_index]
        session.speech_index += 1
        end = session.speech_index >= len(SPEECH)
        session.kv += len(text.split()) + 2
        await self.send(
            session,
            {
                "type": "response.output.delta",
                "kind": "text",
                "response_id": rid,
                "text": text,
                "metrics": metrics(generate_ms=2.0),
            },
        )
        late = end and bool(cfg.get("mock_late_audio"))
        if not late:
            await self.send(
                session,
                {
                    "type": "response.output.delta",
                    "kind": "audio",
                    "response_id": rid,
                    "audio": _b64(_wave(0.6 if end else 1.0)),
                    "metrics": metrics(),
                },
            )
        if end:
            session.speech_index = -1
            await self.send(
                session,
                {
                    "type": "response.output.delta",
                    "kind": "listen",
                    "response_id": rid,
                    "metrics": metrics(generate_ms=2.0),
                },
            )
            if late:  # TTS finishing after the LLM switched to listen, as the real server can
                await self.send(
                    session,
                    {
                        "type": "response.output.delta",
                        "kind": "audio",
                        "response_id": rid,
                        "audio": _b64(_wave(0.6)),
                        "metrics": metrics(),
                    },
                )
        await self.send(
            session,
            {
                "type": "response.done",
                "response_id": rid,
                "text": text,
                "reason": "turn_end",
                "audio": None,
                "metrics": metrics(generate_ms=2.0),
            },
        )
        return True


class RunningServer:
    """The mock served by uvicorn on a background thread (for tests)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        import socket

        import uvicorn

        self.mock = MockLlamaOmniServer()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        self.host, self.port = sock.getsockname()[:2]
        self._sock = sock
        config = uvicorn.Config(
            self.mock.app, log_level="warning", ws="websockets-sansio", lifespan="off"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> RunningServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("mock llama-omni-server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self._sock.close()


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(
        description="mock llama-omni-server (/backend WebSocket protocol)"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=22500)
    args = parser.parse_args(argv)
    mock = MockLlamaOmniServer()
    uvicorn.run(
        mock.app,
        host=args.host,
        port=args.port,
        log_level="warning",
        lifespan="off",
        ws="websockets-sansio",
    )


if __name__ == "__main__":
    main()
