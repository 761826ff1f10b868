"""One typed settings object for every process (environment variables prefixed ``OMNISERVE_``)."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AliasChoices,
    Field,
    IPvAnyNetwork,
    SecretStr,
    ValidationError,
    field_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from omnicore.redact import redact_url


class Settings(BaseSettings):
    """Configuration of the gateway, the workers and the CLI.

    Every field reads ``OMNISERVE_<FIELD>`` (for example ``OMNISERVE_GATEWAY_PORT``); the Redis URL
    also reads the conventional ``REDIS_URL``.
    """

    model_config = SettingsConfigDict(env_prefix="OMNISERVE_", extra="ignore")

    # --- shared state
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("OMNISERVE_REDIS_URL", "REDIS_URL"),
    )
    key_prefix: str = "omni"  # every Redis key and channel starts with this
    redis_max_connections: int = 256  # per gateway process; callers wait for a free connection

    # --- gateway
    gateway_host: str = "127.0.0.1"
    gateway_port: int = 8006
    api_keys: list[SecretStr] = Field(default_factory=list)  # empty: no authentication
    max_queue: int = 1000  # waiting tickets before queue_full
    queue_update_interval_s: float = 3.0  # positions are pushed at least this often
    chat_duration_s: float = 600.0
    video_duration_s: float = 300.0
    audio_duration_s: float = 600.0
    legacy_chat_timeout_s: float = 300.0
    init_timeout_s: float = 30.0  # worker must answer session.init within this
    task_start_timeout_s: float = 15.0  # worker must pick up a session task within this
    # a duplex relay loop is woken by what it waits for (api/realtime/duplex.py); it also looks
    # at its session at least this often, a backstop (the test suite sets it high, to prove that)
    relay_look_s: float = Field(5.0, gt=0)
    # the largest WebSocket message (the reference server and its SDK allow 128 MiB); larger ones
    # get an error event and close 1009 (api/server/ws_protocol.py)
    max_frame_bytes: int = 128 * 1024 * 1024
    ws_deflate: bool = False  # permessage-deflate: costs ~half the gateway CPU on audio frames
    max_video_frames: int = 8
    max_chat_turns_queued: int = Field(4, ge=1)  # chat mode: turns waiting behind the running one

    # --- dead and stuck clients (issue #9; docs/PROTOCOL.md, "Dead and slow clients")
    # a duplex client that sends nothing this long while it holds a slot is ended (0: off)
    client_idle_timeout_s: float = Field(6.0, ge=0)
    # WebSocket pings from the gateway; a peer that has not answered within the timeout is gone
    ws_ping_interval_s: float = Field(5.0, gt=0)
    ws_ping_timeout_s: float = Field(4.0, gt=0)
    # output waiting on the gateway for a client that does not read; beyond either cap the
    # session ends with output_backpressure
    output_max_pending_events: int = Field(1000, ge=1)
    output_max_pending_bytes: int = Field(8 * 1024 * 1024, ge=1024)

    # --- recordings of every session (docs/ARCHITECTURE.md, "Recordings")
    recordings: bool = False  # record every session (`omniserve up` turns it on)
    recordings_url: str = ".omniserve/recordings"  # a directory or any fsspec URL (s3://b/x)
    recordings_spool_dir: str | None = None  # local spool for a remote store (default: tmp)
    recordings_max_age_s: float = Field(30 * 86400.0, ge=0)  # older ones are deleted; 0: keep
    recordings_max_bytes: int = Field(50 * 1024**3, ge=0)  # oldest deleted above this; 0: no cap
    recordings_prune_interval_s: float = Field(60.0, gt=0)  # how often retention runs
    # queued items (frames, ~100 KB each with audio) before the writer drops media
    recordings_max_pending: int = Field(1024, ge=1)

    # --- resume and failover (docs/PROTOCOL.md, "Resume and failover")
    resume_grace_s: float = Field(30.0, ge=0)  # a dropped client may resume this long; 0: off
    resume_slot_hold_s: float = Field(5.0, ge=0)  # a detached session keeps its slot this long
    failover_wait_s: float = Field(10.0, ge=0)  # a dead worker's session waits this for a slot

    # --- the official demo's frontend (docs/FRONTEND.md)
    static_dir: str | None = None  # its static/ directory, served at / and the page routes
    default_voice: str | None = None  # in voices_dir: /api/default_ref_audio (unset: the first)
    presets_dir: str | None = None  # <mode>/*.yaml presets in the demo's format: /api/presets
    playback_delay_ms: int = Field(200, ge=0, le=2000)  # GET /api/frontend_defaults

    # --- security (docs/SECURITY.md)
    admin_token: SecretStr | None = None  # guards /metrics, /v1/workers, /v1/admin/*
    voices_dir: str | None = None  # the only files a client may name (tts.ref_audio_path)
    # X-Forwarded-For is believed only from these networks (CIDRs; a bare address is a /32)
    trusted_proxies: list[IPvAnyNetwork] = Field(default_factory=list)
    allowed_origins: list[str] = Field(default_factory=list)  # browser origins besides our own
    max_connections_per_client: int = Field(0, ge=0)  # per client address, all gateways; 0: off
    # client WebSockets one gateway process holds; 0: what its open-files limit leaves after the
    # Redis pool and a reserve (api/security/connection_cap.py)
    gateway_max_connections: int = Field(0, ge=0)

    # --- leases (seconds): a dead worker's clients are told within about lease_ttl_s + 1 s
    lease_ttl_s: float = 1.5  # worker alive keys and session leases
    gateway_lease_ttl_s: float = 6.0  # gateway alive keys (a busy event loop must not lose it)
    heartbeat_interval_s: float = 0.5
    capacity_wait_s: float = 300.0  # queued while workers load: give up after this (0: forever)

    # --- worker
    backend: str = "scripted"
    model_path: str | None = None
    backend_url: str | None = None
    device: str = "cuda"
    backend_options: dict[str, Any] = Field(default_factory=dict)  # JSON, passed to the backend
    worker_slots: int = Field(1, ge=1)  # concurrent sessions of one worker (threads pool when > 1)
    worker_name: str | None = None
    # seconds of input audio kept per session (in chunks: 2 of 1 s, 20 of 100 ms, ...); older
    # chunks are dropped
    input_max_pending: int = 2
    output_log_maxlen: int = 64  # per-session replay log length (events; ~1 min of audio)
    session_ttl_s: float = 900.0  # all per-session keys expire after this
    model_load_timeout_s: float = 900.0  # a (re)started worker process may load this long
    step_timeout_s: float = 30.0  # a backend step running longer ends its session (0: off)
    # SIGTERM / `omniserve drain`: running sessions may finish this long, then server_shutdown
    drain_grace_s: float = Field(600.0, ge=0)
    worker_metrics_port: int = 9108  # each worker node's Prometheus endpoint (0: off)
    worker_metrics_host: str = "0.0.0.0"  # scraped from other hosts (Prometheus)

    # --- scripted backend (deterministic, model-free)
    scripted_step_delay_s: float = 0.0
    scripted_token_delay_s: float = 0.01
    scripted_tokens_per_step: int = 16
    scripted_reply: str = "Hello from the scripted backend."

    # --- omniserve up
    flower: bool = False
    flower_port: int = 5555
    flower_basic_auth: SecretStr | None = None  # user:password (default: a random password)
    # a part that exits after `up` said ready is started again after this delay, doubled per
    # restart in a row (at most 30 s); past the limit in a row (0: none) `up` stops everything
    up_restart_delay_s: float = Field(1.0, ge=0)
    up_restart_limit: int = Field(5, ge=0)
    up_log_dir: str = ".omniserve/logs"  # each part's output: gateway.log, worker-1.log, ...
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["text", "json"] = "text"  # json: one object per line (log shippers)
    # freeze the long-lived heap once a gateway or worker process is up (omnicore/gc_pauses.py)
    gc_freeze: bool = True

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, value: list[str]) -> list[str]:
        """Each entry is ``*`` or a web origin ``scheme://host[:port]`` (no path)."""
        out = []
        for origin in value:
            if origin == "*":
                out.append(origin)
                continue
            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"{origin!r} is not an origin like https://example.com")
            if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
                raise ValueError(f"{origin!r}: an origin has no path, query or user")
            out.append(origin.rstrip("/"))
        return out

    def __repr_args__(self) -> Any:
        """The Redis URL without its password: a settings object printed or logged must not
        show it (API keys and tokens are SecretStr already)."""
        for name, value in super().__repr_args__():
            yield name, redact_url(value) if name == "redis_url" else value

    def secret_values(self) -> list[str]:
        """Every configured secret in clear (API keys, admin token, Redis password): the log
        formatter replaces them wherever they appear."""
        out = [k.get_secret_value() for k in self.api_keys]
        if self.admin_token is not None:
            out.append(self.admin_token.get_secret_value())
        if self.flower_basic_auth is not None:
            out.append(self.flower_basic_auth.get_secret_value().partition(":")[2])
        try:
            password = urlsplit(self.redis_url).password
        except ValueError:
            password = None
        if password:
            out.append(password)
        return [s for s in out if s]

    def duration_limit(self, public_mode: str) -> float:
        """Total session duration allowed for a public mode (chat, video, audio)."""
        return {
            "chat": self.chat_duration_s,
            "video": self.video_duration_s,
            "audio": self.audio_duration_s,
        }[public_mode]


class InvalidSettings(ValueError):
    """The environment holds settings that cannot be read; the message names each variable.

    Why: pydantic's own error is a traceback naming the field (``gateway_port``), not what the
    operator set (``OMNISERVE_GATEWAY_PORT``); ``omniserve`` prints this message instead.
    """


def variable(field: str) -> str:
    """The environment variable(s) a settings field is read from."""
    if field == "redis_url":
        return "OMNISERVE_REDIS_URL (or REDIS_URL)"
    return f"OMNISERVE_{field.upper()}"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment (raises InvalidSettings)."""
    try:
        return Settings()
    except ValidationError as exc:
        lines = [f"{variable(str(e['loc'][0]))}: {e['msg']}" for e in exc.errors() if e["loc"]]
        raise InvalidSettings("\n".join(lines) or str(exc)) from exc
    except SettingsError as exc:  # a list or object setting that is not valid JSON
        found = re.search(r'field "(\w+)"', str(exc))
        name = variable(found.group(1)) if found else "a setting"
        raise InvalidSettings(f"{name}: not valid JSON ({exc.__cause__ or exc})") from exc
