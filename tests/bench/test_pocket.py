"""``python -m bench pocket`` runs the real stack with a pocket worker and reports every figure.

No timing is asserted (the cores are shared): the run must complete, hear every question, and
report the three first-audio figures and each stage for both chunk sizes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from inference.registry import preflight

try:
    preflight("pocket")
except Exception as exc:
    pytest.skip(f"pocket backend not installed: {exc}", allow_module_level=True)

pytestmark = [pytest.mark.pocket, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_bench_pocket_reports_each_figure_and_stage() -> None:
    name = "pytest-pocket"  # bench/results/NAME.json, as every bench names its results
    out = ROOT / "bench" / "results" / f"{name}.json"
    out.unlink(missing_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "pocket", "--rounds", "1", "--output", name],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for line in ("after the chunk with the end", "after the true end of speech", "relay"):
        assert line in proc.stdout
    data = json.loads(out.read_text())
    assert set(data["by_chunk"]) == {"1", "0.25"}
    from bench.pocket_latency import HEAD_START, QUESTIONS, STAGES

    for size, part in data["by_chunk"].items():
        rows, summary = part["rows"], part["summary"]
        assert len(rows) == len(QUESTIONS), size
        for row in rows:
            heard = (row["transcript"] or "").lower().rstrip("?.")
            assert heard.split()[:2] == row["question"].lower().split()[:2], row
            # the answer came for the chunk holding the end of speech or a later one, and the
            # figures are ordered as their starting points are
            assert row["answered_chunk"] >= row["true_end_chunk"]
            assert row["from_true_end_s"] >= row["from_true_end_chunk_s"] >= row["from_chunk_s"]
            assert row["from_chunk_s"] > 0
        for key, _label in [*STAGES, HEAD_START]:
            assert "median" in summary["stages"][key], key
        shares = sum(summary["stages"][k]["share"] for k, _ in STAGES)
        assert shares == pytest.approx(1.0, abs=0.02)  # the stages add up to the work
