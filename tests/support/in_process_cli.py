"""A command's ``main(argv)`` run in the test's own process, as ``python -m ...`` would run it:
an environment of its own (every ``OMNISERVE_*`` variable of the test run removed, then the
test's), its stdout and stderr captured, its exit status returned, the settings read afresh.

The same code as the console script, without an interpreter start and its imports per call;
what only a process shows (``__main__``, the console script) keeps a subprocess test of its own
(``tests/unit/omniserve/test_cli.py``).
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from omnicore.settings import get_settings


@dataclass(frozen=True)
class Ran:
    """What a run of a command left: the shape of ``subprocess.CompletedProcess``'s fields."""

    returncode: int
    stdout: str
    stderr: str


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """``os.environ`` without the run's ``OMNISERVE_*`` variables, plus ``env``; restored after."""
    saved = dict(os.environ)
    try:
        for name in [n for n in os.environ if n.startswith("OMNISERVE_")]:
            del os.environ[name]
        os.environ.update(env)
        get_settings.cache_clear()
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
        get_settings.cache_clear()


def run_main(main: Callable[[Sequence[str] | None], int], argv: Sequence[str], **env: str) -> Ran:
    """``main(argv)`` under ``environment(env)``; a ``SystemExit`` (argparse's) is its status."""
    out, err = io.StringIO(), io.StringIO()
    with environment(env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1 if exc.code else 0
    return Ran(int(code or 0), out.getvalue(), err.getvalue())
