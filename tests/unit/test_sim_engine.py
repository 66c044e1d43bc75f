"""What only the simulator engine does: cache sizing, queueing, roofline time. The behaviour
every engine shares (abort, preemption reporting, too-large refusal) is in tests/contract."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from schemas.jobs import JobKind
from workers.engines.base import GenerationRequest, InferenceEngine, SamplingParams
from workers.engines.prompts import build_prompt
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.output import simulated_output
from workers.engines.sim.profiles import GPU_80GB, LLAMA_8B, Roofline

DOC = " ".join(f"Sentence number {i} tells the simulator something new." for i in range(40))
PROMPT = build_prompt(JobKind.SUMMARIZE, DOC)  # the prompt the engine counts: instruction + DOC


def request(rid: str, max_tokens: int = 30, kind: JobKind = JobKind.SUMMARIZE) -> GenerationRequest:
    return GenerationRequest(request_id=rid, kind=kind, input=DOC, max_tokens=max_tokens)


async def collect(engine: InferenceEngine, req: GenerationRequest) -> list[str]:
    return [piece async for piece in engine.generate(req)]


@pytest.fixture
async def started() -> AsyncIterator[list[SimEngine]]:
    engines: list[SimEngine] = []
    yield engines
    for engine in engines:
        await engine.close()


async def start(engines: list[SimEngine], **kwargs: object) -> SimEngine:
    engine = SimEngine(**kwargs)  # type: ignore[arg-type]
    await engine.start()
    engines.append(engine)
    return engine


async def test_default_cache_is_sized_from_the_profiles(started: list[SimEngine]) -> None:
    engine = await start(started, time_scale=0.0)
    cap = engine.capacity()
    assert cap.block_size == 16
    # (80 GB x 0.9 - 16.06 GB weights - 4 GB reserve) / (128 KiB per token x 16 tokens)
    assert cap.total_blocks == 24_766 == cap.free_blocks
    assert cap.max_running == 256
    assert (cap.running, cap.waiting, cap.preemptions) == (0, 0, 0)


async def test_concurrent_requests_decode_their_output_and_free_every_block(
    started: list[SimEngine],
) -> None:
    engine = await start(started, time_scale=0.0)
    outputs = await asyncio.gather(*(collect(engine, request(f"r{i}")) for i in range(4)))
    assert all(out == simulated_output(request("x")) for out in outputs)
    cap = engine.capacity()
    assert cap.free_blocks == cap.total_blocks
    assert engine.tokens_decoded == 4 * len(outputs[0])


async def test_blocks_held_while_running_match_the_context(started: list[SimEngine]) -> None:
    engine = await start(started, time_scale=1.0)
    gen = engine.generate(request("a", max_tokens=50))
    await anext(gen)  # prefilled: the prompt's blocks are held
    prompt = engine.count_tokens(PROMPT)
    held = engine.capacity().total_blocks - engine.capacity().free_blocks
    assert held == -(-prompt // 16)
    assert engine.capacity().usage == pytest.approx(held / engine.capacity().total_blocks)
    await gen.aclose()
    assert engine.capacity().free_blocks == engine.capacity().total_blocks


async def test_requests_beyond_the_cache_wait_in_the_engine_queue(
    started: list[SimEngine],
) -> None:
    prompt = SimEngine().count_tokens(PROMPT)
    blocks = -(-(prompt + 30) // 16)
    engine = await start(started, num_blocks=blocks, time_scale=1.0)
    first = engine.generate(request("a"))
    await anext(first)
    second = asyncio.create_task(collect(engine, request("b")))
    await asyncio.sleep(0.05)
    assert (engine.capacity().running, engine.capacity().waiting) == (1, 1)
    await first.aclose()
    assert await asyncio.wait_for(second, 10) == simulated_output(request("b"))
    assert engine.capacity().preemptions == 0


async def test_decoding_takes_the_roofline_time(started: list[SimEngine]) -> None:
    engine = await start(started, time_scale=1.0)
    loop = asyncio.get_running_loop()
    began = loop.time()
    pieces = await collect(engine, request("a", max_tokens=20))
    elapsed = loop.time() - began
    roofline = Roofline(model=LLAMA_8B, gpu=GPU_80GB)
    decode_floor = (len(pieces) - 1) * roofline.step_s(
        prefill_tokens=0, decode_requests=1, kv_tokens=engine.count_tokens(PROMPT)
    )
    assert elapsed >= decode_floor * 0.9


def test_a_negative_time_scale_is_refused() -> None:
    with pytest.raises(ValueError, match="time_scale"):
        SimEngine(time_scale=-1.0)


async def test_a_summarys_own_instruction_is_counted_in_its_prompt(
    started: list[SimEngine],
) -> None:
    engine = await start(started, time_scale=1.0)
    own = "Summarize the following document for a harbour master, in one long paragraph."
    asked = GenerationRequest(
        request_id="own",
        kind=JobKind.SUMMARIZE,
        input=DOC,
        max_tokens=50,
        sampling=SamplingParams(instruction=own),
    )
    gen = engine.generate(asked)
    await anext(gen)
    held = engine.capacity().total_blocks - engine.capacity().free_blocks
    assert held == -(-engine.count_tokens(build_prompt(JobKind.SUMMARIZE, DOC, own)) // 16)
    await gen.aclose()
    # The summary is the same extract: the simulator reads the document alone.
    assert simulated_output(asked) == simulated_output(request("x", max_tokens=50))


async def test_the_output_ends_as_vllm_says_it_did(started: list[SimEngine]) -> None:
    engine = await start(started, time_scale=0.0)
    complete = JobKind.COMPLETE  # a completion's text does not depend on max_tokens
    whole = len(simulated_output(request("x", max_tokens=1000, kind=complete)))
    cut = engine.generate(request("cut", max_tokens=whole - 1, kind=complete))
    assert len([piece async for piece in cut]) == whole - 1
    assert cut.finish_reason == "length"
    # Text that fills max_tokens exactly is cut too: the end-of-text token would come next.
    full = engine.generate(request("full", max_tokens=whole, kind=complete))
    assert len([piece async for piece in full]) == whole
    assert full.finish_reason == "length"
    ended = engine.generate(request("ended", max_tokens=whole + 1, kind=complete))
    assert len([piece async for piece in ended]) == whole
    assert ended.finish_reason == "stop"
    summary = engine.generate(request("summary", max_tokens=200))
    assert 0 < len([piece async for piece in summary]) < 200
    assert summary.finish_reason == "stop"  # the extract fits its budget
    stopped = GenerationRequest(
        request_id="stopped",
        kind=JobKind.COMPLETE,
        input=DOC,
        max_tokens=1000,
        sampling=SamplingParams(stop=("simulator",)),
    )
    at_stop = engine.generate(stopped)
    assert "simulator" not in "".join([piece async for piece in at_stop])
    assert at_stop.finish_reason == "stop"


async def test_an_aborted_output_has_no_finish_reason(started: list[SimEngine]) -> None:
    engine = await start(started, time_scale=1.0)
    gen = engine.generate(request("a", max_tokens=50))
    await anext(gen)
    await engine.abort("a")
    assert [piece async for piece in gen] == []
    assert gen.finish_reason is None
