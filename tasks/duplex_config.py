"""The backend configuration of a duplex session, from its (validated) init control."""

from __future__ import annotations

import numpy as np

from inference import DuplexConfig, HistoryTurn
from omnicore.audio import b64_decode, pcm_or_wav_to_16k
from streaming.controls import InitControl


def _voice(b64: str | None) -> np.ndarray | None:
    if not b64:
        return None
    return pcm_or_wav_to_16k(b64_decode(b64))


def duplex_config(
    init: InitControl, public_mode: str, history: list[HistoryTurn] | None = None
) -> DuplexConfig:
    """The backend configuration from a (validated) init control event."""
    ref = _voice(init.ref_audio)
    tts_ref = _voice(init.tts_ref_audio)
    return DuplexConfig(
        mode="video" if public_mode == "video" else "audio",
        system_prompt=init.system_prompt,
        ref_audio=ref,
        tts_ref_audio=tts_ref if tts_ref is not None else ref,
        config=dict(init.config),
        history=list(history or []),
    )
