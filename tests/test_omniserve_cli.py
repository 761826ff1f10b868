"""``omniserve test`` and ``omniserve bench`` hand every argument on, options included."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.stack import ROOT


def test_omniserve_test_accepts_pytest_options() -> None:
    # -q and --collect-only start with a dash: argparse used to reject them (omniserve adds -q)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "omniserve",
            "test",
            "-q",
            "--collect-only",
            "tests/test_structure.py",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"tests/test_structure.py: \d+", done.stdout)  # -q -q: counts per file


def test_omniserve_bench_hands_on_its_options() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "omniserve", "bench", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "--smoke" in done.stdout  # the benchmarks' own help, not omniserve's


def test_the_suite_runs_in_two_workers_unless_told_otherwise() -> None:
    from omniserve.cli import xdist_args

    assert xdist_args([]) == ["-n", "2", "--dist", "loadfile"]
    assert xdist_args(["tests/test_structure.py", "-x"]) == ["-n", "2", "--dist", "loadfile"]
    for chosen in (["-n", "0"], ["-n4"], ["--numprocesses=3"], ["-p", "no:xdist"], ["--dist=no"]):
        assert xdist_args(chosen) == [], chosen
