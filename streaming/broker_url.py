"""Where Celery's broker is: the data plane's Redis (the default), another Redis, the primary
that Redis Sentinel names, or RabbitMQ.

Why a broker of its own: the broker carries only task messages (one per session or chat turn)
and task events, while the data plane carries every session's audio; a data plane that kombu
cannot use (Redis Cluster: kombu's Redis transport has no cluster support) or that should not
carry Celery's traffic needs the broker elsewhere, and RabbitMQ is Celery's production broker.

``OMNISERVE_BROKER_URL`` spellings:

- unset: the data plane's own URL (``OMNISERVE_REDIS_URL``); the gateway then pushes a task and
  the keys it reads in one Redis transaction (``api/gateway/task_submit.py``);
- ``redis://`` / ``rediss://``: another Redis (a task's keys are written to the data plane
  first, then its message is pushed onto the broker's list);
- ``redis+sentinel://…``: as the data plane spells it (``streaming/redis_url.py``), given to
  kombu in its own form;
- ``amqp://USER:PASSWORD@HOST[:PORT]/VHOST`` / ``amqps://``: RabbitMQ through py-amqp.

RabbitMQ and hour-long tasks: a worker acknowledges each task as it takes it
(``task_acks_late=False``, ``tasks/celery_app.py``: a session must never run twice), so no
delivery stays unacknowledged while a session runs, and RabbitMQ's ``consumer_timeout`` (30 min
by default, which closes the channel of a consumer holding an unacknowledged delivery longer)
never ends one. Prefetch is one task per slot; the workers send AMQP heartbeats
(``AMQP_HEARTBEAT_S``) so a broker that went away is noticed within two of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from streaming.redis_connection import TCP_OPTIONS
from streaming.redis_url import celery_broker, sentinel_target, sync_client

BrokerKind = Literal["redis", "sentinel", "amqp"]

KINDS: dict[str, BrokerKind] = {
    "redis": "redis",
    "rediss": "redis",
    "redis+sentinel": "sentinel",
    "amqp": "amqp",
    "amqps": "amqp",
}
AMQP_PORTS = {"amqp": 5672, "amqps": 5671}
AMQP_HEARTBEAT_S = 30  # a worker's heartbeat to RabbitMQ; a dead peer is found in two of them
CHECK_TIMEOUT_S = 5.0  # how long a start-up check waits for the broker to answer


@dataclass(frozen=True)
class BrokerTarget:
    """A broker URL, parsed: what kombu is given for it."""

    url: str  # as configured
    kind: BrokerKind
    kombu_url: str  # the URL kombu takes (a Sentinel URL in kombu's own spelling)
    transport_options: dict[str, Any] = field(default_factory=dict)  # kombu's, for this kind


def broker_target(url: str) -> BrokerTarget:
    """The broker ``url`` names; ``ValueError`` (saying which spellings are taken) otherwise."""
    parts = urlsplit(url)
    kind = KINDS.get(parts.scheme)
    if kind is None:
        taken = ", ".join(f"{scheme}://" for scheme in KINDS)
        why = f"{parts.scheme or '(no scheme)'}:// is not a broker (take {taken})"
        if parts.scheme.startswith("redis+cluster"):
            why += ": Celery cannot use a Redis Cluster, name a broker of its own"
        raise ValueError(why)
    if kind == "sentinel":
        sentinel_target(url)  # malformed: its own ValueError
        kombu_url, options = celery_broker(url)
        return BrokerTarget(url, kind, kombu_url, options)
    try:
        parts.port  # noqa: B018 - a port that is not a number raises here
    except ValueError as exc:
        raise ValueError(f"not a broker URL: {exc}") from None
    if not parts.hostname:
        raise ValueError(f"{parts.scheme}:// URL without a host")
    return BrokerTarget(url, kind, url)


def gateway_transport_options(target: BrokerTarget) -> dict[str, Any]:
    """kombu's transport options for the gateway's publishing connection.

    Redis: no ack emulation, as the workers (their consumers keep no unacked bookkeeping).
    RabbitMQ: publisher confirms, so a task message the broker did not take fails its submit
    instead of vanishing."""
    if target.kind == "amqp":
        return {"confirm_publish": True}
    return {"ack_emulation": False, **target.transport_options}


def worker_transport_options(target: BrokerTarget) -> dict[str, Any]:
    """kombu's transport options for a worker's consumer: on Redis, no ack emulation and the
    TCP options that find a dead peer (``tasks/celery_app.py`` says why); on RabbitMQ, kombu's
    defaults with the heartbeat Celery negotiates (``AMQP_HEARTBEAT_S``)."""
    if target.kind == "amqp":
        return {}
    return {"ack_emulation": False, **TCP_OPTIONS, **target.transport_options}


def where(url: str) -> str:
    """``url`` without user, password, path or options: scheme and host(s), for ``/health``,
    banners and error messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(unreadable URL)"
    hosts = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{hosts}"


def unreachable(url: str, timeout_s: float = CHECK_TIMEOUT_S) -> str | None:
    """Why the broker at ``url`` cannot be used now (None: it answers and takes our login).

    One attempt, bounded by ``timeout_s``: a start that waits on a broker that never answers
    would hang (Celery retries its first connection forever here, by design, for a broker that
    restarts under a running worker).
    """
    target = broker_target(url)
    try:
        if target.kind == "amqp":
            from kombu import Connection

            with Connection(target.kombu_url, connect_timeout=timeout_s) as conn:
                # one try, no retry loop (kombu's connect() would retry once more)
                transport = conn.transport
                transport.close_connection(transport.establish_connection())
            return None
        options = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
        client = sync_client(url, **options)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # noqa: BLE001 - any failure is the answer, in words
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return None
