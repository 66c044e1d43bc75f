from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator

import pytest

from schemas.jobs import JobKind
from workers.engines.base import Capacity, GenerationRequest, InferenceEngine
from workers.engines.sim import (
    COMPLETION_MARK,
    DuplicateRequest,
    EngineAtCapacity,
    EngineNotRunning,
    SimEngine,
    pseudo_completion,
    simulated_output,
)
from workers.summarize import split_sentences, summarize
from workers.tokens import tokenize

DOC = (
    "The harbour master reopened the east basin on Friday. Dredging had removed most of the "
    "silt that stopped larger boats from mooring. Fishing crews said the basin is deep enough "
    "again for the winter fleet. A survey of the west basin will follow next spring."
)
PROMPT = "Write a short note about the harbour reopening and the winter fishing fleet."


def request(
    request_id: str = "r1",
    *,
    kind: JobKind = JobKind.SUMMARIZE,
    text: str = DOC,
    max_tokens: int = 200,
) -> GenerationRequest:
    return GenerationRequest(request_id=request_id, kind=kind, input=text, max_tokens=max_tokens)


@pytest.fixture
async def engine() -> AsyncIterator[SimEngine]:
    sim = SimEngine(token_time_s=0.0, prefill_token_time_s=0.0, slots=2)
    await sim.start()
    try:
        yield sim
    finally:
        await sim.close()


def stream(engine: SimEngine, req: GenerationRequest) -> AsyncGenerator[str, None]:
    gen = engine.generate(req)
    assert isinstance(gen, AsyncGenerator)
    return gen


async def collect(engine: SimEngine, req: GenerationRequest) -> list[str]:
    return [piece async for piece in engine.generate(req)]


def test_sim_engine_satisfies_the_protocol() -> None:
    engine: InferenceEngine = SimEngine(token_time_s=0.0, prefill_token_time_s=0.0, slots=1)
    assert engine.name == "sim"
    assert engine.count_tokens("Hello, world.") == 4


async def test_summarize_streams_the_summary(engine: SimEngine) -> None:
    pieces = await collect(engine, request(max_tokens=30))
    text = "".join(pieces)
    assert text == summarize(DOC, max_tokens=30)
    assert pieces == tokenize(text)
    assert set(split_sentences(text)) <= set(split_sentences(DOC))
    assert engine.capacity().free_slots == 2


@pytest.mark.parametrize("max_tokens", [0, 1, 5, 17])
async def test_max_tokens_respected(engine: SimEngine, max_tokens: int) -> None:
    expected = {
        JobKind.SUMMARIZE: tokenize(summarize(DOC, max_tokens=max_tokens))[:max_tokens],
        JobKind.COMPLETE: tokenize(pseudo_completion(DOC))[:max_tokens],
    }
    for kind in JobKind:
        req = request(kind=kind, text=DOC, max_tokens=max_tokens)
        pieces = await collect(engine, req)
        assert pieces == expected[kind] == simulated_output(req)
        assert len(pieces) <= max_tokens
        assert len(pieces) == max_tokens or kind is JobKind.SUMMARIZE


async def test_completion_is_deterministic_and_marked(engine: SimEngine) -> None:
    req = request(kind=JobKind.COMPLETE, text=PROMPT, max_tokens=1000)
    first = "".join(await collect(engine, req))
    second = "".join(await collect(engine, req))
    assert first == second == pseudo_completion(PROMPT)
    assert first.startswith(COMPLETION_MARK)
    prompt_words = {w.lower().strip(".") for w in PROMPT.split()}
    body = first.removeprefix(COMPLETION_MARK).split()
    assert all(w.lower().strip(".") in prompt_words for w in body)


async def test_completion_length_depends_on_the_prompt(engine: SimEngine) -> None:
    lengths = set()
    for i in range(8):
        req = request(kind=JobKind.COMPLETE, text=f"{PROMPT} Variant {i}.", max_tokens=10_000)
        lengths.add(len(await collect(engine, req)))
    assert len(lengths) > 1
    assert max(lengths) < 10_000


async def test_abort_stops_within_one_token_and_frees_the_slot(engine: SimEngine) -> None:
    gen = stream(engine, request(max_tokens=100))
    first = await anext(gen)
    assert first
    assert engine.capacity().running == 1
    await engine.abort("r1")
    assert engine.capacity() == Capacity(total_slots=2, free_slots=2, running=0)
    assert [piece async for piece in gen] == []


