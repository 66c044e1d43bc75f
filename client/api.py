"""A Python client for the Sluicegate API."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar

import httpx

from client.channel import MAX_BODY, NotRead, SubmitChannel
from client.coalesce import BulkRefused, Coalescer, JobAnswer, encoded
from client.errors import ApiError as ApiError
from client.errors import Unreachable as Unreachable
from schemas import constants
from schemas.api import JobList, JobView, SubmitResponse
from schemas.batches import BatchList, BatchView
from schemas.jobs import JobKind, Priority
from schemas.overview import Overview
from schemas.timeline import JobTimeline
from schemas.webhooks import DeliveryDetail

T = TypeVar("T")
_JSON = {"Content-Type": "application/json"}


def _retry_after_s(answer: JobAnswer, body: Any) -> float | None:
    if isinstance(body, dict) and isinstance(body.get("retry_after_ms"), int | float):
        return float(body["retry_after_ms"]) / 1000
    header = answer.headers.get("retry-after")
    try:
        return float(header) if header is not None else None
    except ValueError:
        return None


def _raise_for(response: httpx.Response) -> None:
    if response.is_success:
        return
    raise _error_of(_answer(response))


def _answer(response: httpx.Response) -> JobAnswer:
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    return JobAnswer(response.status_code, body, response.headers)


def _error_of(answer: JobAnswer) -> ApiError:
    """The error an answer of 4xx or 5xx says (its body's ``error``, or its text)."""
    body, details = answer.body, []
    try:
        error = body["error"]
        code, message = str(error["code"]), str(error["message"])
        if isinstance(error.get("details"), list):
            details = error["details"]
    except (KeyError, TypeError, AttributeError):
        code, message = "http_error", str(body)[:200]
    return ApiError(answer.status, code, message, _retry_after_s(answer, body), details)


@dataclass
class RetryPolicy:
    """Honour 429/503 and Retry-After, with full jitter and a retry budget.

    The budget allows retries worth ``budget_ratio`` of the requests made (plus a floor of
    ``min_retries_per_s``), so a refusing server sees at most that much extra load from a
    client, never a retry storm.
    """

    max_attempts: int = 5
    max_wait_s: float = 60.0
    budget_ratio: float = 0.2
    min_retries_per_s: float = 1.0
    budget_cap: float = 20.0
    _tokens: float = field(init=False)
    _at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self._tokens = self.budget_cap  # a new client may retry a few times at once

    def deposit(self) -> None:
        self._tokens = min(self.budget_cap, self._tokens + self.budget_ratio)

    def withdraw(self) -> bool:
        now = time.monotonic()
        self._tokens = min(
            self.budget_cap, self._tokens + (now - self._at) * self.min_retries_per_s
        )
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def delay_s(self, hint_s: float | None, attempt: int) -> float:
        """Full jitter over the server's hint (or an exponential base without one)."""
        base = hint_s if hint_s is not None else min(2.0**attempt * 0.1, self.max_wait_s)
        return random.uniform(base, min(2 * base, self.max_wait_s))


@dataclass(frozen=True)
class CreatedBatch:
    batch: BatchView
    replayed: bool  # an earlier request with the same Idempotency-Key made it


class AsyncClient:
    def __init__(
        self,
        base_url: str,
        *,
        tenant: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        retry: RetryPolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        on_wait: Callable[[ApiError, float], None] | None = None,
        coalesce: bool = True,
        channel: bool | None = None,
    ) -> None:
        """``on_wait(refusal, seconds)`` is called before each retry's wait, so a caller
        can say what it waits for. ``coalesce``: concurrent ``submit()`` calls share
        requests (``client.coalesce``); each still gets its own answer. ``channel``: a
        submit sent alone goes over the API's submit channel (``client.channel``), not
        as a request of its own; by default, unless ``transport`` is given."""
        headers = {constants.HEADER_TENANT: tenant} if tenant else {}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._http = httpx.AsyncClient(
            base_url=base_url, headers=headers, timeout=timeout_s, transport=transport
        )
        self._retry = retry
        self._sleep = sleep
        self._on_wait = on_wait
        self.base_url = base_url
        self._coalescer = Coalescer(self._submit_one, self._submit_many) if coalesce else None
        if channel is None:
            channel = transport is None
        self._channel = SubmitChannel(base_url, headers, timeout_s) if channel else None

    async def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise Unreachable(self.base_url, exc) from None
        _raise_for(response)
        return response

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        await self._http.aclose()

    async def submit(
        self,
        kind: JobKind | str,
        input: str,
        *,
        max_tokens: int = 256,
        ttl_s: float | None = None,
        deadline: datetime | None = None,
        priority: Priority | str = Priority.NORMAL,
        callback_url: str | None = None,
        idempotency_key: str | None = None,
    ) -> SubmitResponse:
        """``kind`` and ``priority`` as the enums or their strings ("summarize"); one the
        API does not know is its 422, as any invalid field is."""
        body: dict[str, Any] = {
            "kind": str(kind),
            "input": input,
            "max_tokens": max_tokens,
            "priority": str(priority),
        }
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        if deadline is not None:
            body["deadline"] = deadline.isoformat()
        if callback_url is not None:
            body["callback_url"] = callback_url
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        answer = await self._retrying(lambda: self._submit_once(body))
        return SubmitResponse.model_validate(answer.body)

    async def _submit_once(self, body: dict[str, Any]) -> JobAnswer:
        coalescer = self._coalescer
        if coalescer is not None:
            answer = await coalescer.submit(body)
        else:
            answer = await self._submit_one(encoded(body))
        if answer.status >= 400:
            raise _error_of(answer)
        return answer

    async def _submit_one(self, body: bytes) -> JobAnswer:
        on = self._channel
        if on is not None and not on.refused and len(body) <= MAX_BODY:
            try:
                return await on.submit(body)
            except NotRead:
                pass  # the server stopped before it read the job: by HTTP, to whoever answers
        try:
            return _answer(await self._http.post("/v1/jobs", content=body, headers=_JSON))
        except httpx.TransportError as exc:
            raise Unreachable(self.base_url, exc) from None

    async def _submit_many(self, bodies: list[bytes]) -> list[JobAnswer]:
        """One answer a job (``POST /v1/jobs/bulk``); a refusal of the request as a whole
        that is not the jobs' own (no such route, too big, too many) is ``BulkRefused``."""
        try:
            content = b'{"jobs":[' + b",".join(bodies) + b"]}"
            response = await self._http.post("/v1/jobs/bulk", content=content, headers=_JSON)
        except httpx.TransportError as exc:
            raise Unreachable(self.base_url, exc) from None
        if response.status_code in (404, 405):
            raise BulkRefused(response.status_code, lasting=True)
        if response.status_code in (413, 422):
            raise BulkRefused(response.status_code, lasting=False)
        if not response.is_success:  # the caller's key, the server: the same for each job
            return [_answer(response)] * len(bodies)
        return [
            JobAnswer(int(item["status"]), item["body"], item.get("headers") or {})
            for item in response.json()["data"]
        ]

    async def create_batch(
        self,
        requests: list[dict[str, Any]],
        *,
        completion_window: str = "24h",
        metadata: dict[str, str] | None = None,
        callback_url: str | None = None,
        priority: Priority = Priority.NORMAL,
        idempotency_key: str | None = None,
    ) -> CreatedBatch:
        """Submit OpenAI Batch request lines as one batch (admitted or refused whole);
        ``replayed`` when the Idempotency-Key found the batch it made before."""
        body: dict[str, Any] = {
            "requests": requests,
            "completion_window": completion_window,
            "priority": priority.value,
        }
        if metadata is not None:
            body["metadata"] = metadata
        if callback_url is not None:
            body["callback_url"] = callback_url
        headers = {constants.HEADER_IDEMPOTENCY_KEY: idempotency_key} if idempotency_key else {}
        response = await self._post_retrying("/v1/batches", body, headers=headers)
        batch = BatchView.model_validate_json(response.content)
        return CreatedBatch(batch, replayed=response.status_code == 200)

    async def get_batch(self, batch_id: str) -> BatchView:
        response = await self._send("GET", f"/v1/batches/{batch_id}")
        return BatchView.model_validate_json(response.content)

    async def batch_results(
        self, batch_id: str, *, after: str | None = None
    ) -> list[dict[str, Any]]:
        """The batch's output lines in submission order, after the job ``after``, up to
        the first request not ended yet."""
        params = {"after": after} if after else {}
        response = await self._send("GET", f"/v1/batches/{batch_id}/results", params=params)
        return [json.loads(line) for line in response.text.splitlines() if line.strip()]

    async def _post_retrying(
        self, path: str, body: dict[str, Any], *, headers: dict[str, str] | None = None
    ) -> httpx.Response:
        """POST, retrying refusals as the policy allows (the body carries its own
        idempotency key where the caller gave one, so a retry cannot make a second job)."""
        return await self._retrying(lambda: self._send("POST", path, json=body, headers=headers))

    async def _retrying(self, send: Callable[[], Awaitable[T]]) -> T:
        """``send()``, again after each refusal the policy lets it retry."""
        retry = self._retry
        attempt = 0
        if retry is not None:
            retry.deposit()
        while True:
            try:
                response = await send()
            except ApiError as exc:
                attempt += 1
                if (
                    retry is None
                    or not exc.retriable
                    or attempt >= retry.max_attempts
                    or not retry.withdraw()
                ):
                    raise
                wait_s = retry.delay_s(exc.retry_after_s, attempt)
                if self._on_wait is not None:
                    self._on_wait(exc, wait_s)
                await self._sleep(wait_s)
                continue
            return response

    async def get(self, job_id: str) -> JobView:
        response = await self._send("GET", f"/v1/jobs/{job_id}")
        return JobView.model_validate_json(response.content)

    async def cancel(self, job_id: str) -> JobView:
        response = await self._send("DELETE", f"/v1/jobs/{job_id}")
        return JobView.model_validate_json(response.content)

    async def list_jobs(
        self,
        *,
        states: list[str] | None = None,
        model: str | None = None,
        tenant: str | None = None,
        batch_id: str | None = None,
        after: str | None = None,
        limit: int | None = None,
    ) -> JobList:
        """One page of jobs, oldest first (every tenant's for an operator key, unless
        ``tenant`` names one)."""
        params = _params(
            state=states, model=model, tenant=tenant, batch_id=batch_id, after=after, limit=limit
        )
        response = await self._send("GET", "/v1/jobs", params=params)
        return JobList.model_validate_json(response.content)

    async def list_batches(
        self,
        *,
        statuses: list[str] | None = None,
        model: str | None = None,
        tenant: str | None = None,
        after: str | None = None,
        limit: int | None = None,
    ) -> BatchList:
        """One page of batches, newest first."""
        params = _params(status=statuses, model=model, tenant=tenant, after=after, limit=limit)
        response = await self._send("GET", "/v1/batches", params=params)
        return BatchList.model_validate_json(response.content)

    async def timeline(self, job_id: str) -> JobTimeline:
        response = await self._send("GET", f"/v1/jobs/{job_id}/timeline")
        return JobTimeline.model_validate_json(response.content)

    async def overview(self, *, window_s: int | None = None) -> Overview:
        params = _params(window_s=window_s)
        response = await self._send("GET", "/v1/overview", params=params)
        return Overview.model_validate_json(response.content)

    async def redeliver(self, delivery_id: str) -> DeliveryDetail:
        """Send a dead webhook delivery again (409 delivery_not_dead unless it is dead)."""
        response = await self._send("POST", f"/v1/webhooks/deliveries/{delivery_id}/redeliver")
        return DeliveryDetail.model_validate_json(response.content)


def _params(**given: object) -> dict[str, Any]:
    """Query parameters: those given (a list repeats its name), the None ones left out."""
    return {name: value for name, value in given.items() if value is not None}
