"""The OpenAI Realtime client events this server accepts, as pydantic models.

Field names and values are those of the GA protocol (what the ``openai`` SDK's
``client.realtime`` and Pipecat send). Fields a client may send that have no meaning here
(``tools``, ``tool_choice``, ``tracing``, ``noise_reduction``...) are accepted and ignored: the
models allow extra fields. A value this server cannot honour (another audio format or rate) is
refused, with the field named.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, TypeAdapter

Modality = Literal["text", "audio"]


class Loose(BaseModel):
    """Unknown fields are kept (and ignored): clients send more than this server uses."""

    model_config = ConfigDict(extra="allow")


class AudioFormat(Loose):
    """Only ``audio/pcm`` at 24 kHz (pcm16 little-endian, mono) is offered."""

    type: Literal["audio/pcm"] = "audio/pcm"
    rate: Literal[24000] = 24000


class TurnDetection(Loose):
    type: Literal["server_vad", "semantic_vad"] = "server_vad"


class AudioInput(Loose):
    format: AudioFormat | None = None
    turn_detection: TurnDetection | None = None


class AudioOutput(Loose):
    format: AudioFormat | None = None
    voice: StrictStr | dict[str, Any] | None = None
    speed: float | None = None


class AudioConfig(Loose):
    input: AudioInput | None = None
    output: AudioOutput | None = None


class SessionConfig(Loose):
    """``session.update``'s ``session`` (only ``type: "realtime"``; no transcription sessions).
    The beta names (``modalities``, ``voice``, ``*_audio_format``, ``turn_detection``) are
    taken too."""

    type: Literal["realtime"] = "realtime"
    instructions: StrictStr | None = None
    output_modalities: list[Modality] | None = Field(None, min_length=1, max_length=1)
    modalities: list[Modality] | None = Field(None, min_length=1, max_length=2)
    audio: AudioConfig | None = None
    voice: StrictStr | dict[str, Any] | None = None
    input_audio_format: Literal["pcm16"] | None = None
    output_audio_format: Literal["pcm16"] | None = None
    turn_detection: TurnDetection | None = None
    max_output_tokens: StrictInt | Literal["inf"] | None = None
    max_response_output_tokens: StrictInt | Literal["inf"] | None = None


class ContentPart(Loose):
    type: Literal["input_text", "input_audio", "text", "output_text", "output_audio", "audio"]
    text: StrictStr | None = None
    audio: StrictStr | None = None  # base64 pcm16 24 kHz
    transcript: StrictStr | None = None


class MessageItem(Loose):
    type: Literal["message"] = "message"
    id: StrictStr | None = Field(None, max_length=64)
    role: Literal["user", "assistant", "system"]
    content: list[ContentPart] = Field(min_length=1)


class OtherItem(Loose):
    """A function call or its output: kept in the conversation, never run (no tools here)."""

    type: Literal["function_call", "function_call_output"]
    id: StrictStr | None = Field(None, max_length=64)


Item = Annotated[MessageItem | OtherItem, Field(discriminator="type")]


class Event(Loose):
    event_id: StrictStr | None = Field(None, max_length=128)


class SessionUpdate(Event):
    type: Literal["session.update"]
    session: SessionConfig


class AudioAppend(Event):
    type: Literal["input_audio_buffer.append"]
    audio: StrictStr


class AudioCommit(Event):
    type: Literal["input_audio_buffer.commit"]


class AudioClear(Event):
    type: Literal["input_audio_buffer.clear"]


class ItemCreate(Event):
    type: Literal["conversation.item.create"]
    item: Item
    previous_item_id: StrictStr | None = None


class ItemTruncate(Event):
    type: Literal["conversation.item.truncate"]
    item_id: StrictStr
    content_index: StrictInt = Field(ge=0)
    audio_end_ms: StrictInt = Field(ge=0)


class ItemDelete(Event):
    type: Literal["conversation.item.delete"]
    item_id: StrictStr


class ItemRetrieve(Event):
    type: Literal["conversation.item.retrieve"]
    item_id: StrictStr


class ResponseParams(Loose):
    output_modalities: list[Modality] | None = Field(None, min_length=1, max_length=1)
    modalities: list[Modality] | None = Field(None, min_length=1, max_length=2)  # (beta)
    instructions: StrictStr | None = None
    conversation: StrictStr | None = None
    max_output_tokens: StrictInt | Literal["inf"] | None = None


class ResponseCreate(Event):
    type: Literal["response.create"]
    response: ResponseParams | None = None


class ResponseCancel(Event):
    type: Literal["response.cancel"]
    response_id: StrictStr | None = None


ClientEvent = Annotated[
    SessionUpdate
    | AudioAppend
    | AudioCommit
    | AudioClear
    | ItemCreate
    | ItemTruncate
    | ItemDelete
    | ItemRetrieve
    | ResponseCreate
    | ResponseCancel,
    Field(discriminator="type"),
]


def modality(modalities: list[Modality]) -> Modality:
    """The one output modality of a list (a beta ``["text", "audio"]`` speaks)."""
    return "audio" if "audio" in modalities else "text"


CLIENT_EVENTS: TypeAdapter[ClientEvent] = TypeAdapter(ClientEvent)
KNOWN_TYPES = frozenset(
    {
        "session.update",
        "input_audio_buffer.append",
        "input_audio_buffer.commit",
        "input_audio_buffer.clear",
        "conversation.item.create",
        "conversation.item.truncate",
        "conversation.item.delete",
        "conversation.item.retrieve",
        "response.create",
        "response.cancel",
    }
)
