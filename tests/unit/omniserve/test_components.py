"""The restart policy of ``omniserve up`` (``omniserve/components.py``) on real processes that
exit, with a clock the test moves (the end-to-end faults are in tests/e2e/test_up.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from omniserve.components import MAX_DELAY_S, STABLE_S, Components


def exits(code: int) -> subprocess.Popen[bytes]:
    """A real process that has exited with ``code``."""
    proc = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
    proc.wait(timeout=30)
    return proc


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def said() -> list[str]:
    return []


def parts_with(clock: Clock, said: list[str], limit: int = 3, delay: float = 1.0) -> Components:
    return Components(restart_limit=limit, restart_delay_s=delay, clock=clock, say=said.append)


def test_a_part_that_exits_is_started_again_after_a_delay_that_doubles(said) -> None:
    clock = Clock()
    parts = parts_with(clock, said)
    part = parts.add("worker 1", lambda: exits(3))
    first = part.process
    assert parts.exited() == "the worker 1 exited (code 3); see its output above"
    assert parts.tend() is None  # the restart is scheduled, not done
    assert part.process is first and part.in_a_row == 1
    assert said == [
        "the worker 1 exited (code 3); starting it again in 1 s (restart 1 of 3 in a row)"
    ]
    clock.now += 0.9
    assert parts.tend() is None and part.process is first  # not yet due
    clock.now += 0.1
    assert parts.tend() is None
    assert part.process is not first
    assert said[-1] == f"restarted the worker 1 (pid {part.process.pid})"
    clock.now += 1
    parts.tend()  # it exited again at once: the next wait is twice as long
    assert said[-1].endswith("starting it again in 2 s (restart 2 of 3 in a row)")
    assert [parts.delay(n) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]
    assert parts.delay(50) == MAX_DELAY_S


def test_a_part_over_its_restarts_in_a_row_stops_up(said) -> None:
    clock = Clock()
    parts = parts_with(clock, said, limit=2, delay=0.5)
    parts.add("gateway", lambda: exits(1))
    whys = []
    for _ in range(10):
        why = parts.tend()
        if why is not None:
            whys.append(why)
            break
        clock.now += 5
    assert whys == [
        f"the gateway exited (code 1), after 2 restart(s) in a row that each ended within"
        f" {STABLE_S:.0f} s; see its output above"
    ]
    assert sum("restarted the gateway" in line for line in said) == 2


def test_a_part_that_ran_long_enough_starts_its_count_again(said) -> None:
    clock = Clock()
    parts = parts_with(clock, said, limit=1)
    running = sleeper()
    try:
        part = parts.add("Flower", lambda: exits(2), running=running)
        assert part.process is running  # kept, not started a second time
        running.kill()
        running.wait(timeout=30)
        assert parts.tend() is None and part.in_a_row == 1
        clock.now += 1
        parts.tend()  # started again; it exits at once
        clock.now += STABLE_S  # ... but say it ran a minute first: a new first exit in a row
        assert parts.tend() is None and part.in_a_row == 1
        clock.now += 1
        parts.tend()
        clock.now += 1  # this one ended within a second: over the limit of 1
        assert parts.tend() is not None
    finally:
        running.kill()


def test_no_restarts_when_the_limit_is_zero(said) -> None:
    clock = Clock()
    parts = parts_with(clock, said, limit=0)
    parts.add("gateway", lambda: exits(1))
    assert parts.tend() == "the gateway exited (code 1); see its output above"
    assert said == []


def test_a_start_that_fails_counts_as_an_exit(said) -> None:
    clock = Clock()
    parts = parts_with(clock, said, limit=2)
    starts = {"n": 0}

    def start() -> subprocess.Popen[bytes]:
        starts["n"] += 1
        if starts["n"] > 1:
            raise RuntimeError("embedded redis-server exited with code 1")
        return exits(0)

    parts.add("embedded Redis", start)
    why = None
    for _ in range(10):
        why = parts.tend()
        if why is not None:
            break
        clock.now += 5
    assert "the embedded Redis could not be started again: embedded redis-server exited" in said[1]
    assert why is not None and "after 2 restart(s) in a row" in why
