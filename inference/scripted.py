"""The scripted backend: deterministic, model-free output with configurable timing.

It runs no model. It exists for protocol tests and load benchmarks, and labels itself as such
(``info()["label"]``, and ``backend: "scripted"`` in session metrics). Behaviour:

- chat: answers ``X`` to "Reply with exactly: X", otherwise "You said: <last user text>",
  one word per delta; with TTS on, each word comes with a short deterministic tone (24 kHz).
- duplex: an energy detector on each 1 s chunk; while the user speaks (or is silent) it listens;
  after speech followed by a silent chunk it speaks ``reply`` over several steps, 1 s of audio per
  step (``step_audio_s``: other lengths exercise the cutting into 1 s deltas), ``end_of_turn`` on
  the last. ``trigger="always"`` speaks on every step (load tests).
  force_listen, or speech over its own speech, stops it at once. ``fail_every=N`` makes every
  Nth step raise InferenceError (to exercise recoverable errors). The session's ``config`` is
  checked by the ``minicpmo`` rules (``inference.minicpmo.options``): a bad value is refused as
  the real backend refuses it, an unknown key is ignored.
- faults, for the fault tests and for operators rehearsing them: ``load_delay_s`` makes loading
  take that long (a big model), ``hang_after_steps=N`` makes the Nth duplex step of every session
  block for ``hang_s`` seconds, ``hang_on_text`` makes a chat turn whose last user message
  contains that text block after its prefill (a hung model).
- ``transcript``: words it reports as heard, as a backend that transcribes does (``heard``): for
  each utterance that it answers (duplex) and for a user message with audio (chat). It
  recognises nothing: the words are the option's, whatever was said; empty (the default): none.
- ``prompt_log``: a file to which every duplex prompt (the system prompt and, after a failover,
  the conversation so far) is appended as a JSON line, so tests can see what a model would get.
"""

from __future__ import annotations

import math
import re
import time
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson

from inference.base import (
    OUTPUT_SAMPLE_RATE,
    AudioPart,
    Backend,
    ChatDelta,
    ChatDone,
    ChatEvent,
    ChatPrefilled,
    ChatRequest,
    DuplexConfig,
    DuplexInput,
    DuplexSession,
    DuplexStep,
    ImagePart,
    InferenceError,
    VideoPart,
    history_prompt,
)
from inference.minicpmo.options import validate_settings

_EXACT = re.compile(r"reply with exactly:\s*(.+)", re.IGNORECASE | re.DOTALL)
VISION_TOKENS_PER_SLICE = 64


def tone(seconds: float, seed: str, rate: int = OUTPUT_SAMPLE_RATE) -> np.ndarray:
    """A deterministic quiet tone whose pitch depends on ``seed``."""
    n = max(1, round(seconds * rate))
    freq = 220.0 + (zlib.crc32(seed.encode()) % 440)
    t = np.arange(n, dtype=np.float32) / rate
    return (0.2 * np.sin(2 * math.pi * freq * t)).astype(np.float32)


def rms(samples: np.ndarray) -> float:
    """Root mean square level of a chunk."""
    return float(np.sqrt(np.mean(np.square(samples, dtype=np.float64)))) if samples.size else 0.0


