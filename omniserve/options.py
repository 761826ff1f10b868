"""Command-line options on top of the environment, for every subcommand that starts a part,
and the gateway's address as a client on this machine reaches it.

Shared by ``omniserve/cli.py`` (gateway, worker, probe) and ``omniserve/up.py`` (the whole
stack, its banner), so neither imports the other for it.
"""

from __future__ import annotations

import argparse
import json
import os


def env_from_args(args: argparse.Namespace) -> None:
    """Command-line options override the environment (they become OMNISERVE_* variables)."""
    mapping = {
        "redis_url": "OMNISERVE_REDIS_URL",
        "broker_url": "OMNISERVE_BROKER_URL",
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


def client_url(host: str, port: int) -> str:
    """The WebSocket URL a client on this machine reaches a gateway bound to ``host:port`` at: a
    bind to every address (``0.0.0.0``, ``::``) is reached on loopback."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"ws://[{host}]:{port}" if ":" in host else f"ws://{host}:{port}"
