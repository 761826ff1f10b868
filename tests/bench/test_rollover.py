"""``python -m bench rollover``: a call through several rollovers, its figures printed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_short_call_rolls_over_and_reports_its_figures() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "rollover", "--minutes", "2", "--kv-tokens", "300"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert "rollovers, context_full: False, errors: 0" in proc.stdout, proc.stdout
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "rollover",
            "--minutes",
            "1",
            "--kv-tokens",
            "300",
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["rollovers"] >= 2 and not out["context_full"] and not out["errors"]
    assert out["rollover_gap_ms"]["p50"] is not None
    assert set(out["worker_rss_mib"]) == {"first_rollover", "end"}
