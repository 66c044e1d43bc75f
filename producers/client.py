"""A Python client for the Sluicegate API."""

from __future__ import annotations

from datetime import datetime
from types import TracebackType
from typing import Any

import httpx

from schemas import constants
from schemas.api import JobView, SubmitResponse
from schemas.jobs import JobKind, Priority


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


def _raise_for(response: httpx.Response) -> None:
    if response.is_success:
        return
    try:
        error = response.json()["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        code, message = "http_error", response.text[:200]
    raise ApiError(response.status_code, code, message)


class SluicegateClient:
    def __init__(
        self, base_url: str, *, tenant: str | None = None, timeout_s: float = 30.0
    ) -> None:
        headers = {constants.HEADER_TENANT: tenant} if tenant else {}
        self._http = httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout_s)

    async def __aenter__(self) -> SluicegateClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def submit(
        self,
        kind: JobKind,
        input: str,
        *,
        max_tokens: int = 256,
        ttl_s: float | None = None,
        deadline: datetime | None = None,
        priority: Priority = Priority.NORMAL,
        callback_url: str | None = None,
        idempotency_key: str | None = None,
    ) -> SubmitResponse:
        body: dict[str, Any] = {
            "kind": kind.value,
            "input": input,
            "max_tokens": max_tokens,
            "priority": priority.value,
        }
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        if deadline is not None:
            body["deadline"] = deadline.isoformat()
        if callback_url is not None:
            body["callback_url"] = callback_url
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        response = await self._http.post("/v1/jobs", json=body)
        _raise_for(response)
        return SubmitResponse.model_validate_json(response.content)

    async def get(self, job_id: str) -> JobView:
        response = await self._http.get(f"/v1/jobs/{job_id}")
        _raise_for(response)
        return JobView.model_validate_json(response.content)

    async def cancel(self, job_id: str) -> JobView:
        response = await self._http.delete(f"/v1/jobs/{job_id}")
        _raise_for(response)
        return JobView.model_validate_json(response.content)
