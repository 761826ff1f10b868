"""The soak (``python -m bench soak``) in its one-minute form: faults of every kind, random
sessions, and at the end no slot leaked and no session lost without a closing event."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson
import pytest

from tests.support.stack import ROOT


@pytest.mark.slow
def test_one_minute_soak() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench", "soak", "--minutes", "1", "--fault-every", "8", "--json"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=400,
    )
    print(out.stdout[-3000:], out.stderr[-3000:])
    result = orjson.loads(out.stdout.strip().splitlines()[-1])
    assert result["slots_leaked"] == 0, result["pool_at_end"]
    assert result["sessions_lost"] == 0, result["lost"]
    assert result["queue_left"] == 0
    assert result["faults_injected"] >= 3
    assert result["sessions_served"] >= 10
    assert out.returncode == 0
