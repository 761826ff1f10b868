"""Duplex sampling settings: their defaults and the validation of what a session asks for.

The defaults are the official demo's (``MiniCPM-o-Demo``, ``core/schemas/duplex.py``
``DuplexConfig``), not the remote code's own ``_default_duplex_params``: in particular the demo
listens for the first three units (``force_listen_count=3``, its "start-up guard") and samples
with ``top_k=20`` where the bare class would use 0 and 100.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from inference.base import UnsupportedInput

log = logging.getLogger("omniserve.inference.minicpmo")

#: every setting a session may choose through ``session.init`` ``config``, with its default
DUPLEX_SETTING_DEFAULTS: dict[str, Any] = {
    "length_penalty": 1.1,
    "temperature": 0.7,
    "top_p": 0.8,
    "top_k": 20,
    "listen_prob_scale": 1.0,
    "listen_top_k": None,
    "text_repetition_penalty": 1.05,
    "text_repetition_window_size": 512,
    "max_new_speak_tokens_per_chunk": 20,
    "decode_mode": "sampling",
    "force_listen_count": 3,
}

#: settings that are arguments of ``streaming_generate`` (the rest are wrapper attributes)
GENERATE_ARGUMENTS = (
    "max_new_speak_tokens_per_chunk",
    "decode_mode",
    "temperature",
    "top_k",
    "top_p",
    "listen_prob_scale",
    "listen_top_k",
    "text_repetition_penalty",
    "text_repetition_window_size",
    "length_penalty",
)

_FLOATS = {"length_penalty", "temperature", "top_p", "listen_prob_scale", "text_repetition_penalty"}
_INTS = {
    "top_k",
    "listen_top_k",
    "text_repetition_window_size",
    "max_new_speak_tokens_per_chunk",
    "force_listen_count",
}
_POSITIVE = {"max_new_speak_tokens_per_chunk", "text_repetition_window_size"}
_DECODE_MODES = ("sampling", "greedy")


def _coerce(key: str, value: Any) -> Any:
    """One setting's value in its type, or ValueError/TypeError."""
    if value is None:
        if key == "listen_top_k":
            return None
        raise ValueError("must not be null")
    if key in _FLOATS:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError("must be a number")
        number = float(value)
        if not math.isfinite(number) or number < 0:
            raise ValueError("must be a finite number >= 0")
        return number
    if key in _INTS:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError("must be an integer")
        if isinstance(value, float) and not value.is_integer():
            raise TypeError("must be an integer")
        integer = int(value)
        if integer < (1 if key in _POSITIVE else 0):
            raise ValueError("is out of range")
        return integer
    text = str(value)
    if text not in _DECODE_MODES:
        raise ValueError(f"must be one of {_DECODE_MODES}")
    return text


def validate_settings(values: dict[str, Any], strict: bool = False) -> dict[str, Any]:
    """The known settings of ``values`` in their types.

    A bad value is ``UnsupportedInput`` naming ``config.<key>``. An unknown key is a ValueError
    when ``strict`` (operator configuration), else logged and ignored (a client's config may
    carry keys meant for another backend).
    """
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key not in DUPLEX_SETTING_DEFAULTS:
            if strict:
                raise ValueError(f"unknown duplex setting {key!r}")
            log.info("duplex config key %r is not a MiniCPM-o setting; ignored", key)
            continue
        try:
            out[key] = _coerce(key, value)
        except (TypeError, ValueError) as exc:
            raise UnsupportedInput(f"config.{key} {exc}: {value!r}", f"config.{key}") from None
    return out
