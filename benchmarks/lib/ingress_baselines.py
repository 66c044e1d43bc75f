"""The ingress benchmark's baselines: Celery's ``apply_async`` from threads, no worker, on
the local Redis (no AOF: not durable) and on the local RabbitMQ with persistent messages
and publisher confirms (durable: a confirmed message is on disk). Either is left out,
with a note, where its broker does not answer."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from benchmarks.lib.ingress_runs import JOB, Run, bench_modules

REDIS_URL = "redis://127.0.0.1:6379/0"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"


def threaded(call: Callable[[], None], threads: int, seconds: float, jobs: int) -> Run:
    """``threads`` callers in a closed loop for ``seconds``."""
    run = Run(jobs_per_request=jobs)
    lock = threading.Lock()
    until = time.perf_counter() + seconds

    def caller() -> None:
        mine: list[float] = []
        while (started := time.perf_counter()) < until:
            call()
            mine.append(time.perf_counter() - started)
        with lock:
            run.latencies += mine

    began, cpu = time.perf_counter(), time.process_time()
    workers = [threading.Thread(target=caller) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    run.elapsed_s = time.perf_counter() - began
    run.cpu_s = time.process_time() - cpu
    run.statuses[200] = len(run.latencies)
    return run


def celery_on(
    url: str, *, threads: int, seconds: float, batch_size: int, **conf: Any
) -> dict[str, Any]:
    """``apply_async`` of one job from 1 and ``threads`` threads, and a group of
    ``batch_size``, on the broker at ``url`` (the app's ``conf`` added)."""
    celery = bench_modules()[0]
    queue = f"sluicegate-bench-{uuid.uuid4().hex[:8]}"
    app = celery.Celery("sluicegate_bench", broker=url, set_as_current=False)
    app.conf.update(task_default_queue=queue, task_ignore_result=True, broker_pool_limit=64)
    app.conf.update(conf)

    @app.task(name="bench.summarize")  # type: ignore[untyped-decorator]
    def summarize(job: dict[str, Any]) -> None:  # never runs: only enqueued
        del job

    summarize.apply_async(args=(JOB,))  # connect and declare the queue once

    def one() -> None:
        summarize.apply_async(args=(JOB,))

    def group() -> None:
        celery.group(summarize.s(JOB) for _ in range(batch_size)).apply_async()

    try:
        return {
            "single_1_thread": threaded(one, 1, seconds, 1).figures(),
            f"single_{threads}_threads": threaded(one, threads, seconds, 1).figures(),
            f"group_of_{batch_size}": threaded(group, 1, seconds, batch_size).figures(),
        }
    finally:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)


def celery_redis(threads: int, seconds: float, batch_size: int) -> dict[str, Any]:
    redis = bench_modules()[1]
    url = os.environ.get("CELERY_BENCH_REDIS_URL", REDIS_URL)
    client = redis.Redis.from_url(url)
    try:
        durable = client.config_get("appendonly").get("appendonly") == "yes"
    finally:
        client.close()
    runs = celery_on(url, threads=threads, seconds=seconds, batch_size=batch_size)
    return {
        "setup": f"Celery {bench_modules()[0].__version__}, Redis broker at "
        f"{url.rsplit('@', 1)[-1]} (appendonly {'yes' if durable else 'no'}), apply_async "
        "from threads, no worker; cpu_ms_per_job: of the calling process",
        **runs,
    }


def celery_rabbitmq(threads: int, seconds: float, batch_size: int) -> dict[str, Any]:
    """Durable: persistent messages on a durable queue, each publish confirmed."""
    url = os.environ.get("CELERY_BENCH_AMQP_URL", AMQP_URL)
    try:
        runs = celery_on(
            url,
            threads=threads,
            seconds=seconds,
            batch_size=batch_size,
            task_default_delivery_mode="persistent",
            broker_transport_options={"confirm_publish": True},
            broker_connection_retry_on_startup=False,
            broker_connection_max_retries=0,
        )
    except OSError as exc:
        return {"setup": f"left out: no RabbitMQ at {url.rsplit('@', 1)[-1]} ({exc})"}
    return {
        "setup": f"Celery, RabbitMQ broker at {url.rsplit('@', 1)[-1]}: persistent messages, "
        "a durable queue, publisher confirms; apply_async from threads, no worker",
        **runs,
    }
