"""The strict stand-in's vocabulary, fault type and KV cache (a symbol list with its grammar).

Feeding checks the unit grammar the model's duplex loop relies on: after the system prompt,
every token lies inside ``<unit> ... </unit>``; a second ``<unit>`` inside an open one (what a
prefill answered "audio not enough" leaves behind) or a token between units is a ``StandInFault``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

SPEECH = ["Hello", " there,", " how can I help?"]
OUT_RATE = 24_000
AUDIO_TOKENS_PER_UNIT = 10
QUERY_NUM = 64  # tokens per image slice (plus <image></image> around it)

VOCAB = {
    name: i
    for i, name in enumerate(
        [
            "<unit>",
            "</unit>",
            "<|listen|>",
            "<|speak|>",
            "<|tts_bos|>",
            "<|chunk_eos|>",
            "<|turn_eos|>",
            "<image>",
            "</image>",
            "<|im_start|>",
            "<|im_end|>",
            "<|audio_start|>",
            "<|audio_end|>",
        ],
        start=1,
    )
}
NAMES = {i: name for name, i in VOCAB.items()}
MARKUP = ("<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>")


class StandInFault(RuntimeError):
    """The real model would misbehave here (garbage context, stale speech, lag)."""


def wave(seconds: float, freq: float = 220.0) -> np.ndarray:
    t = np.arange(int(OUT_RATE * seconds), dtype=np.float32) / OUT_RATE
    return (0.2 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


class Embedding:
    """What ``embed_token`` returns: token symbols and the KV positions they take."""

    def __init__(self, symbols: list[str], positions: int | None = None) -> None:
        self.symbols = symbols
        self.positions = len(symbols) if positions is None else positions


class StreamDecoder:
    """The wrapper's KV cache as a symbol list, checking the unit grammar on every feed."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.symbols: list[str] = []
        self.length = 0
        self.unit_open = False
        self.prompt_done = False

    def embed_token(self, token: Any) -> Embedding:
        return Embedding([NAMES.get(int(token), f"tok{int(token)}")])

    def embed_tokens(self, tokens: list[Any]) -> Embedding:
        return Embedding([NAMES.get(int(t), f"tok{int(t)}") for t in tokens])

    def feed(self, embeds: Embedding, return_logits: bool = False) -> Any:
        for sym in embeds.symbols:
            if sym == "<unit>":
                if self.unit_open:
                    raise StandInFault("<unit> inside an open unit: a unit was left dangling")
                self.unit_open = True
            elif sym == "</unit>":
                if not self.unit_open:
                    raise StandInFault("</unit> without an open unit")
                self.unit_open = False
            elif self.prompt_done and not self.unit_open:
                raise StandInFault(f"{sym} fed between units")
        self.symbols.extend(embeds.symbols)
        self.length += embeds.positions
        return (object(), object()) if return_logits else None

    def get_cache_length(self) -> int:
        return self.length
