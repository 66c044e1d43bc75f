"""Continuous batching over paged KV blocks."""

from collections import Counter

from workers.engines.sim.batching import BatchScheduler, SimRequest
from workers.engines.sim.blocks import BlockAllocator


def run(scheduler: BatchScheduler, limit: int = 1000) -> tuple[Counter[str], list[int]]:
    tokens: Counter[str] = Counter()
    prefills = []
    for _ in range(limit):
        step = scheduler.step()
        if step.idle and not scheduler.waiting:
            break
        tokens.update(step.emitted)
        prefills.append(step.prefill_tokens)
    return tokens, prefills


def test_one_request_prefills_then_decodes_one_token_a_step() -> None:
    s = BatchScheduler(BlockAllocator(num_blocks=100, block_size=16))
    s.add(SimRequest(id="a", prompt_tokens=40, output_tokens=5))
    first = s.step()
    assert first.prefill_tokens == 40
    assert first.emitted == ("a",)
    assert s.allocator.held("a") == 3
    steps = [s.step() for _ in range(4)]
    assert [st.decode_requests for st in steps] == [1, 1, 1, 1]
    assert steps[-1].finished == ("a",)
    assert s.allocator.free_blocks == 100


def test_chunked_prefill_respects_the_token_budget() -> None:
    s = BatchScheduler(BlockAllocator(num_blocks=100, block_size=16), max_num_batched_tokens=16)
    s.add(SimRequest(id="a", prompt_tokens=40, output_tokens=2))
    tokens, prefills = run(s)
    assert prefills[:3] == [16, 16, 8]
    assert tokens["a"] == 2


def test_decodes_share_a_step_with_new_prefills() -> None:
    s = BatchScheduler(BlockAllocator(num_blocks=100, block_size=16))
    s.add(SimRequest(id="a", prompt_tokens=10, output_tokens=10))
    s.step()
    s.add(SimRequest(id="b", prompt_tokens=30, output_tokens=3))
    step = s.step()
    assert step.decode_requests == 1
    assert step.prefill_tokens == 30
    assert set(step.emitted) == {"a", "b"}
    assert step.kv_tokens == 11


def test_exhausted_blocks_preempt_the_newest_and_everything_still_finishes() -> None:
    # 6 blocks of 4 tokens; each request grows to 8 + 12 = 20 tokens = 5 blocks.
    s = BatchScheduler(BlockAllocator(num_blocks=6, block_size=4))
    s.add(SimRequest(id="old", prompt_tokens=8, output_tokens=12))
    s.add(SimRequest(id="new", prompt_tokens=8, output_tokens=12))
    tokens, _ = run(s)
    assert s.preemptions >= 1
    assert tokens == Counter({"old": 12, "new": 12})  # no token lost or duplicated
    assert s.allocator.free_blocks == 6


def test_abort_frees_blocks_wherever_the_request_is() -> None:
    s = BatchScheduler(BlockAllocator(num_blocks=10, block_size=16))
    s.add(SimRequest(id="a", prompt_tokens=64, output_tokens=50))
    s.add(SimRequest(id="b", prompt_tokens=64, output_tokens=50))
    s.step()
    assert s.allocator.free_blocks < 10
    assert s.abort("a")
    assert s.abort("b")
    assert not s.abort("b")
    assert s.allocator.free_blocks == 10
    assert not s.running
    assert not s.waiting
