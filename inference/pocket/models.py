"""What a duplex session and its replies use of the pocket backend: a Protocol, not the class.

``PocketBackend`` (backend.py) satisfies it. Naming the needs here keeps duplex.py and reply.py
below backend.py, which imports them, instead of the modules importing each other.
"""

from __future__ import annotations

from typing import Protocol

from inference.pocket.asr import SpeechRecognizer
from inference.pocket.llm import LanguageModel
from inference.pocket.tts import Speaker
from inference.pocket.turns import TurnDetector


class PocketModels(Protocol):
    """The loaded models and the session options."""

    asr: SpeechRecognizer
    llm: LanguageModel
    speaker: Speaker
    system_prompt: str
    barge_in: bool
    max_history_tokens: int
    duplex_max_new_tokens: int
    first_audio_timeout_s: float
    first_clause_priority: bool

    def turn_detector(self) -> TurnDetector:
        """A fresh end-of-speech detector for one session's input stream."""
        ...
