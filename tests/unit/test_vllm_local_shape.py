"""The in-process vLLM engine where no GPU (and no vLLM) is needed: it imports and is built
without vLLM, refuses work before start, and turns vLLM's stats into a Capacity. Its
behaviour on a real engine is in tests/gpu/test_vllm_local.py."""

from __future__ import annotations

import asyncio
import importlib
import sys
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from schemas.jobs import JobKind
from workers.engines.base import Finished, GenerationRequest, SamplingParams
from workers.engines.errors import (
    DuplicateRequest,
    EngineAborted,
    EngineError,
    EngineNotRunning,
    RequestTooLarge,
)
from workers.engines.prompts import build_prompt
from workers.engines.streaming import output_pieces
from workers.engines.vllm.local import VllmLocalEngine, finished_output
from workers.engines.vllm.stats import StatsSink, capacity_from


def engine() -> VllmLocalEngine:
    return VllmLocalEngine(
        model="facebook/opt-125m",
        gpu_memory_utilization=0.5,
        max_model_len=512,
        block_size=16,
        max_num_seqs=8,
    )


def scheduler_stats(
    *, usage: float, running: int = 0, waiting: int = 0, deferred: int = 0
) -> SimpleNamespace:
    return SimpleNamespace(
        kv_cache_usage=usage,
        num_running_reqs=running,
        num_waiting_reqs=waiting,
        num_skipped_waiting_reqs=deferred,
    )


def test_the_module_imports_without_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # any `import vllm...` now fails
    monkeypatch.delitem(sys.modules, "workers.engines.vllm.local")
    module = importlib.import_module("workers.engines.vllm.local")
    assert module.VllmLocalEngine.name == "vllm_local"


def test_the_worker_builds_it_without_starting_it() -> None:
    from plumbing.settings import Settings
    from workers.engines.build import build_engine

    built = build_engine("vllm_local", Settings(vllm_model="facebook/opt-125m").engines)
    assert isinstance(built, VllmLocalEngine)
    assert built.model == "facebook/opt-125m"


def test_capacity_before_start_reports_no_blocks() -> None:
    cap = engine().capacity()
    assert (cap.total_blocks, cap.free_blocks, cap.usage) == (0, 0, 0.0)
    assert cap.block_size == 16
    assert (cap.running, cap.waiting, cap.preemptions, cap.max_running) == (0, 0, 0, 8)


async def test_generate_before_start_is_refused() -> None:
    request = GenerationRequest(request_id="r1", kind=JobKind.COMPLETE, input="Hello", max_tokens=4)
    with pytest.raises(EngineNotRunning):
        await anext(engine().generate(request))


def test_count_tokens_before_start_is_refused() -> None:
    with pytest.raises(EngineNotRunning):
        engine().count_tokens("Hello")


async def test_abort_and_close_before_start_do_nothing() -> None:
    unstarted = engine()
    await unstarted.abort("nobody")
    await unstarted.close()
    await unstarted.close()


def test_prompts_per_kind() -> None:
    assert build_prompt(JobKind.COMPLETE, "Once upon a time") == "Once upon a time"
    prompt = build_prompt(JobKind.SUMMARIZE, "The document.")
    assert prompt.startswith("Summarize")
    assert "The document." in prompt
    assert prompt.endswith("Summary:")
    own = build_prompt(JobKind.SUMMARIZE, "The document.", "List the facts.")
    assert own == "List the facts.\n\nDocument:\nThe document.\n\nSummary:"
    assert build_prompt(JobKind.COMPLETE, "Once", "List the facts.") == "Once"


def test_a_finished_output_says_why_it_ended_as_vllm_did() -> None:
    def output(*reasons: str | None) -> SimpleNamespace:
        completions = [SimpleNamespace(finish_reason=reason) for reason in reasons]
        return SimpleNamespace(finished=True, outputs=completions)

    assert finished_output(output("stop"), "r") == Finished("stop")
    assert finished_output(output("length"), "r") == Finished("length")
    with pytest.raises(EngineAborted):
        finished_output(output("abort"), "r")
    for other in ("error", "repetition", None):
        with pytest.raises(EngineError):
            finished_output(output(other), "r")


