"""The shipped Grafana dashboard against a real Prometheus: every panel shows data.

The roles run as a user runs them (``python -m sluicegate api|relay|worker|webhooks``, two
pools, alpha and beta, with a worker each on the simulator), each serving its metrics on a
port of its own; Prometheus (Debian's ``prometheus``) scrapes them every second with the
scrape jobs of
deploy/prometheus/prometheus.yml (tests/e2e/prometheus.py). A load of about a minute
exercises every panel: steady submits, bursts over ``lag_hard`` (429) and bad requests
(4xx), jobs that expire before decode, cancels of running jobs, webhook deliveries that
are delivered, retried and dead-lettered, and poison on the dispatch topic.

Prometheus also loads the alert rules of deploy/prometheus/alerts.yml, and every rule must
have evaluated without error by the end.

Then every target of every panel of deploy/grafana/dashboards/sluicegate.json is queried
(as Grafana sends it with every variable at All: ``$model`` as ``.*``, and
``$__rate_interval`` as ``5m``, a window covering the load) and must give a number; every
``sluicegate_*`` family must come from its own role only (no process exports another
role's families); and every role exits 0 on SIGTERM. Each panel's values are printed
(``pytest -s``) and written to ``dashboard_values.json`` in the test's directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaProducer
from fastapi import Response

from plumbing.settings import Settings
from schemas import constants
from schemas import webhooks as webhook_schemas
from schemas.states import JobState
from sluicegate.local.embedded import free_port
from tests.e2e import prometheus as prom
from tests.faults.processes import Role, roles
from tests.integration.webhooks import Receiver, failing, receiving, webhook_settings
from tests.unit.deploy.files import DASHBOARD_FILE
from tests.unit.deploy.metrics import (
    all_values,
    exprs,
    grafana_query,
    panels,
    promql_grouping,
    promql_metrics,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        prom.binary() is None,
        reason="no `prometheus` binary: install Debian's (apt-get install prometheus), as "
        ".ci/run does",
    ),
]

LOAD_S = 60.0  # the load's length
RATE_WINDOW = "5m"  # $__rate_interval: a window covering the whole load
SETTLE_S = 30.0  # after the load, for the last events to be scraped
STARTUP_S = 60.0  # for a role to serve its metrics (a loaded machine is slow)
STOP_S = 60.0  # for a role to exit on SIGTERM
DOC = "The dashboard shows what the pipeline does, panel by panel. " * 6

# The roles, as Prometheus' scrape jobs name them.
API, RELAY, WORKER, WEBHOOKS = "api", "relay", "worker", "webhooks"


def _named(prefix: str, *modules: object) -> list[str]:
    """The metric names (``M_*``) of ``modules`` that start with ``prefix``."""
    return [
        value
        for module in modules
        for key, value in vars(module).items()
        if key.startswith("M_") and isinstance(value, str) and value.startswith(prefix)
    ]


# Which role exports each family (the counter's _total included, a histogram's without
# _bucket/_sum/_count); no other role may export it.
OWNERS: dict[str, frozenset[str]] = {
    **dict.fromkeys(
        [
            constants.M_SUBMITTED,
            constants.M_REFUSED,
            constants.M_SUBMIT_GROUP,
            *_named("sluicegate_admission_", constants),
            constants.M_LAG,
            constants.M_CONSUMER_LAG,
            constants.M_LAG_KNOWN,
            constants.M_LAG_READER,
            constants.M_DRAIN_RATE,
            constants.M_ARRIVAL_RATE,
            constants.M_IN_FLIGHT,
            constants.M_JOBS_BY_STATE,
            constants.M_LATENCY_W,
            constants.M_LITTLE_L,
            constants.M_METERED,
        ],
        frozenset({API}),
    ),
    **dict.fromkeys(
        [constants.M_RELAY_PUBLISHED, constants.M_RECONCILED, constants.M_PRUNED],
        frozenset({RELAY}),
    ),
    **dict.fromkeys(
        [*_named("sluicegate_worker_", constants), constants.M_JOB_SECONDS], frozenset({WORKER})
    ),
    **dict.fromkeys(_named("sluicegate_webhook_", webhook_schemas), frozenset({WEBHOOKS})),
    constants.M_DEAD_LETTERED: frozenset({WORKER, WEBHOOKS}),
}

# Label values a panel's series must show once the load ran: (metric, label) -> values.
# A label is checked only where the panel's expression keeps it (``by (...)``).
EXPECTED_LABELS: dict[tuple[str, str], set[str]] = {
    (constants.M_REFUSED, "code"): {"lag_hard", "invalid_json", "deadline_too_far"},
    (constants.M_DROPPED, "reason"): {"deadline_passed"},
    (constants.M_ABORTED, "reason"): {"cancelled"},
    (constants.M_WASTED_TOKENS, "reason"): {"cancelled"},
    (webhook_schemas.M_WEBHOOK_ATTEMPTS, "outcome"): {"delivered", "retry", "dead", "gone"},
    (webhook_schemas.M_WEBHOOK_FINISHED, "state"): {"delivered", "dead"},
    (constants.M_DEAD_LETTERED, "source"): {"dispatch", "webhook"},
    # Two pools, a worker each: every per-model panel shows both.
    (constants.M_LAG, "model"): {"alpha", "beta"},
    (constants.M_DRAIN_RATE, "model"): {"alpha", "beta"},
    (constants.M_ADMISSIONS, "model"): {"alpha", "beta"},
    (constants.M_KV_USAGE, "model"): {"alpha", "beta"},
    (constants.M_JOBS_STARTED, "model"): {"alpha", "beta"},
    (constants.M_TOKENS_DECODED, "model"): {"alpha", "beta"},
}
POOLS = ("alpha", "beta")  # the second pool's jobs: every other steady submit


def family(series: str) -> str:
    """The family a series name belongs to (a histogram's without its suffix)."""
    for suffix in ("_bucket", "_sum", "_count"):
        if series.endswith(suffix) and series.removesuffix(suffix) in OWNERS:
            return series.removesuffix(suffix)
    return series


@dataclass
class Panel:
    title: str
    expr: str  # as the dashboard has it
    query: str  # what was sent: $__rate_interval and $model replaced
    result: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    def values(self) -> list[tuple[dict[str, str], float]]:
        return [(r.get("metric", {}), float(r["value"][1])) for r in self.result]

    def numbers(self) -> list[float]:
        return [v for _, v in self.values() if not math.isnan(v)]

    def shown(self) -> str:
        if self.error:
            return self.error
        if not self.result:
            return "no series"
        return ", ".join(
            f"{{{', '.join(f'{k}={v}' for k, v in labels.items())}}}={value:.4g}"
            for labels, value in self.values()
        )


def dashboard_targets() -> list[Panel]:
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    # Every variable at All ($model: every model), $__rate_interval a window over the load.
    values = {**all_values(dashboard), "__rate_interval": RATE_WINDOW}
    found = []
    for panel in panels(dashboard):
        for expr in exprs(panel):
            query = grafana_query(expr, values)
            found.append(Panel(str(panel.get("title", "")), expr, query))
    return found


def dashboard_families(targets: list[Panel]) -> set[str]:
    return {
        family(name)
        for t in targets
        for name in promql_metrics(t.expr)
        if name.startswith("sluicegate_")
    }


# ---------------------------------------------------------------------------------------------
# The load


@dataclass
class Load:
    """Every scenario runs until ``end``, but the steady submits, which go on until
    ``finished`` is set (while the dashboard is read); what each got back is counted by
    scenario."""

    api: httpx.AsyncClient
    receiver: Receiver
    settings: Settings
    end: float
    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)
    refusals: Counter[str] = field(default_factory=Counter)
    rng: random.Random = field(default_factory=lambda: random.Random(20261207))
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    gone: int = 0  # receiver paths that answered 410 so far

    def running(self) -> bool:
        return time.monotonic() < self.end

    async def every(
        self,
        period_s: float,
        step: Callable[[], Awaitable[None]],
        running: Callable[[], bool] | None = None,
    ) -> None:
        while (running or self.running)():
            started = time.monotonic()
            await step()
            await asyncio.sleep(max(0.0, period_s - (time.monotonic() - started)))

    async def post(self, scenario: str, body: Any, *, raw: bytes | None = None) -> httpx.Response:
        if raw is not None:
            r = await self.api.post(
                "/v1/jobs", content=raw, headers={"Content-Type": "application/json"}
            )
        else:
            r = await self.api.post("/v1/jobs", json=body)
        self.statuses[scenario, r.status_code] += 1
        if r.status_code >= 400:
            error = r.json().get("error", {})
            self.refusals[str(error.get("code"))] += 1
        return r

    def job(self, max_tokens: int, **extra: Any) -> dict[str, Any]:
        return {"kind": "complete", "input": DOC, "max_tokens": max_tokens, **extra}

    async def steady(self) -> None:
        """Single submits, one every 0.4 s, of 1-2 s each (a few in flight, under
        lag_soft), to each pool in turn; every fifth with a callback that answers 200."""
        n = 0

        async def step() -> None:
            nonlocal n
            n += 1
            extra = {"callback_url": self.receiver.url("/ok")} if n % 5 == 0 else {}
            max_tokens = self.rng.randint(100, 200)
            model = POOLS[n % len(POOLS)]
            await self.post("steady", self.job(max_tokens, ttl_s=600, model=model, **extra))

        await self.every(0.4, step, lambda: not self.finished.is_set())

    async def bursts(self) -> None:
        """Every 10 s a burst of the first pool's model (requests that name none): 15
        high-priority submits at once, admitted without waiting
        until the lag reaches lag_hard (the rest refused, 429 lag_hard); then 10 normal
        ones, refused at once while the lag is at lag_hard, else made to wait between
        lag_soft and lag_hard (admitted, or refused when the wait runs out)."""
        await asyncio.sleep(3)

        async def step() -> None:
            high = self.job(200, ttl_s=600, priority="high")
            await asyncio.gather(*(self.post("burst-high", high) for _ in range(15)))
            normal = self.job(200, ttl_s=600)
            await asyncio.gather(*(self.post("burst", normal) for _ in range(10)))

        await self.every(10, step)

    async def expiring(self) -> None:
        """Jobs whose deadline passes before a worker gets to them (dropped before decode,
        deadline_passed), and jobs far too long for their deadline (dropped as unreachable
        once the workers measured their speed, else aborted at the deadline)."""

        async def step() -> None:
            await self.post("expiring", self.job(50, ttl_s=0.01))
            await self.post("unreachable", self.job(1000, ttl_s=1.0))

        await self.every(2.5, step)

    async def cancels(self) -> None:
        """A long job, cancelled once it has decoded a while: aborted mid-decode
        (cancelled), its tokens wasted."""

        async def step() -> None:
            r = await self.post("cancel", self.job(1000, ttl_s=600))
            if r.status_code != 202:
                return
            job = r.json()["id"]
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                state = (await self.api.get(f"/v1/jobs/{job}")).json()["state"]
                if state == JobState.RUNNING.value:
                    await asyncio.sleep(0.3)
                    break
                await asyncio.sleep(0.05)
            d = await self.api.delete(f"/v1/jobs/{job}")
            self.statuses["cancel-delete", d.status_code] += 1

        await asyncio.sleep(2)
        await self.every(5, step)

    async def webhooks(self) -> None:
        """Jobs announced to a receiver that answers 200, 500 then 200 (retried), 410 (the
        endpoint disabled, dead-lettered: a new endpoint every time, and one that was
        disabled, given up without a request), or always 500 (dead after the last
        attempt)."""

        async def step() -> None:
            self.gone += 1
            fresh = f"/gone/{self.gone}"
            self.receiver.replies[fresh] = self.receiver.replies["/gone"]
            for path in ("/ok", "/flaky", "/gone", fresh, "/never"):
                callback = {"callback_url": self.receiver.url(path)}
                await self.post("webhook", self.job(30, ttl_s=600, **callback))

        await asyncio.sleep(1)
        await self.every(6, step)

    async def bad_requests(self) -> None:
        """Requests refused before admission: not JSON (400), no input (422), a deadline
        too far away (400/422)."""

        async def step() -> None:
            await self.post("bad", None, raw=b"{not json")
            await self.post("bad", {"kind": "complete", "max_tokens": 10})
            too_far = self.settings.max_ttl_s * 2
            await self.post("bad", self.job(10, ttl_s=too_far))

        await self.every(4, step)

    async def poison(self) -> None:
        """A record that is not a dispatch envelope, twice: dead-lettered by a worker."""
        producer = AIOKafkaProducer(
            bootstrap_servers=self.settings.require_kafka(), enable_idempotence=False
        )
        await producer.start()
        try:
            for at in (2.0, LOAD_S / 2):
                await asyncio.sleep(max(0.0, self.end - LOAD_S + at - time.monotonic()))
                await producer.send_and_wait(
                    self.settings.dispatch_topic, b"\x00\xffnot a dispatch envelope", partition=0
                )
        finally:
            await producer.stop()

    async def run(self) -> None:
        await asyncio.gather(
            self.bursts(),
            self.expiring(),
            self.cancels(),
            self.webhooks(),
            self.bad_requests(),
            self.poison(),
        )


