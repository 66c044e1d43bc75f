"""The greedy baseline the KV-pull benchmarks build for themselves (``benchmarks.lib.greedy``):
it behaves as the worker's greedy pull policy did before production kept only the KV gate.
It starts whatever it is given up to its own ``max_running``, whatever the KV cache, the
engine's sequence cap or the prefill cap say; and a worker is built with it by class."""

from __future__ import annotations

import pytest

from benchmarks.lib.greedy import GATES, GreedyGate
from plumbing.settings.worker import WorkerSettings
from schemas.jobs import JobKind
from tests.support.dispatch import envelope
from workers.engines.base import GenerationRequest
from workers.engines.sim.engine import SimEngine
from workers.gate import PullGate
from workers.service import build_gate


@pytest.fixture
def engine(small_sim: SimEngine) -> SimEngine:
    return small_sim


async def test_greedy_gate_ignores_the_cache(engine: SimEngine) -> None:
    gate = GreedyGate(engine, max_running=50)
    for i in range(50):  # completions: a summary this long would be cut into a graph
        assert gate.admits(envelope(f"j{i}", prompt_tokens=5000, kind=JobKind.COMPLETE))
        gate.started(envelope(f"j{i}", prompt_tokens=5000, kind=JobKind.COMPLETE))
    assert not gate.admits(envelope("one-more"))
    assert not gate.room()
    gate.finished("j0")
    assert gate.room()
    assert gate.admits(envelope("one-more"))


async def test_greedy_gate_ignores_the_prefill_cap(engine: SimEngine) -> None:
    greedy = GreedyGate(engine, watermark=0.0, max_prefill_tokens=150)
    gated = PullGate(engine, watermark=0.0, max_prefill_tokens=150)
    for gate in (greedy, gated):
        gate.started(envelope("a"))  # 100 prompt tokens in prefill
    assert greedy.admits(envelope("b"))  # 200 > 150
    assert not gated.admits(envelope("b"))  # the KV gate waits for a's first token


async def test_greedy_gate_has_room_when_the_engine_is_at_its_sequence_cap() -> None:
    engine = SimEngine(num_blocks=1000, max_num_seqs=2, time_scale=1.0)
    await engine.start()
    text = "A document about canals and the gates that hold their water back. " * 4
    streams = [
        engine.generate(
            GenerationRequest(request_id=f"r{i}", kind=JobKind.COMPLETE, input=text, max_tokens=50)
        )
        for i in range(2)
    ]
    try:
        for stream in streams:
            await anext(stream)
        assert not PullGate(engine).room()
        greedy = GreedyGate(engine)
        assert greedy.room()
        assert greedy.admits(envelope("queued-in-the-engine"))
    finally:
        for stream in streams:
            await stream.aclose()
        await engine.close()


async def test_a_worker_builds_the_greedy_gate_from_its_settings(engine: SimEngine) -> None:
    worker = WorkerSettings(worker_max_running=3, worker_max_prefill_tokens=64)
    gate = build_gate(worker, engine, GATES["greedy"])
    assert isinstance(gate, GreedyGate)
    assert (gate.max_running, gate.max_prefill_tokens) == (3, 64)
    assert type(build_gate(worker, engine)) is PullGate  # production's one gate
    assert GATES["kv"] is PullGate
