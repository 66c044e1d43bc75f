"""Model and GPU profiles, and the roofline step-time model of the simulator.

Decode is memory-bandwidth bound: every step reads the weights once and the KV cache of every
running request. Prefill is compute bound: 2 FLOPs per parameter per token. A step that mixes
both (chunked prefill beside decodes) takes the larger of the two, plus a fixed overhead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ModelProfile:
    name: str
    params: float
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2  # bf16

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, for every layer and KV head (grouped-query attention)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes


@dataclass(frozen=True, kw_only=True)
class GpuProfile:
    name: str
    memory_bytes: float
    hbm_bytes_per_s: float
    peak_flops: float  # dense bf16
    memory_utilization: float = 0.9
    prefill_efficiency: float = 0.5  # achieved fraction of peak FLOP/s in prefill
    activation_reserve_bytes: float = 4e9  # activations, CUDA graphs, workspace


# An 8B Llama-class model with grouped-query attention (Llama 3.1 8B's shape).
LLAMA_8B = ModelProfile(name="llama-8b", params=8.03e9, layers=32, kv_heads=8, head_dim=128)
# An 80 GB GPU of the H100 SXM class.
GPU_80GB = GpuProfile(
    name="80GB-HBM3", memory_bytes=80e9, hbm_bytes_per_s=3.35e12, peak_flops=989e12
)


def num_gpu_blocks(model: ModelProfile, gpu: GpuProfile, block_size: int) -> int:
    """KV blocks that fit beside the weights, as vLLM sizes its cache."""
    budget = gpu.memory_bytes * gpu.memory_utilization - model.weight_bytes
    budget -= gpu.activation_reserve_bytes
    if budget <= 0:
        raise ValueError(f"{model.name} does not fit on {gpu.name}")
    return math.floor(budget / (model.kv_bytes_per_token * block_size))


@dataclass(frozen=True, kw_only=True)
class Roofline:
    model: ModelProfile
    gpu: GpuProfile
    overhead_s: float = 0.003  # scheduling, sampling, kernel launches

    def step_s(self, *, prefill_tokens: int, decode_requests: int, kv_tokens: int) -> float:
        """Time of one engine step.

        ``kv_tokens`` is the KV context the decoding requests read this step.
        """
        if prefill_tokens == 0 and decode_requests == 0:
            return 0.0
        memory_s = (
            self.model.weight_bytes + kv_tokens * self.model.kv_bytes_per_token
        ) / self.gpu.hbm_bytes_per_s
        flops = 2 * self.model.params * (prefill_tokens + decode_requests)
        compute_s = flops / (self.gpu.peak_flops * self.gpu.prefill_efficiency)
        return max(memory_s, compute_s) + self.overhead_s

    def per_token_latency_s(self, *, batch: int, context_tokens: int) -> float:
        """Decode latency each request sees with ``batch`` requests of ``context_tokens``."""
        return self.step_s(
            prefill_tokens=0, decode_requests=batch, kv_tokens=batch * context_tokens
        )
