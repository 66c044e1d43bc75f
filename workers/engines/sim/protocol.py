"""The sim-server's OpenAI-compatible wire format, as ``vllm serve`` speaks it: the request
bodies it parses, its OpenAI-style error bodies, server-sent events, and the made-up token
ids ``/tokenize`` and ``return_token_ids`` report.
"""

from __future__ import annotations

import json
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
    # Sampling, with vLLM's bounds (its SamplingParams refuses the rest with a 400).
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
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
