"""Continuous batching over paged KV blocks, step by step, as vLLM's scheduler does it.

Each step has a token budget (``max_num_batched_tokens``). Running requests go first: a
request still prefilling takes a chunk of its prompt, a decoding request takes one token and
may need one more block. When a decode needs a block and none is free, the newest running
request is preempted: its blocks are freed and it goes back to the front of the queue, to be
recomputed (its prompt and the tokens it had decoded are prefilled again). Waiting requests
are admitted in order while the budget and the free blocks allow, and none are admitted in a
step that preempted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from workers.engines.sim.blocks import BlockAllocator


@dataclass
class SimRequest:
    id: str
    prompt_tokens: int
    output_tokens: int
    prefilled: int = 0  # tokens of prompt (+ recomputed output) in the KV cache
    decoded: int = 0
    preemptions: int = 0

    @property
    def context(self) -> int:
        """Every token of the sequence so far: prompt and decoded output."""
        return self.prompt_tokens + self.decoded

    @property
    def prefill_target(self) -> int:
        """KV to compute before decoding: the prompt, or after a preemption every token but
        the last one (the next decode step processes that one)."""
        return self.prompt_tokens if self.decoded == 0 else self.context - 1

    @property
    def prefilling(self) -> bool:
        return self.prefilled < self.prefill_target

    @property
    def done(self) -> bool:
        return self.decoded >= self.output_tokens


@dataclass(frozen=True, kw_only=True)
class Step:
    prefill_tokens: int
    decode_requests: int
    kv_tokens: int  # KV context read by the decodes
    emitted: tuple[str, ...]  # requests that produced one token this step
    finished: tuple[str, ...]
    preempted: tuple[str, ...]

    @property
    def idle(self) -> bool:
        return self.prefill_tokens == 0 and self.decode_requests == 0


@dataclass
class BatchScheduler:
    allocator: BlockAllocator
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    waiting: deque[SimRequest] = field(default_factory=deque)
    running: list[SimRequest] = field(default_factory=list)
    preemptions: int = 0

    def add(self, request: SimRequest) -> None:
        self.waiting.append(request)

    def abort(self, request_id: str) -> bool:
        """Drop the request wherever it is and free its blocks."""
        for queue in (self.running, self.waiting):
            for request in list(queue):
                if request.id == request_id:
                    queue.remove(request)
                    self.allocator.release(request_id)
                    return True
        return False

    def step(self) -> Step:
        budget = self.max_num_batched_tokens
        prefill = decodes = kv = 0
        emitted: list[str] = []
        preempted: list[str] = []
        for request in list(self.running):
            if request not in self.running:
                continue  # preempted earlier in this step
            if budget <= 0:
                break
            if request.prefilling:
                chunk = min(request.prefill_target - request.prefilled, budget)
                if not self._grow(request, request.prefilled + chunk, preempted):
                    continue
                request.prefilled += chunk
                prefill += chunk
                budget -= chunk
                if not request.prefilling and request.decoded == 0:
                    emitted.append(request.id)  # the first token is sampled after prefill
            else:
                # Process the last sampled token (its KV is written now), sample the next.
                if not self._grow(request, request.context, preempted):
                    continue
                request.prefilled += 1
                decodes += 1
                kv += request.context
                budget -= 1
                emitted.append(request.id)
        if not preempted:
            admitted = self._admit(budget, emitted)
            prefill += admitted
        for request in self.running:
            if request.id in emitted:
                request.decoded += 1
        finished = [r for r in self.running if r.done]
        for request in finished:
            self.running.remove(request)
            self.allocator.release(request.id)
        return Step(
            prefill_tokens=prefill,
            decode_requests=decodes,
            kv_tokens=kv,
            emitted=tuple(emitted),
            finished=tuple(r.id for r in finished),
            preempted=tuple(preempted),
        )

    def _grow(self, request: SimRequest, tokens: int, preempted: list[str]) -> bool:
        """Find blocks for ``request``, preempting the newest running requests if needed.
        False when ``request`` itself had to be preempted."""
        while not self.allocator.can_grow_to(request.id, tokens):
            victim = self.running[-1]
            self._preempt(victim)
            preempted.append(victim.id)
            if victim is request:
                return False
        self.allocator.grow_to(request.id, tokens)
        return True

    def _preempt(self, request: SimRequest) -> None:
        self.running.remove(request)
        self.allocator.release(request.id)
        request.prefilled = 0  # recompute: the KV is gone
        request.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(request)

    def _admit(self, budget: int, emitted: list[str]) -> int:
        """Start waiting requests in order while budget and blocks allow; returns the
        prefill tokens scheduled for them."""
        scheduled = 0
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            chunk = min(request.prefill_target - request.prefilled, budget)
            if not self.allocator.can_grow_to(request.id, request.prefilled + chunk):
                break
            self.waiting.popleft()
            self.allocator.grow_to(request.id, request.prefilled + chunk)
            request.prefilled += chunk
            budget -= chunk
            scheduled += chunk
            self.running.append(request)
            if not request.prefilling and request.decoded == 0:
                emitted.append(request.id)
        return scheduled
