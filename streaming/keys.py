"""Redis key and channel names, all under one prefix, each carrying a Redis Cluster hash tag.

On Redis Cluster a key lives on the slot of its hash tag (the text between its first ``{`` and
``}``), and a script or a transaction may touch one slot only. So every key is built here with
one of two tags:

- a session's own tag, ``{<session id>}``: its lease, claim, output channel and replay log,
  input streams, resume record, history, frames and restart counter; a chat turn's request and
  a restart's claim (ids ``<session>_t<n>``, ``<session>_o<n>``, ``<id>.r<n>``) carry the tag of
  the session they belong to (``base_session``), so one session's keys share one slot while
  the sessions spread over all of them: ``omni:s:{rt_1_ab}:lease``, ``omni:s:{rt_1_ab}_t3:request``.
- the admission tag, ``{<prefix>}``: the queue and its events, the slot pool and holds, the
  worker and gateway registry and presence, the statistics, API keys, usage, quotas and
  per-client connection counts (``omni:{omni}:queue``). The admission scripts build some of
  these names themselves (a ticket's assignment, a slot's hold) from ``Keys.admission``.

On a single Redis or Sentinel the tags change nothing but the names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PART_OF_SESSION = re.compile(r"(?:_[to]\d+)?(?:\.r\d+)?$")


@dataclass(frozen=True, slots=True)
class Keys:
    """Builds every Redis key omniserve uses. ``prefix`` separates deployments sharing a Redis."""

    prefix: str = "omni"

    @property
    def admission(self) -> str:
        """What every admission and registry key starts with: the prefix and the admission
        hash tag (the Lua scripts that build such names take this as their ``prefix``)."""
        return f"{self.prefix}:{{{self.prefix}}}"

    def _session(self, any_id: str) -> str:
        """What the keys of a session, turn or claim id start with: the session's hash tag."""
        base = base_session(any_id)
        return f"{self.prefix}:s:{{{base}}}{any_id[len(base) :]}"

    # --- admission
    @property
    def queue(self) -> str:
        """ZSET ticket_id -> arrival sequence: the global FIFO."""
        return f"{self.admission}:queue"

    @property
    def queue_seq(self) -> str:
        return f"{self.admission}:queue:seq"

    @property
    def queue_events(self) -> str:
        """Pub/sub channel: something changed in the queue or the slot pool."""
        return f"{self.admission}:queue:events"

    @property
    def queue_info(self) -> str:
        """HASH ticket_id -> ``<mode>|<deadline>`` of a waiting ticket (Redis time; 0: none),
        for the wait estimates."""
        return f"{self.admission}:queue:info"

    @property
    def free_slots(self) -> str:
        """LIST of idle slot ids (``<worker_id>|<n>``)."""
        return f"{self.admission}:slots:free"

    @property
    def busy_slots(self) -> str:
        """SET of slot ids handed to a ticket and not yet released."""
        return f"{self.admission}:slots:busy"

    @property
    def running_slots(self) -> str:
        """HASH slot id -> ``<mode>|<deadline>|<dispatched at>`` (Redis time) of a slot handed
        out: what its session is expected to hold it for (the wait estimates)."""
        return f"{self.admission}:slots:running"

    def slot_hold(self, slot_id: str) -> str:
        """Set while a slot is handed out: by dispatch (short TTL), then renewed by its session."""
        return f"{self.admission}:hold:{slot_id}"

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
        return f"{self.admission}:assign:{ticket_id}"

    # --- liveness
    def gateway_alive(self, gateway_id: str) -> str:
        return f"{self.admission}:gw:{gateway_id}:alive"

    def worker_alive(self, worker_id: str) -> str:
        return f"{self.admission}:wk:{worker_id}:alive"

    @property
    def workers(self) -> str:
        """HASH worker_id -> JSON description (host, pid, backend, queue, slots)."""
        return f"{self.admission}:workers"

    # --- sessions
    def session_lease(self, session_id: str) -> str:
        return f"{self._session(session_id)}:lease"

    def session_claim(self, session_id: str) -> str:
        return f"{self._session(session_id)}:claim"

    def output_channel(self, session_id: str) -> str:
        return f"{self._session(session_id)}:out"

    def output_log(self, session_id: str) -> str:
        return f"{self._session(session_id)}:log"

    def input_audio(self, session_id: str) -> str:
        return f"{self._session(session_id)}:in:audio"

    def input_control(self, session_id: str) -> str:
        return f"{self._session(session_id)}:in:ctl"

    def session_resume(self, session_id: str) -> str:
        """HASH: the resume record (token hash, attached gateway, grace, init; streaming/resume)."""
        return f"{self._session(session_id)}:resume"

    def session_history(self, session_id: str) -> str:
        """STRING: the conversation so far (JSON list of role/text), for a failover's prompt."""
        return f"{self._session(session_id)}:history"

    def session_attempts(self, session_id: str) -> str:
        """INCR counter: a duplex session's restart attempts (failover, late resume, a start on
        another slot), or a chat turn's (``<turn id>``: its worker died before it started),
        shared by every gateway that restarts it, so each attempt's claim ``<sid>.r<n>`` is new."""
        return f"{self._session(session_id)}:attempts"

    def chat_frames(self, session_id: str) -> str:
        """STREAM: a chat session's numbered server frames (entry id ``<seq>-1``), for resume."""
        return f"{self._session(session_id)}:frames"

    def chat_turn_lease(self, session_id: str) -> str:
        """STRING: the connection running a chat session's turn now (TTL: it renews it)."""
        return f"{self._session(session_id)}:turn"

    def chat_request(self, turn_id: str) -> str:
        """STRING: one chat turn's request (messages, media), read once by its task."""
        return f"{self._session(turn_id)}:request"

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
        return f"{self.admission}:client:{address}:conns"

    # --- named API keys, usage and quotas (streaming/keystore.py, streaming/usage.py,
    # streaming/quotas.py)
    @property
    def api_keys(self) -> str:
        """HASH sha256 hex of a key -> its record (JSON: name, quotas, created): the named keys
        a gateway accepts, shared by all gateways."""
        return f"{self.admission}:apikeys"

    @property
    def api_key_names(self) -> str:
        """HASH key name -> JSON of that name's record, whatever its state (a revoked one too):
        the listing, and the name's current digest."""
        return f"{self.admission}:apikeys:names"

    def usage_hour(self, name: str, hour: int) -> str:
        """HASH figure -> total of one key name's usage in one UTC hour (``hour``: unix
        seconds // 3600)."""
        return f"{self.admission}:usage:{name}:h:{hour}"

    def usage_day(self, name: str, day: int) -> str:
        """HASH figure -> total of one key name's usage in one UTC day (unix seconds // 86400):
        what the session-minutes quota reads."""
        return f"{self.admission}:usage:{name}:d:{day}"

    @property
    def usage_names(self) -> str:
        """SET of the key names that have usage recorded."""
        return f"{self.admission}:usage:names"

    def key_sessions(self, name: str) -> str:
        """ZSET session id -> Redis time its hold lapses: one key name's open sessions, kept
        alive by their gateways (the concurrent-sessions quota)."""
        return f"{self.admission}:quota:{name}:sessions"

    # --- statistics
    @property
    def duration_stats(self) -> str:
        """HASH: moving averages of slot hold times for wait estimates, ``ema_s`` (all modes)
        and ``ema_s:<mode>``, and ``last_s``; what an operator set (the official admin API's ETA
        settings): ``base_s:<mode>`` (a mode's hold until one of its sessions has ended),
        ``alpha`` (the averages' weight of the latest hold) and ``official_eta`` (the settings
        as given, JSON)."""
        return f"{self.admission}:stats:duration"

    @property
    def load_stats(self) -> str:
        """HASH backend name -> seconds its last model load took (wait estimates while loading)."""
        return f"{self.admission}:stats:load_s"

    @property
    def worker_counters(self) -> str:
        """HASH of worker-side counters (e.g. ``backend_step_timeouts_total``), all workers."""
        return f"{self.admission}:stats:workers"

    def drain(self, node: str) -> str:
        """STRING: the worker node is draining; the value is the unix time by which its running
        sessions must end (set on SIGTERM and by ``omniserve drain``; cleared when it starts)."""
        return f"{self.admission}:drain:{node}"

    def node_stopping(self, node: str) -> str:
        """STRING: the worker node's Celery parent is stopping (a warm shutdown): a pool process
        it starts now exits instead of loading the backend (cleared when the node starts)."""
        return f"{self.admission}:stopping:{node}"

    def node_counters(self, node: str) -> str:
        """HASH of one worker node's Prometheus counters that outlive its pool processes
        (field ``<metric>|<label values>``; ``tasks/metrics.py``)."""
        return f"{self.admission}:stats:node:{node}"


def base_session(any_id: str) -> str:
    """The session a turn id (``<session>_t<n>``, ``<session>_o<n>``) or a restart's claim id
    (``<id>.r<n>``) belongs to; a session id itself is its own (generated ids have no such
    suffix: their random part is hex)."""
    return _PART_OF_SESSION.sub("", any_id, count=1) or any_id


def slot_worker(slot_id: str) -> str:
    """The worker id a slot id belongs to."""
    return slot_id.rsplit("|", 1)[0]


def ticket_gateway(ticket_id: str) -> str:
    """The gateway id a ticket id belongs to (``ticket_<gateway>_<n>``)."""
    return ticket_id.split("_")[1]


def worker_queue(worker_id: str) -> str:
    """The Celery queue of the worker node a worker id (``<node>#<pid>``) belongs to."""
    return "omni.w." + worker_id.rsplit("#", 1)[0]
