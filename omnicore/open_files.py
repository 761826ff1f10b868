"""The open-files limit of this process, raised to what the system allows.

Why: every client WebSocket, Redis connection and log file is a file descriptor, and many Linux
hosts start a process with a soft limit of 1024 under a far larger hard one. A gateway meant
for a thousand sessions then ran out near a thousand: ``accept`` failed (clients saw a handshake
with no answer) and its Redis pool could not open a connection (``EMFILE``), failing sessions
that were already running. A process may raise its own soft limit up to the hard one without
privileges, as servers commonly do at start.
"""

from __future__ import annotations

import resource

CEILING = 1_048_576  # where the hard limit is "unlimited": the kernel's usual nr_open


def raise_open_files_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard one (``CEILING`` if unlimited); returns the
    soft limit now in force (the old one where the system refuses)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = CEILING if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return soft
        return target
    return CEILING if soft == resource.RLIM_INFINITY else soft