def test_a_delta_gives_one_item_per_token() -> None:
    assert output_pieces(" world", 1) == [" world"]
    # Deltas merged while the consumer was behind: the text, then one empty item per token.
    assert output_pieces(" big world", 2) == [" big world", ""]
    # A token whose text is held back (an incomplete character) still counts.
    assert output_pieces("", 1) == [""]
    # The final output of an aborted request carries nothing.
    assert output_pieces("", 0) == []


def test_capacity_leaves_out_the_null_block() -> None:
    # vLLM's usage is over num_gpu_blocks - 1 blocks (one is the never-allocated null block).
    cap = capacity_from(
        kv_cache_usage=0.25,
        running=3,
        waiting=1,
        preemptions=2,
        num_gpu_blocks=101,
        block_size=16,
        max_running=256,
    )
    assert (cap.total_blocks, cap.free_blocks) == (100, 75)
    assert cap.usage == pytest.approx(0.25)
    assert (cap.running, cap.waiting, cap.preemptions, cap.max_running) == (3, 1, 2, 256)


def test_capacity_clamps_usage() -> None:
    full = capacity_from(
        kv_cache_usage=1.2,
        running=0,
        waiting=0,
        preemptions=0,
        num_gpu_blocks=11,
        block_size=16,
        max_running=None,
    )
    assert full.free_blocks == 0
    empty = capacity_from(
        kv_cache_usage=-0.1,
        running=0,
        waiting=0,
        preemptions=0,
        num_gpu_blocks=11,
        block_size=16,
        max_running=None,
    )
    assert empty.free_blocks == empty.total_blocks == 10


def test_the_sink_keeps_the_latest_step_and_adds_up_preemptions() -> None:
    sink = StatsSink()
    assert sink.factory(object(), 0) is sink
    sink.record(scheduler_stats(usage=0.5, running=4, waiting=2, deferred=1), None)
    sink.record(
        scheduler_stats(usage=0.75, running=5, waiting=0),
        SimpleNamespace(num_preempted_reqs=2),
    )
    sink.record(None, SimpleNamespace(num_preempted_reqs=1))
    cap = sink.capacity(num_gpu_blocks=201, block_size=16, max_running=8)
    assert (cap.total_blocks, cap.free_blocks) == (200, 50)
    assert (cap.running, cap.waiting, cap.preemptions) == (5, 0, 3)
    assert sink.steps == 2


def test_the_sink_counts_deferred_requests_as_waiting() -> None:
    sink = StatsSink()
    sink.record(scheduler_stats(usage=0.0, running=1, waiting=2, deferred=3), None)
    assert sink.capacity(num_gpu_blocks=11, block_size=16, max_running=None).waiting == 5


def test_the_sink_has_what_vllm_calls_on_a_stat_logger() -> None:
    sink = StatsSink()
    sink.log_engine_initialized()
    sink.log()
    sink.record_sleep_state(1, 0)
    sink.record(scheduler_stats(usage=0.1), None, mm_cache_stats=None, engine_idx=0)
    assert sink.steps == 1


# The engine's control flow (duplicate ids, abort, early close, cancel, close) against a
# stand-in for vLLM's AsyncLLM that keeps the parts of its contract the engine relies on:
# ``generate`` streams DELTA outputs and aborts by itself when closed or cancelled, and
# ``abort`` by external id ends the stream with a final, empty, finished output.


class FakeTokenizer:
    def encode(self, text: str) -> list[int]:
        return list(range(len(text.split())))


def fake_output(
    text: str, token_ids: list[int], *, finished: bool, finish_reason: str | None = None
) -> SimpleNamespace:
    """A DELTA ``RequestOutput``; the final one's ``CompletionOutput`` says why it ended
    ("length", "stop", or "abort" for one the engine aborted: v1/engine/output_processor.py
    ~636-648)."""
    if finished and finish_reason is None:
        finish_reason = "length"
    completion = SimpleNamespace(text=text, token_ids=token_ids, finish_reason=finish_reason)
    return SimpleNamespace(finished=finished, outputs=[completion])


