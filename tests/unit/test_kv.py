"""Block allocator, roofline model and the KV reservation arithmetic."""

import random

import pytest

from schemas.jobs import JobKind
from workers.engines.sim.batching import BatchScheduler, SimRequest
from workers.engines.sim.blocks import BlockAllocator, OutOfBlocks
from workers.engines.sim.profiles import GPU_80GB, LLAMA_8B, Roofline, num_gpu_blocks
from workers.kv import ExpectedOutput, KvLedger, kv_need


def test_allocator_grows_in_blocks_and_frees_exactly() -> None:
    a = BlockAllocator(num_blocks=10, block_size=16)
    a.grow_to("r1", 17)  # 2 blocks
    assert a.held("r1") == 2
    assert a.free_blocks == 8
    a.grow_to("r1", 32)  # still 2
    assert a.free_blocks == 8
    a.grow_to("r1", 33)
    assert a.free_blocks == 7
    assert a.release("r1") == 3
    assert a.free_blocks == 10


def test_allocator_is_all_or_nothing() -> None:
    a = BlockAllocator(num_blocks=4, block_size=16)
    a.grow_to("r1", 48)
    assert not a.can_grow_to("r2", 32)
    with pytest.raises(OutOfBlocks):
        a.grow_to("r2", 32)
    assert a.free_blocks == 1
    assert a.held("r2") == 0


def test_kv_sizing_of_the_default_profiles() -> None:
    # 2 x 32 layers x 8 KV heads x 128 dims x 2 bytes
    assert LLAMA_8B.kv_bytes_per_token == 131_072
    blocks = num_gpu_blocks(LLAMA_8B, GPU_80GB, block_size=16)
    # (72 GB - 16.06 GB of weights - 4 GB reserve) / (16 x 128 KiB) = 24,766.9
    assert blocks == 24_766


def test_roofline_decode_is_bandwidth_bound_and_has_the_cliff() -> None:
    r = Roofline(model=LLAMA_8B, gpu=GPU_80GB)
    small = r.per_token_latency_s(batch=1, context_tokens=1000)
    # one pass over 16 GB of weights and 1,000 tokens of KV at 3.35 TB/s, plus overhead
    assert small == pytest.approx((16.06e9 + 1000 * 131_072) / 3.35e12 + 0.003, rel=1e-3)
    # per-token latency rises as the batch's KV grows (the utilization cliff)
    latencies = [r.per_token_latency_s(batch=b, context_tokens=2000) for b in (8, 64, 256)]
    assert latencies == sorted(latencies)
    assert latencies[-1] > 2 * latencies[0]


def test_roofline_prefill_is_compute_bound() -> None:
    r = Roofline(model=LLAMA_8B, gpu=GPU_80GB)
    step = r.step_s(prefill_tokens=8192, decode_requests=0, kv_tokens=0)
    assert step == pytest.approx(2 * 8.03e9 * 8192 / (989e12 * 0.5) + 0.003, rel=1e-3)


def test_kv_need_is_the_ceiling_over_block_size() -> None:
    assert kv_need(100, 28, 16) == 8
    assert kv_need(100, 29, 16) == 9


def test_a_job_is_committed_at_its_need_until_its_first_token() -> None:
    ledger = KvLedger(block_size=16, watermark_blocks=2)
    # 32 prompt tokens, 128 expected output: 10 blocks at the end.
    ledger.started("a", prompt_tokens=32, expected_output=128)
    assert ledger.committed() == 10
    # 20 free of 20: 20 - 10 committed - 2 watermark = 8 for a new job
    assert ledger.available(free_blocks=20, total_blocks=20) == 8
    assert ledger.can_start(8, free_blocks=20, total_blocks=20)
    assert not ledger.can_start(9, free_blocks=20, total_blocks=20)
    # What is free right now bounds it as well.
    assert ledger.available(free_blocks=5, total_blocks=20) == 3
    assert ledger.finished("a") == (128, 0)
    assert ledger.committed() == 0


def test_a_decoding_job_is_committed_at_its_peak_with_a_block_for_lag() -> None:
    ledger = KvLedger(block_size=16)
    ledger.started("a", prompt_tokens=32, expected_output=128)
    ledger.decoded("a")  # 32 tokens written (2 blocks); 127 steps to go, ending at 159
    assert ledger.committed() == 11  # ceil(159 / 16) = 10, plus 1 for lag
    assert ledger.reserved_growth(used_blocks=2) == 9
    ledger.decoded("a", 127)  # done: it holds 10 blocks until it is forgotten
    assert ledger.committed() == 11
    assert ledger.finished("a") == (128, 128)


def test_the_engines_prompt_count_replaces_the_estimate() -> None:
    ledger = KvLedger(block_size=16)
    ledger.started("a", prompt_tokens=100, expected_output=28)  # 8 blocks
    ledger.prompt_counted("a", 120)  # 148 tokens: 10 blocks
    assert ledger.reserved("a") == 10