class ScriptedBackend(Backend):
    """Deterministic stand-in for a model (labelled "scripted" everywhere it appears)."""

    name = "scripted"
    max_concurrency = 100_000

    def __init__(
        self,
        reply: str = "Hello from the scripted backend.",
        token_delay_s: float = 0.01,
        step_delay_s: float = 0.0,
        tokens_per_step: int = 16,
        speech_threshold: float = 0.01,
        trigger: str = "vad",
        words_per_step: int = 3,
        prefill_delay_s: float = 0.0,
        fail_every: int = 0,
        prepare_delay_s: float = 0.0,
        load_delay_s: float = 0.0,
        hang_after_steps: int = 0,
        hang_on_text: str = "",
        hang_s: float = 3600.0,
        prompt_log: str = "",
        step_audio_s: float = 1.0,
        transcript: str = "",
    ) -> None:
        if load_delay_s:
            time.sleep(load_delay_s)  # stands in for loading a large model
        self.reply = reply
        self.token_delay_s = token_delay_s
        self.step_delay_s = step_delay_s
        self.tokens_per_step = tokens_per_step
        self.speech_threshold = speech_threshold
        self.trigger = trigger
        self.words_per_step = max(1, words_per_step)
        self.prefill_delay_s = prefill_delay_s
        self.prepare_delay_s = prepare_delay_s
        self.fail_every = fail_every  # > 0: every Nth duplex step raises InferenceError (tests)
        self.hang_after_steps = hang_after_steps
        self.hang_on_text = hang_on_text
        self.hang_s = hang_s
        self.prompt_log = prompt_log  # a file: each duplex prompt is appended as a JSON line
        self.step_audio_s = step_audio_s
        self.transcript = transcript  # reported as the user's words (see the module docstring)

    def info(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "label": "scripted (deterministic, model-free; not a model)",
            "trigger": self.trigger,
            "step_delay_s": self.step_delay_s,
            "token_delay_s": self.token_delay_s,
        }

    # ------------------------------------------------------------------ chat
    def answer_for(self, request: ChatRequest) -> str:
        """The deterministic answer to a conversation."""
        users = [m for m in request.messages if m.role == "user"]
        last = users[-1].text().strip() if users else ""
        match = _EXACT.search(last)
        if match:
            return match.group(1).strip()
        return f"You said: {last}" if last else self.reply

    def chat(self, request: ChatRequest) -> Iterator[ChatEvent]:
        input_tokens = 0
        for m in request.messages:
            input_tokens += 4 + len(m.text().split())
            for part in m.content:
                if isinstance(part, ImagePart):
                    input_tokens += VISION_TOKENS_PER_SLICE * (request.max_slice_nums or 1)
                elif isinstance(part, AudioPart):
                    input_tokens += max(1, part.samples.size // 1600)
                elif isinstance(part, VideoPart):
                    input_tokens += VISION_TOKENS_PER_SLICE * len(part.frames)
        if self.prefill_delay_s:
            time.sleep(self.prefill_delay_s)
        yield ChatPrefilled(input_tokens=input_tokens)
        last = next((m.text() for m in reversed(request.messages) if m.role == "user"), "")
        if self.hang_on_text and self.hang_on_text in last:
            time.sleep(self.hang_s)
        words = self.answer_for(request).split(" ")
        words = words[: max(1, request.generation.max_new_tokens)]
        audio: list[np.ndarray] = []
        for i, word in enumerate(words):
            if self.token_delay_s:
                time.sleep(self.token_delay_s)
            piece = word if i == 0 else " " + word
            pcm = tone(0.05 + 0.05 * len(word), word) if request.tts.enabled else None
            if pcm is not None:
                audio.append(pcm)
            yield ChatDelta(text=piece, audio=pcm)
        users = [m for m in request.messages if m.role == "user"]
        spoke = bool(users) and any(isinstance(p, AudioPart) for p in users[-1].content)
        yield ChatDone(
            text=" ".join(words),
            input_tokens=input_tokens,
            generated_tokens=len(words),
            audio=np.concatenate(audio) if audio else None,
            metrics={"backend": self.name},
            heard=self.transcript if spoke else "",
        )

    # ------------------------------------------------------------------ duplex
    def text_tokens(self, text: str) -> int:
        """One token per word, as its duplex prompt is counted."""
        return len(text.split())

    def open_duplex(self) -> DuplexSession:
        return ScriptedDuplex(self)


class ScriptedDuplex(DuplexSession):
    """One scripted duplex conversation."""

    def __init__(self, backend: ScriptedBackend) -> None:
        self.b = backend
        self.kv = 0
        self.heard_speech = False
        self.pending: list[str] = []  # words still to speak in the current turn
        self.speaking = False
        self.turns = 0
        self.steps = 0

    def prepare(self, config: DuplexConfig) -> int:
        if self.b.prepare_delay_s:
            time.sleep(self.b.prepare_delay_s)
        validate_settings(config.config)
        prompt = history_prompt(config.system_prompt, config.history)
        self.kv = 16 + len(prompt.split())
        if self.b.prompt_log:  # what a real model would have been prompted with (tests)
            with open(self.b.prompt_log, "ab") as fh:
                fh.write(orjson.dumps({"prompt": prompt}) + b"\n")
        if config.ref_audio is not None:
            self.kv += max(1, config.ref_audio.size // 1600)
        return self.kv

    def reprime(self, config: DuplexConfig) -> int:
        """A rollover: a fresh prompt; the turn state starts over as in a new session."""
        self.interrupt()
        return self.prepare(config)

    def interrupt(self) -> None:
        self.pending = []
        self.speaking = False
        self.heard_speech = False

    def _start_turn(self) -> None:
        self.turns += 1
        self.pending = self.b.reply.split()
        self.speaking = True

    def step(self, chunk: DuplexInput) -> DuplexStep:
        self.steps += 1
        if self.b.fail_every and self.steps % self.b.fail_every == 0:
            raise InferenceError(f"scripted failure on step {self.steps}")
        if self.b.hang_after_steps and self.steps == self.b.hang_after_steps:
            time.sleep(self.b.hang_s)
        if self.b.step_delay_s:
            time.sleep(self.b.step_delay_s)
        slices = len(chunk.frames) * max(1, chunk.max_slice_nums)
        self.kv += self.b.tokens_per_step + VISION_TOKENS_PER_SLICE * slices
        metrics = {
            "kv_cache_length": self.kv,
            "vision_slices": slices,
            "vision_tokens": VISION_TOKENS_PER_SLICE * slices,
            "backend": self.b.name,
        }
        voiced = rms(chunk.audio) >= self.b.speech_threshold
        if chunk.force_listen or (self.speaking and voiced and self.b.trigger == "vad"):
            self.interrupt()
            self.heard_speech = voiced
            return DuplexStep(listen=True, kv_cache_length=self.kv, metrics=metrics)
        heard = ""
        if not self.speaking:
            if self.b.trigger == "always":
                self._start_turn()
            elif voiced:
                self.heard_speech = True
            elif self.heard_speech:
                self.heard_speech = False
                self._start_turn()
                heard = self.b.transcript  # the utterance it answers
        if not self.speaking:
            return DuplexStep(listen=True, kv_cache_length=self.kv, metrics=metrics)
        words = self.pending[: self.b.words_per_step]
        self.pending = self.pending[self.b.words_per_step :]
        end = not self.pending
        if end:
            self.speaking = False
        text = " ".join(words) + ("" if end else " ")
        return DuplexStep(
            listen=False,
            kv_cache_length=self.kv,
            text=text,
            audio=tone(self.b.step_audio_s, text),
            end_of_turn=end,
            metrics=metrics,
            heard=heard,
        )

    def close(self) -> None:
        self.pending = []
        self.speaking = False