class FakeAsyncLLM:
    def __init__(self, args: SimpleNamespace, stat_loggers: list[Any]) -> None:
        self.args = args
        engines = getattr(args, "data_parallel_size", 1)
        # One logger per engine index, as vLLM asks its factory (the frontend's per-engine
        # loggers); the DP-wide total of blocks on the config (v1/engine/core_client.py ~877).
        self.sinks = [stat_loggers[0](None, index) for index in range(engines)]
        self.sink = self.sinks[0]
        self.vllm_config = SimpleNamespace(
            cache_config=SimpleNamespace(num_gpu_blocks=101 * engines, block_size=args.block_size),
            parallel_config=SimpleNamespace(data_parallel_size=engines),
            model_config=SimpleNamespace(max_model_len=args.max_model_len),
            scheduler_config=SimpleNamespace(max_num_seqs=args.max_num_seqs),
        )
        self.streams: dict[str, asyncio.Queue[SimpleNamespace]] = {}
        self.finishes: dict[str, str] = {}  # request id -> its last output's finish_reason
        self.prompts: dict[str, list[int]] = {}  # request id -> its prompt's token ids
        self.aborted: list[str] = []
        self.shut_down = 0

    @classmethod
    def from_engine_args(cls, args: SimpleNamespace, stat_loggers: list[Any]) -> FakeAsyncLLM:
        return cls(args, stat_loggers)

    def get_tokenizer(self) -> FakeTokenizer:
        return FakeTokenizer()

    async def generate(
        self, prompt: dict[str, Any], params: SimpleNamespace, request_id: str
    ) -> AsyncIterator[SimpleNamespace]:
        queue: asyncio.Queue[SimpleNamespace] = asyncio.Queue()
        self.streams[request_id] = queue
        self.prompts[request_id] = prompt["prompt_token_ids"]
        decoder = asyncio.create_task(self._decode(request_id, params.max_tokens, queue))
        try:
            while True:
                output = await queue.get()
                yield output
                if output.finished:
                    return
        except (asyncio.CancelledError, GeneratorExit):
            await self.abort(request_id)
            raise
        finally:
            decoder.cancel()

    async def _decode(self, request_id: str, n: int, queue: asyncio.Queue[Any]) -> None:
        for i in range(n):
            await asyncio.sleep(0.001)
            if self.streams.get(request_id) is not queue:
                return
            last = i == n - 1
            reason = self.finishes.get(request_id) if last else None
            queue.put_nowait(fake_output(f" t{i}", [i], finished=last, finish_reason=reason))
        self.streams.pop(request_id, None)

    async def abort(self, request_id: str | list[str]) -> None:
        for rid in [request_id] if isinstance(request_id, str) else request_id:
            queue = self.streams.pop(rid, None)
            if queue is not None:
                self.aborted.append(rid)
                queue.put_nowait(fake_output("", [], finished=True, finish_reason="abort"))
        await asyncio.sleep(0)

    def fail(self, request_id: str) -> None:
        """The engine core failed the request (finish_reason "error")."""
        queue = self.streams.pop(request_id)
        queue.put_nowait(fake_output("", [], finished=True, finish_reason="error"))

    def shutdown(self) -> None:
        self.shut_down += 1


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    modules = {
        "vllm": SimpleNamespace(SamplingParams=SimpleNamespace),
        "vllm.engine": SimpleNamespace(),
        "vllm.engine.arg_utils": SimpleNamespace(AsyncEngineArgs=SimpleNamespace),
        "vllm.v1": SimpleNamespace(),
        "vllm.v1.engine": SimpleNamespace(),
        "vllm.v1.engine.async_llm": SimpleNamespace(AsyncLLM=FakeAsyncLLM),
        "vllm.exceptions": SimpleNamespace(VLLMError=RuntimeError),
        "vllm.inputs": SimpleNamespace(
            tokens_input=lambda ids: {"type": "token", "prompt_token_ids": ids}
        ),
        "vllm.sampling_params": SimpleNamespace(RequestOutputKind=SimpleNamespace(DELTA="delta")),
    }
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)


