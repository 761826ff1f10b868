"""SmolLM2's GGUF file, converted once to a CTranslate2 int8 model (and cached on disk).

Why: run token by token through transformers, the 135M model spends its time in Python and
in small torch ops (docs/POCKET.md has the figures), so its first clause alone would take most
of a second. CTranslate2 (already installed: faster-whisper runs on it) decodes the same weights
in C++, several times faster.

How: transformers reads the GGUF file and de-quantizes it, CTranslate2's own Llama
loader turns that model into its format, quantized to int8. That is slow (the whole model
de-quantized in Python), so the result is kept under ``cache_dir`` keyed by the GGUF file (path,
size, mtime), the CTranslate2 version and the quantization; a later load only reads it and never
imports torch. Writes go to a
temporary directory renamed into place, so concurrent workers never see a half-written model,
under a file lock, so workers that start together on one machine convert it once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from inference.pocket.assets import require

log = logging.getLogger("omniserve.pocket")

META = "omniserve.json"
TOKENIZER_DIR = "tokenizer"


def default_cache_dir() -> Path:
    """Where converted models are kept unless the backend is told otherwise."""
    return Path.home() / ".cache" / "omniserve" / "pocket"


def cache_key(gguf_path: Path, quantization: str) -> str:
    """Changes whenever the source file, CTranslate2 or the quantization does."""
    ct2 = require("ctranslate2", "ctranslate2")
    stat = gguf_path.stat()
    raw = (
        f"{gguf_path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{ct2.__version__}|{quantization}"
    )
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


@contextlib.contextmanager
def converted(
    gguf_path: Path, quantization: str = "int8", cache_dir: Path | None = None
) -> Iterator[Path]:
    """A directory with the CTranslate2 model, its tokenizer and ``omniserve.json``.

    ``cache_dir`` None: convert into a temporary directory that is removed on exit.
    """
    if cache_dir is not None:
        target = cache_dir / f"{gguf_path.stem}-{quantization}-{cache_key(gguf_path, quantization)}"
        if (target / META).exists():
            yield target
            return
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
            lock = open(cache_dir / f".{target.name}.lock", "a")  # noqa: SIM115 - held below
        except OSError as exc:
            log.warning("pocket: cannot write the model cache %s (%s); not caching", cache_dir, exc)
        else:
            with lock:
                # one conversion per machine: workers starting together wait for the first one
                # instead of each spending the same CPU converting the same file side by side
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not (target / META).exists():
                    _convert_into(gguf_path, quantization, cache_dir, target)
            yield target
            return
    with tempfile.TemporaryDirectory(prefix="omniserve-pocket-") as tmp:
        out = Path(tmp) / "model"
        _convert(gguf_path, out, quantization)
        yield out


def _convert_into(gguf_path: Path, quantization: str, cache_dir: Path, target: Path) -> None:
    """Convert into a temporary directory of ``cache_dir``, then rename it to ``target``."""
    work = Path(tempfile.mkdtemp(prefix=".convert-", dir=cache_dir))
    try:
        _convert(gguf_path, work / "model", quantization)
        try:
            os.rename(work / "model", target)
        except OSError:  # a process without the lock (an older version) renamed its copy first
            if not (target / META).exists():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _convert(gguf_path: Path, out: Path, quantization: str) -> None:
    """GGUF -> transformers (float32) -> CTranslate2 ``quantization``, plus tokenizer and facts."""
    converter_mod = require("ctranslate2.converters.converter", "ctranslate2")
    loaders = require("ctranslate2.converters.transformers", "ctranslate2")
    model, tokenizer = _load_gguf(gguf_path)
    config = model.config
    facts: dict[str, Any] = {
        "source": str(gguf_path),
        "quantization": quantization,
        "context_tokens": int(getattr(config, "max_position_embeddings", 2048)),
        "eos_tokens": _eos_tokens(model, tokenizer),
    }
    # The weights are de-quantized float32 tensors now; the GGUF quantization note in the
    # config would make the Llama loader refuse them.
    config.quantization_config = None

    class _FromLoadedModel(converter_mod.Converter):  # type: ignore[misc, name-defined]
        def _load(self):  # type: ignore[no-untyped-def]
            return loaders.LlamaLoader()(model, tokenizer)

    _FromLoadedModel().convert(str(out), quantization=quantization)
    tokenizer.save_pretrained(str(out / TOKENIZER_DIR))
    (out / META).write_text(json.dumps(facts, indent=2))


def _load_gguf(gguf_path: Path) -> tuple[Any, Any]:
    for module, package in (("gguf", "gguf"), ("accelerate", "accelerate")):
        require(module, package)
    torch = require("torch", "torch")
    transformers = require("transformers", "transformers")
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    kwargs = {"gguf_file": gguf_path.name, "local_files_only": True}
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf_path.parent), **kwargs)
    with _quiet_gguf_progress():
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), dtype=torch.float32, **kwargs
        )
    return model, tokenizer


def _eos_tokens(model: Any, tokenizer: Any) -> list[str]:
    ids: set[int] = set()
    for source in (
        tokenizer.eos_token_id,
        getattr(model.generation_config, "eos_token_id", None),
    ):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(int(i) for i in source)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(end, int) and end != tokenizer.unk_token_id:
        ids.add(end)
    return sorted(tokenizer.convert_ids_to_tokens(sorted(ids)))


@contextlib.contextmanager
def _quiet_gguf_progress() -> Iterator[None]:
    """Hide transformers' GGUF de-quantization progress bar (cosmetic; a worker log is no TTY)."""
    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # layout changed: keep the bar
        yield
        return
    original = getattr(gguf_utils, "tqdm", None)
    # setattr: transformers does not export the name it imported (mypy's attr-defined)
    setattr(gguf_utils, "tqdm", lambda iterable, *args, **kwargs: iterable)  # noqa: B010 - as above
    try:
        yield
    finally:
        setattr(gguf_utils, "tqdm", original)  # noqa: B010 - as above
