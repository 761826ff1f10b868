"""The ``llama_omni`` backend: a client of the C++ ``llama-omni-server`` (llama.cpp-omni).

Protocol (the server's ``/backend`` WebSocket and HTTP close):

- connect ``ws://host:port/backend``; the first frame is ``session.init`` with ``payload.mode``
  ``turn_based`` or ``full_duplex``, ``use_tts``, ``system_prompt``, ``voice.ref_audio_base64`` /
  ``voice.tts_ref_audio_base64`` (float32 PCM, 16 kHz) and an opaque ``config`` (sampling knobs).
  The server answers ``session.created`` (session_id, mode, metrics.kv_cache_length) once its model
  is ready - its port opens before the weights are loaded, so readiness is this event, not
  ``/health``. It holds one session at a time: a second connection is closed without a word.
- each ``input.append`` is one turn (``messages``) or one ~1 s duplex chunk (``audio``,
  ``video_frames``, ``force_listen``, ``max_slice_nums``); replies are ``response.output.delta``
  with ``kind`` text / audio / listen and ``response.done``; metrics carry ``kv_cache_length``.
- any protocol or inference failure is reported as ``session.closed`` with a reason and the socket
  is closed: the session is over (``LlamaOmniSessionClosed``, a ``BackendError``).
- ``POST /sessions/{id}/close`` stops inference and frees the server for the next session.

This module uses the synchronous ``websockets`` client: the Backend interface is called from a
worker thread. Pushes are paced on replies: one chunk is in flight at a time.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from inference.base import (
    MAX_CONTEXT_TOKENS,
    AudioPart,
    Backend,
    BackendError,
    ChatDelta,
    ChatDone,
    ChatEvent,
    ChatPrefilled,
    ChatRequest,
    DuplexConfig,
    DuplexInput,
    DuplexSession,
    DuplexStep,
    ImagePart,
    InferenceError,
    TextPart,
    UnsupportedInput,
    VideoPart,
)

log = logging.getLogger("omniserve.inference.llama_omni")

#: server close reasons -> (kind, explanation). kind is "input" (the request was bad),
#: "inference" (the server failed), or "closed" (closed on request / disconnect).
CLOSE_REASONS: dict[str, tuple[str, str]] = {
    "invalid_json": ("input", "the server could not parse a frame"),
    "unexpected_message_type": ("input", "a frame other than input.append after session.init"),
    "invalid_input": ("input", "input.append failed validation"),
    "mode_mismatch": ("input", "input shape does not match the session mode"),
    "empty_messages": ("input", "turn without messages"),
    "missing_audio": ("input", "duplex chunk without audio"),
    "voice_audio_decode_failed": ("input", "the reference voice could not be decoded"),
    "tts_voice_audio_decode_failed": ("input", "the TTS reference voice could not be decoded"),
    "video_decode_failed": ("input", "a video could not be decoded"),
    "omni_init_failed": ("inference", "the server could not initialise its model"),
    "tts_voice_prepare_failed": ("inference", "the TTS voice could not be prepared"),
    "voice_prefill_failed": ("inference", "prefill of the system prompt and voice failed"),
    "system_prefill_failed": ("inference", "prefill of the system prompt failed"),
    "activate_failed": ("inference", "the server could not activate the session"),
    "prefill_failed": ("inference", "prefill failed"),
    "video_frame_prefill_failed": ("inference", "prefill of a video frame failed"),
    "client_closed": ("closed", "closed through POST /sessions/{id}/close"),
    "client_disconnected": ("closed", "the connection was closed"),
}


class LlamaOmniSessionClosed(BackendError):
    """The server ended the session (``session.closed``) or dropped the connection."""

    def __init__(
        self, reason: str, message: str | None = None, diagnostic: str | None = None
    ) -> None:
        kind, explanation = CLOSE_REASONS.get(reason, ("inference", "the server ended the session"))
        text = message or f"llama-omni-server closed the session: {reason} ({explanation})"
        if diagnostic:
            text += f": {diagnostic}"
        super().__init__(text)
        self.reason = reason
        self.kind = kind


def _pcm_b64(samples: np.ndarray) -> str:
    arr = np.asarray(samples, dtype="<f4").reshape(-1)
    if not np.all(np.isfinite(arr)):
        raise UnsupportedInput("audio contains non-finite samples", "audio")
    return base64.b64encode(arr.tobytes()).decode("ascii")


def _b64_pcm(data: Any) -> np.ndarray | None:
    if not data or not isinstance(data, str):
        return None
    if "," in data[:64] and "base64" in data[:64]:
        data = data.split(",", 1)[1]
    raw = base64.b64decode(data)
    if len(raw) % 4:
        raise InferenceError("llama-omni-server sent audio that is not float32 PCM")
    return np.frombuffer(raw, dtype="<f4").astype(np.float32)


def _metrics_kv(event: dict[str, Any]) -> int | None:
    metrics = event.get("metrics")
    if isinstance(metrics, dict) and isinstance(metrics.get("kv_cache_length"), (int, float)):
        return int(metrics["kv_cache_length"])
    return None


class _Connection:
    """One ``/backend`` WebSocket session (sync)."""

    def __init__(self, backend: LlamaOmniBackend) -> None:
        self.backend = backend
        self.ws: Any = None
        self.session_id: str | None = None
        self.kv = 0
        self.closed = False
        self.close_error: LlamaOmniSessionClosed | None = None

    def open(self, payload: dict[str, Any]) -> dict[str, Any]:
        from websockets.exceptions import ConnectionClosed, InvalidHandshake
        from websockets.sync.client import connect

        b = self.backend
        try:
            self.ws = connect(
                b.ws_url,
                open_timeout=b.connect_timeout_s,
                close_timeout=b.close_timeout_s,
                max_size=None,
                ping_interval=None,
                compression=None,
            )
            # used as a context manager from here to close(): websockets >= 17.1 warns otherwise
            self.ws = self.ws.__enter__()
        except (OSError, InvalidHandshake, TimeoutError) as exc:
            raise BackendError(f"cannot connect to llama-omni-server at {b.ws_url}: {exc}") from exc
        try:
            self.ws.send(json.dumps({"type": "session.init", "payload": payload}))
        except ConnectionClosed as exc:
            raise BackendError(
                "llama-omni-server closed the connection during session.init"
            ) from exc
        event = self.recv(b.init_timeout_s, waiting_for="session.created")
        if event.get("type") != "session.created":
            self.abort()
            raise BackendError(
                f"expected session.created from llama-omni-server, got {event.get('type')!r}"
            )
        self.session_id = str(event.get("session_id") or "")
        self.kv = _metrics_kv(event) or 0
        log.info(
            "llama-omni session %s created (mode=%s, kv=%d)",
            self.session_id,
            event.get("mode"),
            self.kv,
        )
        return event

    def send(self, message: dict[str, Any]) -> None:
        from websockets.exceptions import ConnectionClosed

        if self.closed:
            raise self.close_error or BackendError("llama-omni session is closed")
        try:
            self.ws.send(json.dumps(message))
        except ConnectionClosed as exc:
            self._closed_by_server(None)
            raise self.close_error from exc  # type: ignore[misc]

    def _closed_by_server(self, event: dict[str, Any] | None) -> None:
        self.closed = True
        if event is None:
            if self.session_id is None:
                err = LlamaOmniSessionClosed(
                    "rejected",
                    "llama-omni-server closed the connection before session.created "
                    "(a session is already active on it, or session.init was refused)",
                )
            else:
                err = LlamaOmniSessionClosed(
                    "connection_lost", "the connection to llama-omni-server was lost"
                )
        else:
            diag = event.get("diagnostic")
            diag_text = diag.get("message") if isinstance(diag, dict) else None
            err = LlamaOmniSessionClosed(
                str(event.get("reason") or "unknown"), diagnostic=diag_text
            )
        self.close_error = err
        try:
            self.ws.close()
        except Exception:  # noqa: BLE001
            pass

    def recv(self, timeout: float, waiting_for: str = "a reply") -> dict[str, Any]:
        """Next event; raises on session.closed / disconnect, TimeoutError on timeout."""
        from websockets.exceptions import ConnectionClosed

        if self.closed:
            raise self.close_error or BackendError("llama-omni session is closed")
        try:
            raw = self.ws.recv(timeout=max(0.0, timeout))
        except TimeoutError:
            raise TimeoutError(
                f"no {waiting_for} from llama-omni-server within {timeout:.1f} s"
            ) from None
        except ConnectionClosed as exc:
            self._closed_by_server(None)
            raise self.close_error from exc  # type: ignore[misc]
        try:
            event = json.loads(raw)
        except (TypeError, ValueError) as exc:
            self.abort()
            raise BackendError(f"llama-omni-server sent a frame that is not JSON: {exc}") from exc
        if not isinstance(event, dict):
            raise BackendError("llama-omni-server sent a frame that is not a JSON object")
        kv = _metrics_kv(event)
        if kv is not None:
            self.kv = kv
        if event.get("type") == "session.closed":
            self._closed_by_server(event)
            raise self.close_error  # type: ignore[misc]
        if event.get("type") == "error":
            err = event.get("error") if isinstance(event.get("error"), dict) else {}
            raise InferenceError(f"llama-omni-server error: {err.get('message') or event}")
        return event

    def abort(self) -> None:
        self.closed = True
        if self.ws is not None:
            try:
                self.ws.close()
            except Exception:  # noqa: BLE001
                pass

    def close(self) -> None:
        """Close the server session (HTTP close first: it returns once inference has stopped)."""
        if self.session_id and not (
            self.close_error and self.close_error.reason != "client_closed"
        ):
            self.backend._http_close(self.session_id)
        self.abort()


class LlamaOmniBackend(Backend):
    """Client of one ``llama-omni-server`` process (one session at a time)."""

    name = "llama_omni"
    max_concurrency = 1

    def __init__(
        self,
        backend_url: str = "http://127.0.0.1:22500",
        connect_timeout_s: float = 10.0,
        init_timeout_s: float = 300.0,
        step_timeout_s: float = 30.0,
        turn_timeout_s: float = 300.0,
        close_timeout_s: float = 10.0,
        use_tts: bool = True,
        max_context_tokens: int = MAX_CONTEXT_TOKENS,
        step_token_reserve: int = 64,
        vision_tokens_per_slice: int = 66,
    ) -> None:
        parts = urlsplit(backend_url if "://" in backend_url else f"http://{backend_url}")
        if parts.scheme not in ("http", "https", "ws", "wss") or not parts.netloc:
            raise ValueError(f"backend_url must be http(s)://host:port, got {backend_url!r}")
        http_scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
        ws_scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
        base_path = parts.path.rstrip("/")
        if base_path.endswith("/backend"):
            base_path = base_path[: -len("/backend")]
        self.http_url = urlunsplit((http_scheme, parts.netloc, base_path, "", ""))
        self.ws_url = urlunsplit((ws_scheme, parts.netloc, base_path + "/backend", "", ""))
        self.connect_timeout_s = float(connect_timeout_s)
        self.init_timeout_s = float(init_timeout_s)
        self.step_timeout_s = float(step_timeout_s)
        self.turn_timeout_s = float(turn_timeout_s)
        self.close_timeout_s = float(close_timeout_s)
        self.use_tts = bool(use_tts)
        self.max_context_tokens = int(max_context_tokens)
        self.step_token_reserve = int(step_token_reserve)
        self.vision_tokens_per_slice = int(vision_tokens_per_slice)
        self._lock = threading.Lock()
        self._active: LlamaOmniDuplexSession | None = None
        self._busy = False

    def info(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "backend_url": self.http_url,
            "ws_url": self.ws_url,
            "use_tts": self.use_tts,
            "max_context_tokens": self.max_context_tokens,
            "duplex_active": self._active is not None,
        }

    def _http_close(self, session_id: str) -> bool:
        url = f"{self.http_url}/sessions/{session_id}/close"
        req = urllib.request.Request(
            url, data=b"{}", method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.close_timeout_s) as resp:
                resp.read()
            return True
        except urllib.error.HTTPError as exc:
            if exc.code != 404:  # 404: the session is already gone
                log.warning("POST %s -> HTTP %s", url, exc.code)
            return False
        except (OSError, urllib.error.URLError) as exc:
            log.warning("POST %s failed: %s", url, exc)
            return False

    def _claim(self) -> None:
        with self._lock:
            if self._busy:
                raise InferenceError("llama-omni-server is serving another session")
            self._busy = True

    def _release(self) -> None:
        with self._lock:
            self._busy = False

    # ------------------------------------------------------------------ chat

    def _content(self, parts: list[Any], index: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for part in parts:
            if isinstance(part, TextPart):
                out.append({"type": "text", "text": part.text})
            elif isinstance(part, ImagePart):
                out.append({"type": "image", "data": base64.b64encode(part.data).decode("ascii")})
            elif isinstance(part, AudioPart):
                out.append({"type": "audio", "data": _pcm_b64(part.samples)})
            elif isinstance(part, VideoPart):
                raise UnsupportedInput(
                    "video input is not supported by the llama_omni backend (its server takes MP4 containers)",
                    f"messages[{index}].content",
                )
            else:
                raise UnsupportedInput(
                    f"unsupported content part {type(part).__name__}", f"messages[{index}].content"
                )
        return out

    def chat(self, request: ChatRequest) -> Iterator[ChatEvent]:
        if not request.messages:
            raise UnsupportedInput("messages must not be empty", "messages")
        messages = [
            {"role": m.role, "content": self._content(m.content, i)}
            for i, m in enumerate(request.messages)
        ]
        system_prompt = "\n".join(
            m.text() for m in request.messages if m.role == "system" and m.text()
        )
        gen = request.generation
        voice: dict[str, Any] = {}
        tts_ref = None
        if request.tts.ref_audio is not None and np.asarray(request.tts.ref_audio).size:
            tts_ref = _pcm_b64(request.tts.ref_audio)
            voice["tts_ref_audio_base64"] = tts_ref
        init = {
            "mode": "turn_based",
            "use_tts": self.use_tts,
            "system_prompt": system_prompt,
            "config": {
                "temperature": gen.temperature,
                "top_p": gen.top_p,
                "length_penalty": gen.length_penalty,
            },
        }
        if voice:
            init["voice"] = voice
        turn: dict[str, Any] = {
            "messages": messages,
            "streaming": bool(request.streaming),
            "generation": {
                "max_new_tokens": gen.max_new_tokens,
                "length_penalty": gen.length_penalty,
            },
            "omni_mode": bool(request.omni_mode),
            "use_tts_template": bool(request.use_tts_template),
            "enable_thinking": bool(request.enable_thinking),
            "tts": {"enabled": bool(request.tts.enabled)},
        }
        if tts_ref:
            turn["tts"]["ref_audio_data"] = tts_ref
        if request.max_slice_nums is not None:
            turn["image"] = {"max_slice_nums": int(request.max_slice_nums)}

        self._claim()
        conn = _Connection(self)
        try:
            t0 = time.monotonic()
            conn.open(init)
            conn.send({"type": "input.append", "input": turn})
            deadline = time.monotonic() + self.turn_timeout_s
            texts: list[str] = []
            audio: list[np.ndarray] = []
            prefilled = False
            first_delta_s = None
            while True:
                try:
                    event = conn.recv(deadline - time.monotonic(), waiting_for="response.done")
                except TimeoutError as exc:
                    raise InferenceError(str(exc)) from exc
                etype = event.get("type")
                if not prefilled and etype in ("response.output.delta", "response.done"):
                    prefilled = True
                    metrics = event.get("metrics") or {}
                    n_tok = int(metrics.get("n_tokens") or 0) if etype == "response.done" else 0
                    yield ChatPrefilled(input_tokens=max(0, conn.kv - n_tok))
                if etype == "response.output.delta":
                    kind = event.get("kind")
                    if kind == "text" and event.get("text"):
                        texts.append(str(event["text"]))
                        first_delta_s = first_delta_s or time.monotonic() - t0
                        yield ChatDelta(text=str(event["text"]))
                    elif kind == "audio":
                        wave = _b64_pcm(event.get("audio"))
                        if wave is not None and wave.size:
                            audio.append(wave)
                            first_delta_s = first_delta_s or time.monotonic() - t0
                            yield ChatDelta(audio=wave)
                elif etype == "response.done":
                    metrics = event.get("metrics") or {}
                    generated = int(metrics.get("n_tokens") or 0)
                    final_audio = _b64_pcm(event.get("audio"))
                    if final_audio is None and audio:
                        final_audio = np.concatenate(audio)
                    text = (
                        event.get("text") if isinstance(event.get("text"), str) else "".join(texts)
                    )
                    yield ChatDone(
                        text=text or "".join(texts),
                        input_tokens=max(0, conn.kv - generated),
                        generated_tokens=generated,
                        audio=final_audio if final_audio is not None and final_audio.size else None,
                        metrics={
                            "prefill_s": round(float(metrics.get("prefill_ms") or 0) / 1000, 4),
                            "generate_s": round(float(metrics.get("generate_ms") or 0) / 1000, 4),
                            "total_s": round(time.monotonic() - t0, 4),
                            "first_delta_s": None
                            if first_delta_s is None
                            else round(first_delta_s, 4),
                            "kv_cache_length": conn.kv,
                        },
                    )
                    return
        finally:
            conn.close()
            self._release()

    # ------------------------------------------------------------------ duplex

    def open_duplex(self) -> LlamaOmniDuplexSession:
        self._claim()
        session = LlamaOmniDuplexSession(self)
        self._active = session
        return session

    def _duplex_closed(self, session: LlamaOmniDuplexSession) -> None:
        with self._lock:
            if self._active is session:
                self._active = None
                self._busy = False

    def close(self) -> None:
        if self._active is not None:
            self._active.close()


_RESP_ID = re.compile(r"^(?P<sid>.+)_resp_(?P<n>\d+)$")


class LlamaOmniDuplexSession(DuplexSession):
    """A ``full_duplex`` session on the server; one ``input.append`` in flight at a time."""

    def __init__(self, backend: LlamaOmniBackend) -> None:
        self._backend = backend
        self._conn: _Connection | None = None
        self._pushes = 0
        self._terminated: set[str] = set()
        self._interrupt = False
        self._closed = False
        self._context_full = False

    def prepare(self, config: DuplexConfig) -> int:
        if self._closed:
            raise BackendError("duplex session is closed")
        if self._conn is not None:
            raise BackendError("duplex session is already prepared")
        payload: dict[str, Any] = {
            "mode": "full_duplex",
            "use_tts": self._backend.use_tts,
            "system_prompt": config.system_prompt or "",
            "config": dict(config.config or {}),
        }
        voice: dict[str, str] = {}
        if config.ref_audio is not None and np.asarray(config.ref_audio).size:
            voice["ref_audio_base64"] = _pcm_b64(config.ref_audio)
        if config.tts_ref_audio is not None and np.asarray(config.tts_ref_audio).size:
            voice["tts_ref_audio_base64"] = _pcm_b64(config.tts_ref_audio)
        if voice:
            payload["voice"] = voice
        conn = _Connection(self._backend)
        self._conn = conn
        try:
            conn.open(payload)
        except BaseException:
            self.close()
            raise
        return conn.kv

    def _reserve(self, chunk: DuplexInput) -> int:
        b = self._backend
        return (
            b.step_token_reserve
            + len(chunk.frames) * (max(1, chunk.max_slice_nums) + 1) * b.vision_tokens_per_slice
        )

    def _is_mine(self, event: dict[str, Any], push: int) -> bool:
        """Is this terminator (listen / response.done) the answer to push number ``push``?"""
        rid = event.get("response_id")
        if not rid:
            return True
        rid = str(rid)
        if rid in self._terminated:
            return False
        m = _RESP_ID.match(rid)
        if m and self._conn is not None and m.group("sid") == self._conn.session_id:
            return int(m.group("n")) == push
        return True

    def step(self, chunk: DuplexInput) -> DuplexStep:
        if self._closed:
            raise BackendError("duplex session is closed")
        conn = self._conn
        if conn is None:
            raise BackendError("duplex session is not prepared")
        b = self._backend
        limit = b.max_context_tokens
        if self._context_full or conn.kv + self._reserve(chunk) > limit:
            self._context_full = True
            return DuplexStep(
                listen=True,
                kv_cache_length=max(conn.kv, limit),
                metrics={"context_full": True, "kv_cache_length_actual": conn.kv, "skipped": True},
            )
        audio = np.asarray(chunk.audio, dtype=np.float32).reshape(-1)
        if audio.size == 0:
            raise UnsupportedInput("a duplex chunk needs audio", "audio")
        force_listen = bool(chunk.force_listen or self._interrupt)
        self._interrupt = False
        message: dict[str, Any] = {"audio": _pcm_b64(audio), "force_listen": force_listen}
        if chunk.frames:
            message["video_frames"] = [base64.b64encode(f).decode("ascii") for f in chunk.frames]
            message["max_slice_nums"] = max(1, int(chunk.max_slice_nums or 1))
        t0 = time.monotonic()
        conn.send({"type": "input.append", "input": message})
        self._pushes += 1
        push = self._pushes
        deadline = t0 + b.step_timeout_s
        texts: list[str] = []
        audio_out: list[np.ndarray] = []
        terminator: str | None = None
        term_metrics: dict[str, Any] = {}
        first_reply_s = None
        while terminator is None:
            try:
                event = conn.recv(
                    deadline - time.monotonic(), waiting_for="listen or response.done"
                )
            except TimeoutError as exc:
                raise InferenceError(str(exc)) from exc
            first_reply_s = first_reply_s or time.monotonic() - t0
            etype = event.get("type")
            if etype == "response.output.delta":
                kind = event.get("kind")
                if kind == "text":
                    text = str(event.get("text") or "")
                    if text and text not in ("__END_OF_TURN__", "__TURN_IDLE__", "__IS_LISTEN__"):
                        texts.append(text)
                elif kind == "audio":
                    wave = _b64_pcm(event.get("audio"))
                    if wave is not None and wave.size:
                        audio_out.append(wave)
                elif kind == "listen" and self._is_mine(event, push):
                    terminator = "listen"
                    term_metrics = event.get("metrics") or {}
            elif etype == "response.done" and self._is_mine(event, push):
                terminator = "done"
                term_metrics = event.get("metrics") or {}
            if terminator is not None and event.get("response_id"):
                self._terminated.add(str(event["response_id"]))
        spoken = bool(texts or audio_out)
        metrics = {
            "prefill_s": round(float(term_metrics.get("prefill_ms") or 0) / 1000, 4),
            "generate_s": round(float(term_metrics.get("generate_ms") or 0) / 1000, 4),
            "tts_s": round(
                sum(
                    float(term_metrics.get(k) or 0)
                    for k in ("cost_tts_prep_ms", "cost_tts_ms", "cost_token2wav_ms")
                )
                / 1000,
                4,
            ),
            "round_trip_s": round(time.monotonic() - t0, 4),
            "first_reply_s": None if first_reply_s is None else round(first_reply_s, 4),
            "force_listen": force_listen,
            "terminator": terminator,
        }
        kv = conn.kv
        if kv >= limit:
            self._context_full = True
            metrics["context_full"] = True
        return DuplexStep(
            listen=not spoken,
            kv_cache_length=kv,
            text="".join(texts),
            audio=np.concatenate(audio_out).astype(np.float32) if audio_out else None,
            end_of_turn=spoken and terminator == "listen",
            metrics=metrics,
        )

    def interrupt(self) -> None:
        self._interrupt = True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._conn is not None:
                self._conn.close()
        finally:
            self._conn = None
            self._backend._duplex_closed(self)
