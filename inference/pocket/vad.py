"""Streaming voice-activity detection: the Silero VAD model that faster-whisper ships (ONNX).

The model scores 32 ms windows (512 samples at 16 kHz) and carries an LSTM state from one window
to the next, so a stream can be scored piece by piece as audio arrives, whatever the piece
size: ``VADStream`` keeps the state, the 64-sample context the model looks back on, and the
samples not yet filling a window. One ``SileroVAD`` (one ONNX session) serves every stream.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from inference.pocket.assets import require

WINDOW = 512  # samples per score at 16 kHz (32 ms): what the model is trained on
CONTEXT = 64  # samples of the previous window the model sees in front of each window
STATE_SHAPE = (1, 1, 128)


def default_model_path() -> Path:
    """``silero_vad_v6.onnx`` from faster-whisper's package assets (no download)."""
    utils = require("faster_whisper.utils", "faster-whisper")
    path = Path(utils.get_assets_path()) / "silero_vad_v6.onnx"
    if not path.exists():
        from inference.pocket.assets import missing

        raise missing("faster-whisper", f"its Silero VAD model {path.name} is missing")
    return path


class SileroVAD:
    """The loaded model; ``stream()`` gives an independent scorer for one audio stream."""

    sample_rate = 16_000
    window_s = WINDOW / 16_000

    def __init__(self, model_path: str | Path | None = None) -> None:
        ort = require("onnxruntime", "onnxruntime")
        options = ort.SessionOptions()
        # one window is very little work: more threads only add wake-ups on a shared CPU
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 4
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = ort.InferenceSession(
            str(model_path or default_model_path()),
            sess_options=options,
            providers=["CPUExecutionProvider"],
        )
        self._lock = threading.Lock()

    def stream(self) -> VADStream:
        """A new stream, starting from silence."""
        return VADStream(self)

    def score(
        self, windows: np.ndarray, h: np.ndarray, c: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Speech probabilities of consecutive ``windows`` (n, CONTEXT + WINDOW), new state."""
        with self._lock:
            probs, h, c = self._session.run(None, {"input": windows, "h": h, "c": c})
        return np.asarray(probs, dtype=np.float32).reshape(-1), h, c


class VADStream:
    """Scores one continuous 16 kHz stream in 32 ms windows, fed in pieces of any size."""

    def __init__(self, model: SileroVAD) -> None:
        self._model = model
        self._h = np.zeros(STATE_SHAPE, dtype=np.float32)
        self._c = np.zeros(STATE_SHAPE, dtype=np.float32)
        self._context = np.zeros(CONTEXT, dtype=np.float32)
        self._rest = np.zeros(0, dtype=np.float32)
        self.samples_scored = 0  # samples covered by the windows scored so far

    def push(self, audio: np.ndarray) -> np.ndarray:
        """Score every window that ``audio`` completes; one probability per 32 ms window.

        Window ``i`` of the result covers stream samples ``[start + i*512, start + (i+1)*512)``
        where ``start`` is ``samples_scored`` before the call.
        """
        data = np.concatenate([self._rest, np.asarray(audio, dtype=np.float32).reshape(-1)])
        n = data.size // WINDOW
        self._rest = data[n * WINDOW :]
        if n == 0:
            return np.zeros(0, dtype=np.float32)
        frames = data[: n * WINDOW].reshape(n, WINDOW)
        previous = np.concatenate([self._context[None, :], frames[:-1, -CONTEXT:]], axis=0)
        windows = np.ascontiguousarray(np.concatenate([previous, frames], axis=1))
        probs, self._h, self._c = self._model.score(windows, self._h, self._c)
        self._context = frames[-1, -CONTEXT:].copy()
        self.samples_scored += n * WINDOW
        return probs
