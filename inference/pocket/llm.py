"""The language model: SmolLM2-135M-Instruct from a GGUF file, run by transformers on CPU."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from inference.pocket.assets import require

ChatMessages = list[dict[str, str]]


@dataclass(slots=True)
class GenerationStats:
    """Filled in while a generation runs."""

    input_tokens: int = 0
    generated_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    stopped: str = ""  # "eos", "length" or "cancelled"
    extra: dict[str, float] = field(default_factory=dict)


@contextlib.contextmanager
def _quiet_gguf_progress() -> Iterator[None]:
    """Hide transformers' GGUF de-quantization progress bar (cosmetic; a worker log is no TTY)."""
    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # layout changed: keep the bar
        yield
        return
    original = getattr(gguf_utils, "tqdm", None)
    gguf_utils.tqdm = lambda iterable, *args, **kwargs: iterable
    try:
        yield
    finally:
        gguf_utils.tqdm = original


class LanguageModel:
    """Greedy, token-by-token chat generation with a chat template and a KV cache."""

    def __init__(
        self, gguf_path: str | Path, threads: int = 2, repetition_penalty: float = 1.15
    ) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        for module, package in (("gguf", "gguf"), ("accelerate", "accelerate")):
            require(module, package)
        self._torch = require("torch", "torch")
        transformers = require("transformers", "transformers")
        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
        self._torch.set_num_threads(threads)
        gguf_path = Path(gguf_path)
        kwargs = {"gguf_file": gguf_path.name, "local_files_only": True}
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf_path.parent), **kwargs)
        with _quiet_gguf_progress():
            self.model = transformers.AutoModelForCausalLM.from_pretrained(
                str(gguf_path.parent), dtype=self._torch.float32, **kwargs
            )
        self.model.eval()
        self.repetition_penalty = repetition_penalty
        self.eos_ids = self._eos_ids()
        self.context_tokens = int(getattr(self.model.config, "max_position_embeddings", 2048))
        self._lock = threading.Lock()

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (
            self.tokenizer.eos_token_id,
            getattr(self.model.generation_config, "eos_token_id", None),
        ):
            if isinstance(source, int):
                ids.add(source)
            elif source:
                ids.update(int(i) for i in source)
        end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(end, int) and end != self.tokenizer.unk_token_id:
            ids.add(end)
        return ids

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
    ) -> Iterator[str]:
        """Yield text deltas of the assistant's reply as tokens are generated (greedy)."""
        stats = stats if stats is not None else GenerationStats()
        torch = self._torch
        prompt = self.encode_chat(messages)
        stats.input_tokens = len(prompt)
        budget = max(0, min(max_new_tokens, self.context_tokens - len(prompt)))
        generated: list[int] = []
        emitted = ""
        with self._lock:  # held across yields; inference mode only around model calls
            t0 = time.perf_counter()
            out = self._forward(torch.tensor([prompt]), None)
            stats.prefill_s = time.perf_counter() - t0
            t1 = time.perf_counter()
            stats.stopped = "length"
            for _ in range(budget):
                logits = out.logits[0, -1, :].float().clone()
                if self.repetition_penalty != 1.0 and generated:
                    seen = torch.tensor(sorted(set(generated)))
                    scores = logits[seen]
                    logits[seen] = torch.where(
                        scores > 0,
                        scores / self.repetition_penalty,
                        scores * self.repetition_penalty,
                    )
                token = int(torch.argmax(logits))
                if token in self.eos_ids:
                    stats.stopped = "eos"
                    break
                generated.append(token)
                stats.generated_tokens = len(generated)
                text = self.tokenizer.decode(generated, skip_special_tokens=True)
                if (
                    not text.endswith("\ufffd")
                    and len(text) > len(emitted)
                    and text.startswith(emitted)
                ):
                    delta, emitted = text[len(emitted) :], text
                    stats.decode_s = time.perf_counter() - t1
                    yield delta
                if cancelled():
                    stats.stopped = "cancelled"
                    break
                out = self._forward(torch.tensor([[token]]), out.past_key_values)
            stats.decode_s = time.perf_counter() - t1
        final = self.tokenizer.decode(generated, skip_special_tokens=True)
        if final.startswith(emitted) and len(final) > len(emitted):
            yield final[len(emitted) :]

    def _forward(self, input_ids, past):  # type: ignore[no-untyped-def]
        with self._torch.inference_mode():
            return self.model(
                input_ids=input_ids, past_key_values=past, use_cache=True, logits_to_keep=1
            )
