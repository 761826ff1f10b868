"""Shared helpers of the minicpmo backend tests (the strict stand-in, audio, messages)."""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from inference import Backend, DuplexInput, Message, TextPart, create_backend

LOADER = "tests.standins.fake_minicpmo:load"
UNIT = 16_000  # one second at 16 kHz: what one duplex step consumes


def make_backend(revision: str = "published", **opts: Any) -> Backend:
    """The minicpmo backend on the strict stand-in (``revision`` picks its duplex wrapper)."""
    opts.setdefault("model_path", "/models/fake")
    opts.setdefault("device", "cpu")
    opts.setdefault("loader_options", {"revision": revision})
    return create_backend("minicpmo", model_loader=LOADER, **opts)


def jpeg(color: tuple[int, int, int] = (200, 10, 10)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (32, 24), color).save(buf, format="JPEG")
    return buf.getvalue()


def loud(seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(UNIT * seconds), dtype=np.float32) / UNIT
    return (0.5 * np.sin(2 * np.pi * 300 * t)).astype(np.float32)


def quiet(seconds: float = 1.0) -> np.ndarray:
    return np.zeros(int(UNIT * seconds), dtype=np.float32)


def voice(seconds: float = 2.0) -> np.ndarray:
    return (0.1 * np.sin(np.arange(int(UNIT * seconds)) / 10)).astype(np.float32)


def user(text: str, *parts: Any) -> Message:
    return Message(role="user", content=[TextPart(text), *parts])


def units(*audio: np.ndarray, **fields: Any) -> list[DuplexInput]:
    return [DuplexInput(audio=a, **fields) for a in audio]


def to_speech(session: Any) -> list[Any]:
    """Drive a prepared session into its scripted turn: three start-up units, loud, quiet."""
    return [session.step(u) for u in units(quiet(), quiet(), quiet(), loud(), quiet())]
