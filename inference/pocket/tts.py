"""Text to speech: a Piper voice (ONNX), resampled to 24 kHz float32."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import numpy as np

from inference.base import OUTPUT_SAMPLE_RATE
from inference.pocket.assets import require
from omnicore.audio import resample

# Markdown and symbols a small LLM likes to emit that should not be read aloud.
_UNSPOKEN = re.compile(r"[*_#`~>|\[\]{}<>]+")


class Speaker:
    """Speaks English text with a Piper voice; output is mono float32 at 24 kHz."""

    def __init__(
        self, voice_path: str | Path, threads: int = 2, length_scale: float | None = None
    ) -> None:
        piper = require("piper", "piper-tts")
        ort = require("onnxruntime", "onnxruntime")
        voice_path = Path(voice_path)
        config_path = Path(f"{voice_path}.json")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # no busy-waiting between runs: the LLM needs those cores right after each sentence
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(
            str(voice_path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        config = piper.config.PiperConfig.from_dict(
            json.loads(config_path.read_text(encoding="utf-8"))
        )
        self._voice = piper.PiperVoice(
            session=session, config=config, download_dir=voice_path.parent
        )
        self._syn = piper.SynthesisConfig(length_scale=length_scale)
        # without the generator's noise the voice says a text the same way every time: test and
        # benchmark inputs are then the same from run to run
        self._fixed = piper.SynthesisConfig(
            length_scale=length_scale, noise_scale=0, noise_w_scale=0
        )
        self.native_rate = int(config.sample_rate)
        self._lock = threading.Lock()

    def synthesize(self, text: str, *, varied: bool = True) -> np.ndarray:
        """Speech for ``text`` at 24 kHz (an empty array when there is nothing to say).

        ``varied=False`` leaves out Piper's random variation, so the same text gives the same
        samples on every call (inputs that tests and benchmarks can rely on)."""
        clean = _UNSPOKEN.sub(" ", text).strip()
        if not any(ch.isalnum() for ch in clean):
            return np.zeros(0, dtype=np.float32)
        with self._lock:
            parts = [
                c.audio_float_array
                for c in self._voice.synthesize(
                    clean, syn_config=self._syn if varied else self._fixed
                )
            ]
        if not parts:
            return np.zeros(0, dtype=np.float32)
        audio = np.concatenate(parts).astype(np.float32)
        audio = resample(audio, self.native_rate, OUTPUT_SAMPLE_RATE)
        return np.clip(audio, -1.0, 1.0, out=audio)  # resampling can overshoot full scale a little
