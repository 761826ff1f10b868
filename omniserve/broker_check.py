"""The broker checked before a part starts: a broker of its own that does not answer stops the
gateway, a worker or ``omniserve up`` at once, saying why (exit 1).

Why: Celery retries its first broker connection forever (``broker_connection_retry_on_startup``
with no retry limit, so that a worker outlives a broker restart), so a worker given a broker
that never answers waited silently, and a gateway would take clients it cannot hand to any
worker. The shared Redis as broker (``OMNISERVE_BROKER_URL`` unset) is not checked here: a part
started before its Redis waits for it, as it always has (docs/OPERATIONS.md).
"""

from __future__ import annotations

import sys

from omnicore.redact import redact
from omnicore.settings import Settings

NOT_ANSWERING = """the broker at {where} does not answer ({why}).
Check OMNISERVE_BROKER_URL (scheme, host, port, user and password, virtual host), or unset it to
use the shared Redis (OMNISERVE_REDIS_URL) as the broker."""


def broker_problem(s: Settings) -> str | None:
    """Why the configured broker cannot be used (None: it answers, or it is the shared Redis)."""
    from streaming.broker_url import broker_target, unreachable, where

    try:
        broker_target(s.broker)
    except ValueError as exc:
        named = "OMNISERVE_BROKER_URL" if s.separate_broker else "OMNISERVE_REDIS_URL (the broker)"
        return f"{named} cannot be used as Celery's broker: {exc}"
    if not s.separate_broker:
        return None
    why = unreachable(s.broker)
    if why is None:
        return None
    return NOT_ANSWERING.format(where=where(s.broker), why=redact(why, s.secret_values()))


def refuse_unless_broker(s: Settings, who: str) -> bool:
    """Print why ``who`` cannot start and return False when the broker is unusable."""
    problem = broker_problem(s)
    if problem is None:
        return True
    print(f"{who}: {problem}", file=sys.stderr, flush=True)
    return False
