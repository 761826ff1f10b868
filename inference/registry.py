"""Backend lookup by name; imports each backend lazily so a worker loads only what it uses."""

from __future__ import annotations

import importlib
from typing import Any

from inference.base import Backend

_BACKENDS: dict[str, str] = {
    "scripted": "inference.scripted:ScriptedBackend",
    "pocket": "inference.pocket:PocketBackend",
    "minicpmo": "inference.minicpmo:MiniCPMOBackend",
    "llama_omni": "inference.llama_omni:LlamaOmniBackend",
}


#: what a worker says it is loading, for progress lines and the registry
LOADING_WHAT = {
    "pocket": "pocket models (Whisper, SmolLM2, Piper)",
    "minicpmo": "the MiniCPM-o model",
    "llama_omni": "the llama-omni-server client",
    "scripted": "the scripted backend (deterministic, model-free)",
}


def loading_what(name: str) -> str:
    """A person's description of what loading backend ``name`` means."""
    return LOADING_WHAT.get(name, name)


def available_backends() -> list[str]:
    """Names accepted by ``create_backend``."""
    return sorted(_BACKENDS)


def create_backend(name: str, **options: Any) -> Backend:
    """Import and construct the backend called ``name`` with keyword ``options``."""
    try:
        target = _BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"unknown backend {name!r}; choose one of {available_backends()}"
        ) from None
    module_name, _, class_name = target.partition(":")
    module = importlib.import_module(module_name)
    cls: type[Backend] = getattr(module, class_name)
    return cls(**options)


def preflight(name: str) -> None:
    """Check, without loading any model, that backend ``name`` can start in this install.

    Raises ValueError for an unknown name and the backend module's own error (naming the missing
    package) when its dependencies are absent.
    """
    try:
        target = _BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"unknown backend {name!r}; choose one of {available_backends()}"
        ) from None
    module = importlib.import_module(target.partition(":")[0])
    check = getattr(module, "preflight", None)
    if callable(check):
        check()


def choose_backend(name: str) -> tuple[str, str | None]:
    """Resolve ``auto`` (pocket when installed, else scripted); other names pass through.

    Returns the backend name and, when ``auto`` could not use pocket, the reason: the missing
    package and the command that installs it (shown by ``omniserve up``, the worker log and the
    gateway's ``/health``).
    """
    if name != "auto":
        return name, None
    try:
        preflight("pocket")
    except Exception as exc:  # noqa: BLE001 - any missing piece means "not installed"
        return "scripted", f"pocket backend not used: {exc}"
    return "pocket", None
