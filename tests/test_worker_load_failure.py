"""A worker whose backend fails to load tries once and exits with status 3.

Celery replaces a pool process that exits; before, one whose backend failed to load was replaced
by one that failed the same way, about ten a second for as long as the worker ran, each one
registering as loading capacity that clients queued for, and `omniserve worker` exited 0 whatever
the worker's own status was.
"""

from __future__ import annotations

import pytest

from tests.faults.harness import log_text, registry
from tests.stack import Stack

BAD_OPTIONS = '{"no_such_option": 1}'  # the scripted backend's constructor refuses it


@pytest.mark.parametrize("slots", [1, 2], ids=["prefork", "threads"])
def test_a_backend_that_fails_to_load_stops_its_worker(stack: Stack, slots: int) -> None:
    worker = stack.start_worker(slots=slots, wait=False, OMNISERVE_BACKEND_OPTIONS=BAD_OPTIONS)
    status = worker.popen.wait(timeout=60)
    text = log_text(worker)
    assert status == 3, text
    assert "unexpected keyword argument 'no_such_option'" in text
    assert text.count("loading the scripted backend") == 1, text  # one attempt, not a loop
    assert registry(stack) == {}  # nothing left for clients to queue for
    assert stack.live_slots("loading") == 0


def test_a_worker_stopped_by_its_operator_exits_0(stack: Stack) -> None:
    """The exit status is the worker's own: a warm shutdown (SIGTERM) is a success."""
    worker = stack.start_worker()
    worker.stop()
    assert worker.popen.returncode == 0, log_text(worker)
