"""One typed settings object for every process (environment variables prefixed ``OMNISERVE_``)."""

from __future__ import annotations

import hashlib
import hmac
import re
from functools import lru_cache
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    IPvAnyNetwork,
    SecretStr,
    ValidationError,
    field_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from omnicore.redact import redact_url

BROKER_SCHEMES = ("redis", "rediss", "redis+sentinel", "amqp", "amqps")
"""The broker URL spellings (``streaming/broker_url.py`` reads each)."""


class ApiKeyDuration(BaseModel):
    """One API key's own duration limits (``api_key_durations``); a mode left out keeps the
    deployment's limit."""

    model_config = ConfigDict(extra="forbid")

    key: SecretStr
    audio_s: float | None = Field(None, gt=0)
    video_s: float | None = Field(None, gt=0)
    chat_s: float | None = Field(None, gt=0)

    def limit(self, public_mode: str) -> float | None:
        """This key's limit for a public mode, or None (the deployment's applies)."""
        return {"audio": self.audio_s, "video": self.video_s, "chat": self.chat_s}.get(public_mode)


class Settings(BaseSettings):
    """Configuration of the gateway, the workers and the CLI.

    Every field reads ``OMNISERVE_<FIELD>`` (for example ``OMNISERVE_GATEWAY_PORT``); the Redis URL
    also reads the conventional ``REDIS_URL``. Each field's description is its entry in
    docs/CONFIGURATION.md, and each ``# --- Title`` comment starts a section there: after a
    change, ``python -m omnicore.settings_doc`` writes the document again.
    """

    model_config = SettingsConfigDict(env_prefix="OMNISERVE_", extra="ignore")

    # --- Shared state
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("OMNISERVE_REDIS_URL", "REDIS_URL"),
        description="The shared Redis (queue, registry, streams), and the Celery broker unless "
        "`OMNISERVE_BROKER_URL` names another; "
        "`redis+sentinel://…` names the primary that Redis Sentinel watches, "
        "`redis+cluster://HOST:PORT,HOST:PORT/` a Redis Cluster (then set `broker_url`) "
        "([Redis requirements](OPERATIONS.md#redis-requirements)). The gateway's commands time "
        "out after 5 s; its connections, the workers' and their Celery consumers' are dropped "
        "and reopened when nothing is acknowledged for 10 s (a dead host, a network dropping "
        "packets). redis-py options in the URL win (`?socket_timeout=2`).",
    )
    broker_url: str | None = Field(
        None,
        description="Celery's broker (task messages and task events) when it is not the shared "
        "Redis: `redis://…`, `redis+sentinel://…` (spelled as for `OMNISERVE_REDIS_URL`) or "
        "RabbitMQ, `amqp://USER:PASSWORD@HOST:5672/VHOST` (`amqps://` for TLS); unset: the "
        "shared Redis. A broker that does not answer within 5 s stops the gateway, a worker "
        "or `omniserve up` at start, saying so (exit 1). Required when the shared state is a "
        "Redis Cluster, which Celery cannot use ([Broker](OPERATIONS.md#broker)).",
    )
    key_prefix: str = Field(
        "omni",
        description="Prefix of every omniserve Redis key and channel (separates deployments "
        "sharing a Redis; Celery's own queue keys are not prefixed).",
    )
    redis_max_connections: int = Field(
        256,
        description="Size of each gateway's blocking Redis connection pool (commands wait for a "
        "free connection). Besides it, each gateway holds one pub/sub connection and one input "
        "link (`omniserve-input-<gateway>` in `CLIENT LIST`).",
    )

    # --- Gateway
    gateway_host: str = Field(
        "127.0.0.1", description="Gateway bind address (`0.0.0.0` in containers)."
    )
    gateway_port: int = Field(8006, description="Gateway port.")
    api_keys: list[SecretStr] = Field(
        default_factory=list,
        description="Accepted API keys, a JSON list (`Authorization: Bearer` or `?api_key=`); "
        "empty: no authentication.",
    )
    max_queue: int = Field(
        1000,
        description="Waiting tickets (beyond idle slots) before `queue_full`; `0`: no queue, "
        "`worker_busy` when no slot is idle.",
    )
    queue_update_interval_s: float = Field(
        3.0,
        description="`session.queue_update` is sent on every position change and at least "
        "this often.",
    )
    chat_duration_s: float = Field(
        600.0, description="Total duration of a `mode=chat` connection (waiting included)."
    )
    video_duration_s: float = Field(
        300.0, description="Total duration of a `mode=video` session (waiting included)."
    )
    audio_duration_s: float = Field(
        600.0, description="Total duration of a `mode=audio` session (waiting included)."
    )
    api_key_durations: list[ApiKeyDuration] = Field(
        default_factory=list,
        description="Duration limits of particular API keys, a JSON list of "
        '`{"key": "...", "audio_s": 1800, "video_s": 900, "chat_s": 600}` (each mode optional: '
        "one left out keeps the limit above). A client presenting such a key (as it presents "
        "any key) gets these limits, counted from connect; the key is accepted only if "
        "`OMNISERVE_API_KEYS` accepts it.",
    )
    require_api_key: bool = Field(
        False,
        description="Refuse every client without a valid key even when no key is configured "
        "(neither `OMNISERVE_API_KEYS` nor a named key): set it with named keys (`omniserve "
        "keys`), so that a Redis that lost them refuses everyone instead of letting everyone in.",
    )
    key_cache_s: float = Field(
        0.5,
        ge=0,
        description="How long a gateway trusts its last look-up of a named API key "
        "(`omniserve keys`): a revoked or rotated key is refused on every gateway within this.",
    )
    usage_flush_s: float = Field(
        10.0,
        gt=0,
        description="A gateway adds its live sessions' usage to the per-key aggregates in Redis "
        "this often (and when a connection ends): what a gateway that dies can lose of it.",
    )
    usage_retention_days: int = Field(
        400,
        gt=0,
        description="Per-key hourly and daily usage aggregates expire after this many days.",
    )
    legacy_chat_timeout_s: float = Field(
        300.0,
        description="Deadline of one `/ws/chat` or `POST /api/chat` request, from connect "
        "(waiting included).",
    )
    init_timeout_s: float = Field(
        30.0,
        description="A duplex backend must answer `session.init` within this, else `error` "
        "`backend_error`, `session.closed` `backend_error`, close 1011.",
    )
    task_start_timeout_s: float = Field(
        15.0,
        description="A worker must start a submitted session or turn within this, else "
        "`worker_connect_failed`. When the slot's worker process is gone before it started "
        "(seen within a 0.5 s liveness tick), the session or turn goes to another slot instead "
        "(`failover_wait_s`).",
    )
    relay_look_s: float = Field(
        5.0,
        gt=0,
        description="A duplex session's relay loop sleeps until an event, a change it must act "
        "on (the client's close or departure, a replaced connection, a lapsed worker lease) or "
        "its next deadline wakes it; it also looks at least this often, a backstop that nothing "
        "should need (the test suite sets it high to prove that).",
    )
    max_frame_bytes: int = Field(
        128 * 1024 * 1024,
        description="Largest WebSocket message the gateway accepts (uvicorn `ws_max_size`; the "
        "reference server and its SDK allow 128 MiB); a larger one gets an `error` event and "
        "close 1009.",
    )
    ws_deflate: bool = Field(
        False,
        description="Negotiate permessage-deflate. Off because compressing base64 audio costs "
        "about half the gateway's CPU for little gain ([BENCHMARKS.md](BENCHMARKS.md)).",
    )
    max_video_frames: int = Field(
        8, description="Video frames kept per `input.append` (extra frames are dropped)."
    )
    max_chat_turns_queued: int = Field(
        4,
        ge=1,
        description="Chat mode: turns that may wait behind the running one on a connection; "
        "more get `turn_queue_full`.",
    )

    # --- Dead and stuck clients
    client_idle_timeout_s: float = Field(
        6.0,
        ge=0,
        description="A duplex client holding a slot that sends nothing this long is ended "
        "(`client_idle`); `0`: off ([PROTOCOL.md](PROTOCOL.md)).",
    )
    ws_ping_interval_s: float = Field(
        5.0, gt=0, description="The gateway pings every WebSocket this often."
    )
    ws_ping_timeout_s: float = Field(
        4.0,
        gt=0,
        description="The gateway closes a WebSocket that has not answered a ping within this "
        "(a frozen client's slot is free within interval + timeout).",
    )
    output_max_pending_events: int = Field(
        1000,
        ge=1,
        description="Output events waiting on the gateway for a client that does not read; "
        "beyond it the session ends with `output_backpressure`.",
    )
    output_max_pending_bytes: int = Field(
        8 * 1024 * 1024,
        ge=1024,
        description="The same cap in bytes (8 MiB).",
    )

    # --- Recordings
    recordings: bool = Field(
        False,
        description="Record every session of every endpoint and mode; `omniserve up` turns it "
        "on ([Recordings](OPERATIONS.md#recordings)).",
    )
    recordings_url: str = Field(
        ".omniserve/recordings",
        description="Where: a local directory, `file://…`, or any fsspec URL "
        "(`s3://bucket/prefix` with `s3fs` installed, `gs://` with `gcsfs`, …). One it cannot "
        "open stops the gateway at its start, as an invalid setting. Every gateway of a "
        "deployment writes to the same store.",
    )
    recordings_spool_dir: str | None = Field(
        None,
        description="Local folder where a remote store's recordings are written while their "
        "sessions run; unset: `<tmp>/omniserve-recordings` (a local store spools in its own "
        "`.incoming/`).",
    )
    recordings_max_age_s: float = Field(
        30 * 86400.0,
        ge=0,
        description="Recordings that ended longer ago are deleted (30 days); `0`: kept.",
    )
    recordings_max_bytes: int = Field(
        50 * 1024**3,
        ge=0,
        description="Above this total the oldest recordings are deleted (50 GiB); `0`: no cap.",
    )
    recordings_prune_interval_s: float = Field(
        60.0,
        gt=0,
        description="How often each gateway applies the two retention rules above.",
    )
    recordings_max_pending: int = Field(
        1024,
        ge=1,
        description="Frames queued for the background writer per gateway (an audio frame holds "
        "about 100 KB, so this bounds the queue's memory near 100 MB); beyond it media is "
        "dropped (counted in the recording's `dropped`), never waited for.",
    )

    # --- Resume and failover
    resume_grace_s: float = Field(
        30.0,
        ge=0,
        description="A client (duplex or chat) whose connection drops may resume its session "
        "(`session.resume`, any gateway) this long; `0`: off "
        '([PROTOCOL.md](PROTOCOL.md), "Resume and failover").',
    )
    resume_slot_hold_s: float = Field(
        5.0,
        ge=0,
        description="A detached session keeps its worker slot this long; a later resume "
        "restarts it on a slot with the conversation so far.",
    )
    failover_wait_s: float = Field(
        10.0,
        ge=0,
        description="A duplex session whose worker died waits this long at the head of the "
        "queue for a new worker (`session.recovering`, `session.recovered`), else ends with "
        "`backend_error`; a session or chat turn whose worker died before starting it waits as "
        "long for another slot, else `worker_connect_failed`; `0`: off.",
    )

    # --- Long calls
    rollover: bool = Field(
        True,
        description="A duplex session whose KV cache passes `OMNISERVE_ROLLOVER_KV_TOKENS` "
        "goes on in a fresh model session primed with the conversation so far "
        "(`session.rollover`, [PROTOCOL.md](PROTOCOL.md#long-calls-rollover-and-expiry)); "
        "`false`: it ends with `context_full` when the context is full.",
    )
    rollover_kv_tokens: int = Field(
        0,
        ge=0,
        description="The KV cache length at which a session rolls over, between two steps "
        "(while the model speaks, it waits for the reply's end up to halfway to the backend's "
        "context limit); `0`: three quarters of the backend's context (6144 of 8192).",
    )
    rollover_prime_tokens: int = Field(
        0,
        ge=0,
        description="How much of the conversation (in the backend's tokens) a rollover's "
        "prime carries besides the system prompt and the voice: the newest turns that fit; "
        "`0`: a quarter of the rollover budget.",
    )
    expiring_notice_s: float = Field(
        30.0,
        ge=0,
        description='A duplex client that opted in (`extensions: ["session.expiring"]`) '
        "gets `session.expiring` this long before its duration limit, or before its context "
        "is estimated full when rollover is off.",
    )

    # --- The official demo's frontend
    static_dir: str | None = Field(
        None,
        description="A frontend directory (the official demo's `static/`) served at `/`, "
        "`/turnbased`, `/omni`, `/audio_duplex`, `/realtime`, `/admin` and `/static/…`; "
        "omniserve's own client then answers at `/web/` ([FRONTEND.md](FRONTEND.md)).",
    )
    default_voice: str | None = Field(
        None,
        description="A voice name in `OMNISERVE_VOICES_DIR`: the official pages' default "
        "reference voice (`GET /api/default_ref_audio`); unset: the directory's first voice "
        "file by name.",
    )
    presets_dir: str | None = Field(
        None,
        description="The official demo's `assets/presets` (`<page>/*.yaml`), served by "
        "`GET /api/presets`.",
    )
    playback_delay_ms: int = Field(
        200,
        ge=0,
        le=2000,
        description="`GET /api/frontend_defaults`: how long the official pages buffer speech "
        "before playing it.",
    )
    ref_audio_max_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        description="Largest audio file (decoded from its base64) that `POST "
        "/api/assets/ref_audio` takes into `OMNISERVE_VOICES_DIR`.",
    )
    ref_audio_max_s: float = Field(
        120.0,
        gt=0,
        description="Longest reference voice, in seconds, that `POST /api/assets/ref_audio` takes.",
    )

    # --- Security
    admin_token: SecretStr | None = Field(
        None,
        description="Bearer token for `/metrics`, `/v1/workers`, `/v1/admin/*`, "
        "`/v1/recordings*` and the official admin API ([FRONTEND.md](FRONTEND.md)); unset: "
        "those are open on a loopback bind, 403 on any other ([SECURITY.md](SECURITY.md)).",
    )
    voices_dir: str | None = Field(
        None,
        description="The directory of reference voices a client may name in "
        "`tts.ref_audio_path` (relative names only); unset: the field is refused.",
    )
    trusted_proxies: list[IPvAnyNetwork] = Field(
        default_factory=list,
        description="JSON list of networks (CIDRs; a bare address is a /32) whose "
        "`X-Forwarded-For` is believed (your TLS proxy or ingress); others' is ignored.",
    )
    allowed_origins: list[str] = Field(
        default_factory=list,
        description='Web origins (`["https://app.example.com"]`; `["*"]`: any) whose pages '
        "may connect, besides the gateway's own; requests without `Origin` are not browsers "
        "and are not checked.",
    )
    max_connections_per_client: int = Field(
        0,
        ge=0,
        description="Concurrent WebSockets per client address, counted over all gateways; "
        "`0`: no limit.",
    )
    gateway_max_connections: int = Field(
        0,
        ge=0,
        description="Client WebSockets one gateway process holds (both endpoints); more get "
        "`service_unavailable` (1013) and `/readyz` answers 503. `0`: what the process's "
        "open-files limit leaves after `redis_max_connections` and a reserve of 64 (the gateway "
        "raises its soft open-files limit to the hard one at start and logs both figures: "
        "`at most N client connections (open-files limit L)`).",
    )

    # --- Leases and liveness
    lease_ttl_s: float = Field(
        1.5,
        description="TTL of worker alive keys and session leases. With the gateway's 0.5 s "
        "lease check, a dead worker's clients are told within about `lease_ttl_s` + 0.5 s "
        "(after a stall of Redis itself, leases settle this long before a gone one is "
        "believed).",
    )
    gateway_lease_ttl_s: float = Field(
        6.0,
        description="TTL of gateway alive keys (longer: a busy gateway event loop must not "
        "lose its clients' tickets).",
    )
    heartbeat_interval_s: float = Field(
        0.5,
        description="How often gateways and workers renew their leases (and rewrite what they "
        "own in Redis).",
    )
    redis_outage_grace_s: float = Field(
        8.0,
        ge=0,
        description="How long a session carries on while Redis cannot be reached (a Sentinel "
        "failover, a restart): the worker holds its output and retries its reads and lease "
        "renewals, the gateway reads leases as held and keeps its client. Leases are judged "
        "again once Redis has answered for `lease_ttl_s`. Longer outages end the sessions, "
        "each with an error and a reason. `0`: a lost connection ends them at once.",
    )
    capacity_wait_s: float = Field(
        300.0,
        description="A client queued while workers are registered but none is ready (models "
        "loading) gets `service_unavailable` after this; `0`: waits without limit.",
    )

    # --- Worker
    backend: str = Field(
        "scripted",
        description="Worker backend: `scripted`, `pocket`, `minicpmo`, `llama_omni`, or `auto` "
        "(pocket when installed, else scripted with a note saying why; the default of "
        "`omniserve up`) ([BACKENDS.md](BACKENDS.md)).",
    )
    model_path: str | None = Field(None, description="Local model directory (`minicpmo`).")
    backend_url: str | None = Field(None, description="`llama-omni-server` URL (`llama_omni`).")
    device: str = Field("cuda", description="Torch device (`minicpmo`).")
    backend_options: dict[str, Any] = Field(
        default_factory=dict,
        description="JSON object of extra backend constructor options "
        "([BACKENDS.md](BACKENDS.md)).",
    )
    worker_slots: int = Field(
        1,
        ge=1,
        description="Concurrent sessions of one worker; more than 1 runs a threads pool (meant "
        "for the scripted backend).",
    )
    worker_name: str | None = Field(
        None,
        description="Celery node name; the worker consumes queue `omni.w.<name>`. Must be "
        "unique per running worker. Unset: `omni-<random>@<hostname>`.",
    )
    input_max_pending: int = Field(
        2,
        description="Seconds of input audio buffered per session (that many 1 s chunks, or as "
        "many shorter ones as make it, at most 256); older chunks are dropped silently.",
    )
    output_log_maxlen: int = Field(
        64,
        ge=1,
        description="Most events a session's output replay log keeps (a chat session's frame "
        "log: approximate trim). A duplex session's log keeps the newest events within all "
        "three bounds: this, `output_log_max_bytes` and `output_log_max_s`.",
    )
    output_log_max_bytes: int = Field(
        320 * 1024,
        ge=1024,
        description="Most bytes of events a duplex session's replay log keeps (speech as raw "
        "24 kHz float32: 96,000 bytes a second, so 320 KiB is about 3.4 s of speech); what a "
        "resumed client missed beyond it is told as `session.resync_required`. The newest "
        "event always stays.",
    )
    output_log_max_s: float = Field(
        30.0,
        gt=0,
        description="Most seconds a duplex session's replay log keeps an event (the newest "
        "always stays).",
    )
    output_write: Literal["script", "pipeline"] = Field(
        "script",
        description="How a worker publishes and logs its output: `script`, one Lua call, each "
        "event's bytes sent to Redis once; `pipeline`, a `PUBLISH` and an `XADD`, sent twice "
        "(twice the bytes into Redis, but on Redis 7 about half its CPU per audio event and "
        "~0.3 ms less per audio delta: docs/BENCHMARKS.md).",
    )
    session_ttl_s: float = Field(
        900.0,
        description="Expiry of every per-session key (a safety net; keys are deleted at "
        "session end).",
    )
    model_load_timeout_s: float = Field(
        900.0,
        description="How long a (re)started prefork worker process may take to load its model "
        "before Celery kills it (`worker_proc_alive_timeout`); also how long `omniserve up` "
        "waits for ready.",
    )
    step_timeout_s: float = Field(
        30.0,
        description="Per-step watchdog: a backend call (duplex prepare or step, one chat event) "
        "running longer ends its session with `backend_error` (chat turn: `inference_error`), "
        "and the slot is not reused until the backend is healthy again; `0`: off.",
    )
    drain_grace_s: float = Field(
        600.0,
        ge=0,
        description="On SIGTERM (or `omniserve drain`), running sessions of gateways and "
        "workers may finish this long before `server_shutdown`; `omniserve up` sets 0 for its "
        "children unless this is set ([Shutdown and drain](OPERATIONS.md#shutdown-and-drain)).",
    )
    worker_metrics_port: int = Field(
        9108,
        description="Each worker process's Prometheus `/metrics` port; `0`: off. `omniserve up` "
        "gives worker *i* this port + *i*, and says which worker runs without metrics because "
        "its port is taken.",
    )
    worker_metrics_host: str = Field(
        "0.0.0.0",
        description="Address the worker metrics endpoint binds, for scrapes from other hosts "
        "(`omniserve up`, when this is not set: the gateway's host, `127.0.0.1` unless "
        "`--host`).",
    )

    # --- Scripted backend (deterministic, model-free)
    scripted_step_delay_s: float = Field(0.0, description="Time per duplex step.")
    scripted_token_delay_s: float = Field(0.01, description="Time per chat token.")
    scripted_tokens_per_step: int = Field(16, description="Tokens per duplex step.")
    scripted_reply: str = Field("Hello from the scripted backend.", description="The answer.")

    # --- `omniserve up`
    flower: bool = Field(
        False, description="`omniserve up` also starts Flower (same as `--flower`)."
    )
    flower_port: int = Field(5555, description="Flower's port for `omniserve up`.")
    flower_basic_auth: SecretStr | None = Field(
        None,
        description="`user:password` for the Flower of `omniserve up`; unset: user `omniserve` "
        "and a random password per run, printed in the banner.",
    )
    up_restart_delay_s: float = Field(
        1.0,
        ge=0,
        description="`omniserve up` starts a part that exited after `ready` again after this "
        "long, doubled per restart in a row (at most 30 s).",
    )
    up_restart_limit: int = Field(
        5,
        ge=0,
        description="Restarts in a row (each ending within 60 s of its start) after which "
        "`omniserve up` stops everything and exits 1; `0`: no restarts, any exit stops it.",
    )
    up_log_dir: str = Field(
        ".omniserve/logs",
        description="Where `omniserve up` writes each part's output (`gateway.log`, "
        "`worker-N.log`, `flower.log`, `redis.log`; emptied at each start); only warnings and "
        "errors reach its console ([Logs](OPERATIONS.md#logs)).",
    )

    # --- Logs and the process
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Log level of gateways, workers and Celery."
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description="`json`: one JSON object per line for log shippers (`ts`, `level`, "
        "`logger`, `pid`, `msg`, `session_id`, extra fields).",
    )
    gc_freeze: bool = Field(
        True,
        description="A gateway (once started) and a worker (once its backend loaded) freeze "
        "their long-lived objects out of the garbage collector's reach, so a full collection "
        "does not stall every session for tens to hundreds of milliseconds "
        "(`omniserve_gc_pause_seconds`; [BENCHMARKS.md](BENCHMARKS.md)).",
    )

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

    @field_validator("broker_url")
    @classmethod
    def _broker(cls, value: str | None) -> str | None:
        """Empty is unset; otherwise one of the spellings ``streaming/broker_url.py`` takes."""
        if value is None or not value.strip():
            return None
        scheme = urlsplit(value).scheme
        if scheme not in BROKER_SCHEMES:
            taken = ", ".join(f"{s}://" for s in BROKER_SCHEMES)
            raise ValueError(f"{scheme or '(no scheme)'}:// is not a broker (take {taken})")
        return value.strip()

    @property
    def broker(self) -> str:
        """The broker URL in use: ``broker_url``, else the shared Redis's."""
        return self.broker_url or self.redis_url

    @property
    def separate_broker(self) -> bool:
        """Whether the broker is not the shared Redis (its own start-up check, its own
        connection for task messages)."""
        return self.broker_url is not None and self.broker_url != self.redis_url

    def __repr_args__(self) -> Any:
        """The Redis and broker URLs without their passwords: a settings object printed or
        logged must not show them (API keys and tokens are SecretStr already)."""
        for name, value in super().__repr_args__():
            secret = name in ("redis_url", "broker_url") and value is not None
            yield name, redact_url(value) if secret else value

    def secret_values(self) -> list[str]:
        """Every configured secret in clear (API keys, admin token, Redis password): the log
        formatter replaces them wherever they appear."""
        out = [k.get_secret_value() for k in self.api_keys]
        out += [d.key.get_secret_value() for d in self.api_key_durations]
        if self.admin_token is not None:
            out.append(self.admin_token.get_secret_value())
        if self.flower_basic_auth is not None:
            out.append(self.flower_basic_auth.get_secret_value().partition(":")[2])
        for url in (self.redis_url, self.broker_url or ""):
            try:
                password = urlsplit(url).password
            except ValueError:
                password = None
            if password:
                out.append(password)
        return [s for s in out if s]

    def duration_limit(self, public_mode: str, api_key: str | None = None) -> float:
        """Total session duration allowed for a public mode (chat, video, audio), for a client
        that presented ``api_key`` (``api_key_durations``)."""
        if api_key:
            given = hashlib.sha256(api_key.encode()).digest()
            for entry in self.api_key_durations:
                own = hashlib.sha256(entry.key.get_secret_value().encode()).digest()
                limit = entry.limit(public_mode)
                if hmac.compare_digest(given, own) and limit is not None:
                    return limit
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


def environment_variables(field: str) -> list[str]:
    """The environment variables a settings field is read from, the one to set first: its
    aliases where it has them (``REDIS_URL``), else ``OMNISERVE_<FIELD>``."""
    info = Settings.model_fields.get(field)
    if info is not None and isinstance(info.validation_alias, AliasChoices):
        return [str(choice) for choice in info.validation_alias.choices]
    return [f"OMNISERVE_{field.upper()}"]


def variable(field: str) -> str:
    """The environment variable(s) a settings field is read from, as an error message names
    them."""
    first, *others = environment_variables(field)
    return f"{first} (or {', '.join(others)})" if others else first


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
