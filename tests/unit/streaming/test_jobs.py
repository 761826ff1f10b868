"""streaming/jobs.py: what the gateway submits matches what the worker tasks accept."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from streaming.jobs import CHAT_TASK, DUPLEX_TASK, ChatJob, DuplexJob, Job
from tasks.celery_app import app
from tasks.chat import chat_turn
from tasks.duplex import duplex_session


@pytest.mark.parametrize(
    "job_cls,task", [(DuplexJob, duplex_session), (ChatJob, chat_turn)], ids=["duplex", "chat"]
)
def test_job_fields_are_the_task_parameters(job_cls: type[Job], task: object) -> None:
    fields = [f.name for f in dataclasses.fields(job_cls)]
    params = list(inspect.signature(task.run).parameters)  # type: ignore[attr-defined]
    assert fields == params
    assert task.name == job_cls.task and job_cls.task in app.tasks  # type: ignore[attr-defined]


def test_kwargs_and_names() -> None:
    job = DuplexJob(
        session_id="rt_1", slot_id="w#1|0", gateway_id="g", public_mode="audio", deadline_ts=1.0
    )
    assert job.task == DUPLEX_TASK and ChatJob.task == CHAT_TASK
    assert job.kwargs() == {
        "session_id": "rt_1",
        "slot_id": "w#1|0",
        "gateway_id": "g",
        "public_mode": "audio",
        "deadline_ts": 1.0,
        "attempt": 0,
        "fresh": False,
    }
    assert job.claim_id == "rt_1"  # a failover's attempt claims its own id
    again = dataclasses.replace(job, attempt=2)
    assert again.claim_id == "rt_1.r2" and again.kwargs()["attempt"] == 2
    turn = ChatJob(turn_id="rt_1_t1", slot_id="w#1|0", gateway_id="g", deadline_ts=1.0)
    assert turn.task_id == turn.claim_id == "rt_1_t1" and turn.kwargs()["attempt"] == 0
    moved = dataclasses.replace(turn, attempt=1)  # its first worker died before starting it
    assert moved.task_id == moved.claim_id == "rt_1_t1.r1"