# ---------------------------------------------------------------------------------------------
# Starting and stopping


async def serving_metrics(client: httpx.AsyncClient, role: Role, port: int) -> None:
    """Until the role serves its metrics on ``port``: by then its SIGTERM handler is set."""
    deadline = time.monotonic() + STARTUP_S
    while True:
        assert role.process.poll() is None, f"{role.name} exited:\n{role.output()[-3000:]}"
        with contextlib.suppress(httpx.TransportError):
            if (await client.get(f"http://127.0.0.1:{port}/metrics", timeout=2)).is_success:
                return
        assert time.monotonic() < deadline, f"{role.name} serves no metrics:\n{role.output()}"
        await asyncio.sleep(0.1)


async def admitting(api: httpx.AsyncClient, within_s: float) -> None:
    """Until a submit is admitted (503 lag_unknown until the API read the lag once) and
    ends: the workers consume."""
    deadline = time.monotonic() + within_s
    body = {"kind": "complete", "input": DOC, "max_tokens": 5}
    while True:
        r = await api.post("/v1/jobs?wait=5", json=body)
        if r.status_code in (200, 202) and r.json()["state"] == "succeeded":
            return
        assert time.monotonic() < deadline, f"no job ran: {r.status_code} {r.text}"
        await asyncio.sleep(0.2)


