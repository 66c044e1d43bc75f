"""Entry point of a worker process."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer

from plumbing.db import make_engine
from plumbing.kafka import close_client, make_consumer
from plumbing.metrics import serve as serve_metrics
from plumbing.retry import Stopped, outage, retrying
from plumbing.settings import Settings
from workers.consumer import Worker
from workers.control import Control
from workers.engines.base import InferenceEngine
from workers.engines.sim.engine import SimEngine
from workers.execution import Executor
from workers.gate import PreDecodeGate, PullGate
from workers.kv import ExpectedOutput
from workers.metrics import watch
from workers.repository import WorkerRepository
from workers.speed import SpeedMeter

log = logging.getLogger(__name__)


def build_sim_engine(settings: Settings) -> SimEngine:
    return SimEngine(
        block_size=settings.sim_block_size,
        num_blocks=settings.sim_num_blocks,
        max_num_seqs=settings.sim_max_num_seqs,
        max_num_batched_tokens=settings.sim_max_num_batched_tokens,
        time_scale=settings.sim_time_scale,
    )


def build_engine(settings: Settings) -> InferenceEngine:
    if settings.engine == "sim":
        return build_sim_engine(settings)
    if settings.engine == "vllm_http":
        from workers.engines.vllm.http import VllmHttpEngine

        return VllmHttpEngine(
            base_url=settings.vllm_url,
            model=settings.vllm_model,
            metrics_interval_s=settings.vllm_metrics_interval_s,
            request_timeout_s=settings.vllm_request_timeout_s,
        )
    if settings.engine == "llamacpp":
        from workers.engines.llamacpp.engine import LlamaCppEngine

        return LlamaCppEngine(
            base_url=settings.llamacpp_url,
            temperature=settings.llamacpp_temperature,
            repeat_penalty=settings.llamacpp_repeat_penalty,
            poll_interval_s=settings.llamacpp_poll_interval_s,
            request_timeout_s=settings.llamacpp_request_timeout_s,
        )
    if settings.engine == "vllm_local":
        from workers.engines.vllm.local import VllmLocalEngine

        return VllmLocalEngine(
            model=settings.vllm_model,
            gpu_memory_utilization=settings.vllm_gpu_memory_utilization,
            max_model_len=settings.vllm_max_model_len,
            block_size=settings.vllm_block_size,
            max_num_seqs=settings.vllm_max_num_seqs,
        )
    raise ValueError(f"unknown engine {settings.engine!r}")


def build_gate(settings: Settings, engine: InferenceEngine) -> PullGate:
    return PullGate(
        engine,
        policy=settings.pull_policy,
        max_running=settings.worker_max_running,
        watermark=settings.kv_watermark,
        max_prefill_tokens=settings.worker_max_prefill_tokens,
        expected=ExpectedOutput(
            observed=settings.expected_output == "observed",
            quantile=settings.observed_quantile,
            min_samples=settings.observed_min_samples,
            window=settings.observed_window,
        ),
    )


def build_predecode(settings: Settings, gate: PullGate) -> PreDecodeGate:
    return PreDecodeGate(
        speed=SpeedMeter(window=settings.speed_window, min_samples=settings.speed_min_samples),
        expected=gate.expected,
        drop_unreachable=settings.drop_unreachable,
    )


async def start_consumer(settings: Settings, stop: asyncio.Event) -> AIOKafkaConsumer | None:
    """The worker's consumer, started once the broker answers; None if ``stop`` comes
    first."""

    async def start() -> AIOKafkaConsumer:
        consumer = make_consumer(
            settings.require_kafka(),
            group_id=settings.consumer_group,
            fetch_bytes=settings.worker_fetch_bytes,
            group_instance_id=settings.worker_group_instance_id,
            session_timeout_ms=settings.worker_session_timeout_ms,
        )
        try:
            await consumer.start()
        except BaseException:
            await close_client(consumer)
            raise
        return consumer

    try:
        return await retrying("worker_start", start, stop=stop, transient=outage)
    except Stopped:
        return None


async def run_worker(
    settings: Settings,
    stop: asyncio.Event,
    *,
    engine: InferenceEngine | None = None,
    on_worker: Callable[[Worker], None] | None = None,
) -> None:
    """Run one worker until ``stop``. ``on_worker`` is shown the worker before it starts
    (tests and benchmarks watch it)."""
    serve_metrics("worker", settings.metrics_port)
    inference = engine if engine is not None else build_engine(settings)
    db = make_engine(settings.require_database_url(), pool_size=settings.worker_db_pool_size)
    await inference.start()
    try:
        consumer = await start_consumer(settings, stop)
        if consumer is None:
            return
        repo = WorkerRepository(
            db, events_topic=settings.events_topic, dead_letter_topic=settings.dead_letter_topic
        )
        control = Control(
            engine=inference,
            repo=repo,
            database_url=settings.database_url,
            sweep_s=settings.control_sweep_s,
        )
        control_stop = asyncio.Event()
        control_task = asyncio.create_task(control.run(control_stop), name="control")
        try:
            gate = build_gate(settings, inference)
            executor = Executor(
                engine=inference,
                repo=repo,
                control=control,
                predecode=build_predecode(settings, gate),
                # A revoked owner's jobs end or are aborted within its drain.
                takeover_grace_s=settings.drain_timeout_s,
            )
            watch(inference, gate.reserved_blocks)
            worker = Worker(
                consumer=consumer,
                gate=gate,
                executor=executor,
                topic=settings.dispatch_topic,
                bootstrap=settings.require_kafka(),
                drain_timeout_s=settings.drain_timeout_s,
                claim_batch=settings.claim_batch,
            )
            if on_worker is not None:
                on_worker(worker)
            await worker.run(stop)
        finally:
            control_stop.set()  # after the drain: jobs still decoding can be stopped
            await control_task
            await close_client(consumer)
    finally:
        await inference.close()
        await db.dispose()
