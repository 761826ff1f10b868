"""The language model: SmolLM2-135M-Instruct from its GGUF file, run by CTranslate2 (int8, CPU).

The chat template and tokenizer are transformers'; decoding is CTranslate2's, greedy and
streamed token by token (``llm_convert`` explains the conversion and its cache).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from inference.pocket.assets import require
from inference.pocket.llm_convert import META, TOKENIZER_DIR, converted

ChatMessages = list[dict[str, str]]


@dataclass(slots=True)
class GenerationStats:
    """Filled in while a generation runs."""

    input_tokens: int = 0
    generated_tokens: int = 0
    prefill_s: float = 0.0  # prompt in -> first token out
    decode_s: float = 0.0  # first token -> last token
    stopped: str = ""  # "eos", "length" or "cancelled"
    extra: dict[str, float] = field(default_factory=dict)


class LanguageModel:
    """Greedy, token-by-token chat generation with a chat template."""

    def __init__(
        self,
        gguf_path: str | Path,
        threads: int = 2,
        repetition_penalty: float = 1.1,
        cache_dir: str | Path | None = None,
        quantization: str = "int8",
    ) -> None:
        """Load (converting first when ``cache_dir`` has no copy; None: convert every load)."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        ct2 = require("ctranslate2", "ctranslate2")
        transformers = require("transformers", "transformers")
        transformers.utils.logging.set_verbosity_error()
        cache = Path(cache_dir) if cache_dir is not None else None
        with converted(Path(gguf_path), quantization, cache) as model_dir:
            facts = json.loads((model_dir / META).read_text())
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(
                str(model_dir / TOKENIZER_DIR), local_files_only=True
            )
            self._generator = ct2.Generator(
                str(model_dir),
                device="cpu",
                compute_type=quantization,
                intra_threads=threads,
                inter_threads=1,
            )
        self.repetition_penalty = repetition_penalty
        self.eos_tokens: list[str] = list(facts["eos_tokens"])
        self.context_tokens = int(facts["context_tokens"])
        self._lock = threading.Lock()

    def encode_chat(self, messages: ChatMessages, add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the chat-templated conversation."""
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def count_tokens(self, messages: ChatMessages) -> int:
        """How many tokens the model holds for this conversation."""
        return len(self.encode_chat(messages, add_generation_prompt=False)) if messages else 0

    def stream(
        self,
        messages: ChatMessages,
        max_new_tokens: int,
        stats: GenerationStats | None = None,
        cancelled: Callable[[], bool] = lambda: False,
        gate: threading.Event | None = None,
    ) -> Iterator[str]:
        """Yield text deltas of the assistant's reply as tokens are generated (greedy).

        Decoding runs on CTranslate2's own thread; with a ``gate``, it pauses (between two
        tokens) while the gate is clear, so a caller can give the CPU to something more urgent.
        """
        stats = stats if stats is not None else GenerationStats()
        prompt = self.encode_chat(messages)
        stats.input_tokens = len(prompt)
        budget = max(0, min(max_new_tokens, self.context_tokens - len(prompt)))
        stats.stopped = "length"
        if budget == 0:
            return
        tokens = self.tokenizer.convert_ids_to_tokens(prompt)
        generated: list[int] = []
        emitted = ""

        def on_token(_step: object) -> bool:  # on the decoding thread; True stops it
            if gate is not None:
                while not gate.wait(0.05):
                    if cancelled():
                        return True
            return cancelled()

        with self._lock:  # held across yields: one generation at a time
            t0 = time.perf_counter()
            steps = self._generator.generate_tokens(
                tokens,
                max_length=budget,
                sampling_topk=1,
                repetition_penalty=self.repetition_penalty,
                end_token=self.eos_tokens,
                callback=on_token,
            )
            try:
                for step in steps:
                    now = time.perf_counter()
                    if not generated:
                        stats.prefill_s = now - t0
                    if step.token in self.eos_tokens:
                        stats.stopped = "eos"
                        break
                    generated.append(int(step.token_id))
                    stats.generated_tokens = len(generated)
                    stats.decode_s = now - t0 - stats.prefill_s
                    text = self.tokenizer.decode(generated, skip_special_tokens=True)
                    if (
                        not text.endswith("\ufffd")
                        and len(text) > len(emitted)
                        and text.startswith(emitted)
                    ):
                        delta, emitted = text[len(emitted) :], text
                        yield delta
                    if cancelled():
                        stats.stopped = "cancelled"
                        break
                else:
                    if len(generated) < budget:
                        stats.stopped = "eos"
            finally:
                steps.close()  # stops the decoding at once when the caller leaves early
        final = self.tokenizer.decode(generated, skip_special_tokens=True)
        if final.startswith(emitted) and len(final) > len(emitted):
            yield final[len(emitted) :]
