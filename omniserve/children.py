"""Child processes that end with the process that started them.

Why: ``omniserve up`` starts the gateway, the workers, Flower and perhaps an embedded Redis, each
in a session of its own (a terminal's Ctrl-C reaches only ``up``, which stops them in order). If
``up`` itself is killed (``kill -9``, the OOM killer, a SIGTERM before it installed its handler),
its own cleanup never runs: the children went on, holding the gateway's port and the worker
slots, until someone found and killed them. On Linux each child asks the kernel for a signal when
its parent dies (``prctl(PR_SET_PDEATHSIG)``) and so stops as it would on Ctrl-C.

The signal comes when the *thread* that started the child ends, not the process; so a child
started from any other thread than the main one is left as it was (a pool thread that ends would
stop it).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def dies_with_parent(sig: signal.Signals = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the child sent ``sig`` when this process dies; None (the child
    outlives a killed parent) off Linux and off the main thread (see the module docstring)."""
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # loaded before the fork, not in the child
    prctl = libc.prctl
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died between the fork and the prctl
            os.kill(os.getpid(), sig)

    return preexec
