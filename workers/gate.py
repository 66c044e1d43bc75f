"""The worker's two gates in front of the engine.

The pull gate: may the next dispatch record start on the engine now? It starts a job only
when the engine's free KV blocks, less the growth reserved for the jobs already running and
a watermark, cover the job's need; on an engine of slots (llama.cpp, where each sequence has
a context of its own), only when a slot is free and the job fits its context. It stops at
``max_running`` jobs in flight.

The pre-decode gate: should a job that fits still run? It judges every job at the last
moment, with its row locked, after the KV check and just before the engine sees it: a job
that was cancelled, was abandoned by its caller, is past its deadline, or could only meet its
deadline by running faster than the engine measurably runs, is dropped without an engine call.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from schemas import reasons
from schemas.envelopes import DispatchEnvelope, JobEvent
from schemas.jobs import JobKind
from schemas.states import JobState
from workers.engines.base import Capacity, InferenceEngine
from workers.kv import ExpectedOutput, KvLedger, SpeedMeter
from workers.metrics import UNDER_RESERVED


@dataclass
class JobProgress:
    """What the executor reports while a job decodes; feeds the ledger."""

    gate: PullGate
    envelope: DispatchEnvelope
    released: bool = False

    @property
    def job_id(self) -> str:
        return self.envelope.job_id

    def prompt_counted(self, tokens: int) -> None:
        if self.released:  # decoded again (a job claimed back): reserved again
            self.gate.reserve(self.envelope)
            self.released = False
        self.gate.ledger.prompt_counted(self.job_id, tokens)

    def decoded(self) -> None:
        self.gate.ledger.decoded(self.job_id)
        self.gate.prefilled(self.job_id)

    def completed(self, output_tokens: int) -> None:
        """The output ended by itself (not aborted): a sample of this kind's length."""
        self.gate.expected.record(self.envelope.kind, output_tokens)

    def ended(self) -> None:
        """The engine let go of the job (its decoding stopped, its KV is free), before its
        end is written: its reservation goes now, so that the next record may be claimed
        meanwhile (and carry the end, ``plumbing.unit_of_work``)."""
        if not self.released:
            self.released = True
            self.gate.finished(self.job_id)
            self.gate.room_changed.set()


