"""Webhook contracts: the message a receiver gets, a delivery row as stored and the API's
views of deliveries and signing secrets, the dead-letter record, and the names both sides
share."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from schemas.envelopes import Envelope
from schemas.errors import InvalidRequest, SluicegateError

# NOTIFY channel: a delivery row was made (payload: its id); wakes every dispatcher.
WEBHOOKS_CHANNEL = "sluicegate_webhooks"
# dead_letters.source of a delivery that ran out of attempts or could not be sent.
DEAD_LETTER_SOURCE = "webhook"
# Standard Webhooks headers and secret prefix.
HEADER_ID = "webhook-id"
HEADER_TIMESTAMP = "webhook-timestamp"
HEADER_SIGNATURE = "webhook-signature"
SECRET_PREFIX = "whsec_"
# Prometheus metric names.
M_WEBHOOK_ATTEMPTS = "sluicegate_webhook_attempts_total"
M_WEBHOOK_FINISHED = "sluicegate_webhook_deliveries_finished_total"
M_WEBHOOK_OLDEST_DUE = "sluicegate_webhook_oldest_due_seconds"


class DeliveryState(StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    DEAD = "dead"


@dataclass(frozen=True, kw_only=True)
class Delivery:
    """A ``webhook_deliveries`` row as stored."""

    id: str  # the webhook-id header of every attempt
    tenant: str
    subject: str  # the job or batch id
    event_type: str
    url: str
    body: str  # the signed body, WebhookPayload as JSON
    state: DeliveryState
    attempts: int
    next_attempt_at: datetime
    last_status: int | None
    last_error: str | None
    created_at: datetime
    finished_at: datetime | None

    @property
    def endpoint(self) -> tuple[str, str]:
        """(tenant, url): where it goes, whose secrets sign it."""
        return (self.tenant, self.url)


def delivery_from_row(row: Mapping[Any, Any]) -> Delivery:
    """The one mapping of a ``webhook_deliveries`` row (every column) to a Delivery."""
    return Delivery(
        id=row["id"],
        tenant=row["tenant"],
        subject=row["subject"],
        event_type=row["event_type"],
        url=row["url"],
        body=row["body"],
        state=DeliveryState(row["state"]),
        attempts=row["attempts"],
        next_attempt_at=row["next_attempt_at"],
        last_status=row["last_status"],
        last_error=row["last_error"],
        created_at=row["created_at"],
        finished_at=row["finished_at"],
    )


class DeliveryNotFound(SluicegateError):
    """No such webhook delivery for this tenant."""

    code = "delivery_not_found"
    status = 404


class DeliveryNotDead(SluicegateError):
    """Only a dead delivery can be redelivered; this one is pending or was delivered."""

    code = "delivery_not_dead"
    status = 409


class SecretNotFound(SluicegateError):
    """No such webhook signing secret for this tenant."""

    code = "webhook_secret_not_found"
    status = 404


class InvalidCallbackUrl(InvalidRequest):
    """``callback_url`` is not an absolute http(s) URL with a host."""

    code = "invalid_callback_url"


def check_callback_url(url: str) -> str:
    """An absolute http(s) URL with a host, or InvalidCallbackUrl. Where it points is
    judged when it is called (the dispatcher's SSRF policy), not here."""
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a port that is not a number in range
    except ValueError as exc:
        raise InvalidCallbackUrl(f"callback_url is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise InvalidCallbackUrl("callback_url must be an absolute http:// or https:// URL")
    if not parts.hostname:
        raise InvalidCallbackUrl("callback_url has no host")
    if port == 0 or any(c.isspace() or not c.isprintable() for c in url):
        raise InvalidCallbackUrl("callback_url is not a valid URL")
    return url


def job_event_type(state: str) -> str:
    return f"job.{state}"


def batch_event_type(status: str) -> str:
    return f"batch.{status}"


# What a receiver gets (the signed body).


class JobData(BaseModel):
    """The job as it ended."""

    object: Literal["job"] = "job"
    id: str
    kind: str
    state: str
    attempt: int
    custom_id: str | None
    batch_id: str | None
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    created_at: datetime
    finished_at: datetime | None


class BatchData(BaseModel):
    """The batch once every job of it is terminal; ``counts`` by job state."""

    object: Literal["batch"] = "batch"
    id: str
    status: Literal["completed", "expired", "cancelled"]
    total: int
    counts: dict[str, int]
    metadata: dict[str, Any] | None
    created_at: datetime
    finished_at: datetime | None


class WebhookPayload(BaseModel):
    """The body of every webhook (Standard Webhooks' recommended shape)."""

    type: str  # job.succeeded | job.failed | job.expired | job.cancelled | job.abandoned |
    # batch.completed | batch.expired | batch.cancelled
    timestamp: datetime  # when the event happened
    data: JobData | BatchData


class WebhookDeadLetter(Envelope):
    """The record on the dead-letter topic for a delivery that was given up."""

    type: Literal["webhook.dead"] = "webhook.dead"
    source: Literal["webhook"] = "webhook"
    delivery_id: str
    tenant: str
    subject: str
    event_type: str
    url: str
    attempts: int
    last_status: int | None
    reason: str
    at: datetime


# The API's views.


class AttemptView(BaseModel):
    attempt: int
    at: datetime
    status_code: int | None
    error: str | None
    duration_ms: float


class DeliveryView(BaseModel):
    id: str  # the webhook-id header of every attempt
    subject: str  # the job or batch id
    event_type: str
    url: str
    state: DeliveryState
    attempts: int
    next_attempt_at: datetime | None  # while pending
    last_status: int | None
    last_error: str | None
    created_at: datetime
    finished_at: datetime | None


def delivery_view(delivery: Delivery) -> DeliveryView:
    """The API's view of a delivery: its next attempt's time only while it is pending."""
    pending = delivery.state is DeliveryState.PENDING
    return DeliveryView(
        id=delivery.id,
        subject=delivery.subject,
        event_type=delivery.event_type,
        url=delivery.url,
        state=delivery.state,
        attempts=delivery.attempts,
        next_attempt_at=delivery.next_attempt_at if pending else None,
        last_status=delivery.last_status,
        last_error=delivery.last_error,
        created_at=delivery.created_at,
        finished_at=delivery.finished_at,
    )


class DeliveryDetail(DeliveryView):
    payload: dict[str, Any]
    attempt_log: list[AttemptView]
    dead_letter_reason: str | None


class DeliveryList(BaseModel):
    """A page of deliveries, oldest first; pass ``next_after`` as ``after`` for the next."""

    data: list[DeliveryView]
    next_after: str | None


class SecretView(BaseModel):
    """A signing secret as listed: the secret itself is shown only when it is made."""

    id: int
    created_at: datetime
    expires_at: datetime | None
    active: bool


class NewSecret(SecretView):
    secret: str  # whsec_<base64>


class ExpireSecret(BaseModel):
    """POST /v1/webhooks/secrets/{id}/expire: stop signing with it after ``in_s`` seconds
    (0: now), the grace period of a rotation."""

    model_config = ConfigDict(extra="forbid")
    in_s: Annotated[float, Field(ge=0, le=30 * 86400, strict=True)] = 0.0


class SecretList(BaseModel):
    data: list[SecretView]
