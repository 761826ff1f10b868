"""The regression guard (``python -m bench --check``): its comparison, and its smoke form for real.

The smoke form is what CI runs: a real stack and the baseline server on loopback, figures as
ratios to the baseline of the same run, compared with bench/expected.json.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import check

ROOT = Path(__file__).resolve().parents[2]


def _lat(p50: float, p99: float, n: int) -> dict[str, Any]:
    return {"n": n, "p50": p50, "p99": p99, "max": p99}


def _results(stack_p50: float, n: int) -> dict[str, Any]:
    return {
        "relay": {
            "levels": [
                {
                    "sessions": 10,
                    "latency_ms": _lat(stack_p50, 9.0, n),
                    "gateway_cpu_pct_per_session": 0.3,
                }
            ],
            "baseline": [
                {
                    "sessions": 10,
                    "latency_ms": _lat(1.0, 3.0, n),
                    "server_cpu_pct_per_session": 0.1,
                }
            ],
            "ratio": [{"sessions": 10, "p50_ratio": stack_p50, "p99_ratio": 3.0}],
        },
        "chat": {
            side: {
                "short_5_words": {"first_delta_ms": {"p50": v}, "done_ms": {"p50": 50.0}},
                "long_200_words": {"first_delta_ms": {"p50": v}, "done_ms": {"p50": 2000.0}},
            }
            for side, v in (("stack", 20.0), ("baseline", 10.0))
        },
    }


def test_figures_are_ratios_and_skip_thin_percentiles() -> None:
    figs = check.figures(_results(2.0, n=50))
    assert figs["relay_p50_ratio_10"] == 2.0
    assert "relay_p99_ratio_10" not in figs  # 50 deltas: a p99 would be the maximum
    assert figs["gateway_cpu_ratio_10"] == 3.0
    assert figs["chat_short_5_words_first_delta_ms_ratio"] == 2.0
    assert figs["chat_long_200_words_done_ms_ratio"] == 1.0
    assert "relay_p99_ratio_10" in check.figures(_results(2.0, n=400))


def test_compare_flags_only_what_exceeds_the_margin() -> None:
    expected = {"a": 2.0, "b": 0.4, "c": 1.0, "gone": 1.0}
    rows = {r.name: r for r in check.compare({"a": 2.9, "b": 1.6, "c": 3.1}, expected, 0.5)}
    assert set(rows) == {"a", "b", "c"}  # a figure the run lacks is not guarded
    assert rows["a"].ok and rows["a"].limit == 3.0
    assert not rows["b"].ok and rows["b"].limit == 1.5  # below parity counts as parity
    assert not rows["c"].ok
    assert "REGRESSION" in check.render(list(rows.values()), 0.5)


def test_expected_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "expected.json"
    assert check.load_expected("smoke", path) is None
    check.save_expected("smoke", {"x": 1.5}, {"command": "c", "machine": {}}, path)
    check.save_expected("quick", {"y": 2.0}, {"command": "c"}, path)
    assert check.load_expected("smoke", path) == {"x": 1.5}
    assert json.loads(path.read_text())["quick"]["figures"] == {"y": 2.0}


@pytest.mark.slow
def test_guard_smoke_form_passes_on_this_tree() -> None:
    """CI's smoke form: a real run compared with the committed smoke figures."""
    pytest.importorskip("psutil")
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--check", "--smoke", "--output", "pytest-check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert "Regression guard" in proc.stdout, proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "relay_p50_ratio_10" in proc.stdout
