"""A partition that drops packets between the gateway and Redis (Redis's host gone dark, a switch
failing), 15 s, then healed: run in a network namespace by ``tests/faults/dropped_packets.py``.

Nothing answers a dropped packet, so no connection learns that it is dead: a command times out,
but the gateway's pub/sub connection waited on in silence, and after the heal TCP's
retransmission backoff kept it so for 4.5-8.5 s more (measured before the fix; every session
quiet meanwhile). The gateway's connections now have the kernel probe them and drop a dead one
(``streaming/redis_connection.py``): the gateway finds its pub/sub connection dead during the
cut, opens a new one as soon as the network lets it, and its sessions answer again once their
workers take them back (about 2 s after the heal, measured, against 4.5-8.5 s before).

What a client must see: its session goes on (``session.recovering``/``session.recovered`` at
most, an ``inference_error`` for input the gateway could not queue); every slot comes back; a new
session is served.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

ROOT = Path(__file__).resolve().parents[2]
CUT_S = 15.0  # past DEAD_PEER_S (10 s), past the gateway's lease (6 s)


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


@pytest.mark.slow
def test_a_gateway_cut_off_by_dropped_packets_reopens_its_connections() -> None:
    why = _namespace_with_tun()
    if why:
        pytest.skip(why)
    run = subprocess.run(
        [
            "unshare",
            "-rn",
            sys.executable,
            "-m",
            "tests.faults.dropped_packets",
            "gateway",
            str(CUT_S),
        ],
        capture_output=True,
        cwd=ROOT,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr.decode(errors="replace")[-6000:]
    out = orjson.loads(run.stdout.splitlines()[-1])
    log = out.pop("log")
    for seen in out["probes"]:
        assert not seen["closed"], (seen, out)
        assert set(seen["errors"]) <= {"inference_error"}, seen
        assert set(seen["kinds"]) <= {"error", "session.recovering", "session.recovered"}, seen
        assert seen["first_delta_after_heal_s"] is not None and seen["deltas_in_last_5_s"] > 0
    # the gateway's pub/sub connection is a new one: the old was dropped as dead and replaced
    # (before, the old one came back with TCP's next retransmission, seconds after the heal)
    before, after = out["subscribers_before"], out["subscribers_after"]
    assert len(before) == 1 and after and min(after) > before[0], (out, log[-3000:])
    assert out["slots_back"] is True, out
    assert out["new_session_answered"] and out["gateway_alive"], out
    print(orjson.dumps(out).decode())  # the figures, with -s
