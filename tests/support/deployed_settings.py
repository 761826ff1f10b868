"""The settings an omniserve process reads from a deployment's environment (a compose service's
``environment``, a pod's resolved ``env``), and from nothing else.

Why: what a deployment gives a gateway or a worker is checked by what ``Settings`` makes of it;
the test process's own ``OMNISERVE_*`` and ``REDIS_URL`` would mix in otherwise.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from omnicore.settings import Settings


def settings_of(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """``Settings`` read from ``env`` alone (the test's own environment set aside)."""
    from omnicore.settings import Settings

    for key in list(os.environ):
        if key.startswith("OMNISERVE_") or key == "REDIS_URL":
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return Settings()
