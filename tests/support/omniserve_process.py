"""``python -m omniserve ARGS`` run to its end as a process of its own, on only the settings a
test gives it.

Why: what a command does at start (its exit status, what it says on stderr) shows only in a
process of its own; the test run's own ``OMNISERVE_*`` variables must not reach it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

from tests.support.module_imports import ROOT


def omniserve_env(settings: Mapping[str, str]) -> dict[str, str]:
    """This process's environment less every ``OMNISERVE_*`` variable, then ``settings``, with
    the repository on ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNISERVE_")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(settings)
    return env


def run_omniserve(
    env: Mapping[str, str], *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python -m omniserve ARGS`` with ``env`` from the repository root, its output as text
    (``timeout``: a backstop for a hang, not a figure)."""
    return subprocess.run(
        [sys.executable, "-m", "omniserve", *args],
        env=dict(env),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
