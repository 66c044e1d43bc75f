"""The pull gate's decisions against a real simulator engine's capacity."""

from __future__ import annotations

import pytest

from schemas.jobs import JobKind
from tests.support.dispatch import envelope
from workers.engines.base import GenerationRequest
from workers.engines.sim.engine import SimEngine
from workers.gate import PullGate
from workers.kv import ExpectedOutput


@pytest.fixture
def engine(small_sim: SimEngine) -> SimEngine:
    return small_sim


async def test_kv_policy_starts_only_what_the_cache_holds(engine: SimEngine) -> None:
    gate = PullGate(engine, watermark=0.02)  # 2 blocks kept free
    assert gate.need(envelope("a")) == 10  # ceil(160 / 16)
    started = 0
    while gate.admits(envelope(f"j{started}")):
        gate.started(envelope(f"j{started}"))
        started += 1
    assert started == 9  # 9 x 10 blocks + 2 watermark <= 100 < 10 x 10 + 2
    assert gate.reserved_blocks() == 90
    gate.finished("j0")
    assert gate.admits(envelope("next"))


async def test_no_room_at_the_gates_own_cap(engine: SimEngine) -> None:
    gate = PullGate(engine, max_running=3, watermark=0.0)
    for i in range(3):
        assert gate.room()
        gate.started(envelope(f"j{i}", prompt_tokens=1, max_tokens=1))
    assert not gate.room()
    assert not gate.admits(envelope("small", prompt_tokens=1, max_tokens=1))


async def test_no_room_when_the_engine_is_at_its_sequence_cap() -> None:
    engine = SimEngine(num_blocks=1000, max_num_seqs=2, time_scale=1.0)
    await engine.start()
    gate = PullGate(engine)
    streams = [engine.generate(request) for request in requests(2)]
    try:
        for stream in streams:
            await anext(stream)
        assert not gate.room()
        await streams[0].aclose()
        assert gate.room()
    finally:
        for stream in streams:
            await stream.aclose()
        await engine.close()


def requests(n: int) -> list[GenerationRequest]:
    text = "A document about canals and the gates that hold their water back. " * 4
    return [
        GenerationRequest(request_id=f"r{i}", kind=JobKind.COMPLETE, input=text, max_tokens=50)
        for i in range(n)
    ]


async def test_a_job_larger_than_the_cache_starts_alone(engine: SimEngine) -> None:
    gate = PullGate(engine, watermark=0.0)
    huge = envelope("huge", prompt_tokens=5000, kind=JobKind.COMPLETE)
    gate.started(envelope("small"))
    assert not gate.admits(huge)
    gate.finished("small")
    assert gate.admits(huge)  # the engine refuses it with request_too_large


async def test_a_document_longer_than_the_context_is_let_in_holding_nothing(
    engine: SimEngine,
) -> None:
    gate = PullGate(engine, watermark=0.0)
    gate.started(envelope("small"))
    long = envelope("long", prompt_tokens=5000)  # a summary: it is cut into a graph
    assert gate.splits(long)
    assert gate.admits(long)  # at once, beside the job running: it is never decoded whole
    held = gate.reserved_blocks()
    gate.started(long).ended()
    assert gate.reserved_blocks() == held
    assert not gate.splits(envelope("fits", prompt_tokens=50))


async def test_observed_output_packs_more_jobs(engine: SimEngine) -> None:
    observed = ExpectedOutput(observed=True, min_samples=5)
    for _ in range(5):
        observed.record(JobKind.SUMMARIZE, 12)
    gate = PullGate(engine, watermark=0.0, expected=observed)
    assert gate.need(envelope("a", prompt_tokens=100, max_tokens=500)) == 7  # 112 / 16
    progress = gate.started(envelope("a", prompt_tokens=100, max_tokens=500))
    for _ in range(20):
        progress.decoded()
    gate.finished("a")
    assert gate.under_reserved == 1  # 20 decoded > 12 reserved


async def test_prefill_cap_paces_starts_until_first_tokens_come(engine: SimEngine) -> None:
    gate = PullGate(engine, watermark=0.0, max_prefill_tokens=250)
    first = gate.started(envelope("a"))  # 100 prompt tokens in prefill
    gate.started(envelope("b"))  # 200
    assert not gate.admits(envelope("c"))  # 300 > 250, though the cache has room
    first.decoded()  # a's first token: its prefill is done
    assert gate.admits(envelope("c"))
    gate.finished("b")
    assert gate.admits(envelope("big", prompt_tokens=240))
    alone = PullGate(engine, watermark=0.0, max_prefill_tokens=50)
    assert alone.admits(envelope("x", prompt_tokens=90))  # alone, over the cap, still starts
    assert PullGate(engine, watermark=0.0).admits(envelope("y"))  # no cap by default


async def test_a_job_that_stopped_decoding_gives_its_room_back_before_its_end_is_written(
    engine: SimEngine,
) -> None:
    """The engine let go of the job: the next record may be claimed (and carry the job's
    end in its transaction) while the end waits; a job decoded again is reserved again."""
    gate = PullGate(engine, max_running=1, watermark=0.0)
    progress = gate.started(envelope("a", prompt_tokens=1, max_tokens=1))
    assert not gate.admits(envelope("b", prompt_tokens=1, max_tokens=1))
    assert not gate.room_changed.is_set()
    progress.ended()
    assert gate.room_changed.is_set()
    gate.room_changed.clear()
    progress.ended()  # once
    assert not gate.room_changed.is_set()
    assert gate.admits(envelope("b", prompt_tokens=1, max_tokens=1))
    progress.prompt_counted(1)  # claimed back and decoding again
    assert not gate.admits(envelope("b", prompt_tokens=1, max_tokens=1))
    gate.finished("a")
    assert gate.admits(envelope("b", prompt_tokens=1, max_tokens=1))
