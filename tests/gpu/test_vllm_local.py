"""The in-process vLLM engine on a real GPU with a small model.

Needs the vllm extra, a CUDA GPU and the model already on disk: nothing is downloaded. The
model is SLUICEGATE_TEST_VLLM_MODEL (default facebook/opt-125m), a local directory or a
Hugging Face id already in the local cache (``hf download facebook/opt-125m`` beforehand).
SLUICEGATE_TEST_VLLM_GPU_MEMORY_UTILIZATION (default 0.3) sizes its KV cache.

Every test shares one engine; each uses request ids of its own.
"""

from __future__ import annotations

import asyncio
import os
import warnings
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # import-time deprecations in vLLM and torch are not ours
    pytest.importorskip("vllm", reason="needs the vllm extra")
    torch = pytest.importorskip("torch", reason="needs the vllm extra")

from schemas.jobs import JobKind
from workers.engines.base import Capacity, GenerationRequest
from workers.engines.errors import DuplicateRequest, EngineNotRunning, RequestTooLarge
from workers.engines.vllm.local import VllmLocalEngine

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

MODEL = os.environ.get("SLUICEGATE_TEST_VLLM_MODEL", "facebook/opt-125m")
GPU_MEMORY_UTILIZATION = float(os.environ.get("SLUICEGATE_TEST_VLLM_GPU_MEMORY_UTILIZATION", "0.3"))
MAX_MODEL_LEN = 512
BLOCK_SIZE = 16
MAX_NUM_SEQS = 8
PROMPT = "The history of the printing press begins"


def local_model(name: str) -> str | None:
    """A local directory holding ``name``, without touching the network."""
    if Path(name).is_dir():
        return name
    from huggingface_hub import snapshot_download

    try:
        return str(snapshot_download(repo_id=name, local_files_only=True))
    except Exception:  # not cached (the exception's module moved between hub versions)
        return None


MODEL_PATH = local_model(MODEL)
if MODEL_PATH is None:
    pytest.skip(
        f"model {MODEL!r} is not on disk (tests never download it): fetch it first, e.g. "
        f"`hf download {MODEL}`, or point SLUICEGATE_TEST_VLLM_MODEL at a local directory",
        allow_module_level=True,
    )

pytestmark = [
    pytest.mark.gpu,
    # vLLM, torch and transformers warn at run time about things that are not ours.
    pytest.mark.filterwarnings("default"),
    # The first test also starts the engine (weights, memory profiling).
    pytest.mark.timeout(600),
]


@pytest.fixture(scope="module")
async def engine() -> AsyncIterator[VllmLocalEngine]:
    assert MODEL_PATH is not None
    with pytest.MonkeyPatch.context() as env:
        # The engine core process inherits these: no Hub requests at all.
        env.setenv("HF_HUB_OFFLINE", "1")
        env.setenv("TRANSFORMERS_OFFLINE", "1")
        started = VllmLocalEngine(
            model=MODEL_PATH,
            gpu_memory_utilization=GPU_MEMORY_UTILIZATION,
            max_model_len=MAX_MODEL_LEN,
            block_size=BLOCK_SIZE,
            max_num_seqs=MAX_NUM_SEQS,
            enforce_eager=True,  # no CUDA graph capture: a faster start
        )
        await started.start()
        try:
            yield started
        finally:
            await started.close()


def request(
    rid: str, *, max_tokens: int = 16, kind: JobKind = JobKind.COMPLETE, text: str = PROMPT
) -> GenerationRequest:
    return GenerationRequest(request_id=rid, kind=kind, input=text, max_tokens=max_tokens)


def unfinished(engine: VllmLocalEngine) -> int:
    """Requests vLLM's frontend still tracks (it drops an aborted one at once)."""
    return int(engine._llm.get_num_unfinished_requests())