async def test_abort_from_another_task_during_decode(engine: SimEngine) -> None:
    slow = SimEngine(token_time_s=0.01, prefill_token_time_s=0.0, slots=1)
    await slow.start()
    received: list[str] = []

    async def consume() -> None:
        async for piece in slow.generate(request(max_tokens=100)):
            received.append(piece)
            if len(received) == 3:
                aborter.set()

    aborter = asyncio.Event()
    task = asyncio.create_task(consume())
    await aborter.wait()
    await slow.abort("r1")
    await asyncio.wait_for(task, timeout=1.0)
    assert 3 <= len(received) <= 4
    assert slow.capacity().free_slots == 1
    await slow.close()


async def test_abort_during_prefill_ends_without_tokens() -> None:
    slow = SimEngine(token_time_s=0.0, prefill_token_time_s=10.0, slots=1)
    await slow.start()
    gen = stream(slow, request())
    first = asyncio.create_task(anext(gen, None))
    await asyncio.sleep(0.01)
    assert slow.capacity().running == 1
    await slow.abort("r1")
    assert await asyncio.wait_for(first, timeout=1.0) is None
    assert slow.capacity().free_slots == 1
    await slow.close()


async def test_abort_unknown_id_is_a_noop(engine: SimEngine) -> None:
    await engine.abort("nobody")
    assert engine.capacity().free_slots == 2


async def test_closing_the_generator_early_frees_the_slot(engine: SimEngine) -> None:
    gen = stream(engine, request())
    await anext(gen)
    assert engine.capacity().free_slots == 1
    await gen.aclose()
    assert engine.capacity().free_slots == 2


async def test_cancelling_the_consumer_frees_the_slot() -> None:
    slow = SimEngine(token_time_s=10.0, prefill_token_time_s=0.0, slots=1)
    await slow.start()
    task = asyncio.create_task(collect(slow, request()))
    await asyncio.sleep(0.01)
    assert slow.capacity().running == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert slow.capacity().free_slots == 1
    await slow.close()


async def test_over_capacity_raises(engine: SimEngine) -> None:
    a = stream(engine, request("a"))
    b = stream(engine, request("b"))
    c = stream(engine, request("c"))
    await anext(a)
    await anext(b)
    assert engine.capacity().free_slots == 0
    with pytest.raises(EngineAtCapacity):
        await anext(c)
    await a.aclose()
    again = stream(engine, request("c"))
    assert await anext(again) != ""
    for gen in (again, b):
        await gen.aclose()


async def test_duplicate_running_id_raises(engine: SimEngine) -> None:
    a = stream(engine, request("same"))
    await anext(a)
    with pytest.raises(DuplicateRequest):
        await anext(stream(engine, request("same")))
    await a.aclose()


async def test_close_aborts_everything_and_refuses_new_work() -> None:
    sim = SimEngine(token_time_s=0.0, prefill_token_time_s=0.0, slots=2)
    with pytest.raises(EngineNotRunning):
        await anext(stream(sim, request()))
    await sim.start()
    gen = stream(sim, request())
    await anext(gen)
    await sim.close()
    assert sim.capacity().running == 0
    assert [piece async for piece in gen] == []
    with pytest.raises(EngineNotRunning):
        await anext(stream(sim, request("r2")))


async def test_prefill_and_decode_take_simulated_time() -> None:
    sim = SimEngine(token_time_s=0.002, prefill_token_time_s=0.001, slots=1)
    await sim.start()
    loop = asyncio.get_running_loop()
    req = request(max_tokens=20)
    began = loop.time()
    pieces = await collect(sim, req)
    elapsed = loop.time() - began
    expected = sim.count_tokens(DOC) * 0.001 + len(pieces) * 0.002
    assert elapsed >= expected * 0.9
    await sim.close()


def test_invalid_configuration_is_refused() -> None:
    with pytest.raises(ValueError, match="slots"):
        SimEngine(token_time_s=0.0, prefill_token_time_s=0.0, slots=0)
    with pytest.raises(ValueError, match="token times"):
        SimEngine(token_time_s=-1.0, prefill_token_time_s=0.0, slots=1)
