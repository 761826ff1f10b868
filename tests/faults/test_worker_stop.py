"""A worker told to stop while its backend loads stops at once, without finishing the load.

Prefork: the loading pool process dies of a SIGTERM sent to the whole process group, or is
ended by its stopping parent when only the parent got it (a container's PID 1); Celery starts a
replacement, which must not load a model either. Threads pool: the process itself loads, and
has nothing to drain. Either way the worker leaves the registry and exits 0 within seconds,
with a load of two minutes still to go.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.support.fault_harness import log_text, wait_for
from tests.support.stack import Stack

LOADING = '{"load_delay_s": 120}'


@pytest.mark.parametrize(
    ("slots", "to_group"),
    [(1, True), (1, False), (2, True), (2, False)],
    ids=["prefork-group", "prefork-parent", "threads-group", "threads-parent"],
)
def test_a_worker_stopped_while_loading_exits_at_once(
    stack: Stack, slots: int, to_group: bool
) -> None:
    worker = stack.start_worker(slots=slots, wait=False, OMNISERVE_BACKEND_OPTIONS=LOADING)
    wait_for(lambda: stack.live_slots("loading") == slots, 30, "the loading registration")
    time.sleep(0.5)  # inside the load
    (os.killpg if to_group else os.kill)(worker.popen.pid, signal.SIGTERM)
    assert worker.popen.wait(timeout=20) == 0, log_text(worker)[-3000:]
    text = log_text(worker)
    if slots == 1:
        if not to_group:
            assert "still loading" in text  # the parent ended it
    else:
        assert "is stopping while the backend loads: exiting now" in text
    assert stack.live_slots("loading") == 0 and stack.live_slots() == 0
