"""``/v1/admin/keys``: named API keys, created, listed, rotated, revoked and given quotas live
(``streaming/keystore.py``), behind the admin guard. A key's secret is in the answer to its
creation or rotation only; Redis holds its hash."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from api.gateway.state import Gateway
from api.security.policy import require_admin
from streaming.keystore import KeyProblem, KeyQuota, KeyRecord, KeyStore


class QuotaBody(BaseModel):
    """A key's quota; a field left out (or null) is no limit of that kind."""

    model_config = ConfigDict(extra="forbid")

    max_sessions: int | None = Field(None, gt=0)
    minutes_per_day: float | None = Field(None, gt=0)
    max_session_s: float | None = Field(None, gt=0)

    def quota(self) -> KeyQuota:
        return KeyQuota(self.max_sessions, self.minutes_per_day, self.max_session_s)


class CreateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    quota: QuotaBody = Field(default_factory=QuotaBody)


def _store(request: Request) -> KeyStore:
    gateway: Gateway = request.app.state.gateway
    return gateway.metering.keystore


def _with_secret(secret: str, rec: KeyRecord) -> dict[str, Any]:
    return {**rec.public(), "key": secret}


def create_router() -> APIRouter:
    router = APIRouter(prefix="/v1/admin/keys", dependencies=[Depends(require_admin)])

    @router.get("")
    async def list_keys(request: Request) -> dict[str, Any]:
        return {"keys": [r.public() for r in await _store(request).records()]}

    @router.post("", status_code=201)
    async def create(request: Request, body: CreateBody) -> dict[str, Any]:
        try:
            secret, rec = await _store(request).create(body.name, body.quota.quota())
        except KeyProblem as exc:
            raise HTTPException(409 if "already" in str(exc) else 422, str(exc)) from None
        return _with_secret(secret, rec)

    @router.post("/{name}/rotate")
    async def rotate(request: Request, name: str) -> dict[str, Any]:
        try:
            secret, rec = await _store(request).rotate(name)
        except KeyProblem as exc:
            raise HTTPException(404, str(exc)) from None
        return _with_secret(secret, rec)

    @router.post("/{name}/revoke")
    async def revoke(request: Request, name: str) -> dict[str, Any]:
        try:
            return (await _store(request).revoke(name)).public()
        except KeyProblem as exc:
            raise HTTPException(404, str(exc)) from None

    @router.put("/{name}/quota")
    async def set_quota(request: Request, name: str, body: QuotaBody) -> dict[str, Any]:
        try:
            return (await _store(request).set_quota(name, body.quota())).public()
        except KeyProblem as exc:
            raise HTTPException(404, str(exc)) from None

    return router
