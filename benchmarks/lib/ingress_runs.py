"""What the ingress benchmark's parts share (its runner, ``benchmarks.lib.ingress``; its
clients, ``benchmarks.lib.ingress_clients``; its baselines): the job submitted, one run's
answers, the API served, and the bench extra's modules."""

from __future__ import annotations

import importlib
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.lib.reports import percentile
from client.samples import sample_documents

INSTALL = "pip install -e '.[bench]'  (celery, redis, aiohttp, matplotlib)"

# The same job for Sluicegate and for a baseline: a document of about 3 KB to summarize.
DOCUMENT = sample_documents()[0][1]
JOB: dict[str, Any] = {"kind": "summarize", "input": DOCUMENT, "max_tokens": 256, "ttl_s": 3600}


def bench_modules() -> tuple[Any, Any, Any]:
    """celery, redis and aiohttp, or an exit that says what to install."""
    try:
        return tuple(importlib.import_module(m) for m in ("celery", "redis", "aiohttp"))  # type: ignore[return-value]
    except ImportError as exc:
        sys.exit(f"the ingress benchmark needs the bench extra ({exc.name} is missing): {INSTALL}")


@dataclass
class Run:
    """One scenario's answers: latencies (s) of the accepted ones, statuses, elapsed time."""

    jobs_per_request: int
    latencies: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    elapsed_s: float = 0.0
    cpu_s: float = 0.0  # CPU time of the side that accepts (see the setup's line)
    client_cpu_s: float | None = None  # of the load generator (aiohttp), for Sluicegate
    groups: tuple[float, float] | None = None  # single submits: (jobs, statements) written

    def figures(self) -> dict[str, Any]:
        accepted = len(self.latencies)
        if not accepted:
            return {"jobs_per_s": 0.0, "statuses": {str(k): v for k, v in self.statuses.items()}}
        return {
            "requests_accepted": accepted,
            "jobs_accepted": accepted * self.jobs_per_request,
            "jobs_per_s": round(accepted * self.jobs_per_request / self.elapsed_s, 1),
            "requests_per_s": round(accepted / self.elapsed_s, 1),
            "p50_ms": round(percentile(self.latencies, 0.5) * 1000, 2),
            "p99_ms": round(percentile(self.latencies, 0.99) * 1000, 2),
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "seconds": round(self.elapsed_s, 2),
            "cpu_ms_per_job": round(self.cpu_s * 1000 / (accepted * self.jobs_per_request), 3),
            **(
                {}
                if not self.groups or not self.groups[1]
                else {"mean_group_size": round(self.groups[0] / self.groups[1], 1)}
            ),
            **(
                {}
                if self.client_cpu_s is None
                else {
                    "client_cpu_ms_per_job": round(
                        self.client_cpu_s * 1000 / (accepted * self.jobs_per_request), 3
                    )
                }
            ),
        }


@dataclass(frozen=True)
class Served:
    url: str
    api_pid: int

    def api_cpu_s(self) -> float:
        """User + system CPU seconds of the API process and its children (Linux /proc)."""
        tick, total = os.sysconf("SC_CLK_TCK"), 0.0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if self.api_pid in (int(stat.parent.name), int(fields[1])):
                total += (int(fields[11]) + int(fields[12])) / tick
        return total
