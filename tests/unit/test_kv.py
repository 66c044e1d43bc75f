"""Block allocator, roofline model and the KV reservation arithmetic."""

import pytest

from workers.engines.blocks import BlockAllocator, OutOfBlocks
from workers.engines.profiles import GPU_80GB, LLAMA_8B, Roofline, num_gpu_blocks
from workers.kv import KvLedger, kv_need


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


def test_reservation_covers_growth_of_running_jobs() -> None:
    ledger = KvLedger(block_size=16, watermark_blocks=2)
    # A running job prefilled 32 tokens (2 blocks held) and will grow to 10 blocks.
    ledger.started("a", prompt_tokens=32, need_blocks=10)
    assert ledger.reserved_growth() == 8
    # 20 free: 20 - 8 reserved - 2 watermark = 10 available
    assert ledger.can_start(10, free_blocks=20)
    assert not ledger.can_start(11, free_blocks=20)
    ledger.decoded("a", 32)  # 4 blocks held now: 6 still to come
    assert ledger.reserved_growth() == 6
    ledger.finished("a")
    assert ledger.reserved_growth() == 0
    assert ledger.can_start(18, free_blocks=20)
