"""Shared helpers of the minicpmo backend tests (the strict stand-in, audio, messages)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from inference import Backend, DuplexInput, Message, TextPart, create_backend
from tests.support.stack import Stack

LOADER = "tests.support.standins.fake_minicpmo:load"
UNIT = 16_000  # one second at 16 kHz: what one duplex step consumes


def make_backend(revision: str = "published", **opts: Any) -> Backend:
    """The minicpmo backend on the strict stand-in (``revision`` picks its duplex wrapper)."""
    opts.setdefault("model_path", "/models/fake")
    opts.setdefault("device", "cpu")
    opts.setdefault("loader_options", {"revision": revision})
    return create_backend("minicpmo", model_loader=LOADER, **opts)


@contextmanager
def fake_minicpmo_stack(redis_server: str, **worker_env: str) -> Iterator[Stack]:
    """A gateway and one ``minicpmo`` worker whose model is the strict stand-in, chosen by
    configuration (it consumes exactly one second per step and faults on a short or long unit).
    The gateway keeps up to 64 pending chunks: a burst of short ones queued while the worker
    steps is all kept, not thinned by the silent drop. ``worker_env``: more worker settings."""
    s = Stack(redis_server)
    try:
        s.start_worker(
            "minicpmo",
            OMNISERVE_MODEL_PATH="/tmp/none",
            OMNISERVE_DEVICE="cpu",
            OMNISERVE_BACKEND_OPTIONS=json.dumps({"model_loader": LOADER, "device": "cpu"}),
            **worker_env,
        )
        s.start_gateway(OMNISERVE_INPUT_MAX_PENDING="64")
        yield s
    finally:
        s.stop()


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
