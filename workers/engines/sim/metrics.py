"""sim-server's ``/metrics``: vLLM 0.33's names, labels and buckets (paths inside ``vllm/``).

- Gauges per engine (labels ``model_name``, ``engine``; ``v1/metrics/loggers.py`` ~499-504):
  ``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``
  (a fraction, 0..1), and the counter ``vllm:num_preemptions``.
- ``vllm:cache_config_info``: a gauge of 1 whose labels are the cache config, one row per
  engine. With data parallelism the frontend sums ``num_gpu_blocks`` over its engines
  (``v1/engine/core_client.py`` ~874-877) and every engine's row carries that total
  (``v1/metrics/loggers.py`` ~1133-1136). Each engine's count includes its null block.
- Per request (``v1/metrics/loggers.py`` ~748-990): the counters ``vllm:prompt_tokens``,
  ``vllm:generation_tokens``, ``vllm:request_success`` (label ``finished_reason``), and the
  histograms ``vllm:e2e_request_latency_seconds``, ``vllm:time_to_first_token_seconds`` and
  ``vllm:inter_token_latency_seconds`` with vLLM's default buckets
  (``v1/metrics/buckets.py`` ~30-104), so vLLM's own Grafana dashboard fills. The
  simulator has no queue-time figure of its own, so ``vllm:request_queue_time_seconds`` is
  not exported.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from workers.engines.sim.engine import SimEngine

LABELS = ("model_name", "engine")
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
INTER_TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip


class EngineGauges(Collector):
    """The scheduler and cache figures of each engine, read at each scrape."""

    def __init__(self, engines: Sequence[SimEngine], model: str) -> None:
        self._engines = engines
        self._model = model
        self._created = time.time()

    def collect(self) -> Iterator[Metric]:
        caps = [engine.capacity() for engine in self._engines]
        rows = [[self._model, str(index)] for index in range(len(caps))]
        for name, doc, values in (
            ("vllm:num_requests_running", "Number of requests in model execution batches.",
             [float(c.running) for c in caps]),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
             [float(c.waiting) for c in caps]),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
             [c.usage for c in caps]),
        ):  # fmt: skip
            gauge = GaugeMetricFamily(name, doc, labels=list(LABELS))
            for row, value in zip(rows, values, strict=True):
                gauge.add_metric(row, value)
            yield gauge
        preemptions = CounterMetricFamily(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.",
            labels=list(LABELS),
        )  # fmt: skip
        for row, cap in zip(rows, caps, strict=True):
            preemptions.add_metric(row, cap.preemptions, created=self._created)
        yield preemptions
        yield self._cache_config(caps[0].block_size, sum(c.total_blocks + 1 for c in caps))

    def _cache_config(self, block_size: int, num_gpu_blocks: int) -> Metric:
        config = {
            "block_size": str(block_size),
            "cache_dtype": "auto",
            "enable_prefix_caching": "False",
            "gpu_memory_utilization": "0.9",
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(num_gpu_blocks),  # the DP-wide total, nulls included
            "num_gpu_blocks_override": "None",
        }
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=[*config, "engine"],
        )
        for index in range(len(self._engines)):
            info.add_metric([*config.values(), str(index)], 1.0)
        return info


class RequestMetrics:
    """What vLLM counts of each finished request, per engine."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = list(LABELS)
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", labels,
            registry=registry,
        )  # fmt: skip
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", labels,
            registry=registry,
        )  # fmt: skip
        self.success = Counter(
            "vllm:request_success", "Count of successfully processed requests.",
            [*labels, "finished_reason"], registry=registry,
        )  # fmt: skip
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
            labels, buckets=REQUEST_LATENCY_BUCKETS, registry=registry,
        )  # fmt: skip
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            labels, buckets=TIME_TO_FIRST_TOKEN_BUCKETS, registry=registry,
        )  # fmt: skip
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
            labels, buckets=INTER_TOKEN_LATENCY_BUCKETS, registry=registry,
        )  # fmt: skip

    def finished(
        self,
        labels: tuple[str, str],
        *,
        prompt_tokens: int,
        generated: int,
        token_times: list[float],
        arrived: float,
        reason: str,
    ) -> None:
        """One request ended after ``generated`` tokens (an EOS included); ``token_times``
        are the monotonic times of those with text."""
        self.prompt_tokens.labels(*labels).inc(prompt_tokens)
        self.generation_tokens.labels(*labels).inc(generated)
        self.success.labels(*labels, reason).inc()
        self.e2e.labels(*labels).observe(time.monotonic() - arrived)
        if token_times:
            self.ttft.labels(*labels).observe(token_times[0] - arrived)
        for before, after in itertools.pairwise(token_times):
            self.itl.labels(*labels).observe(after - before)
