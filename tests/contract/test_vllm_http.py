"""The HTTP engine reads vLLM's metrics and maps the server's failures to engine errors.
What it shares with every engine is in test_engine_contract.py."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse

from schemas.jobs import JobKind
from workers.engines.base import GenerationRequest
from workers.engines.errors import EngineAborted, EngineError, EngineUnavailable
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.server import create_app, running
from workers.engines.vllm.http import UNKNOWN, VllmHttpEngine, capacity_from_metrics

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
REQUEST = GenerationRequest(request_id="r1", kind=JobKind.COMPLETE, input="hi", max_tokens=50)

# The shape a vLLM 0.33 server with two engines (data parallel) of 1,001 blocks each exposes,
# another model's series included; only the families the engine reads, plus a few it must
# skip. The frontend sums num_gpu_blocks over its engines (v1/engine/core_client.py ~874-877)
# and writes that total, 2,002, on every engine's row (v1/metrics/loggers.py ~1133-1136).
VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="@MODEL@"} 3.0
vllm:num_requests_running{engine="1",model_name="@MODEL@"} 2.0
vllm:num_requests_running{engine="0",model_name="other"} 7.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="@MODEL@"} 1.0
vllm:num_requests_waiting{engine="1",model_name="@MODEL@"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="@MODEL@"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="@MODEL@"} 0.5
vllm:kv_cache_usage_perc{engine="0",model_name="other"} 0.99
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="@MODEL@"} 4.0
vllm:num_preemptions_total{engine="1",model_name="@MODEL@"} 1.0
# HELP vllm:num_preemptions_created Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_created gauge
vllm:num_preemptions_created{engine="0",model_name="@MODEL@"} 1.7e+09
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",\
engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="2002",\
num_gpu_blocks_override="None"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",\
engine="1",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="2002",\
num_gpu_blocks_override="None"} 1.0
""".replace("@MODEL@", MODEL)


def test_capacity_is_read_from_vllms_metrics() -> None:
    cap = capacity_from_metrics(VLLM_METRICS, MODEL)
    assert cap is not None
    # 1000 usable blocks per engine (vLLM's null block aside); 250 + 500 of them in use
    assert (cap.total_blocks, cap.free_blocks, cap.block_size) == (2000, 1250, 16)
    assert (cap.running, cap.waiting, cap.preemptions) == (5, 1, 5)


def test_capacity_is_unknown_without_the_cache_config_or_the_models_usage() -> None:
    no_config = VLLM_METRICS.split("# HELP vllm:cache_config_info")[0]
    assert capacity_from_metrics(no_config, MODEL) is None
    assert capacity_from_metrics(VLLM_METRICS, "not-served-here") is None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_an_unreachable_server_is_unavailable_and_leaves_capacity_unknown() -> None:
    engine = VllmHttpEngine(
        base_url=f"http://127.0.0.1:{free_port()}", model=MODEL, ready_timeout_s=0.05
    )
    await engine.start()
    try:
        assert engine.capacity() == UNKNOWN
        with pytest.raises(EngineUnavailable):
            await engine.wait_ready(0.05)
        with pytest.raises(EngineUnavailable):
            await anext(engine.generate(REQUEST))
    finally:
        await engine.close()


def failing_server(status: int) -> FastAPI:
    app = FastAPI()

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(VLLM_METRICS)

    @app.get("/v1/models")
    async def models() -> dict[str, object]:
        return {"object": "list", "data": [{"id": MODEL, "max_model_len": 4096}]}

    @app.post("/v1/completions")
    async def completions() -> JSONResponse:
        error = {"message": "no", "type": "Error", "param": None, "code": status}
        return JSONResponse({"error": error}, status_code=status)

    return app


@pytest.mark.parametrize(
    ("status", "error"), [(500, EngineUnavailable), (503, EngineUnavailable), (404, EngineError)]
)
async def test_a_refusal_maps_to_an_engine_error(status: int, error: type[EngineError]) -> None:
    async with running(failing_server(status)) as url:
        engine = VllmHttpEngine(base_url=url, model=MODEL)
        await engine.start()
        try:
            with pytest.raises(error) as caught:
                await anext(engine.generate(REQUEST))
            assert isinstance(caught.value, EngineUnavailable) == (status >= 500)
        finally:
            await engine.close()


@pytest.fixture
async def served() -> AsyncIterator[tuple[SimEngine, VllmHttpEngine]]:
    sim = SimEngine(num_blocks=64, time_scale=2.0)
    async with running(create_app(sim, model=MODEL)) as url:
        engine = VllmHttpEngine(base_url=url, model=MODEL, metrics_interval_s=0.005)
        await engine.start()
        try:
            yield sim, engine
        finally:
            await engine.close()


async def test_an_abort_in_the_server_fails_the_stream(
    served: tuple[SimEngine, VllmHttpEngine],
) -> None:
    _, engine = served
    stream = engine.generate(REQUEST)
    await anext(stream)
    async with httpx.AsyncClient(base_url=engine.base_url) as http:  # the server cuts it
        await http.post("/abort_requests", json={"request_ids": [REQUEST.request_id]})
    with pytest.raises(EngineAborted):  # not a complete output
        async for _ in stream:
            pass


async def test_capacity_becomes_unknown_when_scraping_fails() -> None:
    sim = SimEngine(num_blocks=64, time_scale=0.0)
    async with running(create_app(sim, model=MODEL)) as url:
        engine = VllmHttpEngine(base_url=url, model=MODEL, metrics_interval_s=0.005)
        await engine.start()
        assert engine.capacity().total_blocks == 64
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while engine.capacity().total_blocks != 0:
            assert loop.time() < deadline
            await asyncio.sleep(0.005)
        assert engine.capacity() == UNKNOWN
    finally:
        await engine.close()
