"""Who may connect and who may look: API keys, browser origins, per-client limits, admin token.

Everything here runs before a client gets anything of value (a queue ticket, a worker slot, the
worker registry), and every rule answers with a documented error (docs/PROTOCOL.md,
docs/SECURITY.md):

- **API keys** (``OMNISERVE_API_KEYS``, and the named keys in Redis: ``streaming/keystore.py``,
  ``api/security/key_check.py``): ``Authorization: Bearer <key>`` (what the public SDK
  sends; it offers the ``map.realtime`` subprotocol only as a marker, without a key) or
  ``?api_key=<key>`` (browsers cannot set WebSocket headers). The settings' keys are compared in
  constant time, a named key looked up by its sha256; the key's name goes with the connection.
- **Origins** (``OMNISERVE_ALLOWED_ORIGINS``): a request with an ``Origin`` header comes from a
  browser page; it is accepted from the listed origins and from the gateway's own (the web client
  it serves). No ``Origin``: not a browser, not checked.
- **Connections per client address** (``OMNISERVE_MAX_CONNECTIONS_PER_CLIENT``), counted across
  all gateways (``streaming/connections.py``). The address is the peer's, or the one a trusted
  proxy (``OMNISERVE_TRUSTED_PROXIES``) reports in ``X-Forwarded-For`` (uvicorn's
  ``ProxyHeadersMiddleware``, installed by ``api/app.py``).
- **Admin token** (``OMNISERVE_ADMIN_TOKEN``): ``require_admin`` is the one FastAPI dependency
  that guards ``/metrics``, ``/v1/workers`` and every ``/v1/admin/*`` endpoint. Without a token
  those are open on a loopback bind only, and answer 403 otherwise.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit

from fastapi import HTTPException, Request
from pydantic import SecretStr
from redis.exceptions import ResponseError
from starlette.requests import HTTPConnection
from starlette.status import (
    WS_1008_POLICY_VIOLATION,
    WS_1013_TRY_AGAIN_LATER,
)

from api.security.connection_cap import ConnectionCap
from api.security.key_check import IDENTITY_SCOPE, KeyRefused, identify
from omnicore.settings import Settings
from streaming.connections import ClientConnections, TooManyConnections
from streaming.events import ErrorCode
from streaming.keystore import KeyStore

log = logging.getLogger("omniserve.gateway")

DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


@dataclass(frozen=True, slots=True)
class EntryDenied:
    """Why a WebSocket is not let in (key, origin, a connection limit): the error to send and
    the close code."""

    code: ErrorCode
    message: str
    close_code: int


# --------------------------------------------------------------------------- API keys


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()


def key_matches(given: str | None, keys: Sequence[SecretStr]) -> bool:
    """Whether ``given`` is one of ``keys``, in constant time.

    Both sides are hashed first (equal lengths: a length mismatch leaks nothing) and every key is
    compared, without stopping at a match.
    """
    if not given:
        return False
    probe = _digest(given)
    found = False
    for key in keys:
        found |= hmac.compare_digest(probe, _digest(key.get_secret_value()))
    return found


def presented_key(conn: HTTPConnection) -> str | None:
    """The API key a client sent: bearer header first, else the ``api_key`` query parameter."""
    header = conn.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return conn.query_params.get("api_key") or None


# --------------------------------------------------------------------------- origins


def normalise_origin(origin: str) -> str | None:
    """``scheme://host[:port]`` lowercased, default port dropped; None when not an origin."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    if port is not None and port != DEFAULT_PORTS[parts.scheme]:
        host = f"{host}:{port}"
    return f"{parts.scheme}://{host}"


def _host_of(origin: str) -> str:
    return origin.split("://", 1)[1]


