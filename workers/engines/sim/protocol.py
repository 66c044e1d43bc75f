"""The sim-server's OpenAI-compatible wire format, as ``vllm serve`` speaks it: the request
bodies it parses, its OpenAI-style error bodies, server-sent events, and the made-up token
ids ``/tokenize`` and ``return_token_ids`` report.
"""

from __future__ import annotations

import json
import math
import zlib
from http import HTTPStatus
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from schemas.jobs import JobKind
from workers.engines.base import SamplingParams
from workers.engines.errors import EngineError

_VOCAB = 128_256  # token ids /tokenize reports are made-up hashes below this
EOS_ID = 128_009  # the id of the token that ends an output by itself (Llama 3's <|eot_id|>)


class StreamOptions(BaseModel):
    include_usage: bool | None = False


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # as vLLM's OpenAIBaseModel

    model: str | None = None
    prompt: str
    max_tokens: int = Field(default=16, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stream_interval: int | None = Field(default=None, ge=1)
    return_token_ids: bool = False
    sluicegate_kind: JobKind = JobKind.COMPLETE
    # Sampling: unbounded here as in vLLM's request model; checked by ``sampling_refusal``
    # as vLLM's SamplingParams checks them.
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)

    def sampling(self) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else self.stop or []
        return SamplingParams(
            model=self.model,
            temperature=self.temperature,
            top_p=self.top_p,
            stop=tuple(s for s in stop if s),
            seed=self.seed,
        )


class TokenizeRequest(BaseModel):
    model: str | None = None
    prompt: str


class AbortRequest(BaseModel):
    request_ids: list[str] | None = None


def error_response(status: HTTPStatus, message: str, kind: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, kind), status_code=status)


def error_body(status: HTTPStatus, message: str, kind: str | None = None) -> dict[str, Any]:
    error = {"message": message, "type": kind or status.phrase, "param": None, "code": status}
    return {"error": error}


def sampling_refusal(body: CompletionRequest) -> tuple[str, str, float] | None:
    """(message, parameter, value) of a sampling value vLLM 0.33 refuses, as its
    ``SamplingParams._verify_args`` words it (``vllm/sampling_params.py`` 656-679); its
    server answers 400 ``BadRequestError`` with ``param`` set and the message followed by
    the parameter and value (``vllm/exceptions.py`` 49-56,
    ``vllm/entrypoints/serve/exception_handling/error_response.py`` 43-46)."""
    t = body.temperature
    if t is not None:
        if not math.isfinite(t):
            return f"temperature must be a finite number, got {t}.", "temperature", t
        if t < 0.0:
            return f"temperature must be non-negative, got {t}.", "temperature", t
        if t > 2.0:
            return f"temperature must be in [0, 2], got {t}.", "temperature", t
    if body.top_p is not None and not 0.0 < body.top_p <= 1.0:
        return f"top_p must be in (0, 1], got {body.top_p}.", "top_p", body.top_p
    return None


def validation_response(message: str, parameter: str, value: float) -> JSONResponse:
    body = error_body(
        HTTPStatus.BAD_REQUEST,
        f"{message} (parameter={parameter}, value={value})",
        "BadRequestError",
    )
    body["error"]["param"] = parameter
    return JSONResponse(body, status_code=HTTPStatus.BAD_REQUEST)


def engine_status(exc: EngineError) -> HTTPStatus:
    """vLLM answers 400 to a request it refuses, 503 when the engine cannot serve it."""
    return HTTPStatus.SERVICE_UNAVAILABLE if exc.retriable else HTTPStatus.BAD_REQUEST


def sse(payload: object) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def token_id(piece: str) -> int:
    return zlib.crc32(piece.encode()) % _VOCAB


def unknown_model(name: str) -> JSONResponse:
    return error_response(
        HTTPStatus.NOT_FOUND, f"The model `{name}` does not exist.", "NotFoundError"
    )