async def settled(engine: VllmLocalEngine, timeout_s: float = 10.0) -> Capacity:
    """Capacity once the engine reports nothing running or waiting and every block free."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        cap = engine.capacity()
        if cap.running == 0 and cap.waiting == 0 and cap.free_blocks == cap.total_blocks:
            return cap
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"the engine did not settle within {timeout_s}s: {cap}")
        await asyncio.sleep(0.02)


async def wait_for_items(
    received: list[str], n: int, task: asyncio.Task[None], timeout_s: float = 30.0
) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while len(received) < n:
        if task.done():
            task.result()  # raises what ended the consumer
            pytest.fail(f"the stream ended after {len(received)} of {n} tokens")
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"only {len(received)} of {n} tokens within {timeout_s}s")
        await asyncio.sleep(0.01)


async def test_streams_tokens_and_ends(engine: VllmLocalEngine) -> None:
    pieces = [piece async for piece in engine.generate(request("stream", max_tokens=16))]
    assert 1 <= len(pieces) <= 16
    assert "".join(pieces)
    assert unfinished(engine) == 0


async def test_summarize_streams_too(engine: VllmLocalEngine) -> None:
    document = "The printing press spread across Europe within fifty years. " * 4
    pieces = [
        piece
        async for piece in engine.generate(
            request("summary", max_tokens=12, kind=JobKind.SUMMARIZE, text=document)
        )
    ]
    assert 1 <= len(pieces) <= 12


async def test_counts_tokens_with_the_model_tokenizer(engine: VllmLocalEngine) -> None:
    short = engine.count_tokens("Hello")
    assert short >= 1
    assert engine.count_tokens("Hello " * 50) > short


async def test_capacity_reports_the_cache_and_frees_it_after_the_end(
    engine: VllmLocalEngine,
) -> None:
    cap = await settled(engine)
    assert cap.total_blocks > 0
    assert cap.block_size == BLOCK_SIZE
    assert cap.max_running == MAX_NUM_SEQS
    stream = engine.generate(request("capacity", max_tokens=64))
    for _ in range(3):
        await anext(stream)
    busy = engine.capacity()  # recorded for the step that produced the token just read
    assert busy.running == 1
    assert busy.free_blocks < busy.total_blocks
    async for _ in stream:
        pass
    after = await settled(engine)
    assert after.free_blocks == after.total_blocks == cap.total_blocks
    assert after.usage == 0.0


async def test_abort_mid_decode_ends_the_stream_and_frees_its_blocks(
    engine: VllmLocalEngine,
) -> None:
    received: list[str] = []

    async def consume() -> None:
        async for piece in engine.generate(request("abort-me", max_tokens=400)):
            received.append(piece)

    task = asyncio.create_task(consume())
    await wait_for_items(received, 4, task)
    await engine.abort("abort-me")
    at_abort = len(received)
    await asyncio.wait_for(task, timeout=5)
    assert len(received) == at_abort  # no further tokens
    assert at_abort < 400
    assert unfinished(engine) == 0
    await settled(engine)


async def test_closing_the_stream_early_aborts_the_request(engine: VllmLocalEngine) -> None:
    stream = engine.generate(request("close-me", max_tokens=400))
    for _ in range(3):
        await anext(stream)
    await stream.aclose()  # type: ignore[attr-defined]
    assert unfinished(engine) == 0
    await settled(engine)
    # The id is free again.
    again = [piece async for piece in engine.generate(request("close-me", max_tokens=2))]
    assert 1 <= len(again) <= 2


async def test_cancelling_the_consumer_aborts_the_request(engine: VllmLocalEngine) -> None:
    received: list[str] = []

    async def consume() -> None:
        async for piece in engine.generate(request("cancel-me", max_tokens=400)):
            received.append(piece)

    task = asyncio.create_task(consume())
    await wait_for_items(received, 3, task)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert unfinished(engine) == 0
    await settled(engine)


async def test_a_running_id_is_refused(engine: VllmLocalEngine) -> None:
    first = engine.generate(request("twice", max_tokens=400))
    await anext(first)
    with pytest.raises(DuplicateRequest):
        await anext(engine.generate(request("twice")))
    await first.aclose()  # type: ignore[attr-defined]
    await settled(engine)


async def test_too_large_requests_are_refused_before_submission(
    engine: VllmLocalEngine,
) -> None:
    with pytest.raises(RequestTooLarge):
        await anext(engine.generate(request("long-output", max_tokens=MAX_MODEL_LEN)))
    with pytest.raises(RequestTooLarge):
        await anext(engine.generate(request("long-prompt", text="word " * 2 * MAX_MODEL_LEN)))
    assert unfinished(engine) == 0


async def test_generate_before_start_is_refused() -> None:
    assert MODEL_PATH is not None
    with pytest.raises(EngineNotRunning):
        await anext(VllmLocalEngine(model=MODEL_PATH).generate(request("early")))
