"""Logging setup for omniserve processes."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from omnicore.redact import RedactingFormatter

FORMAT = "%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"


def setup_logging(level: str = "info", secrets: Iterable[str] = ()) -> None:
    """One line per record, with the process id (several workers share a terminal).

    Every line goes through ``RedactingFormatter``: URL passwords, secret query parameters,
    bearer tokens and the given ``secrets`` never reach the output.
    """
    logging.basicConfig(level=level.upper(), format=FORMAT)
    formatter = RedactingFormatter(FORMAT, secrets)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)
