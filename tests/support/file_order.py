"""The order in which ``omniserve test``'s xdist workers take the test files: longest first.

xdist (``--dist loadfile``) hands out whole files one at a time, by default those with the most
tests first; a slow file of one test (the soak, the pocket benchmark) then came last, and one
worker ran it alone for a minute while the others had finished. Started first, the long files
spread over the workers and the short ones fill the end (about 30 s off a 15-minute run).
"""

from __future__ import annotations

from collections import Counter

import pytest

# seconds per file in a full run on 2 cores in three workers (2026-11-28); a file not listed runs
# after these, the ones with more tests first (xdist's own order). Stale figures cost time, never
# a result.
LONGEST = (
    "tests/e2e/test_broker.py",  # 100 (with test_broker_stall.py beside it, 2026-12-03)
    "tests/faults/test_clients_leaving.py",  # 98
    "tests/bench/test_smoke.py",  # 97
    "tests/e2e/test_service.py",  # 86
    "tests/faults/test_worker_death.py",  # 78
    "tests/faults/test_soak.py",  # 77
    "tests/e2e/test_conformance.py",  # 76
    "tests/e2e/test_web_client.py",  # 75, and installing chromium on a fresh machine
    "tests/faults/test_redis_full.py",  # 72
    "tests/faults/test_dropped_packets.py",  # 70
    "tests/faults/test_dead_clients.py",  # 63
    "tests/e2e/test_relay_gap.py",  # 58
    "tests/e2e/test_metering.py",  # 55 (measured alone, 2026-12-02)
    "tests/faults/test_gateway_freeze.py",  # 57
    "tests/faults/test_partition.py",  # 55
    "tests/e2e/test_spec_gaps.py",  # 54
    "tests/bench/test_pocket.py",  # 54
    "tests/bench/test_check.py",  # 49
    "tests/e2e/test_resume_chat.py",  # 49
    "tests/faults/test_start_elsewhere.py",  # 47
    "tests/e2e/test_official_protocol.py",  # 44
    "tests/unit/inference/pocket/test_llm.py",  # 43
    "tests/e2e/test_resume.py",  # 42
    "tests/deploy/test_manifest_options.py",  # 45 (measured alone, 2026-12-03)
    "tests/deploy/test_compose_options.py",  # 40 (measured alone, 2026-12-03)
    "tests/e2e/test_ops.py",  # 41
    "tests/faults/test_hung_step.py",  # 41
    "tests/e2e/test_metrics.py",  # 33
    "tests/faults/test_redis_stall.py",  # 33
    "tests/faults/test_broker_stall.py",  # 30 (measured alone, 2026-12-03)
    "tests/e2e/test_fuzz_protocol.py",  # 31
    "tests/e2e/test_security_access.py",  # 31
    "tests/e2e/test_recordings.py",  # 30
    "tests/e2e/test_up.py",  # 30
    "tests/e2e/test_relay_paths.py",  # 28
    "tests/faults/test_gateway_start.py",  # 26
    "tests/e2e/test_failover.py",  # 21
    "tests/faults/test_worker_freeze.py",  # 21
    "tests/unit/inference/pocket/test_backend.py",  # 20
    "tests/deploy/test_compose.py",  # 20
    "tests/e2e/test_official_http.py",  # 20
    "tests/faults/test_gateway_death.py",  # 17
    "tests/e2e/test_pocket.py",  # 16
)


def longest_first(items: list[pytest.Item]) -> None:
    """Sort ``items`` file by file (in place): the ``LONGEST`` files in that order, then the rest
    by their number of tests; a file's own tests keep their order."""
    rank = {path: i for i, path in enumerate(LONGEST)}
    tests = Counter(_file(item) for item in items)
    items.sort(key=lambda item: (rank.get(_file(item), len(rank)), -tests[_file(item)]))


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]
