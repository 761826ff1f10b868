"""``GET /v1/admin/usage``: usage per key name, per hour or per day, from the aggregates in
Redis (``streaming/usage.py``), behind the admin guard."""

from __future__ import annotations

import time
from typing import Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request

from api.gateway.state import Gateway
from api.security.policy import require_admin
from streaming.usage import DAY_S, usage_report


def create_router() -> APIRouter:
    router = APIRouter(dependencies=[Depends(require_admin)])

    @router.get("/v1/admin/usage")
    async def usage(
        request: Request,
        key: list[str] | None = Query(None),  # noqa: B008 - FastAPI's way to declare it
        granularity: Literal["hour", "day"] = "hour",
        since: float | None = None,
        until: float | None = None,
    ) -> dict[str, Any]:
        """``key`` (repeatable; none: every key), ``since``/``until`` unix seconds (default:
        the last day by the hour, the last 30 days by the day)."""
        gateway: Gateway = request.app.state.gateway
        now = time.time()
        until = now if until is None else until
        since = until - (DAY_S if granularity == "hour" else 30 * DAY_S) if since is None else since
        if since > until:
            raise HTTPException(422, "since is after until")
        try:
            return await usage_report(gateway.metering.ledger, key, granularity, since, until)
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None

    return router