def origin_allowed(origin: str | None, host: str | None, allowed: Sequence[str]) -> bool:
    """Whether a connection with this ``Origin`` (and ``Host``) header may proceed."""
    if origin is None:
        return True  # not a browser: browsers always send Origin on WebSocket handshakes
    if "*" in allowed:
        return True
    norm = normalise_origin(origin)
    if norm is None:
        return False  # "null" (sandboxed frames, file:) and anything malformed
    if norm in {normalise_origin(a) for a in allowed}:
        return True
    if not host:
        return False
    # the gateway's own pages (its web client): the page's host is the host it asked
    scheme = norm.split("://", 1)[0]
    own = normalise_origin(f"{scheme}://{host.strip()}")
    return own is not None and _host_of(own) == _host_of(norm)


# --------------------------------------------------------------------------- the policy


def is_loopback(host: str) -> bool:
    """Whether a bind address only accepts connections from this machine."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name, 0.0.0.0, ::: reachable from elsewhere


class SecurityPolicy:
    """The settings' security rules, prepared once per gateway process."""

    def __init__(self, settings: Settings) -> None:
        self.api_keys = list(settings.api_keys)
        token = settings.admin_token.get_secret_value() if settings.admin_token else ""
        self.admin_token = token or None
        self.allowed_origins = list(settings.allowed_origins)
        self.bind_host = settings.gateway_host
        self.loopback_bind = is_loopback(settings.gateway_host)
        self.max_per_client = settings.max_connections_per_client
        self.trusted_proxies = [str(n) for n in settings.trusted_proxies]
        self.keystore: KeyStore | None = None  # the named keys (set by ``create_app``)
        self.require_key = settings.require_api_key

    # ------------------------------------------------------------------ WebSockets
    def check_socket(self, conn: HTTPConnection) -> EntryDenied | None:
        """Origin, then the settings' API keys: the denial to send, or None."""
        denied = self.check_origin(conn)
        if denied is None and self.api_keys and not key_matches(presented_key(conn), self.api_keys):
            return EntryDenied(
                ErrorCode.UNAUTHORIZED, "missing or invalid API key", WS_1008_POLICY_VIOLATION
            )
        return denied

    def check_origin(self, conn: HTTPConnection) -> EntryDenied | None:
        if not origin_allowed(
            conn.headers.get("origin"), conn.headers.get("host"), self.allowed_origins
        ):
            return EntryDenied(
                ErrorCode.ORIGIN_NOT_ALLOWED,
                "origin not allowed",
                WS_1008_POLICY_VIOLATION,
            )
        return None

    async def check_key(self, conn: HTTPConnection) -> EntryDenied | None:
        """The settings' keys and the named ones (``keystore``): the denial, or None; the
        connection's identity goes into its scope (``api/security/key_check.py``)."""
        try:
            identity = await identify(
                presented_key(conn), self.api_keys, self.keystore, self.require_key
            )
        except KeyRefused as exc:
            return EntryDenied(ErrorCode.UNAUTHORIZED, str(exc), WS_1008_POLICY_VIOLATION)
        except Exception:
            log.warning("API key look-up failed", exc_info=True)
            return EntryDenied(
                ErrorCode.SERVICE_UNAVAILABLE,
                "service unavailable: the gateway cannot reach Redis",
                WS_1013_TRY_AGAIN_LATER,
            )
        conn.scope[IDENTITY_SCOPE] = identity
        return None

    # ------------------------------------------------------------------ admin endpoints
    def check_admin(self, conn: HTTPConnection) -> None:
        """Raise 401 (wrong or missing token) or 403 (no token configured, public bind)."""
        if self.admin_token is None:
            if self.loopback_bind:
                return
            raise HTTPException(
                403,
                "admin endpoints are disabled: this gateway is not bound to loopback and "
                "OMNISERVE_ADMIN_TOKEN is not set",
            )
        header = conn.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        given = value.strip() if scheme.lower() == "bearer" else ""
        if not hmac.compare_digest(_digest(given), _digest(self.admin_token)):
            raise HTTPException(401, "admin token required", {"WWW-Authenticate": "Bearer"})

    def startup_warnings(self) -> list[str]:
        """What an operator should hear about at start-up (logged as warnings)."""
        out = []
        where = f"bound to {self.bind_host}"
        if self.admin_token is None:
            if self.loopback_bind:
                out.append(
                    "OMNISERVE_ADMIN_TOKEN is not set: /metrics, /v1/workers and /v1/admin/* are "
                    f"open to anyone on this machine ({where}); set a token before binding "
                    "elsewhere"
                )
            else:
                out.append(
                    "OMNISERVE_ADMIN_TOKEN is not set: /metrics, /v1/workers and /v1/admin/* "
                    f"answer 403 ({where}, not loopback)"
                )
        if not self.loopback_bind:
            if not self.api_keys and not self.require_key:
                out.append(
                    f"OMNISERVE_API_KEYS is empty: unless a named key exists (omniserve keys), "
                    f"anyone who reaches {where} is served; OMNISERVE_REQUIRE_API_KEY=true "
                    "refuses clients without a key whatever Redis holds"
                )
            if self.max_per_client <= 0:
                out.append(
                    "OMNISERVE_MAX_CONNECTIONS_PER_CLIENT is 0: one client address may open "
                    "any number of connections"
                )
        if any(n in ("0.0.0.0/0", "::/0") for n in self.trusted_proxies):
            out.append(
                "OMNISERVE_TRUSTED_PROXIES trusts every address: any client can claim any "
                "X-Forwarded-For address"
            )
        return out


