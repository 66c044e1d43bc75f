"""What every engine does for the worker, checked on each: the simulator in-process, and the
HTTP engine against a real sim-server (uvicorn on a free local port, same process) set up as
a vLLM 0.33 server is: several tokens a chunk (stream_interval 2), usage only when asked, the
EOS token counted as generated."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from schemas.jobs import JobKind
from workers.engines.base import GenerationRequest, InferenceEngine, SamplingParams
from workers.engines.errors import (
    DuplicateRequest,
    EngineAborted,
    EngineNotRunning,
    RequestTooLarge,
)
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.output import simulated_output
from workers.engines.sim.server import create_app, running
from workers.engines.vllm.http import VllmHttpEngine

MODEL = "sim-8b"
BLOCKS = 256
FAST = 0.02  # times the roofline: a decode step of ~0.2 ms
SLOW = 2.0  # a decode step of ~15 ms: a long output takes seconds
SETTLE_S = 0.5  # far less than what is left of a SLOW output when a test cuts it
DOC = " ".join(f"Sentence number {i} tells the simulator something new." for i in range(40))
PROMPT = "Write a short note about the harbour reopening and the winter fishing fleet."


class MakeEngine(Protocol):
    async def __call__(
        self, *, start: bool = True, num_blocks: int = BLOCKS, time_scale: float = FAST
    ) -> InferenceEngine: ...


@pytest.fixture(params=["sim", "vllm_http"])
async def make_engine(request: pytest.FixtureRequest) -> AsyncIterator[MakeEngine]:
    async with contextlib.AsyncExitStack() as stack:

        async def make(
            *, start: bool = True, num_blocks: int = BLOCKS, time_scale: float = FAST
        ) -> InferenceEngine:
            sim = SimEngine(num_blocks=num_blocks, time_scale=time_scale)
            engine: InferenceEngine = sim
            if request.param == "vllm_http":
                app = create_app(sim, model=MODEL, stream_interval=2)
                url = await stack.enter_async_context(running(app))
                engine = VllmHttpEngine(base_url=url, model=MODEL, metrics_interval_s=0.005)
            stack.push_async_callback(engine.close)
            if start:
                await engine.start()
            return engine

        yield make


def output_of(engine: InferenceEngine, request: GenerationRequest) -> tuple[str, int]:
    """What ``engine`` streams for ``request``, as (text, items): the simulated output, one
    item a token. Behind a vLLM server the text of a chunk of several tokens comes as one
    item and empty ones, and an output shorter than max_tokens ends with the EOS token
    (generated and counted by vLLM; its text is empty)."""
    pieces = simulated_output(request)
    eos = isinstance(engine, VllmHttpEngine) and len(pieces) < request.max_tokens
    return "".join(pieces), len(pieces) + int(eos)


def streamed(pieces: list[str]) -> tuple[str, int]:
    return "".join(pieces), len(pieces)


def summary(rid: str, max_tokens: int = 200) -> GenerationRequest:
    return GenerationRequest(
        request_id=rid, kind=JobKind.SUMMARIZE, input=DOC, max_tokens=max_tokens
    )


async def collect(engine: InferenceEngine, request: GenerationRequest) -> list[str]:
    return [piece async for piece in engine.generate(request)]


async def eventually(check: Callable[[], bool], within_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not check():
        assert loop.time() < deadline, f"not within {within_s} s"
        await asyncio.sleep(0.002)


def all_free(engine: InferenceEngine) -> Callable[[], bool]:
    def check() -> bool:
        cap = engine.capacity()
        return cap.total_blocks > 0 and cap.free_blocks == cap.total_blocks

    return check


class Consumer:
    """A task reading one stream, as the worker's executor does."""

    def __init__(self, engine: InferenceEngine, request: GenerationRequest) -> None:
        self.pieces: list[str] = []
        self._wanted = 0
        self._reached = asyncio.Event()
        self.task = asyncio.create_task(self._run(engine, request))

    async def _run(self, engine: InferenceEngine, request: GenerationRequest) -> None:
        async for piece in engine.generate(request):
            self.pieces.append(piece)
            if len(self.pieces) >= self._wanted:
                self._reached.set()

    async def reach(self, count: int) -> None:
        self._wanted = count
        self._reached.clear()
        if len(self.pieces) < count:
            await asyncio.wait_for(self._reached.wait(), 5)


@pytest.mark.parametrize(
    "request_",
    [
        summary("doc"),
        GenerationRequest(request_id="p", kind=JobKind.COMPLETE, input=PROMPT, max_tokens=200),
    ],
    ids=["summarize", "complete"],
)
async def test_streams_the_simulated_output_exactly(
    make_engine: MakeEngine, request_: GenerationRequest
) -> None:
    engine = await make_engine()
    pieces = await collect(engine, request_)
    assert streamed(pieces) == output_of(engine, request_)
    if isinstance(engine, SimEngine):
        assert pieces == simulated_output(request_)  # one token's text an item
    assert len(pieces) > 20


