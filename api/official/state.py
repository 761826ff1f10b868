"""omniserve's live state in the shapes of the official demo gateway's HTTP API.

The official gateway (OpenBMB/MiniCPM-o-Demo, ``gateway.py``) drives one GPU worker per session,
so its pages count *workers*. An omniserve worker process may hold several slots, each running
one session at a time; a slot is what the official API calls a worker, and every figure here
counts slots. The sources are the same as the operator page's (``api/ops/pages.py``): the worker
registry and slot pool in Redis (all gateways), the global queue, and this gateway's own
sessions and waiting clients (start times and modes are known only for those).
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import Any

from api.gateway.queueing import Waiter
from api.gateway.state import Gateway
from api.ops.pages import slot_states
from streaming.admission import QueueSnapshot

# the id a duplex session holds its slot with (api/realtime/connection.new_session_id); chat
# turns hold theirs as ``<session>_t<n>`` (/v1/realtime chat) or ``chat_<hex>`` (/ws/chat)
_DUPLEX_HOLDER = re.compile(r"^rt_\d+_[0-9a-f]+$")
_REQUEST_TYPES = {"video": "omni_duplex", "audio": "audio_duplex", "chat": "chat"}


def _iso(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, UTC).isoformat() if ts is not None else None


def request_type(holder: str | None, gateway: Gateway) -> str | None:
    """The official ``request_type`` of what holds a slot: ``omni_duplex`` / ``audio_duplex`` /
    ``chat``; ``duplex`` for a duplex session another gateway relays (its mode is not known)."""
    if holder is None:
        return None
    local = gateway.sessions.get(holder)
    if local is not None:
        return _REQUEST_TYPES.get(local.public_mode, "duplex")
    return "duplex" if _DUPLEX_HOLDER.match(holder) else "chat"


def _waiting_connection(waiter: Waiter | None) -> object | None:
    """The connection a local ticket belongs to (``api.realtime.slot_wait`` names it): a
    /v1/realtime session has a mode and an id, a /ws/chat request (``LegacyChat``) its
    ``turn_id``."""
    return waiter.owner if waiter is not None else None


def _slot_status(worker: dict[str, Any], slot: dict[str, Any], kind: str | None) -> str:
    """The official ``GatewayWorkerStatus`` of one slot."""
    state = slot["state"]
    if state == "offline":
        return "offline"
    if worker.get("state") == "loading":
        return "loading"
    if state == "idle":
        return "idle"
    if state == "busy":
        return "busy_chat" if kind == "chat" else "duplex_active"
    return "offline"  # withdrawn: neither offered nor running (draining or stopping)


class OfficialView:
    """One consistent read of the registry, the slots and the queue, rendered on demand."""

    def __init__(
        self, gateway: Gateway, workers: list[dict[str, Any]], snap: QueueSnapshot
    ) -> None:
        self.gateway = gateway
        self.workers = workers
        self.snap = snap
        self.now = time.time()
        # slot id -> the local session holding it (when it got the slot is known)
        self.local = {h.slot_id: h for h in list(gateway.sessions.values()) if h.slot_id}

    @classmethod
    async def read(cls, gateway: Gateway) -> OfficialView:
        workers = await slot_states(gateway)
        snap = await gateway.admission.snapshot()
        return cls(gateway, workers, snap)

    def _slots(self) -> list[tuple[dict[str, Any], int, dict[str, Any]]]:
        return [(w, i, s) for w in self.workers for i, s in enumerate(w.get("slot_states", []))]

    def running_tasks(self, public: bool = False) -> list[dict[str, Any]]:
        """``RunningTaskInfo`` for every busy slot (start known for this gateway's sessions).

        ``public`` (``/status``, polled by every page): slots are named ``slot<n>``, not by
        their id, which holds the worker's node and host name.
        """
        out = []
        mean = self.snap.mean_hold_s
        for n, (_, _, slot) in enumerate(self._slots()):
            if slot["state"] != "busy":
                continue
            local = self.local.get(slot["slot_id"])
            started = local.slot_since if local is not None else None
            elapsed = round(self.now - started, 1) if started is not None else None
            out.append(
                {
                    "worker_id": f"slot{n}" if public else slot["slot_id"],
                    "request_type": request_type(slot["holder"], self.gateway) or "unknown",
                    "started_at": _iso(started),
                    "elapsed_s": elapsed,
                    "estimated_remaining_s": round(max(0.0, mean - (elapsed or 0.0)), 1),
                }
            )
        return out

    def status(self) -> dict[str, Any]:
        """``GET /status`` (``ServiceStatus``): public, so counts and no names."""
        counts = dict.fromkeys(("idle", "busy", "duplex", "loading", "offline"), 0)
        for worker, _, slot in self._slots():
            kind = request_type(slot["holder"], self.gateway)
            status = _slot_status(worker, slot, kind)
            key = {"busy_chat": "busy", "duplex_active": "duplex"}.get(status, status)
            counts[key] += 1
        return {
            "gateway_healthy": not self.gateway.shutting_down,
            "total_workers": sum(counts.values()),
            "idle_workers": counts["idle"],
            "busy_workers": counts["busy"],
            "duplex_workers": counts["duplex"],
            "loading_workers": counts["loading"],
            "error_workers": 0,  # a failed worker leaves the registry; it is never listed
            "offline_workers": counts["offline"],
            "queue_length": self.snap.length,
            "max_queue_size": self.gateway.settings.max_queue,
            "running_tasks": self.running_tasks(public=True),
        }

    def worker_list(self) -> dict[str, Any]:
        """``GET /workers`` (``WorkersResponse``): one entry per slot."""
        out = []
        for worker, index, slot in self._slots():
            kind = request_type(slot["holder"], self.gateway)
            local = self.local.get(slot["slot_id"])
            out.append(
                {
                    "worker_id": slot["slot_id"],
                    "host": str(worker.get("host", "")),
                    "port": 0,  # workers take their tasks from Redis; they listen on no port
                    "gpu_id": index,
                    "status": _slot_status(worker, slot, kind),
                    "current_session_id": slot["holder"],
                    "total_requests": 0,  # not counted per slot
                    "avg_inference_time_ms": round(self.snap.mean_hold_s * 1000, 1),
                    "last_heartbeat": None,
                    "current_request_type": kind,
                    "task_started_at": _iso(local.slot_since) if local is not None else None,
                    "alive": bool(worker.get("alive")),
                }
            )
        return {"total": len(out), "workers": out}

    def queue(self) -> dict[str, Any]:
        """``GET /api/queue`` (``QueueStatus``): the global FIFO, oldest first."""
        waiters = self.gateway.queue.waiters
        mono = time.monotonic()
        items = []
        for ticket, position in sorted(self.snap.order.items(), key=lambda kv: kv[1]):
            waiter = waiters.get(ticket)
            conn = _waiting_connection(waiter)
            mode = getattr(conn, "public_mode", "chat" if conn is not None else None)
            sid = getattr(conn, "session_id", None) or getattr(conn, "turn_id", None)
            waited = mono - waiter.enqueued_at if waiter else None
            items.append(
                {
                    "ticket_id": ticket,
                    "request_type": _REQUEST_TYPES.get(mode or "", "unknown"),
                    "session_id": sid,
                    "position": position,
                    "estimated_wait_s": float(self.snap.estimated_wait_s(position)),
                    "enqueued_at": _iso(self.now - waited) if waited is not None else None,
                    "wait_elapsed_s": round(waited, 1) if waited is not None else None,
                }
            )
        return {
            "queue_length": self.snap.length,
            "max_queue_size": self.gateway.settings.max_queue,
            "items": items,
            "running_tasks": self.running_tasks(),
        }

    def sessions(self) -> dict[str, Any]:
        """``GET /sessions``: every session holding a slot now (all gateways)."""
        out = []
        for _, _, slot in self._slots():
            if slot["state"] != "busy" or not slot["holder"]:
                continue
            out.append(
                {
                    "session_id": slot["holder"],
                    "worker_id": slot["slot_id"],
                    "messages_hash": "",  # no KV cache is kept between requests
                    "last_active": _iso(self.now),  # holding a slot: active now
                    "request_type": request_type(slot["holder"], self.gateway),
                }
            )
        return {"total": len(out), "sessions": out}
