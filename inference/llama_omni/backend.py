"""The ``llama_omni`` backend: a client of the C++ ``llama-omni-server`` (llama.cpp-omni).

The server holds one session at a time; a chat turn is one ``turn_based`` session, a duplex
session one ``full_duplex`` session (``inference.llama_omni.duplex``). The wire protocol is in
``inference.llama_omni.protocol``, the WebSocket in ``inference.llama_omni.connection``.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np

from inference.base import (
    MAX_CONTEXT_TOKENS,
    AudioPart,
    Backend,
    ChatDelta,
    ChatDone,
    ChatEvent,
    ChatPrefilled,
    ChatRequest,
    ImagePart,
    InferenceError,
    TextPart,
    UnsupportedInput,
    VideoPart,
)
from inference.llama_omni import protocol
from inference.llama_omni.connection import LlamaOmniConnection
from inference.llama_omni.duplex import LlamaOmniDuplexSession

log = logging.getLogger("omniserve.inference.llama_omni")


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
        self.http_url, self.ws_url = protocol.endpoints(backend_url)
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

    def http_close(self, session_id: str) -> bool:
        """``POST /sessions/{id}/close``; False when the server did not confirm it."""
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
                out.append({"type": "audio", "data": protocol.encode_pcm(part.samples, "messages")})
            elif isinstance(part, VideoPart):
                raise UnsupportedInput(
                    "video input is not supported by the llama_omni backend "
                    "(its server takes MP4 containers)",
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
            tts_ref = protocol.encode_pcm(request.tts.ref_audio, "tts.ref_audio_data")
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
        conn = LlamaOmniConnection(self)
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
                        wave = protocol.decode_pcm(event.get("audio"))
                        if wave is not None and wave.size:
                            audio.append(wave)
                            first_delta_s = first_delta_s or time.monotonic() - t0
                            yield ChatDelta(audio=wave)
                elif etype == "response.done":
                    metrics = event.get("metrics") or {}
                    generated = int(metrics.get("n_tokens") or 0)
                    final_audio = protocol.decode_pcm(event.get("audio"))
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

    def duplex_closed(self, session: LlamaOmniDuplexSession) -> None:
        """The duplex session ended: the server takes the next session."""
        with self._lock:
            if self._active is session:
                self._active = None
                self._busy = False

    def close(self) -> None:
        if self._active is not None:
            self._active.close()
