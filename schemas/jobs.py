"""The job model: kinds, priorities and the frozen records passed between layers."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from schemas.states import JobState

FinishReason = Literal["stop", "length"]
"""Why the engine ended a job's output, as it reported it (a result's ``finish_reason``):
``stop`` the model ended it (its end of text, or a ``stop`` string), ``length`` it reached
``max_tokens`` (or the model's context)."""
FINISH_REASONS: tuple[FinishReason, ...] = ("stop", "length")


def finish_reason_of(value: object) -> FinishReason | None:
    """``value`` when it is a FinishReason (an engine's answer, a stored result's field);
    None otherwise."""
    return next((reason for reason in FINISH_REASONS if value == reason), None)


class JobKind(StrEnum):
    SUMMARIZE = "summarize"  # input is a document; the result is its summary
    COMPLETE = "complete"  # input is a prompt; the result is its completion


class Priority(StrEnum):
    LOW = "low"
    NORMAL = "normal"
    HIGH = "high"


def utf8_length(text: str) -> int:
    """Bytes of ``text`` in UTF-8; an ASCII text (known to CPython at no cost) is not
    encoded to count them."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def estimate_tokens(text: str) -> int:
    """Engine-neutral token estimate used for admission and KV reservation (~4 chars/token)."""
    return max(1, (utf8_length(text) + 3) // 4)


def model_of(params: Mapping[str, Any] | None) -> str | None:
    """The model a request's parameters name; None: none (the engine's own, the first
    pool's)."""
    model = (params or {}).get("model")
    return model if isinstance(model, str) else None


@dataclass(frozen=True, kw_only=True)
class NewJob:
    """A validated submission, ready to be written with its outbox row."""

    tenant: str
    kind: JobKind
    input: str
    max_tokens: int
    deadline: datetime
    priority: Priority
    callback_url: str | None
    idempotency_key: str | None
    request_hash: str | None
    abandon_on_disconnect: bool = False
    abandon_after_s: float | None = None
    params: dict[str, Any] | None = None  # model and sampling parameters (schemas/sampling.py)

    @property
    def model(self) -> str | None:
        return model_of(self.params)


@dataclass(frozen=True, kw_only=True)
class Job:
    """A job as stored."""

    id: str
    tenant: str
    kind: JobKind
    state: JobState
    priority: Priority
    max_tokens: int
    deadline: datetime
    callback_url: str | None
    idempotency_key: str | None
    created_at: datetime
    updated_at: datetime
    dispatched_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    attempt: int
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    abandon_on_disconnect: bool
    abandon_after_s: float | None
    last_seen_at: datetime
    decoded_tokens: int | None
    batch_id: str | None = None
    custom_id: str | None = None
    params: dict[str, Any] | None = None  # model and sampling parameters, those given
    parent_id: str | None = None  # a part of a document's graph: its document
    level: int | None = None  # and its level (0: a chunk; 1 and up: a reduce)

    @property
    def model(self) -> str | None:
        """The model its request named; None: none (the engine's own)."""
        return model_of(self.params)


def job_from_row(row: Mapping[Any, Any]) -> Job:
    return Job(
        id=str(row["id"]),
        tenant=row["tenant"],
        kind=JobKind(row["kind"]),
        state=JobState(row["state"]),
        priority=Priority(row["priority"]),
        max_tokens=row["max_tokens"],
        deadline=row["deadline"],
        callback_url=row["callback_url"],
        idempotency_key=row["idempotency_key"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        dispatched_at=row["dispatched_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        attempt=row["attempt"],
        result=row["result"],
        error=row["error"],
        abandon_on_disconnect=row["abandon_on_disconnect"],
        abandon_after_s=row["abandon_after_s"],
        last_seen_at=row["last_seen_at"],
        decoded_tokens=row["decoded_tokens"],
        batch_id=str(row["batch_id"]) if row["batch_id"] is not None else None,
        custom_id=row["custom_id"],
        params=row.get("params"),
        parent_id=str(row["parent_id"]) if row.get("parent_id") is not None else None,
        level=row.get("level"),
    )


@dataclass(frozen=True, kw_only=True)
class GraphProgress:
    """A document summarized as a graph of jobs: its chunks, the level whose jobs run now
    (0: the chunks), how many levels were planned, and of the level's jobs how many ended;
    the tokens of the jobs that ended so far."""

    chunks: int
    level: int
    levels: int
    total: int
    ended: int
    prompt_tokens: int
    output_tokens: int


# The shape of a document's graph, from its size alone: how many chunks and levels a
# document of so many prompt tokens makes on an engine of so much context. The worker cuts
# by the engine's own tokenizer (workers/graph); the API judges a whole graph's deadline by
# this estimate before anything is stored.
SAFETY = 0.95  # of the room left once the instruction and the output are counted


@dataclass(frozen=True, kw_only=True)
class GraphShape:
    chunks: int
    levels: int  # the map included
    jobs: int  # chunks and reduces together


def fan_in(budget_tokens: int, max_tokens: int) -> int:
    """Most summaries of ``max_tokens`` each that one reduce's prompt holds (0: fewer than
    two, so the document cannot be reduced)."""
    fits = budget_tokens // (max_tokens + 2)  # a summary and its separator
    return fits if fits >= 2 else 0


def reduce_levels(jobs: int, most: int) -> int:
    """Levels of reduces that bring ``jobs`` summaries down to one, ``most`` at a time."""
    if jobs <= 1:
        return 0
    return max(1, math.ceil(math.log(jobs) / math.log(most) - 1e-9))


def shape(prompt_tokens: int, max_tokens: int, context: int) -> GraphShape | None:
    """The graph a summarize job of ``prompt_tokens`` makes on an engine of ``context``
    tokens; None when it fits whole (or cannot be cut: its worker says why)."""
    if prompt_tokens + max_tokens <= context:
        return None
    budget = int((context - max_tokens) * SAFETY)
    most = fan_in(budget, max_tokens)
    if most == 0:
        return None
    chunks = math.ceil(prompt_tokens / budget)
    jobs, level = chunks, chunks
    while level > 1:
        level = math.ceil(level / most)
        jobs += level
    return GraphShape(chunks=chunks, levels=1 + reduce_levels(chunks, most), jobs=jobs)
