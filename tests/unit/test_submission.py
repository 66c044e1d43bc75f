from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from plumbing.settings import Settings
from producers.jobs.submission import (
    DeadlineInPast,
    DeadlineTooFar,
    InputTooLarge,
    MaxTokensTooLarge,
    new_job,
    request_hash,
)
from schemas.api import SubmitJob
from schemas.errors import InvalidRequest

NOW = datetime(2026, 1, 1, tzinfo=UTC)
SETTINGS = Settings(max_input_bytes=100, max_tokens_limit=1000, default_ttl_s=60, max_ttl_s=3600)


def build(**fields: object) -> SubmitJob:
    return SubmitJob.model_validate({"kind": "summarize", "input": "Some text.", **fields})


def job(body: SubmitJob, key: str | None = None):
    return new_job(body, tenant="t", header_key=key, now=NOW, api=SETTINGS.api)


def test_ttl_resolves_to_an_absolute_deadline() -> None:
    assert job(build(ttl_s=30)).deadline == NOW + timedelta(seconds=30)
    assert job(build()).deadline == NOW + timedelta(seconds=60)


def test_deadline_rules() -> None:
    with pytest.raises(DeadlineInPast):
        job(build(deadline=(NOW - timedelta(seconds=1)).isoformat()))
    with pytest.raises(DeadlineTooFar):
        job(build(deadline=(NOW + timedelta(days=2)).isoformat()))
    with pytest.raises(DeadlineTooFar):
        job(build(ttl_s=7200))
    with pytest.raises(InvalidRequest):
        job(build(ttl_s=5, deadline=(NOW + timedelta(seconds=5)).isoformat()))


def test_limits() -> None:
    with pytest.raises(InputTooLarge):
        job(build(input="x" * 101))
    with pytest.raises(MaxTokensTooLarge):
        job(build(max_tokens=1001))
    with pytest.raises(InvalidRequest):
        job(build(input="   "))


@pytest.mark.parametrize(
    "fields",
    [
        {"kind": "translate"},
        {"input": ""},
        {"input": 5},
        {"max_tokens": "5"},
        {"max_tokens": 0},
        {"ttl_s": -1},
        {"deadline": "2026-01-01T00:00:00"},  # naive: no timezone
        {"priority": "urgent"},
        {"surprise": 1},
    ],
)
def test_schema_refuses_bad_fields(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        build(**fields)


def test_idempotency_hash_ignores_the_key_only() -> None:
    assert request_hash(build(idempotency_key="a")) == request_hash(build(idempotency_key="b"))
    assert request_hash(build()) != request_hash(build(max_tokens=7))
    assert job(build(), key="k").idempotency_key == "k"
    assert job(build()).request_hash is None
    with pytest.raises(InvalidRequest):
        job(build(idempotency_key="a"), key="b")
