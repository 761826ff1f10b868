"""``omniserve doctor`` end to end on the strict stand-in (through the minicpmo backend's
``model_loader`` hook): once in its own process, as an operator runs it, and its failures through
the command's ``main`` in process (the same report and exit status, without a process start)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from omniserve.cli import main
from omniserve.doctor import bundled_sample
from tests.support.in_process_cli import run_main

ROOT = Path(__file__).resolve().parents[3]
LOADER = "tests.support.standins.fake_minicpmo:load"
STAND_IN = json.dumps({"model_loader": LOADER, "device": "cpu"})


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNISERVE_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "omniserve", "doctor", "--backend", "minicpmo", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )


def test_bundled_sample_is_a_few_seconds_of_speech():
    sample = bundled_sample()
    assert sample.dtype == np.float32 and 2 * 16000 < sample.size < 8 * 16000
    assert float(np.sqrt(np.mean(sample**2))) > 0.02  # speech, not silence


def test_doctor_passes_on_the_stand_in_and_reports_every_unit():
    out = doctor("--model", "/tmp/none", "--backend-options", STAND_IN, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    checks = {c["name"]: c for c in json.loads(out.stdout)}
    assert [c["status"] for c in checks.values()] == ["pass"] * 5
    assert checks["load"]["details"]["unit_samples"] == 16000
    assert checks["chat"]["details"]["text"].startswith("echo:")
    spoken = checks["spoken chat"]["details"]
    assert spoken["audio_s"] > 0 and spoken["first_audio_s"] is not None and spoken["rtf"] >= 0
    units = checks["duplex"]["details"]["units"]
    assert [u["unit"] for u in units] == list(range(1, 11))
    assert all(u["rtf"] >= 0 and u["step_s"] >= 0 for u in units)
    assert [u["output"] for u in units[:3]] == ["listen"] * 3  # the start-up guard
    first = checks["answered"]["details"]["first_audio"]
    assert first["output"] == "speak" and first["audio_s"] > 0 and first["unit"] > 3


def doctor_in_process(*args: str) -> tuple[int, str]:
    ran = run_main(main, ["doctor", "--backend", "minicpmo", *args])
    return ran.returncode, ran.stdout


def test_doctor_text_report_and_exit_status_on_failure():
    code, stdout = doctor_in_process(
        "--model", "/tmp/none", "--backend-options", STAND_IN, "--units", "3"
    )
    assert code == 1, stdout  # three units: still in the start-up guard
    lines = stdout.splitlines()
    assert lines[-1] == "result: FAIL (answered)"
    assert any(line.startswith("PASS  duplex") for line in lines)
    assert any(line.startswith("FAIL  answered") for line in lines)
    code, stdout = doctor_in_process("--model", "/nonexistent/model", "--device", "cpu")
    assert code == 1
    assert stdout.startswith("FAIL  load") and "config.json" in stdout