async def test_stop_and_seed_are_applied(make_engine: MakeEngine) -> None:
    engine = await make_engine()

    def completion(rid: str, **sampling: Any) -> GenerationRequest:
        return GenerationRequest(
            request_id=rid,
            kind=JobKind.COMPLETE,
            input=PROMPT,
            max_tokens=80,
            sampling=SamplingParams(**sampling) if sampling else None,
        )

    plain, _ = streamed(await collect(engine, completion("plain")))
    stop = " " + plain.split()[4]
    stopped, _ = streamed(await collect(engine, completion("stop", stop=(stop, "never seen"))))
    assert stopped == plain[: plain.index(stop)]  # up to the stop string, left out
    seeded = [
        streamed(await collect(engine, completion(f"seed{i}", seed=seed, temperature=0.7)))[0]
        for i, seed in enumerate((7, 7, 8))
    ]
    assert seeded[0] == seeded[1]  # the same seed, the same output
    assert len({seeded[0], seeded[2], plain}) == 3  # another seed (or none), another output


async def test_max_tokens_is_respected(make_engine: MakeEngine) -> None:
    engine = await make_engine()
    pieces = await collect(engine, summary("short", max_tokens=7))
    assert streamed(pieces) == output_of(engine, summary("short", max_tokens=7))
    assert len(pieces) == 7


async def test_the_output_ends_with_the_engines_finish_reason(make_engine: MakeEngine) -> None:
    engine = await make_engine()
    cut = engine.generate(summary("cut", max_tokens=7))
    assert len([piece async for piece in cut]) == 7
    assert cut.finish_reason == "length"
    whole = engine.generate(summary("whole"))
    assert 0 < len([piece async for piece in whole]) < 200
    assert whole.finish_reason == "stop"  # the summary ended before max_tokens


async def test_a_summarys_own_instruction_reaches_the_engine(make_engine: MakeEngine) -> None:
    engine = await make_engine()
    own = GenerationRequest(
        request_id="own",
        kind=JobKind.SUMMARIZE,
        input=DOC,
        max_tokens=200,
        sampling=SamplingParams(instruction="List the key facts, one a line.\nKeep numbers."),
    )
    pieces = await collect(engine, own)
    # The simulator extracts from the document alone, whatever it is asked (behind a vLLM
    # server too: it finds the document in the prompt).
    assert streamed(pieces) == output_of(engine, summary("plain"))


async def test_capacity_reports_the_cache_and_every_block_comes_back(
    make_engine: MakeEngine,
) -> None:
    engine = await make_engine()
    cap = engine.capacity()
    assert (cap.total_blocks, cap.free_blocks, cap.block_size) == (BLOCKS, BLOCKS, 16)
    assert (cap.running, cap.waiting, cap.preemptions) == (0, 0, 0)
    await collect(engine, summary("a"))
    await eventually(all_free(engine))


