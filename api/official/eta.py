"""``GET``/``PUT /api/config/eta``: the official admin API's wait-estimate settings.

The official gateway estimates a queued client's wait from a per-mode baseline (``EtaConfig``:
``eta_chat_s``, ``eta_half_duplex_s``, ``eta_audio_duplex_s``, ``eta_omni_duplex_s``) until it
has measured that mode, and from a moving average (weight ``ema_alpha``) after. omniserve's
estimates work the same way over every gateway (``streaming/wait_estimate.py``), so the settings
mean the same here: a ``PUT`` stores them in Redis (``Keys.duration_stats``: ``base_s:<mode>``,
``alpha``, and the settings as given), where every gateway's estimates and the ``RELEASE``
script's averages read them; a ``GET`` reads them back beside the measured averages.

The official modes by omniserve's: chat and streaming -> chat turns, audio duplex -> audio
sessions, omni duplex -> video sessions; half duplex has no omniserve mode (stored, read back).
As in the official gateway, a ``PUT`` replaces the settings: a field it leaves out takes its
default, ``ema_alpha`` left out keeps the current weight.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from api.gateway.state import Gateway
from streaming.admission import QueueSnapshot
from streaming.wait_estimate import HOLD_EMA_ALPHA, HoldTimes

ETA_FIELD = "official_eta"
ALPHA_FIELD = "alpha"
#: official mode -> omniserve mode (half duplex: none)
MODES = {
    "chat": "chat",
    "streaming": "chat",
    "half_duplex": None,
    "audio_duplex": "audio",
    "omni_duplex": "video",
}


class EtaConfig(BaseModel):
    """The official ``EtaConfig`` (its defaults); other fields a client sends are ignored."""

    model_config = ConfigDict(extra="ignore")

    eta_chat_s: float = Field(15.0, ge=0, le=86_400)
    eta_streaming_s: float = Field(20.0, ge=0, le=86_400)
    eta_half_duplex_s: float = Field(180.0, ge=0, le=86_400)
    eta_audio_duplex_s: float = Field(120.0, ge=0, le=86_400)
    eta_omni_duplex_s: float = Field(90.0, ge=0, le=86_400)
    ema_alpha: float | None = Field(None, gt=0, le=1)


async def _stats(gateway: Gateway) -> dict[str, str]:
    raw = await gateway.redis.hgetall(gateway.keys.duration_stats)
    return {
        (k.decode() if isinstance(k, bytes) else str(k)): (
            v.decode() if isinstance(v, bytes) else str(v)
        )
        for k, v in raw.items()
    }


async def store(gateway: Gateway, config: EtaConfig) -> None:
    """Replace the settings (every gateway reads them from Redis)."""
    fields: dict[Any, Any] = {ETA_FIELD: orjson.dumps(config.model_dump()).decode()}
    for official, mode in MODES.items():
        if mode is not None and official != "streaming":  # (streaming shares chat's turns)
            fields[f"base_s:{mode}"] = f"{getattr(config, f'eta_{official}_s'):.3f}"
    if config.ema_alpha is not None:
        fields[ALPHA_FIELD] = f"{config.ema_alpha:.4f}"
    await gateway.redis.hset(gateway.keys.duration_stats, mapping=fields)


async def status(gateway: Gateway, snap: QueueSnapshot) -> dict[str, Any]:
    """The official ``EtaStatus``: the settings and the measured average of each mode."""
    stats = await _stats(gateway)
    try:
        given = orjson.loads(stats[ETA_FIELD]) if ETA_FIELD in stats else {}
        config = EtaConfig.model_validate(given)
    except (orjson.JSONDecodeError, ValueError):
        config = EtaConfig()
    try:
        alpha = float(stats[ALPHA_FIELD]) if ALPHA_FIELD in stats else HOLD_EMA_ALPHA
    except ValueError:
        alpha = HOLD_EMA_ALPHA
    holds = HoldTimes(snap.mode_hold_s, snap.mean_hold_s, snap.base_hold_s)
    out: dict[str, Any] = {"config": config.model_dump(), "ema_alpha": alpha}
    for official, mode in MODES.items():
        measured = snap.mode_hold_s.get(mode) if mode else None
        out[f"ema_{official}_s"] = round(measured, 1) if measured is not None else None
        out[f"ema_{official}_samples"] = 0  # samples are not counted
        out[f"estimate_{official}_s"] = round(holds.of(mode), 1) if mode else None
    return out
