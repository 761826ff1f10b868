"""The ``pocket`` backend: a CPU cascade of three small real models installed from PyPI.

Whisper tiny.en (faster-whisper) -> SmolLM2-135M-Instruct (transformers, GGUF) -> Piper.
Heavy packages are imported when the backend is constructed, so importing this module is cheap
and a missing package is reported as a BackendError naming it.
"""

from inference.pocket.assets import check_installed as preflight
from inference.pocket.backend import DEFAULT_SYSTEM_PROMPT, PocketBackend

__all__ = ["DEFAULT_SYSTEM_PROMPT", "PocketBackend", "preflight"]