async def test_a_streaming_request_is_running_and_holds_blocks(make_engine: MakeEngine) -> None:
    engine = await make_engine(time_scale=SLOW)
    stream = engine.generate(summary("a"))
    await anext(stream)
    prompt_blocks = -(-engine.count_tokens(DOC) // 16)

    def holding() -> bool:
        cap = engine.capacity()
        return cap.running == 1 and cap.total_blocks - cap.free_blocks >= min(prompt_blocks, 20)

    await eventually(holding)
    await stream.aclose()


async def test_abort_mid_decode_ends_the_stream_and_frees_the_blocks(
    make_engine: MakeEngine,
) -> None:
    engine = await make_engine(time_scale=SLOW)
    request = summary("a")
    consumer = Consumer(engine, request)
    await consumer.reach(3)
    await engine.abort(request.request_id)
    at_abort = len(consumer.pieces)
    await asyncio.wait_for(consumer.task, SETTLE_S)
    assert len(consumer.pieces) == at_abort < len(simulated_output(request))
    await eventually(all_free(engine), within_s=SETTLE_S)


async def test_abort_of_an_unknown_id_changes_nothing(make_engine: MakeEngine) -> None:
    engine = await make_engine()
    request = summary("a", max_tokens=40)
    consumer = Consumer(engine, request)
    await consumer.reach(1)
    await engine.abort("no-such-request")
    await consumer.task
    assert streamed(consumer.pieces) == output_of(engine, request)


async def test_closing_the_stream_early_frees_the_blocks(make_engine: MakeEngine) -> None:
    engine = await make_engine(time_scale=SLOW)
    stream = engine.generate(summary("a"))
    for _ in range(3):
        await anext(stream)
    await stream.aclose()
    await eventually(all_free(engine), within_s=SETTLE_S)


async def test_cancelling_the_consumer_frees_the_blocks(make_engine: MakeEngine) -> None:
    engine = await make_engine(time_scale=SLOW)
    consumer = Consumer(engine, summary("a"))
    await consumer.reach(3)
    consumer.task.cancel()
    await asyncio.wait([consumer.task])
    assert consumer.task.cancelled()
    await eventually(all_free(engine), within_s=SETTLE_S)


async def test_a_running_id_cannot_start_twice(make_engine: MakeEngine) -> None:
    engine = await make_engine(time_scale=SLOW)
    request = summary("a", max_tokens=20)
    first = Consumer(engine, request)
    await first.reach(1)
    with pytest.raises(DuplicateRequest):
        await collect(engine, request)
    await first.task
    assert streamed(first.pieces) == output_of(engine, request)


async def test_generate_needs_a_started_engine(make_engine: MakeEngine) -> None:
    engine = await make_engine(start=False)
    with pytest.raises(EngineNotRunning):
        await collect(engine, summary("a"))
    await engine.start()
    await engine.close()
    with pytest.raises(EngineNotRunning):
        await collect(engine, summary("b"))


async def test_a_request_larger_than_the_cache_is_refused(make_engine: MakeEngine) -> None:
    engine = await make_engine(num_blocks=2)
    with pytest.raises(RequestTooLarge):
        await collect(engine, summary("big"))
    cap = engine.capacity()
    assert cap.free_blocks == cap.total_blocks == 2


async def test_a_tiny_cache_preempts_and_reports_it(make_engine: MakeEngine) -> None:
    # Short prompts are all admitted at once (one block each); their growth does not fit.
    engine = await make_engine(num_blocks=10, time_scale=0.2)
    requests = [
        GenerationRequest(
            request_id=f"r{i}",
            kind=JobKind.COMPLETE,
            input=f"Tell story {i} about the locks and the gates of the old canal.",
            max_tokens=60,
        )
        for i in range(6)
    ]
    outputs = await asyncio.gather(*(collect(engine, r) for r in requests))
    assert [streamed(o) for o in outputs] == [output_of(engine, r) for r in requests]
    await eventually(lambda: engine.capacity().preemptions > 0)
    await eventually(all_free(engine))


# Behind a vLLM server only: what a real one does that the client must not take for success.


@pytest.fixture
async def served() -> AsyncIterator[tuple[SimEngine, str]]:
    sim = SimEngine(num_blocks=BLOCKS, time_scale=SLOW)
    async with running(create_app(sim, model=MODEL, aliases=["alias"], stream_interval=3)) as url:
        yield sim, url


async def test_http_counts_every_token_of_multi_token_chunks(
    served: tuple[SimEngine, str],
) -> None:
    _, url = served
    engine = VllmHttpEngine(base_url=url, model=MODEL, metrics_interval_s=0.005)
    await engine.start()
    try:
        request = summary("multi", max_tokens=30)
        before = await generated_tokens(url)
        pieces = await collect(engine, request)
        assert len(pieces) == await generated_tokens(url) - before  # the server's own count
        assert "".join(pieces) == "".join(simulated_output(request))
    finally:
        await engine.close()


async def test_http_a_server_side_abort_is_a_retriable_error_not_a_success(
    served: tuple[SimEngine, str],
) -> None:
    _, url = served
    engine = VllmHttpEngine(base_url=url, model=MODEL, metrics_interval_s=0.005)
    await engine.start()
    try:
        request = summary("paused")
        consumer = Consumer(engine, request)
        await consumer.reach(2)
        async with httpx.AsyncClient(base_url=url) as http:  # as /pause or /sleep would
            await http.post("/abort_requests", json={"request_ids": ["paused"]})
        with pytest.raises(EngineAborted) as caught:
            await consumer.task
        assert caught.value.retriable
    finally:
        await engine.close()


async def test_http_over_the_context_is_refused_before_vllm_would_cap_it(
    served: tuple[SimEngine, str],
) -> None:
    _, url = served
    engine = VllmHttpEngine(base_url=url, model=MODEL, metrics_interval_s=0.005)
    await engine.start()
    try:
        context = BLOCKS * 16  # the server's max_model_len
        with pytest.raises(RequestTooLarge):
            await collect(engine, summary("long", max_tokens=context - 10))
    finally:
        await engine.close()


async def test_http_an_alias_reads_the_capacity_of_the_first_served_name(
    served: tuple[SimEngine, str],
) -> None:
    _, url = served
    engine = VllmHttpEngine(base_url=url, model="alias", metrics_interval_s=0.005)
    await engine.start()
    try:
        assert engine.capacity().total_blocks == BLOCKS
    finally:
        await engine.close()


async def test_http_data_parallel_capacity_is_the_sum_of_the_engines() -> None:
    engines = [SimEngine(num_blocks=BLOCKS, time_scale=FAST) for _ in range(2)]
    app = create_app(engines[0], model=MODEL, data_parallel=engines[1:])
    async with running(app) as url:
        engine = VllmHttpEngine(base_url=url, model=MODEL, metrics_interval_s=0.005)
        await engine.start()
        try:
            cap = engine.capacity()
            assert (cap.total_blocks, cap.free_blocks) == (2 * BLOCKS, 2 * BLOCKS)
        finally:
            await engine.close()


async def generated_tokens(url: str) -> float:
    async with httpx.AsyncClient(base_url=url) as http:
        text = (await http.get("/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:generation_tokens_total":
                return sample.value
    return 0.0
