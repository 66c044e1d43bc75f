"""Two more loads for the ingress benchmark: the project's own Python client
(``client.api.AsyncClient.submit``, concurrent calls coalesced into bulk requests, a lone
one over the submit channel) in tasks of this process or a plain loop of the blocking
client, and wrk, a C load generator, as a subprocess (Debian: ``apt install
wrk``), each in a closed loop against ``sluicegate api``."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.ingress_runs import JOB, Run, Served
from client.api import AsyncClient
from client.sync import Client
from schemas.jobs import JobKind

# wrk posts JOB from a file (no quoting in Lua) and counts the answers that are not 2xx.
_WRK_SCRIPT = """
local f = io.open("{body}", "rb")
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
wrk.headers["X-Sluicegate-Tenant"] = "bench"
done = function(summary, latency, requests)
  io.write(string.format("requests %d\\nnon2xx %d\\n", summary.requests, summary.errors.status))
  io.write(string.format("p50us %d\\np99us %d\\n", latency:percentile(50), latency:percentile(99)))
end
"""


async def drive_client(api: Served, *, tasks: int, seconds: float) -> Run:
    """``tasks`` asyncio tasks calling ``submit()`` on one client in a closed loop."""
    run = Run(jobs_per_request=1)
    async with AsyncClient(api.url, tenant="bench") as client:
        await _one(client)  # connected
        cpu, client_cpu = api.api_cpu_s(), time.process_time()
        loop = asyncio.get_running_loop()
        until = loop.time() + seconds

        async def caller() -> None:
            while (started := loop.time()) < until:
                await _one(client)
                run.latencies.append(loop.time() - started)
                run.statuses[202] += 1

        began = loop.time()
        await asyncio.gather(*(caller() for _ in range(tasks)))
        run.elapsed_s = loop.time() - began
    run.cpu_s = api.api_cpu_s() - cpu
    run.client_cpu_s = time.process_time() - client_cpu
    return run


def drive_blocking_client(api: Served, *, seconds: float) -> Run:
    """A plain loop of ``submit()`` on the blocking client (``client.sync.Client``), in
    this thread: one caller, each submit sent when the last one was answered."""
    run = Run(jobs_per_request=1)
    with Client(api.url, tenant="bench") as client:
        client.submit(JOB["kind"], JOB["input"], max_tokens=JOB["max_tokens"], ttl_s=JOB["ttl_s"])
        cpu, client_cpu = api.api_cpu_s(), time.process_time()
        began = time.perf_counter()
        until = began + seconds
        while (started := time.perf_counter()) < until:
            client.submit(
                JOB["kind"], JOB["input"], max_tokens=JOB["max_tokens"], ttl_s=JOB["ttl_s"]
            )
            run.latencies.append(time.perf_counter() - started)
            run.statuses[202] += 1
        run.elapsed_s = time.perf_counter() - began
    run.cpu_s = api.api_cpu_s() - cpu
    run.client_cpu_s = time.process_time() - client_cpu
    return run


async def _one(client: AsyncClient) -> None:
    await client.submit(
        JobKind(JOB["kind"]), JOB["input"], max_tokens=JOB["max_tokens"], ttl_s=JOB["ttl_s"]
    )


def wrk_found() -> str | None:
    return shutil.which("wrk")


def drive_wrk(api: Served, *, connections: int, seconds: float) -> dict[str, Any]:
    """wrk with ``connections`` connections (at most 2 threads) for ``seconds``: accepted
    jobs/s, p50/p99 of a request, and the API's CPU a job."""
    with tempfile.TemporaryDirectory(prefix="sluicegate-wrk-") as tmp:
        body, script = Path(tmp) / "job.json", Path(tmp) / "post.lua"
        body.write_text(json.dumps(JOB))
        script.write_text(_WRK_SCRIPT.format(body=body))
        threads = min(connections, 2)
        cpu = api.api_cpu_s()
        command = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{round(seconds)}s"]
        began = time.perf_counter()
        done = subprocess.run(
            [*command, "-s", str(script), f"{api.url}/v1/jobs"],
            capture_output=True,
            text=True,
            check=True,
        )
        elapsed = time.perf_counter() - began
        cpu_s = api.api_cpu_s() - cpu
    found = {k: int(v) for k, v in re.findall(r"^(\w+) (\d+)$", done.stdout, re.MULTILINE)}
    duration = float(re.search(r"requests in ([\d.]+)s", done.stdout).group(1))  # type: ignore[union-attr]
    accepted = found["requests"] - found["non2xx"]
    return {
        "jobs_accepted": accepted,
        "jobs_per_s": round(accepted / duration, 1),
        "p50_ms": round(found["p50us"] / 1000, 2),
        "p99_ms": round(found["p99us"] / 1000, 2),
        "statuses": {"2xx": accepted, "other": found["non2xx"]},
        "seconds": round(duration, 2),
        "cpu_ms_per_job": round(cpu_s * 1000 / max(accepted, 1), 3),
        "wall_s": round(elapsed, 2),
    }