@pytest.fixture
async def fake_engine(fake_vllm: None) -> AsyncIterator[VllmLocalEngine]:
    started = engine()
    await started.start()
    yield started
    await started.close()


def llm(engine: VllmLocalEngine) -> FakeAsyncLLM:
    assert isinstance(engine._llm, FakeAsyncLLM)
    return engine._llm


def fake_request(rid: str, max_tokens: int = 5, text: str = "one two three") -> GenerationRequest:
    return GenerationRequest(
        request_id=rid, kind=JobKind.COMPLETE, input=text, max_tokens=max_tokens
    )


async def until_received(received: list[str], n: int, task: asyncio.Task[None]) -> None:
    async with asyncio.timeout(2):
        while len(received) < n:
            if task.done():
                task.result()  # raises what ended the consumer
                pytest.fail(f"the stream ended after {len(received)} items")
            await asyncio.sleep(0.001)


async def test_start_takes_the_engine_figures_and_plugs_in_the_sink(
    fake_engine: VllmLocalEngine,
) -> None:
    fake = llm(fake_engine)
    assert fake.args.disable_log_stats is True
    assert (fake.args.block_size, fake.args.max_model_len, fake.args.max_num_seqs) == (16, 512, 8)
    cap = fake_engine.capacity()
    assert (cap.total_blocks, cap.free_blocks, cap.block_size, cap.max_running) == (100, 100, 16, 8)
    fake.sink.record(
        SimpleNamespace(
            kv_cache_usage=0.5, num_running_reqs=1, num_waiting_reqs=0, num_skipped_waiting_reqs=0
        ),
        None,
    )
    assert fake_engine.capacity().free_blocks == 50
    assert fake_engine.count_tokens("four words right here") == 4


async def test_fake_streams_one_item_per_token(fake_engine: VllmLocalEngine) -> None:
    pieces = [piece async for piece in fake_engine.generate(fake_request("r", max_tokens=5))]
    assert pieces == [" t0", " t1", " t2", " t3", " t4"]
    assert llm(fake_engine).aborted == []


async def test_fake_the_stream_ends_with_vllms_finish_reason(fake_engine: VllmLocalEngine) -> None:
    cut = fake_engine.generate(fake_request("cut", max_tokens=3))
    assert [piece async for piece in cut] == [" t0", " t1", " t2"]
    assert cut.finish_reason == "length"
    llm(fake_engine).finishes["eos"] = "stop"
    ended = fake_engine.generate(fake_request("eos", max_tokens=3))
    assert [piece async for piece in ended] == [" t0", " t1", " t2"]
    assert ended.finish_reason == "stop"


async def test_fake_a_summary_is_prompted_with_its_own_instruction(
    fake_engine: VllmLocalEngine,
) -> None:
    own = "List the key facts, one a line."
    request = GenerationRequest(
        request_id="own",
        kind=JobKind.SUMMARIZE,
        input="The lock reopened on Monday.",
        max_tokens=2,
        sampling=SamplingParams(instruction=own),
    )
    assert [piece async for piece in fake_engine.generate(request)] == [" t0", " t1"]
    words = len(build_prompt(JobKind.SUMMARIZE, request.input, own).split())
    assert len(llm(fake_engine).prompts["own"]) == words  # the fake tokenizer: one a word


async def test_fake_an_aborted_stream_has_no_finish_reason(fake_engine: VllmLocalEngine) -> None:
    stream = fake_engine.generate(fake_request("a", max_tokens=400))
    await anext(stream)
    await fake_engine.abort("a")
    assert [piece async for piece in stream] == []
    assert stream.finish_reason is None


async def test_fake_too_large_is_refused_before_submission(fake_engine: VllmLocalEngine) -> None:
    with pytest.raises(RequestTooLarge):
        await anext(fake_engine.generate(fake_request("big", max_tokens=510)))
    assert llm(fake_engine).streams == {}


