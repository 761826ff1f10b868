"""``GET /v1/admin/overview``: what the operator page shows of the live sessions and slots.

The page reads the gateway's session handlers (``api/ops/pages.py``); these tests keep that view
true to the real sessions: a duplex session names the slot it holds, a chat session holds one only
while a turn runs.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.support.client import Client
from tests.support.stack import Stack

pytestmark = pytest.mark.asyncio

HANG = "[hang]"


async def overview(stack: Stack) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        r = await http.get(f"http://127.0.0.1:{stack.gateways[0][1]}/v1/admin/overview")
    r.raise_for_status()
    return dict(r.json())


async def session_view(stack: Stack, session_id: str) -> dict[str, Any]:
    (view,) = [s for s in (await overview(stack))["sessions"] if s["session_id"] == session_id]
    return dict(view)


async def wait_view(stack: Stack, session_id: str, key: str, want: Any, timeout: float = 30) -> Any:
    """Poll the overview until the session's ``key`` satisfies ``want`` (a value or a test)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        view = await session_view(stack, session_id)
        ok = want(view[key]) if callable(want) else view[key] == want
        if ok:
            return view
        assert loop.time() < deadline, f"{key} of {session_id} stayed {view[key]!r}"
        await asyncio.sleep(0.05)


def busy_slots(ov: dict[str, Any]) -> set[str]:
    return {s["slot_id"] for w in ov["workers"] for s in w["slot_states"] if s["state"] == "busy"}


async def test_sessions_show_mode_state_dialect_and_slot(stack: Stack) -> None:
    stack.start_worker(slots=2, OMNISERVE_BACKEND_OPTIONS=f'{{"hang_on_text": "{HANG}"}}')
    stack.start_gateway()
    duplex = await Client.connect(stack.url(), query="?mode=audio")
    chat = await Client.connect(stack.url(), query="?mode=chat")
    try:
        created = await duplex.init()
        await chat.init()
        view = await session_view(stack, created["session_id"])
        assert view["mode"] == "audio" and view["state"] == "ACTIVE"
        assert view["dialect"] == "current" and view["limit_s"] == 600.0
        assert view["slot_id"] in busy_slots(await overview(stack))

        (chat_id,) = {s["session_id"] for s in (await overview(stack))["sessions"]} - {
            created["session_id"]
        }
        view = await session_view(stack, chat_id)
        assert view["mode"] == "chat" and view["state"] == "ACTIVE"
        assert view["slot_id"] is None  # no turn: no slot
        await chat.send(
            {
                "type": "input.append",
                "input": {"messages": [{"role": "user", "content": "Reply with exactly: ok"}]},
            }
        )
        assert (await chat.until("response.done"))["text"] == "ok"
        await wait_view(stack, chat_id, "slot_id", None)  # given back with the turn
        await chat.send(
            {
                "type": "input.append",
                "input": {"messages": [{"role": "user", "content": f"{HANG} stay"}]},
            }
        )
        view = await wait_view(stack, chat_id, "slot_id", lambda v: v is not None)
        busy = busy_slots(await overview(stack))
        assert view["slot_id"] in busy and len(busy) == 2
    finally:
        await duplex.close()
        await chat.close()
