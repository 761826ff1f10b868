"""A gateway's cap on client connections, and its open-files limit
(``api/security/connection_cap.py``).

Past its open-files limit a gateway's handshakes went unanswered (the clients saw "did not
receive a valid HTTP response") and its Redis pool could not open connections. Now the soft
limit is raised to the hard one at start, and the clients over the cap that the limit leaves
are refused the documented way (``service_unavailable``, close 1013) while ``/readyz`` says so.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.support.client import Client
from tests.support.fault_harness import served_end_to_end
from tests.support.stack import Stack

pytestmark = pytest.mark.slow


def health(port: int) -> dict:
    return httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()


def readyz(port: int) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)


async def refused(url: str, path: str = "/v1/realtime", query: str = "?mode=audio") -> dict:
    """A connection over the cap: its error frame (the close code checked too)."""
    c = await Client.connect(url, path=path, query=query)
    frame = await c.until("error", timeout=15)
    assert await c.closed() == 1013
    return frame


async def test_clients_over_the_cap_are_refused_and_the_count_comes_back(stack: Stack) -> None:
    stack.start_worker()
    # the first client holds the slot silently for the whole test: not ended as idle
    port = stack.start_gateway(
        OMNISERVE_GATEWAY_MAX_CONNECTIONS="3", OMNISERVE_CLIENT_IDLE_TIMEOUT_S="0"
    )
    url = stack.url()
    assert health(port)["connection_limit"] == 3
    # one after the other, so that their places in the queue are in this order
    held = [await Client.connect(url, query="?mode=audio")]
    await held[0].until("session.queue_done")
    for _ in range(2):
        held.append(await Client.connect(url, query="?mode=audio"))
        await held[-1].until("session.queued")
    frame = await refused(url)
    assert frame["error"]["code"] == "service_unavailable"
    assert "at its connection limit (3)" in frame["error"]["message"]
    legacy = await refused(url, path="/ws/chat", query="")
    assert "at its connection limit (3)" in str(legacy)
    body = health(port)
    assert body["connections"] == 3
    assert any("connection limit" in n for n in body["notes"])
    ready = readyz(port)
    assert ready.status_code == 503 and ready.json()["at_connection_limit"] is True
    # one leaves: its place is given back, a new client is served end to end (each holder
    # leaves with session.close, so its slot is not kept for a resume)
    await held[0].send({"type": "session.close"})
    await held[0].close()
    await held[1].until("session.queue_done", timeout=15)
    await held[1].send({"type": "session.close"})
    await held[1].close()
    await held[2].until("session.queue_done", timeout=15)
    await held[2].send({"type": "session.close"})
    await held[2].close()
    await served_end_to_end(url, timeout=20)
    deadline = asyncio.get_running_loop().time() + 10
    while health(port)["connections"] != 0:  # every way out gave its place back
        assert asyncio.get_running_loop().time() < deadline, health(port)
        await asyncio.sleep(0.1)
    assert readyz(port).status_code == 200


async def test_the_open_files_limit_is_raised_and_what_it_allows_is_refused_cleanly(
    stack: Stack,
) -> None:
    """A gateway started with a soft limit of 150 under a hard one of 400: it raises the soft
    one to 400 and holds 400 - 256 (Redis pool) - 64 = 80 clients. 100 connect at once: 80 are
    queued or served, the other 20 are refused with ``service_unavailable``, none fails
    without an answer, and the gateway serves afterwards. (Before, at 200 of 200 descriptors,
    82 of 260 clients got no answer to their handshake at all.)"""
    stack.start_worker()
    port = stack.start_gateway(nofile=(150, 400))
    assert health(port)["connection_limit"] == 80
    url = stack.url()

    async def one() -> tuple[Client, str]:
        c = await Client.connect(url, query="?mode=audio")
        frame = await c.until("session.queued", "session.queue_done", "error", timeout=30)
        return c, frame["type"] if frame["type"] != "error" else frame["error"]["code"]

    got = await asyncio.gather(*(one() for _ in range(100)))
    kinds = [k for _, k in got]
    assert kinds.count("service_unavailable") == 20, kinds
    assert len([k for k in kinds if k.startswith("session.")]) == 80, kinds
    for c, _ in got:
        await c.close()
    await served_end_to_end(url, timeout=30)