def client_address(conn: HTTPConnection) -> str:
    """The client's address (after ``ProxyHeadersMiddleware`` applied X-Forwarded-For)."""
    return conn.client.host if conn.client else "unknown"


async def require_admin(request: Request) -> None:
    """FastAPI dependency for every operator endpoint: ``dependencies=[Depends(require_admin)]``.

    Reads the gateway's ``SecurityPolicy`` from ``app.state.security`` (set by ``create_app``).
    """
    policy: SecurityPolicy = request.app.state.security
    policy.check_admin(request)


@asynccontextmanager
async def let_in(
    conn: HTTPConnection,
    policy: SecurityPolicy,
    connections: ClientConnections,
    cap: ConnectionCap,
) -> AsyncIterator[EntryDenied | None]:
    """A WebSocket's checks before it may queue; holds its per-address count and its place
    under the gateway's connection cap while inside.

    Yields the denial to answer with, or None: then the connection counts against its address
    and the cap until the block ends.
    """
    denied = policy.check_origin(conn) or await policy.check_key(conn)
    if denied is not None:
        yield denied
        return
    if not cap.take():
        log.warning("refused a connection: this gateway holds %d, its limit", cap.limit)
        yield EntryDenied(
            ErrorCode.SERVICE_UNAVAILABLE,
            f"service unavailable: this gateway is at its connection limit ({cap.limit})",
            WS_1013_TRY_AGAIN_LATER,
        )
        return
    try:
        async with _counted(conn, connections) as counted:
            yield counted
    finally:
        cap.give_back()


@asynccontextmanager
async def _counted(
    conn: HTTPConnection, connections: ClientConnections
) -> AsyncIterator[EntryDenied | None]:
    """The per-address count of ``let_in``: the denial, or None while it is held."""
    address = client_address(conn)
    try:
        await connections.acquire(address)
    except TooManyConnections:
        log.info("refused a connection from %s: %d open already", address, connections.limit)
        yield EntryDenied(
            ErrorCode.TOO_MANY_CONNECTIONS,
            f"too many connections from this address (at most {connections.limit})",
            WS_1013_TRY_AGAIN_LATER,
        )
        return
    except Exception as exc:  # Redis unreachable, or refusing writes: nothing could be served
        log.warning("connection count of %s unavailable", address, exc_info=True)
        why = (
            f"Redis refuses writes: {exc}"
            if isinstance(exc, ResponseError)
            else "the gateway cannot reach Redis"
        )
        yield EntryDenied(
            ErrorCode.SERVICE_UNAVAILABLE, f"service unavailable: {why}", WS_1013_TRY_AGAIN_LATER
        )
        return
    try:
        yield None
    finally:
        await connections.release(address)
