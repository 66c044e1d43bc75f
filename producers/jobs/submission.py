"""Turn a submit request into a validated NewJob (deadline, limits, request hash)."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any

from plumbing.settings.api import ApiSettings
from schemas.api import SubmitJob
from schemas.errors import InvalidRequest, PayloadTooLarge
from schemas.jobs import NewJob, utf8_length
from schemas.sampling import SamplingFields, SummaryOptions, check_model, check_summary
from schemas.webhooks import check_callback_url


class DeadlineInPast(InvalidRequest):
    """The deadline (or now + ``ttl_s``) has already passed; nothing was stored."""

    code = "deadline_in_past"


class DeadlineTooFar(InvalidRequest):
    """The deadline, or ``ttl_s``, is further away than ``max_ttl_s``."""

    code = "deadline_too_far"


class InputTooLarge(PayloadTooLarge):
    """The input is over ``max_input_bytes`` bytes of UTF-8."""

    code = "input_too_large"


class MaxTokensTooLarge(InvalidRequest):
    """``max_tokens`` is over ``max_tokens_limit``."""

    code = "max_tokens_too_large"


def request_hash(body: SubmitJob) -> str:
    """What an idempotent replay must match: the request without its key."""
    # Parameters not given are left out, so a request's hash is the one it had before
    # they existed; so are the summary's fields not given (and ``summary`` when none is).
    unset = {name for name in SamplingFields.model_fields if getattr(body, name) is None}
    exclude: dict[str, Any] = dict.fromkeys({"idempotency_key", *unset}, True)
    summary = body.summary.stored() if body.summary is not None else None
    if summary is None:
        exclude["summary"] = True
    else:
        exclude["summary"] = {
            name: True for name in SummaryOptions.model_fields if name not in summary
        }
    canonical = body.model_dump_json(exclude=exclude)
    return hashlib.sha256(canonical.encode()).hexdigest()


def new_job(
    body: SubmitJob,
    *,
    tenant: str,
    header_key: str | None,
    now: datetime,
    api: ApiSettings,
) -> NewJob:
    if body.deadline is not None and body.ttl_s is not None:
        raise InvalidRequest("give either deadline or ttl_s, not both")
    if utf8_length(body.input) > api.max_input_bytes:
        raise InputTooLarge(f"input is over the limit of {api.max_input_bytes} bytes")
    if not body.input.strip():
        raise InvalidRequest("input is blank", details=[{"loc": ["input"], "type": "blank"}])
    if body.max_tokens > api.max_tokens_limit:
        raise MaxTokensTooLarge(f"max_tokens is over the limit of {api.max_tokens_limit}")
    check_model(body.model, api.models)
    check_summary(body.kind, body.summary)
    if body.callback_url is not None:
        check_callback_url(body.callback_url)
    if body.abandon_after_s is not None and body.abandon_after_s > api.max_ttl_s:
        raise InvalidRequest(f"abandon_after_s is over the limit of {api.max_ttl_s} s")
    if body.deadline is not None:
        deadline = body.deadline
    else:
        ttl = body.ttl_s if body.ttl_s is not None else api.default_ttl_s
        if ttl > api.max_ttl_s:
            raise DeadlineTooFar(f"ttl_s is over the limit of {api.max_ttl_s} s")
        deadline = now + timedelta(seconds=ttl)
    if deadline <= now:
        raise DeadlineInPast("the deadline has already passed")
    if deadline > now + timedelta(seconds=api.max_ttl_s):
        raise DeadlineTooFar(f"the deadline is more than {api.max_ttl_s} s away")
    key = body.idempotency_key or header_key
    if header_key and body.idempotency_key and header_key != body.idempotency_key:
        raise InvalidRequest("the Idempotency-Key header and idempotency_key differ")
    return NewJob(
        tenant=tenant,
        kind=body.kind,
        input=body.input,
        max_tokens=body.max_tokens,
        deadline=deadline,
        priority=body.priority,
        callback_url=body.callback_url,
        idempotency_key=key,
        request_hash=request_hash(body) if key else None,
        abandon_on_disconnect=body.abandon_on_disconnect,
        abandon_after_s=body.abandon_after_s,
        params=body.stored_params(),
    )