class PullGate:
    def __init__(
        self,
        engine: InferenceEngine,
        *,
        max_running: int = 256,
        watermark: float = 0.01,
        expected: ExpectedOutput | None = None,
        max_prefill_tokens: int | None = None,
    ) -> None:
        self._engine = engine
        # Set where room may have opened: here when a job's KV is let go early (before its
        # end is written); by its user, the worker, on whatever else it sees free room.
        self.room_changed = asyncio.Event()
        self.max_running = max_running
        # Prompt tokens of started jobs still before their first output token: a cap on it
        # paces starts, so a cohort of jobs ending together is not replaced all at once.
        self.max_prefill_tokens = max_prefill_tokens
        self._prefilling: dict[str, int] = {}
        self._watermark = watermark
        self.expected = expected or ExpectedOutput()
        self.ledger = KvLedger(block_size=1)
        self.under_reserved = 0

    def room(self) -> bool:
        """Whether one more job may be in flight at all (before its size is known)."""
        return self._room(self._engine.capacity())

    def need(self, envelope: DispatchEnvelope) -> int:
        """Blocks the job will hold at its end, on this engine."""
        return self._need(envelope, self._engine.capacity())

    def admits(self, envelope: DispatchEnvelope) -> bool:
        cap = self._engine.capacity()  # one reading for the whole decision
        if not self._room(cap):
            return False
        if self.splits(envelope):
            return True  # cut into a graph of jobs, never decoded whole: it holds no KV
        if cap.total_blocks <= 0:
            return False  # capacity not known yet (a remote engine before its first scrape)
        if not self._prefill_room(envelope.prompt_tokens):
            return False
        if cap.slot_context is not None:
            return self._slot_free(envelope, cap.slot_context, cap)
        need = self._need(envelope, cap)
        if need > cap.total_blocks - self.ledger.watermark_blocks:
            # Larger than the cache can ever hold beside the watermark: start it alone and
            # let the engine run it or refuse it with a clear error.
            return self.ledger.running == 0
        return self.ledger.can_start(need, cap.free_blocks, cap.total_blocks)

    def _slot_free(self, envelope: DispatchEnvelope, slot_context: int, cap: Capacity) -> bool:
        """Slots (llama.cpp): a job fits a slot's context, and a slot is free both by this
        worker's own count and by the engine's (busy or waiting in the server)."""
        expected = self.expected.tokens(envelope.kind, envelope.max_tokens)
        if envelope.prompt_tokens + expected > slot_context:
            # Larger than any slot: start it alone, and the engine refuses it clearly.
            return self.ledger.running == 0
        return max(self.ledger.running, cap.running + cap.waiting) < cap.total_blocks

    def started(self, envelope: DispatchEnvelope) -> JobProgress:
        if self.splits(envelope):
            return JobProgress(self, envelope, released=True)
        self.reserve(envelope)
        return JobProgress(self, envelope)

    def splits(self, envelope: DispatchEnvelope) -> bool:
        """A document longer than the engine's context, by the record's estimate: it will
        be cut into a graph of jobs, each of which fits (``workers.graph``)."""
        return too_long(self._engine, envelope.kind, envelope.prompt_tokens, envelope.max_tokens)

    def reserve(self, envelope: DispatchEnvelope) -> None:
        """The job's KV need, held until it ``finished``."""
        expected = self.expected.tokens(envelope.kind, envelope.max_tokens)
        self.ledger.started(
            envelope.job_id, prompt_tokens=envelope.prompt_tokens, expected_output=expected
        )
        self._prefilling[envelope.job_id] = envelope.prompt_tokens

    def prefilled(self, job_id: str) -> None:
        """The job's first output token came: its prefill is done."""
        self._prefilling.pop(job_id, None)

    def _prefill_room(self, prompt_tokens: int) -> bool:
        if self.max_prefill_tokens is None or not self._prefilling:
            return True
        return sum(self._prefilling.values()) + prompt_tokens <= self.max_prefill_tokens

    def finished(self, job_id: str) -> None:
        self._prefilling.pop(job_id, None)
        outcome = self.ledger.finished(job_id)
        if outcome is not None and outcome[1] > outcome[0]:
            self.under_reserved += 1
            UNDER_RESERVED.inc()

    def reserved_blocks(self) -> int:
        cap = self._engine.capacity()
        return self.ledger.reserved_growth(cap.total_blocks - cap.free_blocks)

    def _room(self, cap: Capacity) -> bool:
        if self.ledger.running >= self.max_running:
            return False
        return cap.max_running is None or cap.running + cap.waiting < cap.max_running

    def _need(self, envelope: DispatchEnvelope, cap: Capacity) -> int:
        """The need in the engine's block size; the ledger takes on the engine's block size
        and the watermark in blocks (both known once the engine reports its cache)."""
        self.ledger.block_size = cap.block_size
        self.ledger.watermark_blocks = math.ceil(self._watermark * cap.total_blocks)
        expected = self.expected.tokens(envelope.kind, envelope.max_tokens)
        return self.ledger.need(envelope.prompt_tokens, expected)


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """What the pre-decode gate sees of a job: its row as read under lock."""

    job_id: str
    state: JobState
    kind: JobKind
    prompt_tokens: int
    max_tokens: int
    deadline: datetime
    abandon_after_s: float | None
    last_seen_at: datetime
    db_now: datetime  # the database's clock, which stamps last_seen_at
    reason: str | None = None  # of a terminal state already written (cancel, disconnect)


