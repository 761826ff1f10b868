"""A ``full_duplex`` session on the server: one ``input.append`` in flight at a time.

Each step pushes one chunk and collects the server's deltas until the push's terminator (a
``listen`` delta or ``response.done``, matched to the push by its response id): text and audio
before it make a speaking step.
"""

from __future__ import annotations

import base64
import re
import time
from typing import Any, Protocol

import numpy as np

from inference.base import (
    BackendError,
    DuplexConfig,
    DuplexInput,
    DuplexSession,
    DuplexStep,
    InferenceError,
    UnsupportedInput,
    history_prompt,
)
from inference.llama_omni import protocol
from inference.llama_omni.connection import LlamaOmniConnection, ServerEndpoint


class DuplexServer(ServerEndpoint, Protocol):
    """What a duplex session uses of its backend besides the connection's needs.

    (``LlamaOmniBackend`` is one; see ``ServerEndpoint``.)
    """

    use_tts: bool
    step_timeout_s: float
    max_context_tokens: int
    step_token_reserve: int
    vision_tokens_per_slice: int

    def duplex_closed(self, session: LlamaOmniDuplexSession) -> None:
        """The duplex session ended: the server takes the next session."""
        ...


_RESP_ID = re.compile(r"^(?P<sid>.+)_resp_(?P<n>\d+)$")


class LlamaOmniDuplexSession(DuplexSession):
    """A ``full_duplex`` session on the server; one ``input.append`` in flight at a time."""

    def __init__(self, backend: DuplexServer) -> None:
        self._backend = backend
        self._conn: LlamaOmniConnection | None = None
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
            "system_prompt": history_prompt(config.system_prompt or "", config.history),
            "config": dict(config.config or {}),
        }
        voice: dict[str, str] = {}
        if config.ref_audio is not None and np.asarray(config.ref_audio).size:
            voice["ref_audio_base64"] = protocol.encode_pcm(
                config.ref_audio, "voice.ref_audio_base64"
            )
        if config.tts_ref_audio is not None and np.asarray(config.tts_ref_audio).size:
            voice["tts_ref_audio_base64"] = protocol.encode_pcm(
                config.tts_ref_audio, "voice.tts_ref_audio_base64"
            )
        if voice:
            payload["voice"] = voice
        conn = LlamaOmniConnection(self._backend)
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
        message: dict[str, Any] = {
            "audio": protocol.encode_pcm(audio),
            "force_listen": force_listen,
        }
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
                    if text and text not in protocol.MARKER_TEXTS:
                        texts.append(text)
                elif kind == "audio":
                    wave = protocol.decode_pcm(event.get("audio"))
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
            self._backend.duplex_closed(self)