async def test_fake_duplicate_is_refused_while_running(fake_engine: VllmLocalEngine) -> None:
    first = fake_engine.generate(fake_request("dup", max_tokens=100))
    await anext(first)
    with pytest.raises(DuplicateRequest):
        await anext(fake_engine.generate(fake_request("dup")))
    await first.aclose()
    assert llm(fake_engine).aborted == ["dup"]
    assert [p async for p in fake_engine.generate(fake_request("dup", max_tokens=2))] == [
        " t0",
        " t1",
    ]


async def test_fake_abort_ends_the_stream_without_further_tokens(
    fake_engine: VllmLocalEngine,
) -> None:
    received: list[str] = []

    async def consume() -> None:
        async for piece in fake_engine.generate(fake_request("a", max_tokens=400)):
            received.append(piece)

    task = asyncio.create_task(consume())
    await until_received(received, 3, task)
    await fake_engine.abort("a")
    at_abort = len(received)
    await asyncio.wait_for(task, timeout=2)
    assert len(received) == at_abort
    assert llm(fake_engine).aborted == ["a"]


async def test_fake_cancelling_the_consumer_aborts(fake_engine: VllmLocalEngine) -> None:
    received: list[str] = []

    async def consume() -> None:
        async for piece in fake_engine.generate(fake_request("c", max_tokens=400)):
            received.append(piece)

    task = asyncio.create_task(consume())
    await until_received(received, 2, task)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert llm(fake_engine).aborted == ["c"]
    assert llm(fake_engine).streams == {}


async def test_fake_close_aborts_open_streams_and_shuts_down_once(fake_vllm: None) -> None:
    started = engine()
    await started.start()
    fake = llm(started)
    stream = started.generate(fake_request("open", max_tokens=400))
    await anext(stream)
    await started.close()
    assert fake.aborted == ["open"]
    assert [p async for p in stream] == []  # its final, aborted output carries nothing
    await started.close()
    assert fake.shut_down == 1
    with pytest.raises(EngineNotRunning):
        await anext(started.generate(fake_request("late")))


async def consume_until_it_ends(engine: VllmLocalEngine, request: GenerationRequest) -> list[str]:
    received: list[str] = []
    async for piece in engine.generate(request):
        received.append(piece)
    return received


async def test_fake_an_abort_by_the_engine_itself_is_not_a_success(
    fake_engine: VllmLocalEngine,
) -> None:
    # Someone else aborted it in vLLM (a pause, a sleep, an admin's abort): AsyncLLM.generate
    # ends the stream without raising, and the output is cut short.
    request = fake_request("cut", max_tokens=400)
    task = asyncio.create_task(consume_until_it_ends(fake_engine, request))
    while "cut" not in llm(fake_engine).streams:
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.01)
    await llm(fake_engine).abort("cut")
    with pytest.raises(EngineAborted) as caught:
        await task
    assert caught.value.retriable


async def test_fake_an_error_in_the_engine_is_an_engine_error(
    fake_engine: VllmLocalEngine,
) -> None:
    request = fake_request("broken", max_tokens=400)
    task = asyncio.create_task(consume_until_it_ends(fake_engine, request))
    while "broken" not in llm(fake_engine).streams:
        await asyncio.sleep(0.001)
    llm(fake_engine).fail("broken")
    with pytest.raises(EngineError):
        await task


async def test_fake_data_parallel_engines_each_keep_their_blocks(fake_vllm: None) -> None:
    dp = VllmLocalEngine(model="m", max_model_len=512, engine_kwargs={"data_parallel_size": 2})
    await dp.start()
    try:
        fake = llm(dp)
        stats = SimpleNamespace(num_running_reqs=1, num_waiting_reqs=0, num_skipped_waiting_reqs=0)
        fake.sinks[0].record(SimpleNamespace(**vars(stats), kv_cache_usage=0.5), None, None, 0)
        fake.sinks[1].record(SimpleNamespace(**vars(stats), kv_cache_usage=0.0), None, None, 1)
        cap = dp.capacity()
        # 202 blocks in all, 101 an engine, one of each its null block; half of engine 0's used.
        assert (cap.total_blocks, cap.free_blocks, cap.running) == (200, 150, 2)
    finally:
        await dp.close()
