"""``omniserve drain WORKER``: drain one worker node without stopping it.

The node takes no new sessions at once (its idle slots leave the pool), lets its running
sessions go on for ``--grace`` seconds (default ``OMNISERVE_DRAIN_GRACE_S``) and then ends the
rest with ``server_shutdown``; it stays up, serving nothing, until it is restarted (a start
clears the flag). It is the flag a SIGTERM sets (``tasks/bootstrap.py``), written through Redis
so that it works from any machine that reaches Redis.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import orjson


def add_parser(sub: Any) -> None:
    """The ``drain`` subcommand on the ``omniserve`` parser."""
    dr = sub.add_parser("drain", help="drain a worker node: no new sessions, running ones finish")
    dr.add_argument("worker", help="node name (omniserve worker prints it) or worker id node#pid")
    dr.add_argument("--grace", type=float, help="seconds running sessions may go on")
    dr.add_argument("--redis-url", dest="redis_url")
    dr.set_defaults(func=cmd_drain)


def cmd_drain(args: argparse.Namespace) -> int:
    """Set the node's drain flag; refuse a node that is not registered."""
    import redis

    from omnicore.redact import redact_url
    from omnicore.settings import get_settings
    from omniserve.options import env_from_args
    from streaming.keys import Keys
    from streaming.redis_url import sync_client

    env_from_args(args)
    s = get_settings()
    keys = Keys(s.key_prefix)
    node = args.worker.rsplit("#", 1)[0]
    grace = s.drain_grace_s if args.grace is None else max(0.0, args.grace)
    client = sync_client(s.redis_url)
    try:
        nodes = {orjson.loads(info).get("node") for info in client.hvals(keys.workers)}
        if node not in nodes:
            known = ", ".join(sorted(n for n in nodes if n)) or "none"
            print(f"omniserve drain: no worker node {node!r} is registered (known: {known})")
            return 1
        deadline = time.time() + grace
        client.set(keys.drain(node), repr(deadline), ex=int(grace) + 3600)
    except redis.RedisError as exc:  # one line, not a traceback: nothing was changed
        where = redact_url(s.redis_url)
        print(f"omniserve drain: cannot reach Redis at {where} ({exc})", file=sys.stderr)
        return 1
    print(f"draining {node}: no new sessions; running ones may go on for {grace:.0f} s")
    return 0
