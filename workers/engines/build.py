"""The engine a worker runs, built from its settings group (``settings.worker.engine``)."""

from __future__ import annotations

from plumbing.settings import Engines
from plumbing.settings.engines import SimSettings
from workers.engines.base import InferenceEngine
from workers.engines.sim.engine import SimEngine


def build_sim_engine(sim: SimSettings) -> SimEngine:
    return SimEngine(
        block_size=sim.sim_block_size,
        num_blocks=sim.sim_num_blocks,
        max_num_seqs=sim.sim_max_num_seqs,
        max_num_batched_tokens=sim.sim_max_num_batched_tokens,
        time_scale=sim.sim_time_scale,
        max_model_len=sim.sim_max_model_len,
    )


def build_engine(name: str, engines: Engines) -> InferenceEngine:
    """The engine ``name`` (``settings.worker.engine``), from its own group."""
    if name == "sim":
        return build_sim_engine(engines.sim)
    if name == "vllm_http":
        from workers.engines.vllm.http import VllmHttpEngine

        vllm = engines.vllm
        return VllmHttpEngine(
            base_url=vllm.vllm_url,
            model=vllm.vllm_model,
            metrics_interval_s=vllm.vllm_metrics_interval_s,
            request_timeout_s=vllm.vllm_request_timeout_s,
        )
    if name == "llamacpp":
        from workers.engines.llamacpp.engine import LlamaCppEngine

        llama = engines.llamacpp
        return LlamaCppEngine(
            base_url=llama.llamacpp_url,
            temperature=llama.llamacpp_temperature,
            repeat_penalty=llama.llamacpp_repeat_penalty,
            poll_interval_s=llama.llamacpp_poll_interval_s,
            request_timeout_s=llama.llamacpp_request_timeout_s,
        )
    if name == "vllm_local":
        from workers.engines.vllm.local import VllmLocalEngine

        vllm = engines.vllm
        return VllmLocalEngine(
            model=vllm.vllm_model,
            gpu_memory_utilization=vllm.vllm_gpu_memory_utilization,
            max_model_len=vllm.vllm_max_model_len,
            block_size=vllm.vllm_block_size,
            max_num_seqs=vllm.vllm_max_num_seqs,
        )
    raise ValueError(f"unknown engine {name!r}")
