"""The ``llama-omni-server`` protocol's fixed parts: endpoints, close reasons, wire audio.

Protocol (the server's ``/backend`` WebSocket and HTTP close):

- connect ``ws://host:port/backend``; the first frame is ``session.init`` with ``payload.mode``
  ``turn_based`` or ``full_duplex``, ``use_tts``, ``system_prompt``, ``voice.ref_audio_base64`` /
  ``voice.tts_ref_audio_base64`` (float32 PCM, 16 kHz) and an opaque ``config`` (sampling knobs).
  The server answers ``session.created`` (session_id, mode, metrics.kv_cache_length) once its
  model is ready - its port opens before the weights are loaded, so readiness is this event, not
  ``/health``. It holds one session at a time: a second connection is closed without a word.
- each ``input.append`` is one turn (``messages``) or one ~1 s duplex chunk (``audio``,
  ``video_frames``, ``force_listen``, ``max_slice_nums``); replies are ``response.output.delta``
  with ``kind`` text / audio / listen and ``response.done``; metrics carry ``kv_cache_length``.
- any protocol or inference failure is reported as ``session.closed`` with a reason and the
  socket is closed: the session is over (``LlamaOmniSessionClosed``, a ``BackendError``).
- ``POST /sessions/{id}/close`` stops inference and frees the server for the next session.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from inference.base import BackendError, InferenceError, UnsupportedInput
from omnicore.audio import AudioFormatError, b64_to_pcm, pcm_to_b64, to_mono_float32

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

#: duplex text deltas the server uses as markers, not words
MARKER_TEXTS = ("__END_OF_TURN__", "__TURN_IDLE__", "__IS_LISTEN__")


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


def endpoints(backend_url: str) -> tuple[str, str]:
    """(HTTP base URL, WebSocket ``/backend`` URL) from any of the forms an operator writes."""
    parts = urlsplit(backend_url if "://" in backend_url else f"http://{backend_url}")
    if parts.scheme not in ("http", "https", "ws", "wss") or not parts.netloc:
        raise ValueError(f"backend_url must be http(s)://host:port, got {backend_url!r}")
    http_scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    ws_scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    base_path = parts.path.rstrip("/")
    if base_path.endswith("/backend"):
        base_path = base_path[: -len("/backend")]
    http_url = urlunsplit((http_scheme, parts.netloc, base_path, "", ""))
    ws_url = urlunsplit((ws_scheme, parts.netloc, base_path + "/backend", "", ""))
    return http_url, ws_url


def encode_pcm(samples: Any, field_name: str = "audio") -> str:
    """Audio for the wire (base64 float32 PCM); non-finite samples are the client's error."""
    audio = to_mono_float32(samples)
    if not np.all(np.isfinite(audio)):
        raise UnsupportedInput("audio contains non-finite samples", field_name)
    return pcm_to_b64(audio)


def decode_pcm(data: Any) -> np.ndarray | None:
    """Audio the server sent (base64 float32 PCM, maybe as a data URI); None when absent."""
    if not data or not isinstance(data, str):
        return None
    if "," in data[:64] and "base64" in data[:64]:
        data = data.split(",", 1)[1]
    try:
        return b64_to_pcm(data)
    except AudioFormatError as exc:
        raise InferenceError(
            f"llama-omni-server sent audio that is not float32 PCM: {exc}"
        ) from exc


def metrics_kv(event: dict[str, Any]) -> int | None:
    """``metrics.kv_cache_length`` of a server event, when it carries one."""
    metrics = event.get("metrics")
    if isinstance(metrics, dict) and isinstance(metrics.get("kv_cache_length"), (int, float)):
        return int(metrics["kv_cache_length"])
    return None
