"""The request lines of OpenAI Batch input and what each asks for: its job's kind, input,
``max_tokens``, sampling parameters (``model``, ``temperature``, ``top_p``, ``stop``,
``seed``, applied by the worker's engine) and, for a summary, ``summary``
(``schemas.sampling``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from schemas.jobs import JobKind
from schemas.sampling import SamplingFields, SummaryOptions, check_summary, summary_params

# The urls a request line may name, and the job kind each becomes.
ENDPOINTS: Mapping[str, JobKind] = {
    "/v1/jobs": JobKind.SUMMARIZE,  # the body names its kind; summarize if it does not
    "/v1/summarize": JobKind.SUMMARIZE,
    "/v1/completions": JobKind.COMPLETE,
    "/v1/chat/completions": JobKind.COMPLETE,
}


class RequestLine(BaseModel):
    """One line of OpenAI Batch input."""

    model_config = ConfigDict(extra="forbid")

    custom_id: Annotated[StrictStr, Field(min_length=1, max_length=512)]
    method: Literal["POST"]
    url: StrictStr
    body: dict[str, Any]


class JobBody(SamplingFields):
    """The body of a ``/v1/jobs`` line: a job without its deadline (the batch's)."""

    model_config = ConfigDict(extra="forbid")

    kind: JobKind = JobKind.SUMMARIZE
    input: StrictStr
    max_tokens: Annotated[int, Field(ge=1, strict=True)] = 256
    summary: SummaryOptions | None = None

    def stored_params(self) -> dict[str, Any] | None:
        return summary_params(super().stored_params(), self.summary)


class CompletionBody(SamplingFields):
    """``/v1/completions``: other OpenAI fields are accepted and not applied."""

    model_config = ConfigDict(extra="allow")

    prompt: StrictStr
    max_tokens: Annotated[int, Field(ge=1, strict=True)] = 256


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: StrictStr
    content: StrictStr | list[dict[str, Any]]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(str(p.get("text", "")) for p in self.content if p.get("type") == "text")


class ChatBody(SamplingFields):
    """``/v1/chat/completions``: the messages become one prompt, ``role: content`` each."""

    model_config = ConfigDict(extra="allow")

    messages: Annotated[list[Message], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1, strict=True)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1, strict=True)] | None = None


@dataclass(frozen=True, kw_only=True)
class LineRequest:
    """What one request line asks for."""

    kind: JobKind
    input: str
    max_tokens: int
    model: str | None = None
    params: dict[str, Any] | None = None  # as stored with the job (schemas/sampling.py)


def line_request(line: RequestLine) -> LineRequest:
    """The job a request line asks for (pydantic's ValidationError or ValueError when its
    body does not fit its url, or a parameter is out of range; SummaryNotApplicable for a
    ``summary`` on a line that is not a summary)."""
    if line.url not in ENDPOINTS:
        raise ValueError(f"url {line.url!r} is not one of {', '.join(ENDPOINTS)}")
    body: SamplingFields
    if line.url in ("/v1/jobs", "/v1/summarize"):
        forced = {"kind": JobKind.SUMMARIZE.value} if line.url == "/v1/summarize" else {}
        body = job = JobBody.model_validate({**line.body, **forced})
        check_summary(job.kind, job.summary)
        kind, text, max_tokens = job.kind, job.input, job.max_tokens
    elif line.url == "/v1/completions":
        body = completion = CompletionBody.model_validate(line.body)
        kind, text, max_tokens = JobKind.COMPLETE, completion.prompt, completion.max_tokens
    else:
        body = chat = ChatBody.model_validate(line.body)
        kind = JobKind.COMPLETE
        text = "\n\n".join(f"{m.role}: {m.text()}" for m in chat.messages)
        max_tokens = chat.max_completion_tokens or chat.max_tokens or 256
    return LineRequest(
        kind=kind,
        input=text,
        max_tokens=max_tokens,
        model=body.model,
        params=body.stored_params(),
    )


def line_job(line: RequestLine) -> tuple[JobKind, str, int]:
    """The kind, input and max_tokens a request line asks for (errors as ``line_request``)."""
    request = line_request(line)
    return request.kind, request.input, request.max_tokens