@dataclass(frozen=True, kw_only=True)
class Drop:
    """A job that will not reach the engine, and why.

    ``store_state`` is False when its terminal state is already stored (the caller's cancel or
    disconnect wrote it); the worker then only lets the record go.
    """

    state: JobState
    reason: str
    store_state: bool = True

    def error(self, stage: str) -> dict[str, str]:
        return reasons.error(self.state, self.reason, stage)


class PreDecodeGate:
    def __init__(
        self, *, speed: SpeedMeter, expected: ExpectedOutput, drop_unreachable: bool = True
    ) -> None:
        self.speed = speed
        self._expected = expected
        self.drop_unreachable = drop_unreachable

    def verdict(self, job: Candidate, now: datetime, *, whole: bool = True) -> Drop | None:
        """None: hand the job to the engine now. A Drop: never. ``whole`` False: a document
        to be cut into a graph, whose speed is judged per part, not as one prompt."""
        if job.state.terminal:
            return Drop(state=job.state, reason=job.reason or job.state.value, store_state=False)
        if job.deadline <= now:
            return Drop(state=JobState.EXPIRED, reason=reasons.DEADLINE_PASSED)
        if lease_lapsed(job.abandon_after_s, job.last_seen_at, job.db_now):
            return Drop(state=JobState.ABANDONED, reason=reasons.HEARTBEAT_LAPSED)
        if self.drop_unreachable and whole:
            service_s = self.speed.service_s(
                prompt_tokens=job.prompt_tokens,
                output_tokens=self._expected.tokens(job.kind, job.max_tokens),
            )
            if service_s is not None and now + timedelta(seconds=service_s) > job.deadline:
                return Drop(state=JobState.EXPIRED, reason=reasons.DEADLINE_UNREACHABLE)
        return None


def lease_lapsed(abandon_after_s: float | None, last_seen_at: datetime, now: datetime) -> bool:
    return abandon_after_s is not None and now - last_seen_at > timedelta(seconds=abandon_after_s)


def too_long(engine: InferenceEngine, kind: JobKind, prompt_tokens: int, max_tokens: int) -> bool:
    """A summarize job whose prompt and output exceed what one request of ``engine`` holds."""
    if kind is not JobKind.SUMMARIZE:
        return False
    context = engine.context_tokens()
    return context is not None and prompt_tokens + max_tokens > context


# What the worker's repository makes of a job's row: the pre-decode gate's candidate, the
# reason a stopped job gives, and the outbox row of a job event.


def reason_of(error: Mapping[Any, Any] | None, state: str) -> str:
    if not error:
        return state
    return str(error.get("reason") or error.get("code") or state)


def candidate_of(
    row: Mapping[Any, Any], prompt_tokens: int, document: Mapping[Any, Any] | None = None
) -> Candidate:
    """``document``: the row of the document ``row`` is a job of, whose lease it keeps (the
    caller polls the document, not its parts)."""
    lease = document if document is not None else row
    return Candidate(
        job_id=str(row["id"]),
        state=JobState(row["state"]),
        kind=JobKind(row["kind"]),
        prompt_tokens=prompt_tokens,
        max_tokens=row["max_tokens"],
        deadline=row["deadline"],
        abandon_after_s=lease["abandon_after_s"],
        last_seen_at=lease["last_seen_at"],
        db_now=row["db_now"],
        reason=reason_of(row["error"], row["state"]),
    )


def event_row(
    topic: str,
    row: Mapping[Any, Any],
    state: JobState,
    attempt: int,
    at: datetime,
    error: Mapping[str, Any],
) -> dict[str, object]:
    """An outbox row announcing the job's (``row``: id, tenant, callback_url) new state."""
    event = JobEvent(
        job_id=str(row["id"]),
        tenant=row["tenant"],
        state=state,
        attempt=attempt,
        at=at,
        callback_url=row["callback_url"],
        error_code=error.get("code"),
        in_batch=row["batch_id"] is not None,
    )
    return event.outbox_row(topic, event.job_id)
