"""The waiting room in Flower (api/gateway/waiting_events.py), read through Flower's own API as an
operator's browser reads it: a real gateway, a real worker with one slot, a real Flower.

A session that waits for the slot is a task that was sent and is pending, with no user content,
under the id it then runs with (STARTED, then SUCCESS); Flower's task list filtered on PENDING
counts the waiting room; a client that leaves the queue shows as revoked; and no worker ever
received or reserved a waiting session (Celery's prefetch trap, DESIGN.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.client import Client
from tests.support.fault_harness import await_for
from tests.support.redis_flower_checks import flower_from_command
from tests.support.stack import Stack

LOGIN = ("ops", "flower-pw-waiting-room")
FLOWER = ["celery", "-A", "tasks.celery_app:app", "flower"]
SECRET = "the user's own words, never in a task event"


@pytest.fixture
def flower(stack: Stack) -> Iterator[httpx.Client]:
    """Flower on the stack's broker, listening before any session starts."""
    env = {"OMNISERVE_REDIS_URL": stack.redis_url, "FLOWER_BASIC_AUTH": ":".join(LOGIN)}
    with (
        flower_from_command(FLOWER, env) as url,
        httpx.Client(base_url=url, auth=LOGIN, timeout=30) as client,
    ):
        yield client


def tasks(flower: httpx.Client, state: str | None = None) -> dict[str, dict[str, Any]]:
    """Flower's ``/api/tasks`` (of one state)."""
    got = flower.get("/api/tasks", params={"state": state} if state else {})
    got.raise_for_status()
    return dict(got.json())


def listed_as_pending(flower: httpx.Client) -> int:
    """How many tasks Flower's task page lists for ``/tasks?state=PENDING`` (its table's
    request, the count it shows under the table)."""
    got = flower.get(
        "/tasks/datatable",
        params={
            "draw": 1,
            "start": 0,
            "length": 15,
            "search[value]": "state:PENDING",
            "order[0][column]": 0,
            "order[0][dir]": "asc",
            "columns[0][data]": "name",
        },
    )
    got.raise_for_status()
    return int(got.json()["recordsFiltered"])


def held_by_workers(flower: httpx.Client) -> set[str]:
    """The task ids the workers hold (reserved or active), asked now (``celery inspect``)."""
    got = flower.get("/api/workers", params={"refresh": 1})
    got.raise_for_status()
    held = set()
    for info in got.json().values():
        for kind in ("reserved", "active"):
            held |= {t["id"] for t in info.get(kind) or []}
    return held


async def wait_state(flower: httpx.Client, task_id: str, *states: str) -> dict[str, Any]:
    """The task as Flower shows it once it is in one of ``states``."""
    seen: dict[str, Any] = {}

    def reached() -> bool:
        seen.update(tasks(flower).get(task_id, {}))
        return seen.get("state") in states

    await await_for(reached, 30, f"task {task_id} in {states} in Flower (last: {seen})")
    return seen


async def queued(stack: Stack) -> Client:
    """A duplex client told it waits."""
    client = await Client.connect(stack.url(), query="?mode=audio")
    await client.until("session.queued")
    return client


async def close(client: Client) -> None:
    await client.send({"type": "session.close"})
    await client.until("session.closed")
    await client.close()


async def test_flower_shows_the_waiting_room(stack: Stack, flower: httpx.Client) -> None:
    stack.start_worker(slots=1)
    stack.start_gateway()
    await await_for(
        lambda: any(w["status"] for w in flower.get("/workers?json=1").json()["data"]),
        60,
        "Flower hearing the worker",
    )
    holder = await Client.connect(stack.url(), query="?mode=audio")
    await holder.init({"system_prompt": SECRET})  # the one slot is held

    waiting = await queued(stack)
    await waiting.send({"type": "session.init", "payload": {"system_prompt": SECRET}})
    pending: dict[str, Any] = {}
    await await_for(lambda: pending.update(tasks(flower, "PENDING")) or pending, 30, "PENDING")
    [(task_id, task)] = pending.items()
    assert task["name"] == "omniserve.duplex_session", task
    assert (task["args"], task["kwargs"]) == ("()", "{}"), task  # no user content
    assert task["client"].startswith("gateway-"), task
    assert task["received"] is None and task.get("worker") is None, task  # no worker has it
    assert SECRET not in str(tasks(flower))
    assert listed_as_pending(flower) == 1  # the waiting room's depth, on Flower's task page
    assert task_id not in held_by_workers(flower)  # not reserved: prefetch never sees it

    leaving = await queued(stack)  # a second one waits, then gives up
    await await_for(lambda: listed_as_pending(flower) == 2, 30, "two waiting in Flower")
    [left_id] = set(tasks(flower, "PENDING")) - {task_id}
    await leaving.close()
    revoked = await wait_state(flower, left_id, "REVOKED")
    assert revoked["started"] is None and revoked["received"] is None, revoked
    assert listed_as_pending(flower) == 1

    await close(holder)  # the slot frees: the waiting session runs, as the same task
    done = await waiting.until("session.queue_done", timeout=30)
    assert done["session_id"] == task_id
    await waiting.until("session.created")
    running = await wait_state(flower, task_id, "STARTED")
    assert running["sent"] is not None and running["received"] is not None, running
    assert running["worker"].startswith("omni-"), running  # the worker runs it
    assert running["received"] > running["sent"]  # received only after it was admitted
    await close(waiting)
    await wait_state(flower, task_id, "SUCCESS")
    assert listed_as_pending(flower) == 0
    assert left_id not in held_by_workers(flower)