async def stop(role: Role) -> tuple[str, int | None, float]:
    """SIGTERM; the role's exit code (None: still running after STOP_S) and how long."""
    started = time.monotonic()
    role.process.send_signal(signal.SIGTERM)
    try:
        code = await asyncio.to_thread(role.process.wait, STOP_S)
    except subprocess.TimeoutExpired:
        return role.name, None, time.monotonic() - started
    return role.name, code, time.monotonic() - started


# ---------------------------------------------------------------------------------------------
# Reading the dashboard back


async def evaluate(
    prometheus: prom.Prometheus, client: httpx.AsyncClient, targets: list[Panel]
) -> list[str]:
    """Query every target; the failures (no series, or none with a number)."""
    failures = []
    for t in targets:
        t.error, t.result = None, []
        try:
            data = await prometheus.query(client, t.query)
        except (AssertionError, httpx.HTTPError) as exc:
            t.error = str(exc)
        else:
            if data["resultType"] == "scalar":
                t.result = [{"metric": {}, "value": data["result"]}]
            else:
                t.result = data["result"]
        if t.error or not t.numbers():
            failures.append(f"  {t.title}: {t.expr}\n    -> {t.shown()}")
        for (metric, label), wanted in EXPECTED_LABELS.items():
            if metric not in {family(n) for n in promql_metrics(t.expr)}:
                continue
            if label not in promql_grouping(t.expr):
                continue
            shown = {labels.get(label) for labels, _ in t.values()}
            if missing := wanted - shown:
                failures.append(
                    f"  {t.title}: {t.expr}\n    -> no {label} {sorted(missing)} "
                    f"(got {sorted(str(s) for s in shown)})"
                )
    return failures


