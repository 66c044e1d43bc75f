"""The paged-KV simulator engine as a worker sees it."""

import asyncio

import pytest

from schemas.jobs import JobKind
from workers.engines.base import GenerationRequest, InferenceEngine
from workers.engines.paged import PagedSimEngine, RequestTooLarge
from workers.engines.sim import simulated_output

DOC = " ".join(f"Sentence number {i} tells the simulator something new." for i in range(40))


def request(rid: str, max_tokens: int = 30, kind: JobKind = JobKind.SUMMARIZE) -> GenerationRequest:
    return GenerationRequest(request_id=rid, kind=kind, input=DOC, max_tokens=max_tokens)


async def collect(engine: InferenceEngine, req: GenerationRequest) -> list[str]:
    return [piece async for piece in engine.generate(req)]


async def test_streams_the_simulated_output_and_frees_blocks() -> None:
    engine = PagedSimEngine(time_scale=0.0)
    await engine.start()
    try:
        outputs = await asyncio.gather(*(collect(engine, request(f"r{i}")) for i in range(4)))
        for out in outputs:
            assert out == simulated_output(request("x"))
        cap = engine.capacity()
        assert cap.free_blocks == cap.total_blocks
        assert cap.running == 0
    finally:
        await engine.close()


async def test_small_cache_preempts_and_still_completes() -> None:
    # Short prompts are all admitted at once (one block each); their growth is not covered.
    engine = PagedSimEngine(num_blocks=10, block_size=16, time_scale=0.0)
    await engine.start()
    try:
        reqs = [
            GenerationRequest(
                request_id=f"r{i}",
                kind=JobKind.COMPLETE,
                input=f"Tell story {i} about the locks and the gates of the old canal.",
                max_tokens=60,
            )
            for i in range(6)
        ]
        outputs = await asyncio.gather(*(collect(engine, r) for r in reqs))
        assert [len(o) for o in outputs] == [len(simulated_output(r)) for r in reqs]
        assert engine.capacity().preemptions > 0
        assert engine.capacity().free_blocks == 10
    finally:
        await engine.close()


async def test_abort_stops_the_stream_and_frees_its_blocks() -> None:
    engine = PagedSimEngine(time_scale=1.0)  # real roofline time: ~10 ms a step
    await engine.start()
    try:
        got: list[str] = []

        async def consume() -> None:
            async for piece in engine.generate(request("a", max_tokens=200)):
                got.append(piece)
                if len(got) == 3:
                    await engine.abort("a")

        await asyncio.wait_for(consume(), 10)
        assert len(got) == 3
        assert engine.capacity().free_blocks == engine.capacity().total_blocks
    finally:
        await engine.close()


async def test_a_request_larger_than_the_cache_is_refused() -> None:
    engine = PagedSimEngine(num_blocks=2, block_size=16, time_scale=0.0)
    await engine.start()
    try:
        with pytest.raises(RequestTooLarge):
            await collect(engine, request("big"))
    finally:
        await engine.close()
