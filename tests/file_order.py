"""The order in which ``omniserve test``'s two xdist workers take the test files: longest first.

xdist (``--dist loadfile``) hands out whole files one at a time, by default those with the most
tests first; a slow file of one test (the soak, the pocket benchmark) then came last, and one
worker ran it alone for a minute while the other had finished. Started first, the long files
spread over both workers and the short ones fill the end (about 30 s off a 15-minute run).
"""

from __future__ import annotations

from collections import Counter

import pytest

# seconds per file in a full run on 2 cores (2026-11-28); a file not listed runs after these,
# the ones with more tests first (xdist's own order). Stale figures cost time, never a result.
LONGEST = (
    "tests/test_conformance.py",  # 103
    "tests/faults/test_worker_death.py",  # 102
    "tests/test_service_e2e.py",  # 95
    "tests/test_bench_smoke.py",  # 91
    "tests/faults/test_clients_leaving.py",  # 90
    "tests/test_web_client.py",  # 84, and installing chromium on a fresh machine
    "tests/faults/test_redis_full.py",  # 75
    "tests/faults/test_soak.py",  # 74
    "tests/test_fuzz_protocol.py",  # 68
    "tests/faults/test_partition.py",  # 66
    "tests/faults/test_dead_clients.py",  # 64
    "tests/test_relay_gap.py",  # 60
    "tests/test_spec_gaps.py",  # 58
    "tests/test_bench_check.py",  # 50
    "tests/test_bench_pocket.py",  # 50
    "tests/faults/test_dropped_packets.py",  # 75
    "tests/faults/test_gateway_freeze.py",  # 48
    "tests/test_resume_chat.py",  # 47
    "tests/faults/test_start_elsewhere.py",  # 46
    "tests/test_official_protocol.py",  # 45
    "tests/test_ops.py",  # 45
    "tests/test_resume.py",  # 44
    "tests/faults/test_redis_stall.py",  # 40
    "tests/test_pocket_llm.py",  # 37
    "tests/test_metrics.py",  # 36
    "tests/test_security_access.py",  # 34
    "tests/test_recordings.py",  # 32
    "tests/test_pocket_backend.py",  # 29
    "tests/test_relay_paths.py",  # 28
    "tests/test_cli_up.py",  # 28
    "tests/faults/test_worker_freeze.py",  # 23
    "tests/faults/test_gateway_start.py",  # 30
)


def longest_first(items: list[pytest.Item]) -> None:
    """Sort ``items`` file by file (in place): the ``LONGEST`` files in that order, then the rest
    by their number of tests; a file's own tests keep their order."""
    rank = {path: i for i, path in enumerate(LONGEST)}
    tests = Counter(_file(item) for item in items)
    items.sort(key=lambda item: (rank.get(_file(item), len(rank)), -tests[_file(item)]))


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]
