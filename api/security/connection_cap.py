"""How many client WebSockets one gateway process holds at once.

Why: past its open-files limit a gateway fails in ways no client can read (a handshake with no
answer) and takes running sessions with it (its Redis pool cannot open a connection). Below the
limit, with room kept for everything else the process opens, a client over the cap is refused
the documented way instead: ``error service_unavailable`` and close 1013 (the spec's "try again
later"), and ``/readyz`` answers 503 meanwhile, so a load balancer sends new clients to another
gateway. The limit is ``OMNISERVE_GATEWAY_MAX_CONNECTIONS`` or, at 0, what the open-files limit
leaves after ``redis_max_connections`` and ``RESERVE``.
"""

from __future__ import annotations

from dataclasses import dataclass

from omnicore.open_files import raise_open_files_limit
from omnicore.settings import Settings

RESERVE = 64  # the listening socket, pub/sub and input link, logs, recordings, HTTP probes


@dataclass
class ConnectionCap:
    """The process's count of client WebSockets against its limit (one event loop: no lock)."""

    limit: int
    open_files: int = 0  # the open-files limit it was derived from (0: set explicitly)
    open: int = 0

    @classmethod
    def for_gateway(cls, settings: Settings) -> ConnectionCap:
        """Raise the open-files limit, then derive the cap from it unless one is set."""
        files = raise_open_files_limit()
        if settings.gateway_max_connections > 0:
            return cls(settings.gateway_max_connections, files)
        return cls(max(1, files - settings.redis_max_connections - RESERVE), files)

    @property
    def full(self) -> bool:
        return self.open >= self.limit

    def take(self) -> bool:
        """Count one more connection; False (nothing counted) when at the limit."""
        if self.full:
            return False
        self.open += 1
        return True

    def give_back(self) -> None:
        self.open = max(0, self.open - 1)
