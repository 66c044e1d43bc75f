"""What the in-process vLLM engine knows of its KV cache and queue, from vLLM's stat loggers.

vLLM (V1) computes a ``SchedulerStats`` in the engine-core process after every step and an
``IterationStats`` in the frontend for every batch of outputs; ``AsyncLLM``'s output handler
hands both to each stat logger's ``record()``. ``StatsSink`` is such a logger: it keeps the
latest scheduler figures and adds up preemptions. It only duck-types vLLM's
``StatLoggerBase`` (``record``, ``log``, ``log_engine_initialized``), so this module imports
nothing from vLLM and its accounting is testable on plain objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from workers.engines.base import Capacity


class SchedulerStatsLike(Protocol):
    """The fields of ``vllm.v1.metrics.stats.SchedulerStats`` read here."""

    num_running_reqs: int
    num_waiting_reqs: int  # waiting, not deferred
    num_skipped_waiting_reqs: int  # waiting, deferred
    kv_cache_usage: float  # 0..1, over every allocatable block


class IterationStatsLike(Protocol):
    """The field of ``vllm.v1.metrics.stats.IterationStats`` read here."""

    num_preempted_reqs: int


@dataclass
class EngineFigures:
    """The latest scheduler figures of one engine core."""

    kv_cache_usage: float = 0.0
    running: int = 0
    waiting: int = 0


class StatsSink:
    """A stat logger for ``AsyncLLM(stat_loggers=[sink.factory])``.

    vLLM calls the factory once per engine index and ``record()`` once per engine step that
    produced outputs or stats, with that step's ``engine_idx`` (v1/engine/async_llm.py ~931),
    on the event loop's thread (from ``AsyncLLM``'s output handler task), so no locking is
    needed. The factory returns this one sink for every index, and the sink keeps each
    engine's figures apart: with data parallelism each engine core has a cache of its own.
    """

    def __init__(self) -> None:
        self.engines: dict[int, EngineFigures] = {}
        self.preemptions = 0  # since start, every engine
        self.steps = 0  # scheduler reports seen

    def factory(self, vllm_config: Any, engine_index: int = 0) -> StatsSink:
        """vLLM's per-engine stat logger factory: ``(vllm_config, engine_index) -> logger``."""
        self.engines.setdefault(engine_index, EngineFigures())
        return self

    def record(
        self,
        scheduler_stats: SchedulerStatsLike | None,
        iteration_stats: IterationStatsLike | None,
        mm_cache_stats: object | None = None,
        engine_idx: int = 0,
    ) -> None:
        if scheduler_stats is not None:
            self.engines[engine_idx] = EngineFigures(
                kv_cache_usage=scheduler_stats.kv_cache_usage,
                running=scheduler_stats.num_running_reqs,
                waiting=scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs,
            )
            self.steps += 1
        if iteration_stats is not None:
            self.preemptions += iteration_stats.num_preempted_reqs

    @property
    def running(self) -> int:
        return sum(figures.running for figures in self.engines.values())

    @property
    def waiting(self) -> int:
        return sum(figures.waiting for figures in self.engines.values())

    def log_engine_initialized(self) -> None:
        pass

    def log(self) -> None:
        pass

    def record_sleep_state(self, is_awake: int, level: int) -> None:
        pass

    def capacity(
        self, *, num_gpu_blocks: int, block_size: int, max_running: int | None, engines: int = 1
    ) -> Capacity:
        """``num_gpu_blocks`` is vLLM's figure after start-up: with data parallelism the sum
        over its ``engines`` (v1/engine/core_client.py ~874-877), an equal share each."""
        per_engine = num_gpu_blocks // max(engines, 1)
        parts = [
            capacity_from(
                kv_cache_usage=self.engines.get(index, EngineFigures()).kv_cache_usage,
                running=0,
                waiting=0,
                preemptions=0,
                num_gpu_blocks=per_engine,
                block_size=block_size,
                max_running=max_running,
            )
            for index in range(max(engines, 1))
        ]
        return Capacity(
            total_blocks=sum(part.total_blocks for part in parts),
            free_blocks=sum(part.free_blocks for part in parts),
            block_size=block_size,
            running=self.running,
            waiting=self.waiting,
            preemptions=self.preemptions,
            max_running=max_running,
        )


def capacity_from(
    *,
    kv_cache_usage: float,
    running: int,
    waiting: int,
    preemptions: int,
    num_gpu_blocks: int,
    block_size: int,
    max_running: int | None,
) -> Capacity:
    """A ``Capacity`` from vLLM's figures.

    vLLM's block pool holds ``num_gpu_blocks`` blocks, one of which (the null block) is never
    handed out, and ``kv_cache_usage`` is the used fraction of the other ``num_gpu_blocks - 1``
    (``BlockPool.get_usage``). Those are the blocks reported here, so that ``Capacity.usage``
    equals vLLM's figure.
    """
    total = max(num_gpu_blocks - 1, 0)
    usage = min(max(kv_cache_usage, 0.0), 1.0)
    free = total - round(usage * total)
    return Capacity(
        total_blocks=total,
        free_blocks=free,
        block_size=block_size,
        running=running,
        waiting=waiting,
        preemptions=preemptions,
        max_running=max_running,
    )
