"""Everything that crosses Redis: key names, the admission queue, the worker registry and leases,
the per-session output channel with its replay log, and the per-session input streams.

This package imports nothing from api/, tasks/ or inference/.
"""
