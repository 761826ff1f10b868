"""One ``apt-get`` at a time across the test run's processes.

The suite runs in pytest-xdist workers, and two of its setups call ``apt-get`` (chromium for the
browser tests, nginx and other tools for the deploy tests). apt's own locks make a second
``apt-get update`` fail at once rather than wait, so both take this file lock first.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_FILE = Path("/tmp/omniserve-test-apt.lock")


@contextmanager
def apt_lock() -> Iterator[None]:
    """Hold the run-wide apt lock (blocking until the other worker's apt-get is done)."""
    with open(LOCK_FILE, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
