"""The ``omniserve`` command itself: arguments handed on (``test``, ``bench``), settings errors."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from omniserve.cli import main
from tests.support.in_process_cli import run_main
from tests.support.stack import ROOT


def test_omniserve_test_accepts_pytest_options() -> None:
    # -q and --collect-only start with a dash: argparse must pass them on, not take them for
    # options of its own (omniserve adds -q)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "omniserve",
            "test",
            "-q",
            "--collect-only",
            "-n",
            "0",  # one pytest process: a -n of the caller's replaces the default workers
            "tests/unit/test_structure.py",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"tests/unit/test_structure.py: \d+", done.stdout)  # -q -q: counts per file


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


def test_the_suite_runs_in_three_workers_unless_told_otherwise() -> None:
    from omniserve.cli import xdist_args

    three = ["-n", "3", "--dist", "loadfile", "--no-loadscope-reorder"]
    assert xdist_args([]) == three
    assert xdist_args(["tests/unit/test_structure.py", "-x"]) == three
    for chosen in (["-n", "0"], ["-n4"], ["--numprocesses=3"], ["-p", "no:xdist"], ["--dist=no"]):
        assert xdist_args(chosen) == [], chosen


def test_the_longest_test_files_go_first_and_each_exists() -> None:
    """``tests/support/file_order.py``: a renamed or removed file must leave its list too; the
    listed files come first, in that order, each file's tests kept together and in order."""
    from tests.support.file_order import LONGEST, longest_first

    assert [p for p in LONGEST if not (ROOT / p).is_file()] == []

    class Item:
        def __init__(self, nodeid: str) -> None:
            self.nodeid = nodeid

    ids = ["tests/a.py::x", "tests/b.py::y", "tests/b.py::z"]
    ids += [LONGEST[1] + "::t", LONGEST[0] + "::u"]
    items = [Item(i) for i in ids]
    longest_first(items)  # type: ignore[arg-type]  # only nodeid is read
    assert [i.nodeid for i in items] == [ids[4], ids[3], ids[1], ids[2], ids[0]]


def test_an_invalid_setting_is_named_by_its_variable() -> None:
    """A setting that cannot be read: the variable and what is wrong, exit 2, no traceback
    (each command's ``main`` in process: the settings are read before anything starts)."""
    cases = [
        (
            ["up", "--backend", "scripted"],
            {"OMNISERVE_GATEWAY_PORT": "abc"},
            "OMNISERVE_GATEWAY_PORT: Input should be a valid integer",
        ),
        (
            ["gateway"],
            {"OMNISERVE_TRUSTED_PROXIES": "[1"},
            "OMNISERVE_TRUSTED_PROXIES: not valid JSON",
        ),
        # a store URL fsspec cannot open: told before the gateway serves, and by `recordings`
        (
            ["gateway", "--port", "0"],
            {"OMNISERVE_RECORDINGS": "true", "OMNISERVE_RECORDINGS_URL": "nosuch://x"},
            "OMNISERVE_RECORDINGS_URL nosuch://x: Protocol not known: nosuch",
        ),
        (
            ["recordings", "ls"],
            {"OMNISERVE_RECORDINGS_URL": "nosuch://x"},
            "OMNISERVE_RECORDINGS_URL nosuch://x: Protocol not known: nosuch",
        ),
        (  # a worker of no slot served nothing, silently
            ["worker", "--slots", "0"],
            {},
            "OMNISERVE_WORKER_SLOTS: Input should be greater than or equal to 1",
        ),
        (  # the probe reads the gateway's address from them (its default --url)
            ["probe", "chat", "hi"],
            {"OMNISERVE_GATEWAY_PORT": "abc"},
            "OMNISERVE_GATEWAY_PORT: Input should be a valid integer",
        ),
    ]
    for argv, bad, said in cases:
        done = run_main(main, argv, **bad)
        assert done.returncode == 2, done.stdout + done.stderr
        assert "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith("omniserve: invalid settings\n"), done.stderr
        assert said in done.stderr, done.stderr


def test_scripts_omniserve_says_it_ran_omniserve(tmp_path) -> None:
    """The launcher hands its own name, as typed, to the omniserve of its virtualenv (``up``'s
    try-it line names it): a virtualenv that is installed already, whose console script only
    says what it was given (the launcher itself runs as it does for a user)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / ".omniserve-installed-test").touch()  # newer than pyproject.toml: nothing installed
    script = venv / "bin" / "omniserve"
    script.write_text('#!/bin/sh\necho "launcher=$OMNISERVE_LAUNCHER args=$*"\n')
    script.chmod(0o755)
    env = {**os.environ, "OMNISERVE_VENV": str(venv), "OMNISERVE_EXTRAS": "test"}
    for typed in ("scripts/omniserve", str(ROOT / "scripts" / "omniserve")):
        done = subprocess.run(
            [typed, "up", "--port", "9000"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout == f"launcher={typed} args=up --port 9000\n", done.stdout
