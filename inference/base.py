"""The backend interface shared by every model backend.

Audio conventions, everywhere in this package:
- input audio is mono float32 PCM at 16 kHz (``INPUT_SAMPLE_RATE``);
- output audio is mono float32 PCM at 24 kHz (``OUTPUT_SAMPLE_RATE``).

A backend object is created once per worker process and may be used for many sessions, one
after another (or concurrently, if ``Backend.max_concurrency`` says so). Chat turns are
stateless: ``Backend.chat`` receives the whole conversation each time. Duplex sessions are
stateful: ``Backend.open_duplex`` returns a ``DuplexSession`` that lives for one client
session and must leave nothing behind (settings, voices, caches) when it is closed.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

INPUT_SAMPLE_RATE = 16_000
OUTPUT_SAMPLE_RATE = 24_000
MAX_CONTEXT_TOKENS = 8192


class BackendError(Exception):
    """An unrecoverable backend failure: the session cannot go on (closed with backend_error)."""


class InferenceError(Exception):
    """A recoverable failure of one step or turn: reported as inference_error, session goes on."""


class UnsupportedInput(Exception):
    """The request asks for something this backend cannot do (reported as invalid_payload)."""

    def __init__(self, message: str, field_name: str | None = None) -> None:
        super().__init__(message)
        self.field_name = field_name


# --------------------------------------------------------------------------- chat turns


@dataclass(slots=True)
class TextPart:
    text: str
    type: Literal["text"] = "text"


@dataclass(slots=True)
class ImagePart:
    """An encoded image file (JPEG, PNG, ...), as the client sent it."""

    data: bytes
    type: Literal["image"] = "image"


@dataclass(slots=True)
class AudioPart:
    """Mono float32 PCM, already resampled to 16 kHz."""

    samples: np.ndarray
    type: Literal["audio"] = "audio"


@dataclass(slots=True)
class VideoPart:
    """A video, split into frames (encoded JPEG bytes, ``stack_frames`` per second of video) and
    1 s audio segments (16 kHz)."""

    frames: list[bytes]
    audio_segments: list[np.ndarray]
    stack_frames: int = 1
    type: Literal["video"] = "video"


ContentPart = TextPart | ImagePart | AudioPart | VideoPart


@dataclass(slots=True)
class Message:
    role: Literal["system", "user", "assistant"]
    content: list[ContentPart]

    def text(self) -> str:
        """The concatenated text parts of this message."""
        return "".join(p.text for p in self.content if isinstance(p, TextPart))


@dataclass(slots=True)
class GenerationConfig:
    max_new_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 0.8
    length_penalty: float = 1.1


@dataclass(slots=True)
class TTSConfig:
    enabled: bool = False
    mode: str = "default"
    ref_audio: np.ndarray | None = None  # 16 kHz float32 reference voice
    ref_audio_path: str | None = None
    language: str | None = None


@dataclass(slots=True)
class ChatRequest:
    messages: list[Message]
    streaming: bool = True
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    tts: TTSConfig = field(default_factory=TTSConfig)
    max_slice_nums: int | None = None
    use_image_id: bool = True
    omni_mode: bool = False
    use_tts_template: bool = False
    enable_thinking: bool = False


@dataclass(slots=True)
class ChatPrefilled:
    """Prefill finished; generation starts."""

    input_tokens: int


@dataclass(slots=True)
class ChatDelta:
    """A piece of the answer: a text delta, an audio segment (24 kHz), or both."""

    text: str = ""
    audio: np.ndarray | None = None


@dataclass(slots=True)
class ChatDone:
    """The turn ended. ``text`` is the whole answer; ``audio`` the whole speech (or None)."""

    text: str
    input_tokens: int
    generated_tokens: int
    audio: np.ndarray | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    # the user's words in the audio of the last user message, from a backend that transcribes
    # (the client gets them as ``metrics.transcript``: a recording's user line for a voice message)
    heard: str = ""


ChatEvent = ChatPrefilled | ChatDelta | ChatDone


# --------------------------------------------------------------------------- duplex sessions


@dataclass(frozen=True, slots=True)
class HistoryTurn:
    """What one side said, as text (a failover restarts a session with the conversation so far)."""

    role: Literal["user", "assistant"]
    text: str


@dataclass(slots=True)
class DuplexConfig:
    """Everything ``session.init`` / ``session.update`` sets for a duplex session.

    ``history``: the conversation so far, oldest first, when the session is restarted on this
    worker after another one failed, or rolled over into a fresh model session when its KV
    cache filled up; every backend puts it in its first prompt.
    """

    mode: Literal["audio", "video"] = "audio"
    system_prompt: str = ""
    ref_audio: np.ndarray | None = None  # LLM reference voice, 16 kHz
    tts_ref_audio: np.ndarray | None = None  # TTS reference voice, 16 kHz (falls back to ref_audio)
    config: dict[str, Any] = field(default_factory=dict)  # e.g. length_penalty
    history: list[HistoryTurn] = field(default_factory=list)


def history_prompt(system_prompt: str, history: list[HistoryTurn]) -> str:
    """A system prompt followed by the conversation so far, for backends whose duplex prompt is
    one text (the model cannot take the earlier audio back, only what was said)."""
    if not history:
        return system_prompt
    lines = [f"{'User' if t.role == 'user' else 'Assistant'}: {t.text}" for t in history]
    head = f"{system_prompt}\n\n" if system_prompt else ""
    return f"{head}The conversation so far (continue it):\n" + "\n".join(lines)


@dataclass(slots=True)
class DuplexInput:
    """One step's input: a client chunk, or exactly ``Backend.unit_samples`` when set."""

    audio: np.ndarray  # 16 kHz float32
    frames: list[bytes] = field(default_factory=list)  # encoded JPEG frames (video mode)
    force_listen: bool = False
    max_slice_nums: int = 1


