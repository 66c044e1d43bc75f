"""The engine contract on llama.cpp with the real model (SmolLM2-135M-Instruct, on the CPU).

One `sluicegate llama-server` process for the module (2 slots of 1,024 tokens, 1 thread, so
another test can run beside it on two cores). Model text is never compared to an expected
string (it changes with the thread count); counts are compared with the server's own.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest

from schemas.jobs import JobKind
from sluicegate.local.embedded import free_port
from tests.support.dispatch import envelope as dispatch_envelope
from tests.support.llamacpp import bundled_model
from workers.engines.base import GenerationRequest, SamplingParams
from workers.engines.errors import (
    DuplicateRequest,
    EngineNotRunning,
    RequestTooLarge,
    UnsupportedParameter,
)
from workers.engines.llamacpp.engine import LlamaCppEngine, deferred_requests
from workers.gate import PullGate

pytestmark = pytest.mark.timeout(180)

SLOTS = 2
SLOT_CONTEXT = 1024
DOC = (
    "The harbour authority reopened the north lock on Monday after three weeks of repairs. "
    "Engineers replaced two gate hinges and cleared silt from the sill. Barges queued since "
    "dawn, and the lock keeper expects normal traffic by Friday."
)


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    url = f"http://127.0.0.1:{free_port()}"
    env = {
        **os.environ,
        "SLUICEGATE_LLAMACPP_URL": url,
        "SLUICEGATE_LLAMACPP_MODEL_PATH": str(bundled_model()),
        "SLUICEGATE_LLAMACPP_SLOTS": str(SLOTS),
        "SLUICEGATE_LLAMACPP_SLOT_CONTEXT": str(SLOT_CONTEXT),
        "SLUICEGATE_LLAMACPP_THREADS": "1",
    }
    process = subprocess.Popen([sys.executable, "-m", "sluicegate", "llama-server"], env=env)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, f"llama-server exited with {process.returncode}"
            assert time.monotonic() < deadline, "llama-server did not answer /health"
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        assert process.wait(timeout=30) == 0  # a clean exit on SIGTERM


@pytest.fixture
async def engine(server_url: str) -> AsyncIterator[LlamaCppEngine]:
    engine = LlamaCppEngine(base_url=server_url, temperature=0.2, poll_interval_s=0.02)
    await engine.start()
    yield engine
    await engine.close()


def summary(rid: str, max_tokens: int = 24, text: str = DOC) -> GenerationRequest:
    return GenerationRequest(
        request_id=rid, kind=JobKind.SUMMARIZE, input=text, max_tokens=max_tokens
    )


async def collect(engine: LlamaCppEngine, request: GenerationRequest) -> list[str]:
    return [piece async for piece in engine.generate(request)]


async def server_metric(url: str, name: str) -> float:
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{url}/metrics")).text
    for line in text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


async def busy_slots(url: str) -> int:
    async with httpx.AsyncClient() as client:
        slots = (await client.get(f"{url}/slots")).json()
    return sum(1 for slot in slots if slot["is_processing"])


async def eventually(check: Callable[[], bool], within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, f"not within {within_s} s"
        await asyncio.sleep(0.01)


async def test_a_summary_is_the_models_text_counted_as_the_server_counts(
    engine: LlamaCppEngine, server_url: str
) -> None:
    before = await server_metric(server_url, "llamacpp:tokens_predicted_total")
    pieces = await collect(engine, summary("s1"))
    after = await server_metric(server_url, "llamacpp:tokens_predicted_total")
    text = "".join(pieces).strip()
    assert text, "no output"
    assert text not in DOC  # a summary, not the input echoed back
    assert 1 <= len(pieces) <= 24
    assert len(pieces) == after - before  # one item per token the server decoded


async def test_stop_and_seed_reach_the_server(engine: LlamaCppEngine) -> None:
    def asked(rid: str, **sampling: Any) -> GenerationRequest:
        request = summary(rid, max_tokens=24)
        return replace(request, sampling=SamplingParams(**sampling))

    greedy = "".join(await collect(engine, asked("greedy", temperature=0.0, seed=1)))
    words = greedy.split()
    assert len(words) >= 4, greedy
    stop = " " + words[3]
    cut = "".join(await collect(engine, asked("cut", temperature=0.0, seed=1, stop=(stop,))))
    assert cut == greedy[: greedy.index(stop)]  # the same greedy text, up to the stop string
    hot = [
        "".join(await collect(engine, asked(f"hot{i}", temperature=1.5, top_p=0.95, seed=seed)))
        for i, seed in enumerate((5, 5))
    ]
    assert hot[0] == hot[1]  # a hot sample, repeated by its seed
    with pytest.raises(UnsupportedParameter):  # llama.cpp would wrap it, or draw at random
        await collect(engine, asked("seedless", seed=-1))


async def test_the_stream_ends_with_the_servers_finish_reason(engine: LlamaCppEngine) -> None:
    cut = engine.generate(summary("four", max_tokens=4))
    assert len([piece async for piece in cut]) == 4
    assert cut.finish_reason == "length"
    # A stop string ends the output before max_tokens: llama.cpp says "stop", as vLLM does.
    at_space = replace(
        summary("space", max_tokens=60), sampling=SamplingParams(temperature=0.0, stop=(" ",))
    )
    stopped = engine.generate(at_space)
    assert " " not in "".join([piece async for piece in stopped]).strip()
    assert stopped.finish_reason == "stop"


async def test_capacity_is_slots_and_shows_a_busy_one(
    engine: LlamaCppEngine, server_url: str
) -> None:
    cap = engine.capacity()
    assert (cap.total_blocks, cap.free_blocks, cap.max_running) == (SLOTS, SLOTS, SLOTS)
    assert cap.slot_context == cap.block_size == SLOT_CONTEXT
    stream = engine.generate(summary("busy", max_tokens=200))
    await anext(stream)
    await eventually(lambda: engine.capacity().running == 1)
    assert engine.capacity().free_blocks == SLOTS - 1
    await stream.aclose()
    await eventually(lambda: engine.capacity().free_blocks == SLOTS)


async def test_abort_mid_decode_frees_the_slot(engine: LlamaCppEngine, server_url: str) -> None:
    request = summary("long", max_tokens=400, text="Write a very long story about a lighthouse.")
    pieces: list[str] = []
    started = asyncio.Event()

    async def consume() -> None:
        async for piece in engine.generate(request):
            pieces.append(piece)
            if len(pieces) >= 5:
                started.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), 30)
    await engine.abort(request.request_id)
    at_abort = len(pieces)
    await asyncio.wait_for(task, 5)
    assert len(pieces) == at_abort < 400
    aborted = time.monotonic()
    while await busy_slots(server_url):
        assert time.monotonic() - aborted < 2, "the slot is still busy 2 s after the abort"
        await asyncio.sleep(0.005)


async def test_too_large_for_a_slot_is_refused_before_the_server_cuts_it(
    engine: LlamaCppEngine,
) -> None:
    # The prompt alone fits; with max_tokens it cannot: llama.cpp would stop it at the end of
    # the slot and call that a complete output.
    with pytest.raises(RequestTooLarge):
        await collect(engine, summary("big", max_tokens=SLOT_CONTEXT - 20))
    assert engine.capacity().free_blocks == SLOTS


async def test_a_running_id_cannot_start_twice(engine: LlamaCppEngine) -> None:
    first = engine.generate(summary("twice", max_tokens=60))
    await anext(first)
    with pytest.raises(DuplicateRequest):
        await collect(engine, summary("twice"))
    await first.aclose()


async def test_generate_needs_a_started_engine(server_url: str) -> None:
    engine = LlamaCppEngine(base_url=server_url)
    with pytest.raises(EngineNotRunning):
        await collect(engine, summary("early"))
    await engine.start()
    await engine.close()
    with pytest.raises(EngineNotRunning):
        await collect(engine, summary("late"))


async def test_under_the_gate_no_request_waits_in_the_server(
    engine: LlamaCppEngine, server_url: str
) -> None:
    gate = PullGate(engine)
    envelopes = [dispatch_envelope(f"g{i}", prompt_tokens=80, max_tokens=24) for i in range(6)]
    waiting = list(envelopes)
    running: set[asyncio.Task[list[str]]] = set()
    deferred: list[int] = []
    async with httpx.AsyncClient(base_url=server_url) as client:
        while waiting or running:
            while waiting and gate.admits(waiting[0]):
                envelope = waiting.pop(0)
                gate.started(envelope)
                task = asyncio.create_task(collect(engine, summary(envelope.job_id)))
                task.add_done_callback(lambda _, job=envelope.job_id: gate.finished(job))
                running.add(task)
            if running:
                done, _ = await asyncio.wait(running, timeout=0.02)
                for task in done:
                    assert task.result(), "no output"
                    running.discard(task)
            else:  # the engine's last reading of /slots still shows a slot busy
                await asyncio.sleep(0.02)
            deferred.append(deferred_requests((await client.get("/metrics")).text))
    assert max(deferred) == 0
    assert engine.capacity().running <= SLOTS
