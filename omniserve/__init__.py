"""omniserve: the command line and process wiring on top of the gateway, workers and backends."""

from omnicore import __version__

__all__ = ["__version__"]