@dataclass(slots=True)
class DuplexStep:
    """The outcome of one step: the model listens, or speaks ``text`` and ``audio``."""

    listen: bool
    kv_cache_length: int
    text: str = ""
    audio: np.ndarray | None = None  # 24 kHz float32
    end_of_turn: bool = False
    metrics: dict[str, Any] = field(default_factory=dict)
    # the user's words this step, from a backend that transcribes: kept in the history, and
    # sent as ``metrics.transcript`` (a recording's user line)
    heard: str = ""


class DuplexSession(abc.ABC):
    """One full-duplex conversation. Not shared between client sessions."""

    @abc.abstractmethod
    def prepare(self, config: DuplexConfig) -> int:
        """Set up the session (system prompt, voices); return the prompt length in tokens."""

    @abc.abstractmethod
    def step(self, chunk: DuplexInput) -> DuplexStep:
        """Consume one input chunk and decide: listen, or speak."""

    def interrupt(self) -> None:  # noqa: B027 - an optional hook: a no-op unless overridden
        """Stop speaking at once (force_listen arrived between steps). Default: nothing to do."""

    def reprime(self, config: DuplexConfig) -> int | None:
        """A rollover: start afresh, in this session, from ``config`` (the session's own
        prompt and voices, ``history`` the conversation so far), dropping the KV cache; return
        the new prompt length. None (the default): this backend cannot, and the worker closes
        this session and prepares a new one instead."""
        return None

    @abc.abstractmethod
    def close(self) -> None:
        """Release everything this session holds; the backend is clean for the next one."""


class Backend(abc.ABC):
    """A loaded model. Created once per worker process."""

    #: short name used in configuration ("scripted", "pocket", "minicpmo", "llama_omni")
    name: str = "base"
    #: how many chat turns / duplex sessions one instance can serve at the same time
    max_concurrency: int = 1
    #: context window; a duplex session stops when its KV cache reaches it
    max_context_tokens: int = MAX_CONTEXT_TOKENS
    #: input samples (16 kHz) one duplex ``step`` consumes, exactly; the worker buffers client
    #: chunks of any length into such units. None: any chunk as it comes.
    unit_samples: int | None = None

    @abc.abstractmethod
    def chat(self, request: ChatRequest) -> Iterator[ChatEvent]:
        """Run one turn: yield ChatPrefilled, then ChatDelta*, then exactly one ChatDone."""

    @abc.abstractmethod
    def open_duplex(self) -> DuplexSession:
        """Start a duplex session (call ``prepare`` on it next)."""

    def info(self) -> dict[str, Any]:
        """What this backend is, for health checks and logs."""
        return {"backend": self.name}

    def text_tokens(self, text: str) -> int:
        """About how many tokens ``text`` takes in this backend's duplex prompt: what a
        rollover's prime is budgeted with. Default: one per four bytes of UTF-8; a backend
        with a tokenizer counts exactly."""
        return (len(text.encode()) + 3) // 4

    def close(self) -> None:  # noqa: B027 - an optional hook: a no-op unless overridden
        """Release the model (worker shutdown)."""
