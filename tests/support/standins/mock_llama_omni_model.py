"""The mock llama-omni-server's deterministic "model": chat turns and duplex chunks.

Turns answer ``"echo: <last user text>"``; in duplex the "model" listens until it has heard a
loud chunk (RMS > 0.05) followed by a quiet one, then speaks ``SPEECH`` over consecutive chunks,
ending the turn with a listen. (The protocol side:
tests/support/standins/mock_llama_omni_server.py.)
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from starlette.websockets import WebSocket

SPEECH = ["Hello", " there,", " how can I help?"]
OUT_RATE = 24_000


def pcm_from_b64(data: Any) -> np.ndarray:
    if not isinstance(data, str) or not data:
        raise ValueError("missing audio")
    raw = base64.b64decode(data, validate=True)
    if len(raw) % 4:
        raise ValueError("not float32 PCM")
    return np.frombuffer(raw, dtype="<f4")


def pcm_to_b64(samples: np.ndarray) -> str:
    return base64.b64encode(np.asarray(samples, dtype="<f4").tobytes()).decode("ascii")


def tone(seconds: float) -> np.ndarray:
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


class MockModel:
    """Chat turns and duplex chunks; the server class provides ``send``, ``fail``, ``metrics``."""

    async def send(self, session: Session, event: dict[str, Any]) -> None:
        raise NotImplementedError

    async def fail(self, session: Session, reason: str) -> None:
        raise NotImplementedError

    @staticmethod
    def metrics(session: Session, **extra: Any) -> dict[str, Any]:
        m: dict[str, Any] = {"backend": "mock-llama.cpp-omni"}
        if session.kv > 0:
            m["kv_cache_length"] = session.kv
        m.update({k: v for k, v in extra.items() if v})
        return m

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
                                pcm_from_b64(p.get("data"))
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
                chunk = tone(0.5)
                if streaming:
                    await self.send(
                        session,
                        {
                            "type": "response.output.delta",
                            "kind": "audio",
                            "response_id": rid,
                            "audio": pcm_to_b64(chunk),
                            "metrics": self.metrics(session),
                        },
                    )
                else:
                    full_audio.append(chunk)
        await self.send(
            session,
            {
                "type": "response.done",
                "response_id": rid,
                "text": " ".join(words),
                "reason": "turn_end",
                "audio": pcm_to_b64(np.concatenate(full_audio)) if full_audio else None,
                "metrics": self.metrics(
                    session, prefill_ms=prefill_ms, generate_ms=3.0, n_tokens=len(words)
                ),
            },
        )
        return True

    async def chunk(self, session: Session, rid: str, data: dict[str, Any]) -> bool:
        try:
            audio = pcm_from_b64(data.get("audio"))
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

        def metrics(**kw: Any) -> dict[str, Any]:
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
                    "audio": pcm_to_b64(tone(0.6 if end else 1.0)),
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
                        "audio": pcm_to_b64(tone(0.6)),
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
