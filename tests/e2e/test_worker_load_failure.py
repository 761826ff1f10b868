"""A worker whose backend fails to load tries once and exits with status 3.

Celery replaces a pool process that exits; before, one whose backend failed to load was replaced
by one that failed the same way, about nine a second for as long as the worker ran, each one
registering as loading capacity that clients queued for, and `omniserve worker` exited 0 whatever
the worker's own status was.
"""

from __future__ import annotations

import os
import signal

import pytest

from tasks.supervisor import process_alive
from tests.support.fault_harness import held_at_fork, log_text, registry, wait_for
from tests.support.stack import Proc, Stack

BAD_OPTIONS = '{"no_such_option": 1}'  # the scripted backend's constructor refuses it
REFUSED = "unexpected keyword argument 'no_such_option'"
# ... and this after a second's "load": a pool process that is still loading when the test
# holds it (one refused at once could fail before the test's SIGSTOP, and then in the other window)
SLOW_BAD_OPTIONS = '{"load_delay_s": 1, "words_per_step": "many"}'
SLOW_REFUSED = "'>' not supported between instances of 'str' and 'int'"


@pytest.mark.parametrize("window", ["before", "after"])
def test_a_backend_that_fails_to_load_stops_its_worker(stack: Stack, window: str) -> None:
    """The pool process fails before Celery's consumer has started (its start-up look at the
    pool, ``did_start_ok``, ended the worker with status 1) or after it (Celery replaced the
    process, again and again); the parent, or the pool process, is held with SIGSTOP so that the
    failure lands in that window every time."""
    options, refused = (
        (BAD_OPTIONS, REFUSED) if window == "before" else (SLOW_BAD_OPTIONS, SLOW_REFUSED)
    )
    worker = stack.start_worker(wait=False, OMNISERVE_BACKEND_OPTIONS=options)
    parent = worker.popen.pid
    child = held_at_fork(worker)
    if window == "before":
        wait_for(lambda: not process_alive(child), 30, "the pool process to fail")
        assert " ready." not in log_text(worker)
        os.kill(parent, signal.SIGCONT)
    else:
        os.kill(child, signal.SIGSTOP)
        os.kill(parent, signal.SIGCONT)
        wait_for(lambda: " ready." in log_text(worker), 30, "the worker's consumer to start")
        os.kill(child, signal.SIGCONT)
    stopped_with_one_attempt(stack, worker, refused)


def test_a_backend_that_fails_to_load_stops_a_threads_worker(stack: Stack) -> None:
    worker = stack.start_worker(slots=2, wait=False, OMNISERVE_BACKEND_OPTIONS=BAD_OPTIONS)
    stopped_with_one_attempt(stack, worker, REFUSED)


def stopped_with_one_attempt(stack: Stack, worker: Proc, refused: str) -> None:
    status = worker.popen.wait(timeout=60)
    text = log_text(worker)
    assert status == 3, text
    assert refused in text
    assert text.count("loading the scripted backend") == 1, text  # one attempt, not a loop
    assert registry(stack) == {}  # nothing left for clients to queue for
    assert stack.live_slots("loading") == 0


def test_a_worker_stopped_by_its_operator_exits_0(stack: Stack) -> None:
    """The exit status is the worker's own: a warm shutdown (SIGTERM) is a success."""
    worker = stack.start_worker()
    worker.stop()
    assert worker.popen.returncode == 0, log_text(worker)
