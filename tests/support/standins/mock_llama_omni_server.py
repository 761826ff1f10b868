"""A mock ``llama-omni-server``: the ``/backend`` WebSocket and ``POST /sessions/{id}/close``.

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

Run it: ``python -m tests.support.standins.mock_llama_omni_server --port 22500``.
"""

from __future__ import annotations

import argparse
import asyncio
import binascii
import contextlib
import json
import threading
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from tests.support.standins.mock_llama_omni_model import SPEECH, MockModel, Session, pcm_from_b64

__all__ = ["SPEECH", "MockLlamaOmniServer", "RunningServer", "main"]


class MockLlamaOmniServer(MockModel):
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
                    pcm_from_b64(voice[key])
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
