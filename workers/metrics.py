"""Prometheus metrics of a worker.

The gauges that mirror the engine and the KV ledger are read when scraped, from the worker
that ``watch`` was last called with (one worker per process).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge, Histogram

from plumbing.metrics import registry
from schemas import constants

if TYPE_CHECKING:
    from workers.engines.base import InferenceEngine

WORKER = registry("worker")
JOBS_STARTED = Counter(constants.M_JOBS_STARTED, "Jobs handed to the engine", registry=WORKER)
GRAPHS = Counter(
    constants.M_GRAPHS, "Documents too long for the engine, cut into graphs", registry=WORKER
)
CHUNKS = Counter(constants.M_GRAPH_CHUNKS, "Chunk jobs those graphs were cut into", registry=WORKER)
JOBS_FINISHED = Counter(
    constants.M_JOBS_FINISHED, "Terminal states written", ["state"], registry=WORKER
)
JOBS_RUNNING = Gauge(constants.M_JOBS_RUNNING, "Jobs running on this worker", registry=WORKER)
TOKENS_DECODED = Counter(constants.M_TOKENS_DECODED, "Output tokens decoded", registry=WORKER)
JOB_SECONDS = Histogram(
    constants.M_JOB_SECONDS,
    "Submit-to-terminal latency of jobs finished here",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900),
    registry=WORKER,
)
DEAD_LETTERED = Counter(
    constants.M_DEAD_LETTERED,
    "Records set aside as dead letters, by source and reason",
    ["source", "reason"],
    registry=WORKER,
)
PAUSED_SECONDS = Counter(
    constants.M_PAUSED_SECONDS,
    "Seconds the worker's partitions were paused for lack of room",
    registry=WORKER,
)
PARTITIONS = Gauge(constants.M_PARTITIONS, "Partitions this worker holds", registry=WORKER)
REVOKED = Counter(
    constants.M_REVOKED, "Partitions revoked from this worker by rebalances", registry=WORKER
)
GENERATION = Gauge(
    constants.M_GENERATION,
    "The classic group's generation this worker joined (the consumer protocol's epoch is "
    "the broker's: not shown)",
    registry=WORKER,
)
UNDER_RESERVED = Counter(
    constants.M_UNDER_RESERVED,
    "Jobs that decoded more tokens than were reserved for them",
    registry=WORKER,
)
DROPPED = Counter(
    constants.M_DROPPED,
    "Jobs dropped before decode, without an engine call",
    ["reason"],
    registry=WORKER,
)
ABORTED = Counter(
    constants.M_ABORTED, "Jobs aborted in the engine mid-decode", ["reason"], registry=WORKER
)
WASTED_TOKENS = Counter(
    constants.M_WASTED_TOKENS,
    "Output tokens decoded for jobs that did not succeed",
    ["reason"],
    registry=WORKER,
)
ABORT_SECONDS = Histogram(
    constants.M_ABORT_SECONDS,
    "From a running job's cancel or abandonment being written to its abort in the engine",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
    registry=WORKER,
)
KV_USAGE = Gauge(constants.M_KV_USAGE, "Fraction of the engine's KV blocks in use", registry=WORKER)
KV_FREE = Gauge(constants.M_KV_FREE, "Free KV blocks the engine reports", registry=WORKER)
KV_RESERVED = Gauge(
    constants.M_KV_RESERVED, "KV blocks reserved for the growth of running jobs", registry=WORKER
)
PREEMPTIONS = Gauge(
    constants.M_PREEMPTIONS, "Preemptions the engine counted since it started", registry=WORKER
)


def watch(engine: InferenceEngine, reserved_blocks: Callable[[], float]) -> None:
    """Point the engine and ledger gauges at this worker's engine and at what its gate
    reserves (``reserved_blocks``: the pull gate's count, read when scraped)."""
    KV_USAGE.set_function(lambda: engine.capacity().usage)
    KV_FREE.set_function(lambda: engine.capacity().free_blocks)
    PREEMPTIONS.set_function(lambda: engine.capacity().preemptions)
    KV_RESERVED.set_function(reserved_blocks)
