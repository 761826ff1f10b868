"""One ``python -m bench`` command run as an operator runs it, from the repository root.

Why: a bench command's test checks the figures it prints; that it ran to the end (exit 0, and
if not, what it said last) is the same for every one of them.
"""

from __future__ import annotations

import subprocess
import sys

from tests.support.module_imports import ROOT

TAIL = 3000  # characters of stderr and of stdout shown when the command failed


def run_bench(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``python -m bench ARGS``, asserted to have exited 0; its output, as text."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,  # a backstop for a hang, not a figure
    )
    assert proc.returncode == 0, proc.stderr[-TAIL:] + proc.stdout[-TAIL:]
    return proc
