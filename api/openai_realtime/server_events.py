"""The OpenAI Realtime server events this server sends, built in one place.

Every event has an ``event_id`` (``event_<n>``, unique in the connection) and the fields the
``openai`` SDK's types (``openai.types.realtime``) and Pipecat's parser require.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any

from api.protocol.errors import Frame
from streaming.events import ErrorCode

# the OpenAI error codes of what this server refuses in the protocol's own words
CODE_NAMES = {
    ErrorCode.UNKNOWN_EVENT: "invalid_value",
    ErrorCode.MISSING_FIELD: "missing_required_parameter",
    ErrorCode.INVALID_PAYLOAD: "invalid_value",
}


# GA event names -> the beta ones (``OpenAI-Beta: realtime=v1``); None: the beta has no such event
BETA_NAMES: dict[str, str | None] = {
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
    "conversation.item.added": "conversation.item.created",
    "conversation.item.done": None,
}
BETA_CONTENT = {"output_audio": "audio", "output_text": "text"}


def new_id(prefix: str) -> str:
    """An OpenAI-style object id (``item_...``, ``resp_...``)."""
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def error_type(code: ErrorCode) -> str:
    """OpenAI's error ``type``: the client's mistake, or the server's."""
    return "invalid_request_error" if code.is_client_error else "server_error"


class ServerEvents:
    """Builds one connection's server events (their ids count up), in GA names or, for a beta
    client, in the beta's."""

    def __init__(self, beta: bool = False) -> None:
        self._ids = itertools.count(1)
        self.beta = beta

    def event(self, kind: str, **fields: Any) -> Frame:
        return {"type": kind, "event_id": f"event_{next(self._ids)}", **fields}

    def named(self, kind: str) -> str | None:
        """The event's name for this client (None: not sent to it)."""
        return BETA_NAMES.get(kind, kind) if self.beta else kind

    def content_type(self, kind: str) -> str:
        """An assistant content part's type for this client."""
        return BETA_CONTENT.get(kind, kind) if self.beta else kind

    def error(
        self,
        code: str,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        event_id: str | None = None,
    ) -> Frame:
        """``error``: OpenAI's ``type``, a ``code``, the offending client ``event_id``."""
        return self.event(
            "error",
            error={
                "type": kind,
                "code": code,
                "message": message,
                "param": param,
                "event_id": event_id,
            },
        )

    def rate_limits(self, position: int, wait_s: float | None) -> Frame:
        """The waiting room in a GA event: one ``requests`` limit, ``remaining`` 0 while
        queued, ``limit`` the position, ``reset_seconds`` the estimated wait."""
        limit: dict[str, Any] = {
            "name": "requests",
            "limit": position,
            "remaining": 0,
            "reset_seconds": float(wait_s) if wait_s is not None else 0.0,
        }
        return self.event("rate_limits.updated", rate_limits=[limit])


def session_object(
    session_id: str, model: str, config: dict[str, Any], beta: bool = False
) -> dict[str, Any]:
    """The ``session`` of ``session.created`` / ``session.updated`` (GA, or the beta's)."""
    audio_in = config.get("audio_input", {})
    audio_out = config.get("audio_output", {})
    if beta:
        return {  # (no ``model``: the beta's type allows only OpenAI's model names there)
            "id": session_id,
            "object": "realtime.session",
            "modalities": ["text", "audio"]
            if config["output_modalities"] == ["audio"]
            else ["text"],
            "instructions": config["instructions"],
            "voice": audio_out.get("voice", "alloy"),
            "input_audio_format": "pcm16",
            "output_audio_format": "pcm16",
            "input_audio_transcription": None,
            "turn_detection": audio_in.get("turn_detection"),
            "tools": [],
            "tool_choice": "auto",
            "temperature": 0.8,
            "max_response_output_tokens": config.get("max_output_tokens", "inf"),
            "speed": audio_out.get("speed", 1.0),
        }
    return {
        "type": "realtime",
        "object": "realtime.session",
        "id": session_id,
        "model": model,
        "output_modalities": config["output_modalities"],
        "instructions": config["instructions"],
        "tools": [],
        "tool_choice": "auto",
        "max_output_tokens": config.get("max_output_tokens", "inf"),
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": 24000},
                "transcription": None,
                "noise_reduction": None,
                "turn_detection": audio_in.get("turn_detection"),
            },
            "output": {
                "format": {"type": "audio/pcm", "rate": 24000},
                "voice": audio_out.get("voice", "alloy"),
                "speed": audio_out.get("speed", 1.0),
            },
        },
    }


def message_item(
    item_id: str,
    role: str,
    content: list[dict[str, Any]],
    status: str = "completed",
) -> dict[str, Any]:
    """A conversation ``message`` item."""
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "message",
        "status": status,
        "role": role,
        "content": content,
    }


def response_object(
    response_id: str,
    status: str,
    modalities: list[str],
    output: list[dict[str, Any]],
    *,
    reason: str | None = None,
    usage: dict[str, int] | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A ``realtime.response``; ``status`` completed, cancelled, failed or in_progress."""
    details: dict[str, Any] | None = None
    if status != "in_progress" and status != "completed":
        details = {"type": status, "reason": reason}
        if error is not None:
            details["error"] = error
    elif status == "completed":
        details = None
    u = usage or {}
    inp, outp = u.get("input_tokens", 0), u.get("output_tokens", 0)
    return {
        "id": response_id,
        "object": "realtime.response",
        "status": status,
        "status_details": details,
        "output": output,
        "conversation_id": "conv_default",
        "output_modalities": modalities,
        "max_output_tokens": "inf",
        "audio": {"output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "alloy"}},
        "usage": {
            "total_tokens": inp + outp,
            "input_tokens": inp,
            "output_tokens": outp,
            "input_token_details": {
                "text_tokens": inp,
                "audio_tokens": 0,
                "image_tokens": 0,
                "cached_tokens": 0,
                "cached_tokens_details": {"text_tokens": 0, "audio_tokens": 0, "image_tokens": 0},
            },
            "output_token_details": {"text_tokens": outp, "audio_tokens": 0},
        },
    }
