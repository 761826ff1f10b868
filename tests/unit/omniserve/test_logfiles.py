"""What of the parts' log files ``omniserve up`` shows on its console (``omniserve/logfiles.py``),
read from a file a real process wrote; the whole of ``up`` is in tests/e2e/test_up.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from omniserve.logfiles import Console, fresh_log, tail

# lines as the parts write them (copied from the logs of a real `up`)
WRITTEN = r"""omniserve worker omni-25935c@vm: backend=scripted slots=1
2026-12-02 05:49:34,017 9198 omniserve.worker INFO node omni-25935c@vm consumes its queue
/venv/celery/platforms.py:893: SecurityWarning: You're running the worker with superuser
absolutely not recommended!

User information: uid=0 euid=0 gid=0 egid=0
 -------------- omni-25935c@vm v5.7.0 (collider)
[tasks]
  . omniserve.chat_turn
2026-12-02 05:49:34,254 9197 omniserve.gateway WARNING OMNISERVE_ADMIN_TOKEN is not set
2026-12-02 05:49:34,350 9197 omniserve.access INFO 127.0.0.1:51622 - "GET /health" 200 0.003s
[W 261202 05:49:35 inspector:98] Inspect method active_queues failed
[E 261202 05:49:36 events:101] Failed to capture events: Connection refused
2026-12-02 05:52:44,396 11873 omniserve.worker CRITICAL backend 'scripted' failed to load
Traceback (most recent call last):
  File "x.py", line 1, in <module>
TypeError: no_such_option
2026-12-02 05:52:44,397 11873 omniserve.worker INFO after the traceback
[2026-12-02 05:52:44,615: ERROR/MainProcess] Process 'ForkPoolWorker-1' exited with 'exitcode 3'
{"ts":"2026-12-02T05:52:44.700+00:00","level":"warning","logger":"omniserve.worker","msg":"j1"}
{"ts":"2026-12-02T05:52:44.701+00:00","level":"info","logger":"omniserve.worker","msg":"j2"}
Traceback (most recent call last):
  File "<string>", line 1, in <module>
RuntimeError: a crash no record introduced"""

SHOWN = [
    "2026-12-02 05:49:34,254 9197 omniserve.gateway WARNING OMNISERVE_ADMIN_TOKEN is not set",
    "[E 261202 05:49:36 events:101] Failed to capture events: Connection refused",
    "2026-12-02 05:52:44,396 11873 omniserve.worker CRITICAL backend 'scripted' failed to load",
    "Traceback (most recent call last):",
    '  File "x.py", line 1, in <module>',
    "TypeError: no_such_option",
    "[2026-12-02 05:52:44,615: ERROR/MainProcess] Process 'ForkPoolWorker-1' exited with "
    "'exitcode 3'",
    '{"ts":"2026-12-02T05:52:44.700+00:00","level":"warning","logger":"omniserve.worker",'
    '"msg":"j1"}',
    "Traceback (most recent call last):",
    '  File "<string>", line 1, in <module>',
    "RuntimeError: a crash no record introduced",
]


def write(path: Path, text: str) -> None:
    """``text`` added to ``path`` by another process, as a part writes its log."""
    script = "import sys; sys.stdout.write(sys.argv[1]); sys.stdout.flush()"
    with path.open("ab") as out:
        subprocess.run([sys.executable, "-c", script, text], stdout=out, check=True, timeout=30)


def test_only_warnings_and_worse_reach_the_console_without_known_noise(tmp_path) -> None:
    log = fresh_log(tmp_path / "worker-1.log")
    said: list[str] = []
    console = Console(say=said.append)
    console.follow("worker 1", log)
    half = len(WRITTEN) // 2  # a line cut in two by a read: said once, whole
    write(log, WRITTEN[:half])
    console.poll()
    write(log, WRITTEN[half:] + "\n")
    console.poll()
    assert said == [f"worker 1 | {line}" for line in SHOWN]
    assert tail(log, 3) == WRITTEN.splitlines()[-3:]


def test_a_followed_file_is_read_from_where_it_ended(tmp_path) -> None:
    """A part started again adds to its log: what the console showed before is not shown again."""
    log = fresh_log(tmp_path / "gateway.log")
    write(log, "2026-12-02 05:49:34,254 1 omniserve.gateway ERROR before\n")
    said: list[str] = []
    console = Console(say=said.append)
    console.follow("gateway", log)
    console.start()
    write(log, "2026-12-02 05:49:34,254 2 omniserve.gateway ERROR after\n")
    console.stop()  # reads what was left
    assert said == ["gateway | 2026-12-02 05:49:34,254 2 omniserve.gateway ERROR after"]
    assert fresh_log(log).read_bytes() == b""
