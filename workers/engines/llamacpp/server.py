"""``sluicegate llama-server``: llama.cpp's HTTP server (from ``xllamacpp``) on a GGUF model,
in this process, listening on loopback only.

Everything comes from Settings: the port of ``llamacpp_url`` (the host is always 127.0.0.1:
the server has no authentication), the model (``llamacpp_model_path``, or the one
``sluicegate model pull`` put in ``data_dir``), ``llamacpp_slots`` sequences of
``llamacpp_slot_context`` tokens each (llama.cpp splits its ``n_ctx`` evenly over its slots)
and ``llamacpp_threads``. It serves ``/health``, ``/props``, ``/slots``, ``/metrics``,
``/tokenize``, ``/apply-template`` and the OpenAI-compatible completion endpoints, which the
``llamacpp`` engine reads. It stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from plumbing.settings.engines import LlamacppSettings

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
QUIET = -1  # llama.cpp's log verbosity: nothing below errors


class ServerNotStarted(Exception):
    """llama.cpp's server did not start; the message says why and what to do."""


class ModelMissing(ServerNotStarted):
    pass


def server_params(llama: LlamacppSettings, model: Path) -> Any:
    """llama.cpp's ``common_params`` for the server, from its settings group."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(model)
    params.model_alias = {served_model_name(model)}  # its answers' `model`, not the path
    params.n_parallel = llama.llamacpp_slots
    params.n_ctx = llama.llamacpp_slots * llama.llamacpp_slot_context
    params.cpuparams.n_threads = llama.llamacpp_threads
    params.cpuparams_batch.n_threads = llama.llamacpp_threads
    params.endpoint_metrics = True
    params.endpoint_slots = True
    params.endpoint_props = True
    params.hostnames = [HOST]
    params.port = port_of(llama.llamacpp_url)
    params.verbosity = QUIET
    return params


def served_model_name(model: Path) -> str:
    """The name the server gives its model: the GGUF file's stem
    (``SmolLM2-135M-Instruct.Q4_1``)."""
    return model.stem


def port_of(url: str) -> int:
    port = urlsplit(url).port
    if port is None:
        raise ValueError(f"llamacpp_url {url!r} names no port")
    return port


async def serve(llama: LlamacppSettings, model: Path, stop: asyncio.Event) -> None:
    """Run the server on the GGUF file ``model`` until ``stop`` is set. ModelMissing if the
    file is not there, ServerNotStarted if llama.cpp refuses it."""
    if not await asyncio.to_thread(model.is_file):
        raise ModelMissing(f"no model at {model}: run `sluicegate model pull` first")
    import xllamacpp

    params = server_params(llama, model)
    try:
        server = await asyncio.to_thread(xllamacpp.Server, params)
    except RuntimeError as exc:  # xllamacpp says only that init failed; llama.cpp logs why
        raise ServerNotStarted(
            f"llama.cpp did not start on {model} at {HOST}:{params.port} ({exc}): the model "
            "may be damaged (`sluicegate model pull` checks and replaces it) or the port taken"
        ) from None
    # The only reference: xllamacpp stops the server when the object goes (``clear``).
    running = [server]
    del server
    log.info(
        "llama.cpp serving %s at http://%s:%d (%d slots of %d tokens, %d threads)",
        model.name,
        HOST,
        params.port,
        llama.llamacpp_slots,
        llama.llamacpp_slot_context,
        llama.llamacpp_threads,
    )
    try:
        await stop.wait()
    finally:
        await asyncio.to_thread(running.clear)
