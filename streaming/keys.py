"""Redis key and channel names, all under one prefix."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Keys:
    """Builds every Redis key omniserve uses. ``prefix`` separates deployments sharing a Redis."""

    prefix: str = "omni"

    # --- admission
    @property
    def queue(self) -> str:
        """ZSET ticket_id -> arrival sequence: the global FIFO."""
        return f"{self.prefix}:queue"

    @property
    def queue_seq(self) -> str:
        return f"{self.prefix}:queue:seq"

    @property
    def queue_events(self) -> str:
        """Pub/sub channel: something changed in the queue or the slot pool."""
        return f"{self.prefix}:queue:events"

    @property
    def queue_info(self) -> str:
        """HASH ticket_id -> ``<mode>|<deadline>`` of a waiting ticket (Redis time; 0: none),
        for the wait estimates."""
        return f"{self.prefix}:queue:info"

    @property
    def free_slots(self) -> str:
        """LIST of idle slot ids (``<worker_id>|<n>``)."""
        return f"{self.prefix}:slots:free"

    @property
    def busy_slots(self) -> str:
        """SET of slot ids handed to a ticket and not yet released."""
        return f"{self.prefix}:slots:busy"

    @property
    def running_slots(self) -> str:
        """HASH slot id -> ``<mode>|<deadline>|<dispatched at>`` (Redis time) of a slot handed
        out: what its session is expected to hold it for (the wait estimates)."""
        return f"{self.prefix}:slots:running"

    def slot_hold(self, slot_id: str) -> str:
        """Set while a slot is handed out: by dispatch (short TTL), then renewed by its session."""
        return f"{self.prefix}:hold:{slot_id}"

    def release_keys(self, slot_id: str) -> list[str]:
        """The keys of the ``RELEASE`` script for one slot, in its order."""
        return [
            self.busy_slots,
            self.free_slots,
            self.worker_alive(slot_worker(slot_id)),
            self.queue_events,
            self.running_slots,
            self.duration_stats,
        ]

    def assignment(self, ticket_id: str) -> str:
        return f"{self.prefix}:assign:{ticket_id}"

    # --- liveness
    def gateway_alive(self, gateway_id: str) -> str:
        return f"{self.prefix}:gw:{gateway_id}:alive"

    def worker_alive(self, worker_id: str) -> str:
        return f"{self.prefix}:wk:{worker_id}:alive"

    @property
    def workers(self) -> str:
        """HASH worker_id -> JSON description (host, pid, backend, queue, slots)."""
        return f"{self.prefix}:workers"

    # --- sessions
    def session_lease(self, session_id: str) -> str:
        return f"{self.prefix}:s:{session_id}:lease"

    def session_claim(self, session_id: str) -> str:
        return f"{self.prefix}:s:{session_id}:claim"

    def output_channel(self, session_id: str) -> str:
        return f"{self.prefix}:s:{session_id}:out"

    def output_log(self, session_id: str) -> str:
        return f"{self.prefix}:s:{session_id}:log"

    def input_audio(self, session_id: str) -> str:
        return f"{self.prefix}:s:{session_id}:in:audio"

    def input_control(self, session_id: str) -> str:
        return f"{self.prefix}:s:{session_id}:in:ctl"

    def session_resume(self, session_id: str) -> str:
        """HASH: the resume record (token hash, attached gateway, grace, init; streaming/resume)."""
        return f"{self.prefix}:s:{session_id}:resume"

    def session_history(self, session_id: str) -> str:
        """STRING: the conversation so far (JSON list of role/text), for a failover's prompt."""
        return f"{self.prefix}:s:{session_id}:history"

    def session_attempts(self, session_id: str) -> str:
        """INCR counter: a duplex session's restart attempts (failover, late resume, a start on
        another slot), or a chat turn's (``<turn id>``: its worker died before it started),
        shared by every gateway that restarts it, so each attempt's claim ``<sid>.r<n>`` is new."""
        return f"{self.prefix}:s:{session_id}:attempts"

    def chat_frames(self, session_id: str) -> str:
        """STREAM: a chat session's numbered server frames (entry id ``<seq>-1``), for resume."""
        return f"{self.prefix}:s:{session_id}:frames"

    def chat_turn_lease(self, session_id: str) -> str:
        """STRING: the connection running a chat session's turn now (TTL: it renews it)."""
        return f"{self.prefix}:s:{session_id}:turn"

    def chat_request(self, turn_id: str) -> str:
        """STRING: one chat turn's request (messages, media), read once by its task."""
        return f"{self.prefix}:s:{turn_id}:request"

    def session_keys(self, session_id: str) -> list[str]:
        """Every key a session owns (for cleanup)."""
        return [
            self.session_lease(session_id),
            self.output_log(session_id),
            self.input_audio(session_id),
            self.input_control(session_id),
        ]

    # --- per-client limits
    def client_connections(self, address: str) -> str:
        """HASH gateway_id -> open connections from one client address (streaming/connections)."""
        return f"{self.prefix}:client:{address}:conns"

    # --- named API keys, usage and quotas (streaming/keystore.py, streaming/usage.py,
    # streaming/quotas.py)
    @property
    def api_keys(self) -> str:
        """HASH sha256 hex of a key -> its record (JSON: name, quotas, created): the named keys
        a gateway accepts, shared by all gateways."""
        return f"{self.prefix}:apikeys"

    @property
    def api_key_names(self) -> str:
        """HASH key name -> JSON of that name's record, whatever its state (a revoked one too):
        the listing, and the name's current digest."""
        return f"{self.prefix}:apikeys:names"

    def usage_hour(self, name: str, hour: int) -> str:
        """HASH figure -> total of one key name's usage in one UTC hour (``hour``: unix
        seconds // 3600)."""
        return f"{self.prefix}:usage:{name}:h:{hour}"

    def usage_day(self, name: str, day: int) -> str:
        """HASH figure -> total of one key name's usage in one UTC day (unix seconds // 86400):
        what the session-minutes quota reads."""
        return f"{self.prefix}:usage:{name}:d:{day}"

    @property
    def usage_names(self) -> str:
        """SET of the key names that have usage recorded."""
        return f"{self.prefix}:usage:names"

    def key_sessions(self, name: str) -> str:
        """ZSET session id -> Redis time its hold lapses: one key name's open sessions, kept
        alive by their gateways (the concurrent-sessions quota)."""
        return f"{self.prefix}:quota:{name}:sessions"

    # --- statistics
    @property
    def duration_stats(self) -> str:
        """HASH: moving averages of slot hold times for wait estimates, ``ema_s`` (all modes)
        and ``ema_s:<mode>``, and ``last_s``; what an operator set (the official admin API's ETA
        settings): ``base_s:<mode>`` (a mode's hold until one of its sessions has ended),
        ``alpha`` (the averages' weight of the latest hold) and ``official_eta`` (the settings
        as given, JSON)."""
        return f"{self.prefix}:stats:duration"

    @property
    def load_stats(self) -> str:
        """HASH backend name -> seconds its last model load took (wait estimates while loading)."""
        return f"{self.prefix}:stats:load_s"

    @property
    def worker_counters(self) -> str:
        """HASH of worker-side counters (e.g. ``backend_step_timeouts_total``), all workers."""
        return f"{self.prefix}:stats:workers"

    def drain(self, node: str) -> str:
        """STRING: the worker node is draining; the value is the unix time by which its running
        sessions must end (set on SIGTERM and by ``omniserve drain``; cleared when it starts)."""
        return f"{self.prefix}:drain:{node}"

    def node_stopping(self, node: str) -> str:
        """STRING: the worker node's Celery parent is stopping (a warm shutdown): a pool process
        it starts now exits instead of loading the backend (cleared when the node starts)."""
        return f"{self.prefix}:stopping:{node}"

    def node_counters(self, node: str) -> str:
        """HASH of one worker node's Prometheus counters that outlive its pool processes
        (field ``<metric>|<label values>``; ``tasks/metrics.py``)."""
        return f"{self.prefix}:stats:node:{node}"


def slot_worker(slot_id: str) -> str:
    """The worker id a slot id belongs to."""
    return slot_id.rsplit("|", 1)[0]


def ticket_gateway(ticket_id: str) -> str:
    """The gateway id a ticket id belongs to (``ticket_<gateway>_<n>``)."""
    return ticket_id.split("_")[1]


def worker_queue(worker_id: str) -> str:
    """The Celery queue of the worker node a worker id (``<node>#<pid>``) belongs to."""
    return "omni.w." + worker_id.rsplit("#", 1)[0]
