"""The gateway -> worker contract: control events on a session's control stream.

Controls are never dropped (unlike audio chunks, ``streaming/input.py``). The gateway writes
them after validating the client's event; the worker decodes them back into these classes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter, ValidationError

from streaming.codec import dumps


@dataclass(slots=True, kw_only=True)
class InitControl:
    """A validated ``session.init`` / ``session.update`` for the duplex backend."""

    type: Literal["init"] = "init"
    system_prompt: str = ""
    ref_audio: str | None = None  # base64 float32 PCM or WAV
    tts_ref_audio: str | None = None  # falls back to ref_audio on the worker
    config: dict[str, Any] = field(default_factory=dict)
    max_slice_nums: int | None = None
    # the current dialect: text and audio go out as separate events and an empty closing piece
    # not at all, so each event after Created is one client frame (consecutive ``seq``)
    split_deltas: bool = False
    # the official gateway's ``/ws/duplex``: each step's speech goes out whole in one event (one
    # ``result`` per step, as the official worker answers each chunk), not cut into deltas
    whole_steps: bool = False
    # the client opted in to ``session.expiring`` (``extensions`` of its init)
    expiring: bool = False


@dataclass(slots=True, kw_only=True)
class CloseControl:
    """End the session (duplex) or stop the turn (chat); ``reason`` is echoed in ``closed``."""

    type: Literal["close"] = "close"
    reason: str | None = None  # None: the worker uses CloseReason.USER_STOP


@dataclass(slots=True, kw_only=True)
class ForceListenControl:
    """Interrupt the current spoken response (sent beside the input chunk that asked for it)."""

    type: Literal["force_listen"] = "force_listen"
    input_id: str


@dataclass(slots=True, kw_only=True)
class TruncateControl:
    """Only ``heard`` of a spoken response reached the user (it was cut short where the client
    played it): the conversation a failover or rollover replays keeps that much. ``spoken`` is
    the response's text as the client got it, which names the response in the conversation."""

    type: Literal["truncate"] = "truncate"
    spoken: str
    heard: str


@dataclass(slots=True, kw_only=True)
class DetachedControl:
    """The client left and its session waits for a resume (its record says so): the worker
    looks at the record now and pauses, rather than at its next presence check."""

    type: Literal["detached"] = "detached"


Control = Annotated[
    InitControl | CloseControl | ForceListenControl | TruncateControl | DetachedControl,
    Field(discriminator="type"),
]
"""Any control event."""

_ADAPTER: TypeAdapter[Control] = TypeAdapter(Control)


class BadControl(ValueError):
    """Bytes that are not a control of this contract."""


def encode_control(control: Control) -> bytes:
    """JSON bytes of a control event."""
    return dumps(control)


def decode_control(data: bytes | str) -> Control:
    """The control JSON ``data`` holds; BadControl when it is not one."""
    try:
        return _ADAPTER.validate_json(data)
    except ValidationError as exc:
        raise BadControl(str(exc)) from None
