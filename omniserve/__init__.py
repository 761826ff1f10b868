"""omniserve: a horizontally scalable Realtime API server for MiniCPM-o."""

__version__ = "0.1.0"