async def ownership(
    prometheus: prom.Prometheus, client: httpx.AsyncClient, on_dashboard: set[str]
) -> tuple[list[str], dict[str, list[str]]]:
    """Which scrape jobs export each family: the failures (a family exported by a role
    that does not own it; one on the dashboard not exported by each owner) and the jobs
    found for each family."""
    failures, found = [], {}
    for name in sorted(on_dashboard - set(OWNERS)):
        failures.append(f"  {name}: on the dashboard, but in no role's table (OWNERS)")
    for name, owners in sorted(OWNERS.items()):
        selector = f'{{__name__=~"{name}(_bucket|_sum|_count)?"}}'
        data = await prometheus.query(client, f"count by (job) ({selector})")
        jobs = sorted(str(r["metric"].get("job")) for r in data["result"])
        found[name] = jobs
        if extra := set(jobs) - owners:
            owned_by = sorted(owners)
            failures.append(f"  {name}: exported by {sorted(extra)} too (owned by {owned_by})")
        if name in on_dashboard and (missing := owners - set(jobs)):
            failures.append(f"  {name}: not exported by {sorted(missing)} (got {jobs})")
    return failures, found


def report(targets: list[Panel], found: dict[str, list[str]], path: Path) -> None:
    """Print each panel's values and write them to ``path``."""
    print("\nDashboard panels against Prometheus:")
    for t in targets:
        print(f"- {t.title}\n    {t.expr}\n    = {t.shown()}")
    print("\nFamilies by scrape job:")
    for name, jobs in found.items():
        print(f"- {name}: {', '.join(jobs) or '(no series)'}")
    path.write_text(
        json.dumps(
            {
                "panels": [
                    {
                        "title": t.title,
                        "expr": t.expr,
                        "query": t.query,
                        "error": t.error,
                        "values": [{"labels": la, "value": v} for la, v in t.values()],
                    }
                    for t in targets
                ],
                "families": found,
            },
            indent=2,
        )
    )
    print(f"\nwritten to {path}")


