"""Settings of the inference engines: the simulator, vLLM (HTTP or in process), llama.cpp."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field

from plumbing.settings.base import SettingsGroup


class SimSettings(SettingsGroup):
    """The simulator engine (`engine=sim`, and `sluicegate sim-server`): an 8B Llama-class
    model on an 80 GB GPU by default."""

    title: ClassVar[str] = "Simulator engine"
    path: ClassVar[str] = "engines.sim"

    sim_time_scale: float = Field(
        default=1.0,
        ge=0,
        description="Multiplies every simulated step's roofline time (0: as fast as the CPU "
        "allows).",
    )
    sim_num_blocks: int | None = Field(
        default=None,
        ge=1,
        description="KV-cache blocks of the simulated GPU. Unset: sized from the model and "
        "GPU profiles.",
    )
    sim_block_size: int = Field(default=16, ge=1, description="Tokens per KV-cache block.")
    sim_max_num_seqs: int = Field(
        default=256, ge=1, description="Sequences the simulator decodes at once (vLLM's)."
    )
    sim_max_num_batched_tokens: int = Field(
        default=8192, ge=1, description="Tokens one simulated step processes at most (vLLM's)."
    )
    sim_max_model_len: int | None = Field(
        default=None,
        ge=16,
        description="Tokens one request's prompt and output may hold together (vLLM's "
        "`max_model_len`); a longer summarize job becomes a graph. Unset: the whole cache's.",
    )


class VllmSettings(SettingsGroup):
    """The vLLM engines: `vllm_http`, a `vllm serve` (or `sluicegate sim-server`) at
    `vllm_url`; `vllm_local`, an in-process AsyncLLM of `vllm_model` (needs the vllm extra and
    a GPU)."""

    title: ClassVar[str] = "vLLM engines"
    path: ClassVar[str] = "engines.vllm"

    vllm_url: str = Field(
        default="http://127.0.0.1:8001",
        description="Base URL of the vLLM server (`vllm_http`).",
    )
    vllm_model: str = Field(
        default="meta-llama/Llama-3.1-8B-Instruct",
        description="The model: the name requests and metrics carry (`vllm_http`, and the "
        "sim-server's default name), the model loaded (`vllm_local`).",
    )
    vllm_metrics_interval_s: float = Field(
        default=0.1,
        gt=0,
        description="How often `vllm_http` scrapes the server's `/metrics` for its capacity.",
    )
    vllm_request_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="Longest `vllm_http` waits on the server in one request (connecting "
        "excepted): the longest a stream may stay silent.",
    )
    vllm_gpu_memory_utilization: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="Fraction of GPU memory `vllm_local` gives vLLM (vLLM's "
        "`gpu_memory_utilization`).",
    )
    vllm_max_model_len: int | None = Field(
        default=None,
        ge=1,
        description="Context length of `vllm_local` (vLLM's `max_model_len`). Unset: the model's.",
    )
    vllm_block_size: int = Field(
        default=16, ge=1, description="KV-cache block size of `vllm_local`, in tokens."
    )
    vllm_max_num_seqs: int = Field(
        default=256,
        ge=1,
        description="Sequences `vllm_local` decodes at once (vLLM's `max_num_seqs`).",
    )


class LlamacppSettings(SettingsGroup):
    """The llama.cpp engine (`engine=llamacpp`): a llama.cpp server (`sluicegate
    llama-server`, which `up --engine llamacpp` runs per worker) at `llamacpp_url`, on a GGUF
    model: the one `sluicegate model pull` puts in `data_dir/models` when
    `llamacpp_model_path` is unset."""

    title: ClassVar[str] = "llama.cpp engine"
    path: ClassVar[str] = "engines.llamacpp"

    llamacpp_url: str = Field(
        default="http://127.0.0.1:8002",
        description="Base URL of the llama.cpp server; `sluicegate llama-server` listens on "
        "its port (on 127.0.0.1).",
    )
    llamacpp_model_path: Path | None = Field(
        default=None,
        description="The GGUF model `sluicegate llama-server` serves. Unset: the one "
        "`sluicegate model pull` put in `data_dir/models`.",
    )
    llamacpp_slots: int = Field(
        default=2,
        ge=1,
        description="Sequences decoded at once (llama.cpp's slots), each with a context of "
        "its own of `llamacpp_slot_context` tokens.",
    )
    llamacpp_slot_context: int = Field(
        default=2048,
        ge=64,
        description="Context of one slot, in tokens: prompt + max_tokens of a job must fit in one.",
    )
    llamacpp_threads: int = Field(
        default=2, ge=1, description="CPU threads of the llama.cpp server."
    )
    llamacpp_poll_interval_s: float = Field(
        default=0.05,
        gt=0,
        description="How often the worker reads the server's `/slots` (its capacity).",
    )
    llamacpp_request_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="Longest the worker waits on the server in one request.",
    )
    llamacpp_temperature: float = Field(
        default=0.2,
        ge=0,
        description="Sampling temperature of every job (0: greedy decoding).",
    )
    llamacpp_repeat_penalty: float = Field(
        default=1.2,
        ge=1,
        description="llama.cpp's penalty on repeating the last 64 tokens (1: none; a small "
        "model loops without one).",
    )
