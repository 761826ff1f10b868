"""PocketBackend: Whisper tiny.en -> SmolLM2-135M-Instruct -> Piper, all on CPU, all from PyPI."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from inference.base import (
    AudioPart,
    Backend,
    ChatDelta,
    ChatDone,
    ChatEvent,
    ChatPrefilled,
    ChatRequest,
    DuplexSession,
    ImagePart,
    TextPart,
    UnsupportedInput,
    VideoPart,
)
from inference.pocket import assets, llm_convert
from inference.pocket.asr import SpeechRecognizer
from inference.pocket.duplex import PocketDuplexSession
from inference.pocket.llm import ChatMessages, LanguageModel
from inference.pocket.pipeline import TurnStats, respond
from inference.pocket.tts import Speaker
from inference.pocket.turns import TurnDetector
from inference.pocket.vad import SileroVAD

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant. Your answers are spoken aloud, so keep them short: "
    "one or two plain sentences."
)


class PocketBackend(Backend):
    """A small, real, CPU-only speech-to-speech cascade (no vision)."""

    name = "pocket"
    max_concurrency = 1

    def __init__(
        self,
        whisper_dir: str | Path | None = None,
        llm_gguf: str | Path | None = None,
        piper_voice: str | Path | None = None,
        threads: int | None = None,
        system_prompt: str = DEFAULT_SYSTEM_PROMPT,
        max_history_tokens: int = 2048,
        duplex_max_new_tokens: int = 64,
        repetition_penalty: float = 1.1,
        vad_threshold: float = 0.5,
        min_speech_s: float = 0.096,
        end_silence_s: float = 0.4,
        barge_in: bool = True,
        max_utterance_s: float = 28.0,
        first_audio_timeout_s: float = 60.0,
        asr_margin_s: float = 2.0,
        llm_cache_dir: str | Path | None = None,
        llm_cache: bool = True,
        first_clause_priority: bool = False,
        speculate_after_s: float | None = 0.16,
    ) -> None:
        """Load the three models, here, before the worker offers a slot. Every option has a default.

        whisper_dir / llm_gguf / piper_voice: model files (default: those the PyPI packages ship).
        threads: CPU threads per model (default: CPU count, at most 4).
        system_prompt: used by chat turns without a system message and by duplex sessions
            whose ``prepare`` gives none.
        max_history_tokens: a duplex session drops its oldest exchanges beyond this.
        duplex_max_new_tokens: reply length cap in duplex sessions (chat turns use the request's).
        repetition_penalty: applied to greedy decoding (1.0 = off).
        vad_threshold: Silero speech probability from which a 32 ms window is speech.
        min_speech_s: speech this long starts an utterance (and barges in while speaking).
        end_silence_s: silence after speech that ends the user's turn (found within a chunk).
        barge_in: speech while speaking stops the reply (turn off without echo cancellation).
        max_utterance_s: a longer utterance is answered without waiting for silence.
        first_audio_timeout_s: a reply that produces nothing for this long fails the step.
        asr_margin_s: silence after the utterance that Whisper's encoder reads (asr.py).
        llm_cache_dir / llm_cache: where the LLM converted for CTranslate2 is kept (default
            ~/.cache/omniserve/pocket); ``llm_cache=False`` converts at every load instead.
        first_clause_priority: the LLM pauses while the first clause is synthesized (it goes on
            during its playback); False (default) runs both at once. No difference was measured
            on 2 cores (docs/POCKET.md).
        speculate_after_s: at this much silence after speech the answer is started, before the
            turn is known to be over (dropped if the user goes on); None: start at the end only.
        """
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        threads = threads or max(1, min(4, os.cpu_count() or 1))
        self.paths = {
            "whisper_dir": Path(whisper_dir) if whisper_dir else assets.default_whisper_dir(),
            "llm_gguf": Path(llm_gguf) if llm_gguf else assets.default_llm_gguf(),
            "piper_voice": Path(piper_voice) if piper_voice else assets.default_piper_voice(),
        }
        self.system_prompt = system_prompt
        self.max_history_tokens = max_history_tokens
        self.duplex_max_new_tokens = duplex_max_new_tokens
        self.vad_threshold = vad_threshold
        self.min_speech_s = min_speech_s
        self.end_silence_s = end_silence_s
        self.barge_in = barge_in
        self.first_clause_priority = first_clause_priority
        self.speculate_after_s = speculate_after_s
        self.max_utterance_s = max_utterance_s
        self.first_audio_timeout_s = first_audio_timeout_s
        started = time.perf_counter()
        self.vad = SileroVAD()
        self.asr = SpeechRecognizer(
            self.paths["whisper_dir"], threads=threads, margin_s=asr_margin_s
        )
        cache = None
        if llm_cache:
            cache = Path(llm_cache_dir) if llm_cache_dir else llm_convert.default_cache_dir()
        self.llm = LanguageModel(
            self.paths["llm_gguf"],
            threads=threads,
            repetition_penalty=repetition_penalty,
            cache_dir=cache,
        )
        self.speaker = Speaker(self.paths["piper_voice"], threads=threads)
        self.load_s = time.perf_counter() - started
        self.max_context_tokens = min(self.max_context_tokens, self.llm.context_tokens)

    # ------------------------------------------------------------------ chat turns

    def chat(self, request: ChatRequest) -> Iterator[ChatEvent]:
        """One stateless turn: audio parts are transcribed, the reply streamed (and spoken)."""
        started = time.perf_counter()
        asr_s, messages, heard = self._to_chat_messages(request)
        stats = TurnStats()
        speaker = self.speaker if request.tts.enabled else None
        pieces = respond(
            self.llm,
            speaker,
            messages,
            request.generation.max_new_tokens,
            stats,
            first_clause_priority=self.first_clause_priority,
        )
        text_parts: list[str] = []
        audio_parts: list[np.ndarray] = []
        first = next(pieces, None)  # runs the prefill
        yield ChatPrefilled(input_tokens=stats.llm.input_tokens)
        piece = first
        while piece is not None:
            if piece.audio is not None:  # the text of speech came as the deltas before it
                if piece.audio.size:
                    audio_parts.append(piece.audio)
                    yield ChatDelta(audio=piece.audio)
            elif piece.text:
                text_parts.append(piece.text)
                yield ChatDelta(text=piece.text)
            piece = next(pieces, None)
        audio = np.concatenate(audio_parts) if audio_parts else None
        if request.tts.enabled and audio is None:
            audio = np.zeros(0, dtype=np.float32)
        metrics: dict[str, Any] = {"asr_s": round(asr_s, 4), **stats.as_metrics()}
        metrics["total_s"] = round(time.perf_counter() - started, 4)
        yield ChatDone(
            text="".join(text_parts).strip(),
            input_tokens=stats.llm.input_tokens,
            generated_tokens=stats.llm.generated_tokens,
            audio=audio,
            metrics=metrics,
            heard=heard,
        )

    def _to_chat_messages(self, request: ChatRequest) -> tuple[float, ChatMessages, str]:
        """Validate first (no vision), then transcribe audio; returns (asr seconds, messages,
        the words heard in the last user message's audio)."""
        for i, message in enumerate(request.messages):
            for j, part in enumerate(message.content):
                if isinstance(part, (ImagePart, VideoPart)):
                    raise UnsupportedInput(
                        f"this backend cannot see images/video: messages[{i}].content[{j}] is "
                        f"{part.type!r}; the pocket backend takes text and audio only",
                        field_name=f"messages[{i}].content[{j}]",
                    )
        asr_s = 0.0
        messages: ChatMessages = []
        heard = ""
        for message in request.messages:
            texts: list[str] = []
            spoken: list[str] = []
            for part in message.content:
                if isinstance(part, TextPart):
                    texts.append(part.text)
                elif isinstance(part, AudioPart):
                    t0 = time.perf_counter()
                    spoken.append(self.asr.transcribe(part.samples))
                    texts.append(spoken[-1])
                    asr_s += time.perf_counter() - t0
            text = " ".join(t.strip() for t in texts if t.strip())
            messages.append({"role": message.role, "content": text})
            if message.role == "user":
                heard = " ".join(t.strip() for t in spoken if t.strip())
        if not messages or messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return asr_s, messages, heard

    # ------------------------------------------------------------------ duplex

    def open_duplex(self) -> DuplexSession:
        """A new voice conversation; turns are found by voice-activity detection."""
        return PocketDuplexSession(self)

    def text_tokens(self, text: str) -> int:
        """The LLM's own count of ``text`` as one message of the conversation."""
        return self.llm.count_tokens([{"role": "user", "content": text}])

    def turn_detector(self) -> TurnDetector:
        """A fresh end-of-speech detector for one session's input stream."""
        return TurnDetector(
            self.vad,
            threshold=self.vad_threshold,
            min_speech_s=self.min_speech_s,
            end_silence_s=self.end_silence_s,
            max_utterance_s=self.max_utterance_s,
            speculate_after_s=self.speculate_after_s,
        )

    def close(self) -> None:
        """Drop the models (worker shutdown)."""
        for attr in ("asr", "llm", "speaker"):
            setattr(self, attr, None)

    def info(self) -> dict[str, Any]:
        """Backend name, model files and load time."""
        return {
            "backend": self.name,
            "models": {k: str(v) for k, v in self.paths.items()},
            "load_s": round(self.load_s, 2),
            "vision": False,
        }
