"""Prometheus metrics of a worker."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from schemas import constants

JOBS_STARTED = Counter(constants.M_JOBS_STARTED, "Jobs handed to the engine")
JOBS_FINISHED = Counter(constants.M_JOBS_FINISHED, "Terminal states written", ["state"])
JOBS_RUNNING = Gauge(constants.M_JOBS_RUNNING, "Jobs running on this worker")
TOKENS_DECODED = Counter(constants.M_TOKENS_DECODED, "Output tokens decoded")
JOB_SECONDS = Histogram(
    constants.M_JOB_SECONDS,
    "Submit-to-terminal latency of jobs finished here",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900),
)
DEAD_LETTERED = Counter(constants.M_DEAD_LETTERED, "Records that could not be decoded", ["reason"])
