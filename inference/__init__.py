"""Model backends behind one small interface.

This package stands alone: it imports nothing from api/, tasks/ or streaming/, nor Redis, Celery
or a web framework, so every backend can be built and tested by itself.
"""

from inference.base import (
    AudioPart,
    Backend,
    BackendError,
    ChatDelta,
    ChatDone,
    ChatEvent,
    ChatPrefilled,
    ChatRequest,
    ContentPart,
    DuplexConfig,
    DuplexInput,
    DuplexSession,
    DuplexStep,
    GenerationConfig,
    HistoryTurn,
    ImagePart,
    InferenceError,
    Message,
    TextPart,
    TTSConfig,
    UnsupportedInput,
    VideoPart,
    history_prompt,
)
from inference.registry import available_backends, create_backend

__all__ = [
    "AudioPart",
    "Backend",
    "BackendError",
    "ChatDelta",
    "ChatDone",
    "ChatEvent",
    "ChatPrefilled",
    "ChatRequest",
    "ContentPart",
    "DuplexConfig",
    "DuplexInput",
    "DuplexSession",
    "DuplexStep",
    "GenerationConfig",
    "HistoryTurn",
    "ImagePart",
    "InferenceError",
    "Message",
    "TTSConfig",
    "TextPart",
    "UnsupportedInput",
    "VideoPart",
    "available_backends",
    "create_backend",
    "history_prompt",
]
