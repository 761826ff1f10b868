"""Command-line options on top of the environment, for every subcommand that starts a part.

Shared by ``omniserve/cli.py`` (gateway, worker) and ``omniserve/up.py`` (the whole stack), so
neither imports the other for it.
"""

from __future__ import annotations

import argparse
import json
import os


def env_from_args(args: argparse.Namespace) -> None:
    """Command-line options override the environment (they become OMNISERVE_* variables)."""
    mapping = {
        "redis_url": "OMNISERVE_REDIS_URL",
        "backend": "OMNISERVE_BACKEND",
        "model": "OMNISERVE_MODEL_PATH",
        "backend_url": "OMNISERVE_BACKEND_URL",
        "device": "OMNISERVE_DEVICE",
        "slots": "OMNISERVE_WORKER_SLOTS",
        "host": "OMNISERVE_GATEWAY_HOST",
        "port": "OMNISERVE_GATEWAY_PORT",
        "backend_options": "OMNISERVE_BACKEND_OPTIONS",
    }
    for attr, var in mapping.items():
        value = getattr(args, attr, None)
        if value is not None:
            os.environ[var] = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    from omnicore.settings import get_settings

    get_settings.cache_clear()
