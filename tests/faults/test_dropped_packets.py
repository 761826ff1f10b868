"""A partition that drops packets between the gateway, or a worker, and Redis (Redis's host gone
dark, a switch failing), then healed: run in a network namespace by
``tests/support/dropped_packets_scenario.py``.

Nothing answers a dropped packet, so no connection learns that it is dead: a command times out,
but the gateway's pub/sub connection waited on in silence, and after the heal TCP's
retransmission backoff kept it so for 4.5-8.5 s more (measured before the fix; every session
quiet meanwhile). The gateway's connections now have the kernel probe them and drop a dead one
(``streaming/redis_connection.py``): the gateway finds its pub/sub connection dead during the
cut, opens a new one as soon as the network lets it, and its sessions answer again once their
workers take them back (about 2 s after the heal, measured, against 4.5-8.5 s before).

A worker cut off for 30 s, idle: its heartbeat offered its slots again at once after the heal,
but its Celery consumer's connection stayed silent in TCP's backoff, so every session given to it
failed to start (``worker_connect_failed`` after ``task_start_timeout_s``, three in a row over
45 s, measured); with the consumer's connection probed too, the first session still failed, its
claim sent on a pooled connection the kernel had dropped (``EPIPE``, no retry). Now the first
session after the heal is served (in 0.4 s, measured).

What a client must see: its session goes on (``session.recovering``/``session.recovered`` at
most, an ``inference_error`` for input the gateway could not queue); every slot comes back; a new
session is served.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

ROOT = Path(__file__).resolve().parents[2]
CUT_S = 15.0  # past DEAD_PEER_S (10 s), past the gateway's lease (6 s)
WORKER_CUT_S = 30.0  # past TCP's retransmission at ~25 s: the consumer's next one comes at ~51 s


def _namespace_with_tun() -> str | None:
    """Why a network namespace with a TUN device cannot be had here, or None."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare (util-linux) and ip (iproute2) are needed"
    tried = subprocess.run(
        ["unshare", "-rn", "ip", "tuntap", "add", "dev", "t0", "mode", "tun"],
        capture_output=True,
        text=True,
    )
    return None if tried.returncode == 0 else f"no namespace with a TUN device: {tried.stderr}"


def _run(case: str, cut_s: float) -> dict[str, Any]:
    """The case run in a network namespace of its own; its JSON result."""
    why = _namespace_with_tun()
    if why:
        pytest.skip(why)
    scenario = [sys.executable, "-m", "tests.support.dropped_packets_scenario", case, str(cut_s)]
    run = subprocess.run(["unshare", "-rn", *scenario], capture_output=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr.decode(errors="replace")[-6000:]
    out: dict[str, Any] = orjson.loads(run.stdout.splitlines()[-1])
    return out


@pytest.mark.slow
def test_a_gateway_cut_off_by_dropped_packets_reopens_its_connections() -> None:
    out = _run("gateway", CUT_S)
    log = out.pop("log")
    for seen in out["probes"]:
        assert not seen["closed"], (seen, out)
        assert set(seen["errors"]) <= {"inference_error"}, seen
        assert set(seen["kinds"]) <= {"error", "session.recovering", "session.recovered"}, seen
        assert seen["first_delta_s"] is not None and seen["deltas_in_last_5_s"] > 0
    # the gateway's pub/sub connection is a new one: the old was dropped as dead and replaced
    # (before, the old one came back with TCP's next retransmission, seconds after the heal)
    before, after = out["subscribers_before"], out["subscribers_after"]
    assert len(before) == 1 and after and min(after) > before[0], (out, log[-3000:])
    assert out["slots_back"] is True, out
    assert out["new_session_answered"] and out["gateway_alive"], out
    print(orjson.dumps(out).decode())  # the figures, with -s


@pytest.mark.slow
def test_a_worker_cut_off_by_dropped_packets_serves_at_once_after_the_heal() -> None:
    out = _run("worker", WORKER_CUT_S)
    log = out.pop("log")
    assert [s["got"] for s in out["sessions"]] == ["served", "served"], (out, log[-3000:])
    assert out["worker_alive"], out
    print(orjson.dumps(out).decode())
