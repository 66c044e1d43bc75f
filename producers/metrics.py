"""Prometheus metrics of the ingress side."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from plumbing.metrics import registry
from schemas import constants

API = registry("api")
RELAY = registry("relay")

SUBMITTED = Counter(constants.M_SUBMITTED, "Jobs accepted", ["kind", "priority"], registry=API)
REFUSED = Counter(constants.M_REFUSED, "Requests refused, by error code", ["code"], registry=API)
SUBMIT_GROUP = Histogram(
    constants.M_SUBMIT_GROUP,
    "Single submits written by one statement (group commit)",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
    registry=API,
)
RELAY_PUBLISHED = Counter(
    constants.M_RELAY_PUBLISHED, "Outbox rows published", ["topic"], registry=RELAY
)
RECONCILED = Counter(
    constants.M_RECONCILED,
    "Jobs dispatched again because their dispatch record was gone",
    registry=RELAY,
)
METERED = Counter(
    constants.M_METERED,
    "Held batch jobs the meter released into the dispatch topic, or expired unreleased",
    ["outcome", "model"],
    registry=API,
)
PRUNED = Counter(
    constants.M_PRUNED,
    "Rows deleted once past their retention window, by table",
    ["table"],
    registry=RELAY,
)

ADMISSIONS = Counter(
    constants.M_ADMISSIONS,
    "Admission decisions by outcome, reason and model (its pool)",
    ["outcome", "reason", "model"],
    registry=API,
)
BLOCKED = Gauge(
    constants.M_BLOCKED, "Submit requests waiting for lag to fall", ["model"], registry=API
)
LAG = Gauge(
    constants.M_LAG,
    "Worker group lag on the dispatch topic (records; lag_measure: open or consumer), by "
    "model (its pool's topic and group)",
    ["model"],
    registry=API,
)
CONSUMER_LAG = Gauge(
    constants.M_CONSUMER_LAG,
    "Worker group consumer lag on the dispatch topic: end - committed offset (records)",
    ["model"],
    registry=API,
)
LAG_KNOWN = Gauge(
    constants.M_LAG_KNOWN, "1 while the lag reading is fresh", ["model"], registry=API
)
LAG_READER = Gauge(
    constants.M_LAG_READER,
    "1 while this API replica reads the lag from the broker for the others (lag_reader=shared)",
    ["model"],
    registry=API,
)
DRAIN_RATE = Gauge(
    constants.M_DRAIN_RATE, "Drain rate μ (records/s, smoothed)", ["model"], registry=API
)
ARRIVAL_RATE = Gauge(
    constants.M_ARRIVAL_RATE, "Arrival rate λ (records/s, smoothed)", ["model"], registry=API
)
IN_FLIGHT = Gauge(
    constants.M_IN_FLIGHT, "Jobs not yet terminal (measured L)", ["model"], registry=API
)
JOBS_BY_STATE = Gauge(
    constants.M_JOBS_BY_STATE,
    "Jobs not ended, by state (queued, dispatched, running) and model (every tenant's)",
    ["state", "model"],
    registry=API,
)
LATENCY_W = Gauge(
    constants.M_LATENCY_W,
    "Mean submit-to-terminal time W of recent jobs (s)",
    ["model"],
    registry=API,
)
LITTLE_L = Gauge(constants.M_LITTLE_L, "λ·W, Little's law estimate of L", ["model"], registry=API)
