"""A Redis pub/sub tap: stamps the moment each worker event (and queue event) is published.

Each worker event carries ``emitted_at``, the worker's clock when it emitted it; the tap adds
the moment a separate subscriber process on the same machine (the same wall clock as the
client) saw Redis publish it. The relay benchmark times deltas from both: from the publish (the
gateway's part) and from the worker's emit (the whole relay, the worker's write to Redis
included: bench/relay.py). The tap runs in its own process so the client's event loop cannot
delay its stamps. It writes one JSON line per message:

    [t, session_id, type, input_id, seq, emitted_at]   a session event
    [t, "queue", message]                              an admission event (release, dispatch, ...)

    python -m bench.tap REDIS_URL PREFIX OUTFILE
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

import orjson
import redis

from streaming.keys import Keys

_AUDIO = b',"audio":"'


def _head(data: bytes) -> dict[str, Any]:
    """The event's fields before its audio: parsing a ~128 KB audio event whole took the
    shared core from the client at the very moment the client was to read that event."""
    cut = data.find(_AUDIO, 0, 4096)
    return cast("dict[str, Any]", orjson.loads(data[:cut] + b"}" if cut > 0 else data))


def run(url: str, prefix: str, outfile: Path) -> None:
    """Subscribe and record until SIGTERM."""
    stop = {"now": False}

    def _stop(*_: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    client = redis.Redis.from_url(url)
    # (redis-py's default push handler builds str() of every message for a debug line: with
    # 128 KB audio events that delayed each stamp and took CPU from the workers' core)
    ps = client.pubsub(ignore_subscribe_messages=True, push_handler_func=lambda m: m)  # type: ignore[no-untyped-call]
    keys = Keys(prefix)
    # every session's and turn's channel: ``PREFIX:s:{SESSION}[_t<n>]:out``
    sessions = keys.output_channel("*").replace("{*}", "*")
    ps.psubscribe(sessions)
    ps.subscribe(keys.queue_events)
    head, _, tail = sessions.partition("*")
    out_head, out_tail = head.encode(), tail.encode()  # around a session id (its tag's braces)
    rows: list[bytes] = []
    Path(str(outfile) + ".ready").write_text("1")
    with open(outfile, "wb") as fh:
        while not stop["now"]:
            msg = ps.get_message(timeout=0.2)
            if msg is None:
                continue
            t = time.time()
            channel: bytes = msg["channel"]
            data: bytes = msg["data"]
            if channel.startswith(out_head) and channel.endswith(out_tail):
                tagged = channel[len(out_head) : len(channel) - len(out_tail)]
                sid = tagged.replace(b"{", b"").replace(b"}", b"").decode()
                ev = _head(data)
                rows.append(
                    orjson.dumps(
                        [
                            t,
                            sid,
                            ev.get("type"),
                            ev.get("input_id"),
                            ev.get("seq"),
                            ev.get("emitted_at"),
                        ]
                    )
                )
            else:
                rows.append(orjson.dumps([t, "queue", data.decode()[:64]]))
            if len(rows) >= 256:
                fh.write(b"\n".join(rows) + b"\n")
                rows.clear()
        if rows:
            fh.write(b"\n".join(rows) + b"\n")


def load(outfile: Path) -> list[list[Any]]:
    """The rows a finished tap wrote."""
    if not outfile.exists():
        return []
    return [orjson.loads(line) for line in outfile.read_bytes().splitlines() if line.strip()]


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2], Path(sys.argv[3]))


class Tap:
    """Runs the tap process for one deployment prefix (a context manager)."""

    def __init__(self, url: str, prefix: str, outfile: Path) -> None:
        self.url, self.prefix, self.outfile = url, prefix, outfile
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Tap:
        from bench.stack import ROOT, spawn

        ready = Path(str(self.outfile) + ".ready")
        ready.unlink(missing_ok=True)
        self.outfile.unlink(missing_ok=True)
        env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
        self.proc, log = spawn(
            f"{self.prefix}-tap",
            [sys.executable, "-m", "bench.tap", self.url, self.prefix, str(self.outfile)],
            env,
        )
        deadline = time.monotonic() + 10
        while not ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tap did not start: {log.read_text(errors='replace')}")
            time.sleep(0.02)
        ready.unlink(missing_ok=True)
        return self

    def __exit__(self, *exc: object) -> None:
        from bench.stack import stop

        if self.proc is not None:
            stop(self.proc)

    def rows(self) -> list[list[Any]]:
        return load(self.outfile)