def test_a_job_that_outgrows_its_reservation_reserves_nothing_more() -> None:
    ledger = KvLedger(block_size=16)
    ledger.started("a", prompt_tokens=16, expected_output=16)
    ledger.decoded("a", 100)
    assert ledger.reserved("a") == 0
    assert ledger.finished("a") == (16, 100)


def test_reservations_match_the_simulators_blocks_exactly() -> None:
    """Reserved growth plus the blocks the engine holds is the need, at every step."""
    allocator = BlockAllocator(num_blocks=100, block_size=16)
    scheduler = BatchScheduler(allocator)
    ledger = KvLedger(block_size=16)
    scheduler.add(SimRequest(id="a", prompt_tokens=40, output_tokens=50))
    ledger.started("a", prompt_tokens=40, expected_output=50)
    need = kv_need(40, 50, 16)
    while scheduler.running or scheduler.waiting:
        step = scheduler.step()
        if "a" in step.emitted:
            ledger.decoded("a")
        if "a" in step.finished:
            break
        assert allocator.held("a") + ledger.reserved("a") == need


def test_expected_output_is_max_tokens_until_enough_samples() -> None:
    expected = ExpectedOutput(observed=True, quantile=0.9, min_samples=10)
    for n in range(1, 10):
        expected.record(JobKind.SUMMARIZE, n * 10)
    assert expected.tokens(JobKind.SUMMARIZE, 500) == 500
    expected.record(JobKind.SUMMARIZE, 100)
    assert expected.tokens(JobKind.SUMMARIZE, 500) == 90  # the 9th of 10 sorted lengths
    assert expected.tokens(JobKind.SUMMARIZE, 50) == 50  # never above max_tokens
    assert expected.tokens(JobKind.COMPLETE, 500) == 500  # per kind


def test_expected_output_off_always_reserves_max_tokens() -> None:
    expected = ExpectedOutput(observed=False, min_samples=1)
    expected.record(JobKind.SUMMARIZE, 10)
    assert expected.tokens(JobKind.SUMMARIZE, 500) == 500


def test_jobs_about_to_end_leave_room_for_the_growth_of_others() -> None:
    ledger = KvLedger(block_size=16)
    ledger.started("ending", prompt_tokens=160, expected_output=16)
    ledger.decoded("ending", 16)  # 175 tokens written, 11 blocks: it ends next step
    ledger.started("young", prompt_tokens=16, expected_output=160)
    ledger.decoded("young")  # 1 block held, will grow to 11
    # Adding up final sizes would commit 22 blocks. The young job grows after the ending
    # job gives its 11 back, so the peak is now: 11 + 1 held, 12; with the bound's rounding
    # and a block a job for lag, 15.
    assert ledger.committed() == 15


@pytest.mark.parametrize("budget", [2048, 8192])
@pytest.mark.parametrize("seed", range(4))
def test_gated_admission_never_preempts_and_keeps_the_cache_full(seed: int, budget: int) -> None:
    """Jobs started by the ledger's rule on the real scheduler, with the ledger hearing of
    tokens and endings up to three steps late: no preemption, ever."""
    rng = random.Random(seed)
    allocator = BlockAllocator(num_blocks=1000, block_size=16)
    scheduler = BatchScheduler(allocator, max_num_batched_tokens=budget)
    ledger = KvLedger(block_size=16)
    backlog = [(rng.randint(20, 1400), rng.randint(1, 300)) for _ in range(250)]
    late: list[tuple[int, bool, str]] = []  # (step heard, finished, job)
    usage: list[float] = []
    step = 0
    while backlog or scheduler.running or scheduler.waiting or late:
        while backlog:
            prompt, output = backlog[0]
            need = ledger.need(prompt, output)
            if not ledger.can_start(need, allocator.free_blocks, allocator.num_blocks):
                break
            backlog.pop(0)
            job = f"j{len(backlog)}"
            scheduler.add(SimRequest(id=job, prompt_tokens=prompt, output_tokens=output))
            ledger.started(job, prompt_tokens=prompt, expected_output=output)
        result = scheduler.step()
        late += [(step + rng.randint(0, 3), False, job) for job in result.emitted]
        late += [(step + 3, True, job) for job in result.finished]
        late.sort()
        while late and late[0][0] <= step:
            _, finished, job = late.pop(0)
            if finished:
                ledger.finished(job)
            else:
                ledger.decoded(job)
        if backlog:
            usage.append(1 - allocator.free_blocks / allocator.num_blocks)
        step += 1
    assert scheduler.preemptions == 0
    full = usage[next(i for i, u in enumerate(usage) if u >= 0.8) :]  # once it first filled
    assert sum(full) / len(full) > 0.85
