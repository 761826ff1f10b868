"""omnicore/logs.py: text and JSON lines, redacted, each naming the session it is about."""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Iterator

import orjson
import pytest

from omnicore.logs import FORMAT, JsonFormatter, SessionFilter, session_context
from omnicore.redact import RedactingFormatter

SECRET = "s3cr3t-admin-token"


@pytest.fixture
def capture() -> Iterator[tuple[logging.Logger, logging.StreamHandler[io.StringIO]]]:
    logger = logging.getLogger("omniserve.test-logs")
    handler = logging.StreamHandler(io.StringIO())
    handler.addFilter(SessionFilter())
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield logger, handler
    finally:
        logger.removeHandler(handler)


def lines(handler: logging.StreamHandler[io.StringIO]) -> list[str]:
    return handler.stream.getvalue().splitlines()


def test_json_lines_carry_the_session_and_extra_fields_redacted(capture) -> None:
    logger, handler = capture
    handler.setFormatter(JsonFormatter(None, [SECRET]))
    logger.info("outside")
    with session_context("rt_1"):
        logger.info("token %s in redis://:pw@host:6379/0", SECRET, extra={"mode": "audio"})
        try:
            raise RuntimeError(f"boom {SECRET}")
        except RuntimeError:
            logger.exception("failed")
    outside, inside, failed = (orjson.loads(x) for x in lines(handler))
    assert "session_id" not in outside and outside["msg"] == "outside"
    assert inside["session_id"] == "rt_1" and inside["mode"] == "audio"
    assert SECRET not in inside["msg"] and "pw@" not in inside["msg"]
    assert set(inside) >= {"ts", "level", "logger", "pid", "msg"}
    assert failed["level"] == "error" and "RuntimeError" in failed["exc"]
    assert SECRET not in failed["exc"]


def test_text_lines_end_with_the_session(capture) -> None:
    logger, handler = capture
    handler.setFormatter(RedactingFormatter(FORMAT, [SECRET]))
    with session_context("rt_2"):
        logger.info("hello %s", SECRET)
    logger.info("after")
    inside, after = lines(handler)
    assert inside.endswith("hello *** session=rt_2")
    assert after.endswith("after")


async def test_tasks_started_inside_a_session_inherit_its_id(capture) -> None:
    logger, handler = capture
    handler.setFormatter(JsonFormatter(None))

    async def child() -> None:
        logger.info("from a task")

    with session_context("rt_3"):
        task = asyncio.create_task(child())
    await task
    assert orjson.loads(lines(handler)[0])["session_id"] == "rt_3"


def test_celery_task_lines_are_named_by_their_task_id(capture) -> None:
    handler = capture[1]
    handler.setFormatter(JsonFormatter(None))
    celery = logging.getLogger("celery.app.trace")
    celery.addHandler(handler)
    celery.propagate = False
    level = celery.level
    celery.setLevel(logging.INFO)
    try:
        celery.info("Task %(name)s[%(id)s] succeeded", {"name": "omniserve.x", "id": "rt_4"})
    finally:
        celery.removeHandler(handler)
        celery.propagate = True
        celery.setLevel(level)
    assert orjson.loads(lines(handler)[0])["session_id"] == "rt_4"
