"""The admission rules, each through the controller's public seam with a fake lag."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

import pytest

from producers.admission.context import EngineContext
from producers.admission.controller import AdmissionController
from producers.admission.policy import Policy, Refused
from producers.admission.ratelimit import TenantLimits
from producers.batches.meter import held_ahead
from producers.jobs.repository import Flow
from producers.lag.estimate import LagEstimate
from producers.lag.monitor import LagMonitor
from schemas.jobs import Priority, shape
from tests.support.admission import NOW, POLICY, FakeClock, NoSource


def monitor_at(lag: int, drain_per_s: float = 10.0) -> tuple[LagMonitor, FakeClock]:
    """A monitor whose last two readings give ``lag`` and a drain rate of ``drain_per_s``."""
    clock = FakeClock()
    monitor = LagMonitor(
        NoSource(),
        estimate=LagEstimate(clock),
        interval_s=0.5,
        stale_after_s=5.0,
        clock=clock,
        smoothing=1,
    )
    drained = int(drain_per_s)
    monitor.update({0: 1000}, {0: 1000 - lag - drained})
    clock.t = 1.0
    monitor.update({0: 1000}, {0: 1000 - lag})
    return monitor, clock


def controller(
    lag: int, policy: Policy = POLICY, *, rpm: int | None = None, tpm: int | None = None
) -> AdmissionController:
    monitor, _ = monitor_at(lag)
    return AdmissionController(policy, monitor, TenantLimits(rpm=rpm, tpm=tpm), monitor.estimate)


async def admit(
    c: AdmissionController,
    *,
    priority: Priority = Priority.NORMAL,
    ttl_s: float = 3600,
    tenant: str = "t",
    max_tokens: int = 10,
) -> float:
    admitted = await c.admit(
        tenant=tenant,
        priority=priority,
        prompt_tokens=10,
        max_tokens=max_tokens,
        deadline=NOW + timedelta(seconds=ttl_s),
        now=NOW,
    )
    return admitted.blocked_s


async def refusal(c: AdmissionController, **kwargs: object) -> Refused:
    with pytest.raises(Refused) as caught:
        await admit(c, **kwargs)  # type: ignore[arg-type]
    return caught.value


async def test_accepts_below_soft() -> None:
    assert await admit(controller(50)) == 0.0


async def test_hard_threshold_refuses_with_computed_retry_after() -> None:
    at_hard = await refusal(controller(200))
    far_over = await refusal(controller(400))
    assert at_hard.status == 429
    assert at_hard.reason == "lag_hard"
    assert at_hard.lag == 200
    # (lag - soft) / μ: 100 / 10 and 300 / 10; not a constant.
    assert at_hard.retry_after_s == pytest.approx(10.0)
    assert far_over.retry_after_s == pytest.approx(30.0)


async def test_reject_mode_refuses_between_thresholds() -> None:
    refused = await refusal(controller(150))
    assert refused.reason == "lag_soft"


async def test_unknown_lag_is_treated_as_saturated() -> None:
    monitor = LagMonitor(NoSource(), estimate=LagEstimate(), interval_s=0.5, stale_after_s=5.0)
    c = AdmissionController(POLICY, monitor, TenantLimits(rpm=None, tpm=None), monitor.estimate)
    refused = await refusal(c)
    assert refused.status == 503
    assert refused.reason == "lag_unknown"


async def test_stale_reading_is_unknown() -> None:
    monitor, clock = monitor_at(10)
    clock.t += 6.0  # older than stale_after_s
    c = AdmissionController(POLICY, monitor, TenantLimits(rpm=None, tpm=None), monitor.estimate)
    assert (await refusal(c)).reason == "lag_unknown"


async def test_deadline_unreachable_is_refused_at_once() -> None:
    # 50 jobs ahead at 10/s is 5 s of queue, plus 10 tokens x 0.01 s of service.
    assert (await refusal(controller(50), ttl_s=4)).reason == "deadline_unreachable"
    assert await admit(controller(50), ttl_s=6) == 0.0
    relaxed = replace(POLICY, deadline_aware=False)
    assert await admit(controller(50, relaxed), ttl_s=4) == 0.0


async def test_jobs_already_running_are_not_queue_ahead_of_a_new_one() -> None:
    # 50 records of lag, 30 of them jobs that workers are running (uncommitted until they
    # end): 20 queued at 10/s is 2 s of wait, and a 4 s deadline holds.
    c = controller(50)
    c.running_jobs(30)
    assert await admit(c, ttl_s=4) == 0.0
    c.running_jobs(0)
    assert (await refusal(c, ttl_s=4)).reason == "deadline_unreachable"


def flow(*, running: int = 0, timed: int, token_time_s: float | None) -> Flow:
    return Flow(
        in_flight=running,
        running=running,
        finished_recently=timed,
        mean_latency_s=None,
        timed_jobs=timed,
        token_time_s=token_time_s,
    )


async def test_the_deadline_check_uses_the_measured_token_time_once_enough_jobs_ended() -> None:
    # No queue: the service estimate decides. 100 tokens at the static 0.01 s is 1 s.
    measured = replace(POLICY, measured_after=8)
    c = controller(0, measured)
    c.observe(flow(timed=7, token_time_s=0.05))  # too few timed jobs: still the static time
    assert c.token_time_s == 0.01
    assert await admit(c, ttl_s=2, max_tokens=100) == 0.0
    c.observe(flow(timed=8, token_time_s=0.05))  # the engine is slower now: 5 s
    assert c.token_time_s == 0.05
    assert (await refusal(c, ttl_s=2, max_tokens=100)).reason == "deadline_unreachable"
    c.observe(flow(timed=8, token_time_s=0.001))  # and faster: 0.1 s
    assert await admit(c, ttl_s=0.5, max_tokens=100) == 0.0
    static = controller(0, replace(POLICY, measured_after=0))
    static.observe(flow(timed=100, token_time_s=0.05))
    assert static.token_time_s == 0.01


async def test_priority_high_passes_soft_low_is_refused_first() -> None:
    assert await admit(controller(150), priority=Priority.HIGH) == 0.0
    assert (await refusal(controller(200), priority=Priority.HIGH)).reason == "lag_hard"
    # Low blocks from soft * 0.5 and is refused at soft, where normal is still accepted.
    assert (await refusal(controller(60), priority=Priority.LOW)).reason == "lag_soft"
    assert (await refusal(controller(100), priority=Priority.LOW)).reason == "lag_hard"
    assert await admit(controller(60)) == 0.0


async def test_tenant_rpm_and_tpm() -> None:
    c = controller(0, rpm=2)
    await admit(c)
    await admit(c)
    refused = await refusal(c)
    assert refused.reason == "tenant_rpm"
    assert 25 < refused.retry_after_s <= 30  # one request refills in 60 s / 2
    assert await admit(c, tenant="other") == 0.0

    c = controller(0, tpm=100)
    await admit(c, max_tokens=60)  # 70 tokens with the prompt
    assert (await refusal(c, max_tokens=60)).reason == "tenant_tpm"
    assert await admit(c, max_tokens=20) == 0.0


async def test_refused_requests_do_not_spend_the_tenant_budget() -> None:
    c = controller(250, rpm=1)
    assert (await refusal(c)).reason == "lag_hard"
    c._monitor, _ = monitor_at(0)  # the backlog drained
    assert await admit(c) == 0.0


async def test_block_mode_waits_for_lag_to_fall() -> None:
    blocking = replace(POLICY, mode="block")
    monitor, clock = monitor_at(150)
    c = AdmissionController(blocking, monitor, TenantLimits(rpm=None, tpm=None), monitor.estimate)
    waiter = asyncio.ensure_future(admit(c))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    assert c.blocked == 1
    # A second submitter beyond max_blocked (1) is refused at once.
    assert (await refusal(c)).reason == "too_many_blocked"
    clock.t += 0.5
    monitor.update({0: 1000}, {0: 1000 - 95})  # below soft, but not below the hysteresis band
    await asyncio.sleep(0.05)
    assert not waiter.done()
    clock.t += 0.5
    monitor.update({0: 1000}, {0: 1000 - 80})
    assert await asyncio.wait_for(waiter, 1) > 0
    assert c.blocked == 0


async def test_block_times_out_into_a_refusal() -> None:
    short = replace(POLICY, mode="block", max_block_s=0.2)
    monitor, _ = monitor_at(150)
    c = AdmissionController(short, monitor, TenantLimits(rpm=None, tpm=None), monitor.estimate)
    assert (await refusal(c)).reason == "block_timeout"


async def test_block_turns_into_refusal_when_lag_crosses_hard() -> None:
    monitor, clock = monitor_at(150)
    c = AdmissionController(
        replace(POLICY, mode="block"), monitor, TenantLimits(rpm=None, tpm=None), monitor.estimate
    )
    waiter = asyncio.ensure_future(admit(c))
    await asyncio.sleep(0.05)
    clock.t += 0.5
    monitor.update({0: 1200}, {0: 1200 - 250})
    with pytest.raises(Refused) as caught:
        await asyncio.wait_for(waiter, 1)
    assert caught.value.reason == "lag_hard"


async def test_hysteresis_in_reject_mode() -> None:
    monitor, clock = monitor_at(150)
    c = AdmissionController(POLICY, monitor, TenantLimits(rpm=None, tpm=None), monitor.estimate)
    assert (await refusal(c)).reason == "lag_soft"
    clock.t += 0.5
    monitor.update({0: 1000}, {0: 1000 - 95})
    assert (await refusal(c)).reason == "lag_soft"  # still inside the band: no flapping
    clock.t += 0.5
    monitor.update({0: 1000}, {0: 1000 - 85})
    assert await admit(c) == 0.0
    clock.t += 0.5
    monitor.update({0: 1000}, {0: 1000 - 95})
    assert await admit(c) == 0.0  # the band applies only on the way down


async def test_a_burst_inside_one_reading_is_counted_at_once() -> None:
    policy = replace(POLICY, soft=5, hard=5)
    c = controller(0, policy)
    results = await asyncio.gather(*(admit(c) for _ in range(10)), return_exceptions=True)
    assert sum(1 for r in results if r == 0.0) == 5
    assert {r.reason for r in results if isinstance(r, Refused)} == {"lag_hard"}


def admit_batch(
    c: AdmissionController,
    jobs: int,
    *,
    ahead: int = 0,
    ttl_s: float = 3600,
    max_tokens: int = 10,
    tenant: str = "t",
) -> None:
    c.admit_batch(
        tenant=tenant,
        jobs=jobs,
        ahead=ahead,
        max_tokens=max_tokens,
        deadline=NOW + timedelta(seconds=ttl_s),
        now=NOW,
    )


async def test_a_batch_of_any_size_is_accepted_whatever_the_lag() -> None:
    # The lag is at the refusal threshold, and the batch is 250 times it: it is held and
    # metered in, so neither bounds it; a single submit beside it is still refused.
    c = controller(200)
    admit_batch(c, 50_000, ttl_s=86_400)
    assert (await refusal(c)).reason == "lag_hard"
    # Accepting it added nothing to the lag admission sees: its jobs are not queued yet.
    assert c.current_lag() == 200


async def test_a_batch_that_cannot_end_in_its_window_is_refused_with_the_numbers() -> None:
    # 50 queued, 300 held ahead and 99 of its own at 10/s: 44.9 s, plus 0.1 s of service.
    with pytest.raises(Refused) as caught:
        admit_batch(controller(50), 100, ahead=300, ttl_s=44.5)
    refused = caught.value
    assert refused.reason == "deadline_unreachable"
    message = str(refused)
    for figure in ("100 jobs", "lag of 50", "300 batch jobs", "44.9 s", "10.0 jobs/s", "44.5 s"):
        assert figure in message, (figure, message)
    assert refused.retry_after_s == pytest.approx(0.5)  # 0.5 s short: the floor
    admit_batch(controller(50), 100, ahead=300, ttl_s=45.5)


async def test_held_jobs_ahead_count_the_tenants_turns() -> None:
    held = {"a": 1000, "b": 30, "c": 5000}
    # A new batch of 100 for "a" waits for all of a's own, and 100 of each other tenant's
    # (turns), or fewer where that tenant holds fewer.
    assert held_ahead(held, "a", 100) == 1000 + 30 + 100
    assert held_ahead(held, "d", 100) == 100 + 30 + 100
    assert held_ahead({}, "a", 100) == 0


async def test_a_batch_is_one_request_to_the_tenant_limits_and_takes_no_tokens() -> None:
    c = controller(0, rpm=2, tpm=100)
    admit_batch(c, 5_000, max_tokens=500)  # 2.5M tokens: not taken from the TPM bucket
    assert await admit(c) == 0.0  # the second request of the minute, and its tokens fit
    with pytest.raises(Refused) as caught:
        admit_batch(c, 10)
    assert caught.value.reason == "tenant_rpm"


async def test_a_batch_is_refused_while_the_lag_is_unknown() -> None:
    clock = FakeClock()
    monitor = LagMonitor(
        NoSource(), estimate=LagEstimate(clock), interval_s=0.5, stale_after_s=5.0, clock=clock
    )
    c = AdmissionController(POLICY, monitor, TenantLimits(rpm=None, tpm=None), monitor.estimate)
    with pytest.raises(Refused) as caught:
        admit_batch(c, 10)
    assert caught.value.reason == "lag_unknown"
    assert c.current_lag() is None


async def test_before_the_speed_is_measured_no_deadline_is_refused_on_a_guess() -> None:
    # A fresh stack: nothing timed yet. 500 tokens at the static 0.01 s is 5 s, over a 3 s
    # deadline, but that figure is a guess: the job is admitted (the worker drops it if it
    # cannot make it). With deadline_speed=static the guess is the rule and it is refused.
    measured = controller(0, replace(POLICY, measured_after=8))
    assert await admit(measured, ttl_s=3, max_tokens=500) == 0.0
    admit_batch(measured, 5, ttl_s=3, max_tokens=500)  # a batch alike
    measured.observe(flow(timed=8, token_time_s=0.01))
    assert (await refusal(measured, ttl_s=3, max_tokens=500)).reason == "deadline_unreachable"
    with pytest.raises(Refused, match="cannot end within its window"):
        admit_batch(measured, 5, ttl_s=3, max_tokens=500)
    static = controller(0, replace(POLICY, measured_after=0))
    assert (await refusal(static, ttl_s=3, max_tokens=500)).reason == "deadline_unreachable"
    with pytest.raises(Refused, match="cannot end within its window"):
        admit_batch(static, 5, ttl_s=3, max_tokens=500)


def cold(lag: int) -> AdmissionController:
    """A controller whose monitor has read ``lag`` twice and seen nothing drain."""
    clock = FakeClock()
    monitor = LagMonitor(
        NoSource(),
        estimate=LagEstimate(clock),
        interval_s=0.5,
        stale_after_s=5.0,
        clock=clock,
        smoothing=1,
    )
    monitor.update({0: lag}, {0: 0})
    clock.t = 1.0
    monitor.update({0: lag}, {0: 0})
    return AdmissionController(POLICY, monitor, TenantLimits(rpm=None, tpm=None), monitor.estimate)


async def test_before_the_drain_rate_is_measured_retry_after_comes_from_the_running_jobs() -> None:
    c = cold(250)
    c.running_jobs(4)
    refused = await refusal(c, max_tokens=100)
    # 150 jobs over the resume level (100), 4 running at 100 tokens x 0.01 s: 37.5 s.
    assert refused.reason == "lag_hard"
    assert refused.retry_after_s == pytest.approx(150 * 1.0 / 4)
    c.running_jobs(0)  # nothing known to drain: the most
    assert (await refusal(c, max_tokens=100)).retry_after_s == POLICY.retry_max_s


def stalled(lag: int, stalled_s: float) -> AdmissionController:
    clock = FakeClock()
    monitor = LagMonitor(
        NoSource(),
        estimate=LagEstimate(clock),
        interval_s=0.5,
        stale_after_s=60.0,
        clock=clock,
        smoothing=1,
    )
    monitor.update({0: lag}, {0: 0})
    clock.t = stalled_s
    monitor.update({0: lag}, {0: 0})
    return AdmissionController(POLICY, monitor, TenantLimits(rpm=None, tpm=None), monitor.estimate)


async def test_a_backlog_nothing_consumes_is_said_plainly() -> None:
    refused = await refusal(stalled(250, stalled_s=12.0))
    assert refused.reason == "lag_hard"  # the code a client keys on does not change
    assert "is any worker running?" in str(refused)
    assert "none has left the queue for 12 s" in str(refused)
    assert refused.retry_after_s == POLICY.retry_max_s

    young = await refusal(stalled(250, stalled_s=3.0))  # not long enough to say so
    assert "worker running" not in str(young)
    busy = stalled(250, stalled_s=12.0)
    busy.running_jobs(2)  # long jobs on a worker: it is alive
    assert "worker running" not in str(await refusal(busy))


def test_the_meters_count_newer_than_the_reading_replaces_its_lag() -> None:
    monitor, clock = monitor_at(150)
    c = AdmissionController(POLICY, monitor, TenantLimits(rpm=None, tpm=None), monitor.estimate)
    c.estimate.record_release(80)  # a meter round released 80 held jobs after the reading
    assert c.current_lag() == 230  # seen at once
    clock.t += 1.0  # the reading is a second old; the jobs that ended since are not in it
    c.estimate.record_count(120, c.estimate.tally())  # the meter's next round counted them
    assert c.current_lag() == 120
    c.estimate.record_release(30)
    assert c.current_lag() == 150
    monitor.update({0: 1000}, {0: 1000 - 40})  # a reading newer than the count
    assert c.current_lag() == 40 + 110  # its lag, plus all released since its tally (0)


async def test_a_document_is_judged_as_its_whole_graph() -> None:
    # 20 jobs ahead at 10/s is 2 s of queue, and 10 tokens x 0.01 s is 0.1 s of service: a
    # single job fits 4 s. As a graph of 30 chunks in 3 levels it waits behind its own 29
    # other chunks too (4.9 s) and its levels run one after another: refused, as a whole.
    graph = shape(30 * 1800, 10, 2000)
    assert graph is not None
    assert graph.chunks >= 28
    assert graph.levels >= 2
    c = controller(20)
    assert await admit(c, ttl_s=4) == 0.0
    with pytest.raises(Refused) as caught:
        await c.admit(
            tenant="t",
            priority=Priority.NORMAL,
            prompt_tokens=30 * 1800,
            max_tokens=10,
            deadline=NOW + timedelta(seconds=4),
            now=NOW,
            graph=graph,
        )
    assert caught.value.reason == "deadline_unreachable"
    assert f"a document of {graph.chunks} chunks in {graph.levels} levels" in str(caught.value)
    assert caught.value.retry_after_s > 0
    roomy = await c.admit(
        tenant="t",
        priority=Priority.NORMAL,
        prompt_tokens=30 * 1800,
        max_tokens=10,
        deadline=NOW + timedelta(seconds=60),
        now=NOW,
        graph=graph,
    )
    assert roomy.blocked_s == 0.0


class Contexts:
    def __init__(self, tokens: int | None) -> None:
        self.tokens = tokens
        self.reads = 0

    async def smallest(self, model: str) -> int | None:
        self.reads += 1
        return self.tokens


async def test_the_context_a_document_is_judged_by_is_the_workers_smallest() -> None:
    store = Contexts(None)
    context = EngineContext(store, "m", every_s=3600)  # type: ignore[arg-type]
    assert await context.graph_of(50_000, 128) is None  # no worker said: judged whole
    store.tokens = 2048
    assert await context.graph_of(50_000, 128) is None  # read again only every every_s
    assert store.reads == 1
    fresh = EngineContext(store, "m", every_s=0)  # type: ignore[arg-type]
    graph = await fresh.graph_of(50_000, 128)
    assert graph is not None
    assert graph.chunks > 20
    assert await fresh.graph_of(1000, 128) is None  # fits one request