async def test_every_dashboard_panel_shows_data_from_its_own_role(
    settings: Settings, tmp_path: Path
) -> None:
    s = webhook_settings(
        settings,
        sim_time_scale=1.0,  # about 5 ms a token: 100-200 tokens take 0.5-1 s
        # A small KV cache (2,560 tokens a worker): a burst fills it, and the pull gate
        # pauses the worker's partitions until jobs end.
        sim_num_blocks=160,
        webhook_retry_schedule_s=(0.0, 0.5, 1.0),
        lag_soft=5,
        lag_hard=10,
        max_block_ms=1000,
        # Jobs with a deadline of 10 ms are admitted (and dropped by the workers).
        deadline_aware=False,
        drain_timeout_s=3.0,
        pools={model: {} for model in POOLS},  # a worker each
    )
    targets = dashboard_targets()
    on_dashboard = dashboard_families(targets)
    receiver = Receiver()
    receiver.replies |= {
        "/ok": lambda _: Response(status_code=200),
        "/flaky": failing(receiver, 1, 500),
        "/gone": lambda _: Response(status_code=410),
        "/never": lambda _: Response(status_code=500),
    }
    problems: dict[str, list[str]] = {}
    started_at = time.monotonic()
    timings: dict[str, float] = {}

    async with receiving(receiver), httpx.AsyncClient() as client:
        with roles(s, tmp_path) as started:
            ports = {API: [free_port()], RELAY: [free_port()], WEBHOOKS: [free_port()]}
            ports[WORKER] = [free_port(), free_port()]
            running = [started.start(API, api_port=ports[API][0])]
            for name in (RELAY, WEBHOOKS):
                running.append(started.start(name, metrics_port=ports[name][0]))
            for model, port in zip(POOLS, ports[WORKER], strict=True):
                running.append(started.start(WORKER, metrics_port=port, worker_model=model))
            config = prom.scrape_config(
                prom.load_deploy_config(),
                {job: [f"127.0.0.1:{p}" for p in ps] for job, ps in ports.items()},
            )
            with prom.running(config, tmp_path / "prometheus", free_port()) as prometheus:
                await prom.ready(prometheus, client, within_s=30)
                for role in running:
                    i = sum(r.name == role.name for r in running[: running.index(role)])
                    await serving_metrics(client, role, ports[role.name][i])
                api = httpx.AsyncClient(base_url=f"http://127.0.0.1:{ports[API][0]}", timeout=30)
                async with api:
                    await admitting(api, within_s=STARTUP_S)
                    r = await api.post("/v1/webhooks/secrets")
                    assert r.status_code == 201, r.text
                    receiver.secrets.append(r.json()["secret"])
                    timings["startup"] = time.monotonic() - started_at

                    load = Load(api, receiver, s, end=time.monotonic() + LOAD_S)
                    steady = asyncio.create_task(load.steady())
                    try:
                        await load.run()
                        timings["load"] = time.monotonic() - started_at - timings["startup"]
                        # Until every panel shows data (the last events scraped), or
                        # SETTLE_S; the steady submits go on meanwhile, so the gauges read
                        # a stack at work.
                        settle_until = time.monotonic() + SETTLE_S
                        while failures := await evaluate(prometheus, client, targets):
                            if time.monotonic() > settle_until:
                                break
                            await asyncio.sleep(1)
                        timings["settle"] = time.monotonic() - started_at - sum(timings.values())
                    finally:
                        load.finished.set()
                        await steady
                owned, found = await ownership(prometheus, client, on_dashboard)
                down = [
                    f"  {t['labels'].get('job')} {t['scrapeUrl']}: {t['lastError']}"
                    for t in await prometheus.targets(client)
                    if t["health"] != "up"
                ]
                report(targets, found, tmp_path / "dashboard_values.json")
                rules = await prometheus.rules(client)

            stopped = await asyncio.gather(*(stop(role) for role in running))
            timings["stop"] = time.monotonic() - started_at - sum(timings.values())

    print(f"\nload: {dict(load.statuses)}\nrefusals: {dict(load.refusals)}")
    print(f"webhook requests by path: {Counter(r.path for r in receiver.got)}")
    print("timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
    if failures:
        problems["panels without data (title: expr -> result)"] = failures
    if owned:
        problems["families exported by a role that does not own them"] = owned
    if down:
        problems["scrape targets down"] = down
    if not rules:
        problems["alert rules"] = ["  Prometheus loaded no rule from deploy/prometheus/alerts.yml"]
    unhealthy = [
        f"  {r['name']}: {r['health']} {r.get('lastError')}" for r in rules if r["health"] != "ok"
    ]
    if unhealthy:
        problems["alert rules that do not evaluate"] = unhealthy
    bad_exits = [
        f"  {name} exited {code} after {took:.1f} s:\n{role.output()[-2000:]}"
        for (name, code, took), role in zip(stopped, running, strict=True)
        if code != 0
    ]
    if bad_exits:
        problems["roles that did not exit 0 on SIGTERM"] = bad_exits
    assert not problems, "\n".join(f"{k}:\n" + "\n".join(v) for k, v in problems.items())
