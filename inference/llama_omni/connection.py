"""One ``/backend`` WebSocket session with the server (synchronous ``websockets`` client: the
Backend interface is called from a worker thread)."""

from __future__ import annotations

import json
import logging
from typing import Any, Protocol

from inference.base import BackendError, InferenceError
from inference.llama_omni.protocol import LlamaOmniSessionClosed, metrics_kv

log = logging.getLogger("omniserve.inference.llama_omni")


class ServerEndpoint(Protocol):
    """What a connection uses of its backend: where the server is, how long to wait, how to
    close a session over HTTP.

    (``LlamaOmniBackend`` is one; naming the needs here keeps this module below backend.py,
    which imports it, instead of the two importing each other.)
    """

    ws_url: str
    connect_timeout_s: float
    init_timeout_s: float
    close_timeout_s: float

    def http_close(self, session_id: str) -> bool:
        """``POST /sessions/{id}/close``; False when the server did not confirm it."""
        ...


class LlamaOmniConnection:
    """Open, send, receive (server closes become ``LlamaOmniSessionClosed``), close."""

    def __init__(self, backend: ServerEndpoint) -> None:
        self.backend = backend
        self.ws: Any = None
        self.session_id: str | None = None
        self.kv = 0
        self.closed = False
        self.close_error: LlamaOmniSessionClosed | None = None

    def open(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Connect, send ``session.init`` and wait for ``session.created``."""
        from websockets.exceptions import ConnectionClosed, InvalidHandshake
        from websockets.sync.client import connect

        b = self.backend
        try:
            self.ws = connect(
                b.ws_url,
                open_timeout=b.connect_timeout_s,
                close_timeout=b.close_timeout_s,
                max_size=None,
                ping_interval=None,
                compression=None,
            )
            # used as a context manager from here to close(): websockets >= 17.1 warns otherwise
            self.ws = self.ws.__enter__()
        except (OSError, InvalidHandshake, TimeoutError) as exc:
            raise BackendError(f"cannot connect to llama-omni-server at {b.ws_url}: {exc}") from exc
        try:
            self.ws.send(json.dumps({"type": "session.init", "payload": payload}))
        except ConnectionClosed as exc:
            raise BackendError(
                "llama-omni-server closed the connection during session.init"
            ) from exc
        event = self.recv(b.init_timeout_s, waiting_for="session.created")
        if event.get("type") != "session.created":
            self.abort()
            raise BackendError(
                f"expected session.created from llama-omni-server, got {event.get('type')!r}"
            )
        self.session_id = str(event.get("session_id") or "")
        self.kv = metrics_kv(event) or 0
        log.info(
            "llama-omni session %s created (mode=%s, kv=%d)",
            self.session_id,
            event.get("mode"),
            self.kv,
        )
        return event

    def send(self, message: dict[str, Any]) -> None:
        from websockets.exceptions import ConnectionClosed

        if self.closed:
            raise self.close_error or BackendError("llama-omni session is closed")
        try:
            self.ws.send(json.dumps(message))
        except ConnectionClosed as exc:
            self._closed_by_server(None)
            raise self.close_error from exc  # type: ignore[misc]

    def _closed_by_server(self, event: dict[str, Any] | None) -> None:
        self.closed = True
        if event is None:
            if self.session_id is None:
                err = LlamaOmniSessionClosed(
                    "rejected",
                    "llama-omni-server closed the connection before session.created "
                    "(a session is already active on it, or session.init was refused)",
                )
            else:
                err = LlamaOmniSessionClosed(
                    "connection_lost", "the connection to llama-omni-server was lost"
                )
        else:
            diag = event.get("diagnostic")
            diag_text = diag.get("message") if isinstance(diag, dict) else None
            err = LlamaOmniSessionClosed(
                str(event.get("reason") or "unknown"), diagnostic=diag_text
            )
        self.close_error = err
        self._close_socket()

    def recv(self, timeout: float, waiting_for: str = "a reply") -> dict[str, Any]:
        """Next event; raises on session.closed / disconnect, TimeoutError on timeout."""
        from websockets.exceptions import ConnectionClosed

        if self.closed:
            raise self.close_error or BackendError("llama-omni session is closed")
        try:
            raw = self.ws.recv(timeout=max(0.0, timeout))
        except TimeoutError:
            raise TimeoutError(
                f"no {waiting_for} from llama-omni-server within {timeout:.1f} s"
            ) from None
        except ConnectionClosed as exc:
            self._closed_by_server(None)
            raise self.close_error from exc  # type: ignore[misc]
        try:
            event = json.loads(raw)
        except (TypeError, ValueError) as exc:
            self.abort()
            raise BackendError(f"llama-omni-server sent a frame that is not JSON: {exc}") from exc
        if not isinstance(event, dict):
            raise BackendError("llama-omni-server sent a frame that is not a JSON object")
        kv = metrics_kv(event)
        if kv is not None:
            self.kv = kv
        if event.get("type") == "session.closed":
            self._closed_by_server(event)
            raise self.close_error  # type: ignore[misc]
        if event.get("type") == "error":
            err = event.get("error")
            if not isinstance(err, dict):
                err = {}
            raise InferenceError(f"llama-omni-server error: {err.get('message') or event}")
        return event

    def _close_socket(self) -> None:
        if self.ws is None:
            return
        try:
            self.ws.close()
        except Exception:
            log.debug("closing the llama-omni-server socket failed", exc_info=True)

    def abort(self) -> None:
        """Drop the connection without telling the server."""
        self.closed = True
        self._close_socket()

    def close(self) -> None:
        """Close the server session (HTTP close first: it returns once inference has stopped)."""
        if self.session_id and not (
            self.close_error and self.close_error.reason != "client_closed"
        ):
            self.backend.http_close(self.session_id)
        self.abort()
