"""Everything that crosses Redis: key names, the admission queue, the worker registry and leases,
the per-session output channel with its replay log, the per-session input streams, and the
typed contract between worker and gateway (``events``, ``controls``, ``jobs``).

This package imports only ``omnicore`` of ours: never ``api``, ``tasks`` or ``inference``.
"""
