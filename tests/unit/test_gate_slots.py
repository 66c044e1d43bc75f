"""The pull gate on an engine of slots (llama.cpp): one free slot whose context holds the job."""

from __future__ import annotations

from dataclasses import dataclass, replace

from schemas.jobs import JobKind
from tests.support.dispatch import envelope
from workers.engines.base import Capacity
from workers.gate import PullGate

SLOTS = Capacity(
    total_blocks=2,
    free_blocks=2,
    block_size=1024,
    running=0,
    waiting=0,
    preemptions=0,
    max_running=2,
    slot_context=1024,
)


@dataclass
class SlotEngine:
    """Only what the gate reads: the capacity an engine of two slots reports."""

    cap: Capacity = SLOTS
    name: str = "slots"

    def capacity(self) -> Capacity:
        return self.cap

    def context_tokens(self) -> int | None:
        return self.cap.slot_context


def test_one_job_a_slot_whatever_its_size() -> None:
    engine = SlotEngine()
    gate = PullGate(engine, watermark=0.01)  # type: ignore[arg-type]
    # 900 tokens would be 1 block of 1024 but, on a paged pool, reserve growth as well: a
    # slot holds the job whole, so two such jobs start on two slots.
    assert gate.admits(envelope("a", prompt_tokens=800, max_tokens=100))
    gate.started(envelope("a", prompt_tokens=800, max_tokens=100))
    assert gate.admits(envelope("b", prompt_tokens=800, max_tokens=100))
    gate.started(envelope("b", prompt_tokens=800, max_tokens=100))
    # Both slots taken by this worker's own count, before the engine's next reading shows it.
    assert not gate.admits(envelope("c", prompt_tokens=10, max_tokens=10))
    gate.finished("a")
    assert gate.admits(envelope("c", prompt_tokens=10, max_tokens=10))


def test_slots_the_server_reports_busy_or_deferred_count_too() -> None:
    engine = SlotEngine(replace(SLOTS, free_blocks=1, running=1))
    gate = PullGate(engine)  # type: ignore[arg-type]
    assert gate.admits(envelope("a", prompt_tokens=10, max_tokens=10))
    engine.cap = replace(SLOTS, free_blocks=0, running=1, waiting=1)
    assert not gate.admits(envelope("b", prompt_tokens=10, max_tokens=10))


def test_a_job_larger_than_a_slot_starts_alone_for_the_engine_to_refuse() -> None:
    engine = SlotEngine()
    gate = PullGate(engine)  # type: ignore[arg-type]
    big = envelope("big", prompt_tokens=1000, max_tokens=100, kind=JobKind.COMPLETE)  # > 1,024
    gate.started(envelope("small", prompt_tokens=10, max_tokens=10))
    assert not gate.admits(big)
    gate.finished("small")
    assert gate.admits(big)
