"""Logging setup for omniserve processes."""

from __future__ import annotations

import logging


def setup_logging(level: str = "info") -> None:
    """One line per record, with the process id (several workers share a terminal)."""
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s",
    )
