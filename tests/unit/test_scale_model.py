"""The scaling derivation (benchmarks/scenarios/scale.py) is docs/scaling.md's arithmetic."""

from __future__ import annotations

import math
from typing import Any

import pytest

from benchmarks.scenarios.scale import derive, gpu_capacity


def costs() -> dict[str, Any]:
    return {
        "per_job_net_of_idle": {
            "cpu_ms": {
                "api": 1.5,
                "relay": 7.0,
                "worker": 16.0,
                "webhooks": 1.0,
                "postgres": 4.0,
                "broker": 0.8,
            },
            "pg": {
                "statements": 30.0,
                "transactions": 7.0,
                "rows_written": 9.0,
                "wal_bytes": 8192.0,
                "rows_by_table_op": {"outbox": {"ins": 2.0}},
            },
            "kafka": {
                "records": {"dispatch": 1.0, "events": 1.0, "dead_letter": 0.0},
                "bytes": {"dispatch": 250.0, "events": 230.0, "dead_letter": 0.0},
            },
            "webhook_delivery": {
                "cpu_ms_webhooks": 8.0,
                "pg_statements": 30.0,
                "pg_transactions": 3.0,
                "rows_written": 4.0,
                "wal_bytes": 4096.0,
                "detail": {"cpu_ms": {"postgres": 2.0}},
            },
        },
        "row_widths": {
            "jobs": {"bytes_per_row": 3000.0},
            "outbox": {"bytes_per_row": 500.0},
            "webhook_deliveries": {"bytes_per_row": 2000.0},
            "webhook_attempts": {"bytes_per_row": 500.0},
        },
    }


RELAY = {"relay": {"rows_per_s": 10_000.0, "cpu_ms_per_row": 0.04}}


def run(share: float) -> dict[str, Any]:
    return derive(
        costs(),
        RELAY,
        gpus=1000,
        jobs_per_s=10_000,
        retention_s=86_400,
        outbox_retention_s=3600,
        gpu_jobs_per_s=20.0,
        callback_share=share,
        core_target=0.5,
    )


def test_processes_are_the_cpu_or_the_relay_rate_at_the_core_target() -> None:
    d = run(0.0)
    assert d["processes"] == {
        "api": 30,  # 10,000 x 1.5 ms = 15 cores at 0.5 each
        "relay": 4,  # 20,000 rows/s / (10,000 x 0.5)
        "webhooks": 20,  # 10,000 x 1.0 ms at 0.5
    }
    assert d["gpu"]["utilization"] == 0.5
    assert d["kafka"]["records_per_s"] == {"dispatch": 10_000, "events": 10_000}
    assert d["kafka"]["dispatch_partitions_at_least"] == 1000


def test_a_callback_per_job_adds_a_delivery_to_each_job() -> None:
    none, every = run(0.0), run(1.0)
    assert every["processes"]["webhooks"] == math.ceil(10_000 * 9.0 / 1000 / 0.5)
    assert none["postgres"]["statements_per_s"] == 300_000
    assert every["postgres"]["statements_per_s"] == 600_000
    assert every["postgres"]["commits_per_s"] == 100_000
    assert every["postgres"]["cores"] == 60.0
    assert every["postgres"]["wal_mib_per_s"] == pytest.approx(10_000 * 12_288 / 2**20, abs=0.05)


def test_size_at_the_window_is_the_kept_rows_plus_the_outbox_hour() -> None:
    d = run(1.0)
    kept = 3000 + 2000 + 500
    outbox = 10_000 * 2 * 3600 * 500
    expected = (10_000 * 86_400 * kept + outbox) / 2**40
    assert d["postgres"]["bytes_kept_per_job"] == kept
    assert d["postgres"]["size_tib_at_window"] == pytest.approx(expected, abs=0.005)


def test_one_gpu_is_the_one_worker_run_at_its_time_scale() -> None:
    report = {
        "config": {"time_scale": 4.0},
        "runs": [{"workers": 2, "jobs_per_s": 9.0}, {"workers": 1, "jobs_per_s": 5.0}],
    }
    assert gpu_capacity(report) == 20.0
