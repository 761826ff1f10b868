"""What a Redis Cluster URL must find when a gateway or worker starts: a cluster, and a broker of
its own.

A process given ``redis+cluster://`` that finds no cluster would otherwise fail later and
vaguely (redis-py's cluster client raises at its first command, or at construction in a
worker), and kombu has no cluster transport, so Celery pointed at a cluster never consumes.
``data_plane_problem`` says why it cannot start, in one line (the caller exits 1); it waits
``FIND_S`` at most for a cluster still forming, never longer.
"""

from __future__ import annotations

import time

import redis

from omnicore.redact import redact_url
from streaming.outage import REDIS_OR_OS_ERRORS
from streaming.redis_url import cluster_target, is_cluster_url

FIND_S = 10.0  # a cluster that is not up (state ok on a node named) this long: exit 1
NODE_TIMEOUT_S = 2.0


def data_plane_problem(
    redis_url: str, broker_url: str | None, within_s: float = FIND_S
) -> str | None:
    """Why a process cannot start on ``redis_url`` (None: it can, or it is no cluster URL)."""
    try:
        target = cluster_target(redis_url)
    except ValueError as exc:
        return f"OMNISERVE_REDIS_URL: {exc}"
    if target is None:
        return None
    if not broker_url:
        return (
            "OMNISERVE_REDIS_URL is a Redis Cluster, which Celery cannot use as its broker: "
            "set OMNISERVE_BROKER_URL (redis://... or redis+sentinel://...)"
        )
    if is_cluster_url(broker_url):
        return "OMNISERVE_BROKER_URL cannot be a Redis Cluster (kombu has no cluster transport)"
    deadline = time.monotonic() + within_s
    why = ""
    while True:
        for host, port in target.nodes:
            node = redis.Redis(
                host=host,
                port=port,
                socket_timeout=NODE_TIMEOUT_S,
                socket_connect_timeout=NODE_TIMEOUT_S,
                **target.options,
            )
            try:
                if str(node.info("cluster").get("cluster_enabled", "0")) != "1":
                    return (
                        f"{host}:{port} of OMNISERVE_REDIS_URL is not in cluster mode: give one "
                        "server as redis://HOST:PORT, a cluster's nodes as redis+cluster://"
                    )
                state = node.execute_command("CLUSTER", "INFO")  # type: ignore[no-untyped-call]
                text = state.decode() if isinstance(state, bytes) else str(state)
                if "cluster_state:ok" in text:
                    return None
                why = f"{host}:{port} says the cluster is not ok (its slots are not all served)"
            except redis.AuthenticationError as exc:
                return f"{host}:{port} of OMNISERVE_REDIS_URL refuses the credentials: {exc}"
            except REDIS_OR_OS_ERRORS as exc:
                why = f"{host}:{port}: {exc}"
            finally:
                node.close()
        if time.monotonic() >= deadline:
            return f"no Redis Cluster at {redact_url(redis_url)} within {within_s:.0f} s ({why})"
        time.sleep(0.5)
