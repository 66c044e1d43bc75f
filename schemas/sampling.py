"""What a request may ask for besides its input, stored with its job (the ``params`` column,
only what was given) and applied by the worker's engine.

- The model and sampling parameters, with OpenAI's names and ranges. ``model`` must be one
  of the deployment's served names (``models``).
- For a summary (``POST /v1/jobs`` with kind ``summarize``, a batch line of
  ``/v1/summarize`` or ``/v1/jobs``), ``summary``: a preset style, or the caller's own
  instructions, with an output language and a length in words. The worker composes the one
  instruction every engine is given with ``instruction`` (``workers.engines.prompts`` puts
  it before the document, or as the system message); a job graph's chunk and reduce jobs
  compose theirs with the same function, so a document split in parts reads the same
  request.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_validator,
)

from schemas.errors import InvalidRequest, SluicegateError
from schemas.jobs import JobKind

MAX_STOP = 4  # OpenAI's limit on stop sequences
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1  # vLLM's bounds (a 64-bit integer)

StopString = Annotated[StrictStr, Field(min_length=1)]


class ModelNotFound(SluicegateError):
    """``model`` names a model this deployment does not serve (setting ``models``)."""

    code = "model_not_found"
    status = 404


class SamplingFields(BaseModel):
    """OpenAI's ``model``, ``temperature``, ``top_p``, ``stop`` and ``seed`` (null: the
    engine's default). ``max_tokens`` stays with each body."""

    model: Annotated[StrictStr, Field(min_length=1, max_length=256)] | None = Field(
        default=None, description="One of the deployment's served models (setting models)"
    )
    temperature: Annotated[StrictFloat | StrictInt, Field(ge=0, le=2)] | None = Field(
        default=None, description="Sampling temperature, 0 to 2 (0: greedy)"
    )
    top_p: Annotated[StrictFloat | StrictInt, Field(gt=0, le=1)] | None = Field(
        default=None, description="Nucleus sampling: the probability mass kept, over 0 up to 1"
    )
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP)] | None = Field(
        default=None, description="Up to 4 sequences where the output stops (not included)"
    )
    seed: Annotated[StrictInt, Field(ge=SEED_MIN, le=SEED_MAX)] | None = Field(
        default=None,
        description="Sampling seed: the same seed, the same output where the "
        "engine is deterministic",
    )

    def stored_params(self) -> dict[str, Any] | None:
        """The parameters given, as the job's ``params`` column holds them (``stop`` a
        list); None when none is."""
        return sampling_params(
            model=self.model,
            temperature=self.temperature,
            top_p=self.top_p,
            stop=self.stop,
            seed=self.seed,
        )


def sampling_params(
    *,
    model: str | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    stop: str | Sequence[str] | None = None,
    seed: int | None = None,
) -> dict[str, Any] | None:
    """The stored form of some parameters (None ones left out; None when all are)."""
    stops = [stop] if isinstance(stop, str) else list(stop) if stop else None
    given = {"model": model, "temperature": temperature, "top_p": top_p, "stop": stops}
    params = {key: value for key, value in given.items() if value is not None}
    if seed is not None:
        params["seed"] = seed
    return params or None


def check_model(model: str | None, served: Sequence[str]) -> None:
    """ModelNotFound unless ``model`` is unset or one of the ``served`` names."""
    if model is not None and model not in served:
        raise ModelNotFound(f"The model `{model}` does not exist or you do not have access to it.")


# What summary a summarize job asks for.

MAX_INSTRUCTIONS = 2000  # characters of free-text instructions
MAX_LANGUAGE = 40  # "Brazilian Portuguese", "zh-Hant-TW"
MAX_WORDS = 2000
# A language's name or a BCP-47 tag: letters first, then words joined by a space or a hyphen.
LANGUAGE_PATTERN = r"^[^\W\d_]\w*(?:[ -]\w+)*$"
_BLANK_LINES = re.compile(r"\n\s*\n")


class SummaryStyle(StrEnum):
    CONCISE = "concise"  # the default
    BULLETS = "bullets"
    KEY_FACTS = "key_facts"
    HEADLINE = "headline"


PRESETS: dict[SummaryStyle, str] = {
    SummaryStyle.CONCISE: "Summarize the following document concisely, in plain prose.",
    SummaryStyle.BULLETS: (
        "Summarize the following document as a short list of bullet points, one point per "
        'line, each line starting with "- ".'
    ),
    SummaryStyle.KEY_FACTS: (
        "List the key facts of the following document, one per line, keeping every number, "
        "date and amount exactly as the document gives it."
    ),
    SummaryStyle.HEADLINE: "Write a single headline for the following document, on one line.",
}
DEFAULT_INSTRUCTION = PRESETS[SummaryStyle.CONCISE]


class SummaryNotApplicable(InvalidRequest):
    """``summary`` was given for a job that is not a summary (kind ``complete``)."""

    code = "summary_not_applicable"


class SummaryOptions(BaseModel):
    """The summary asked for. ``style`` picks a preset (``concise`` when neither it nor
    ``instructions`` is given); ``instructions`` replaces the preset's text (give one or the
    other). ``language`` and ``words`` are added to either."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    style: SummaryStyle | None = Field(
        default=None,
        description="concise (plain prose, the default), bullets (bullet points), key_facts "
        "(the key facts with their numbers) or headline (one headline)",
    )
    instructions: Annotated[StrictStr, Field(min_length=1, max_length=MAX_INSTRUCTIONS)] | None = (
        Field(
            default=None,
            description="Your own instruction for the model, instead of a style's (blank lines "
            "are closed up)",
        )
    )
    language: (
        Annotated[
            StrictStr,
            Field(min_length=1, max_length=MAX_LANGUAGE, pattern=LANGUAGE_PATTERN),
        ]
        | None
    ) = Field(default=None, description='The output\'s language: a name ("French") or a BCP-47 tag')
    words: Annotated[StrictInt, Field(ge=1, le=MAX_WORDS)] | None = Field(
        default=None, description="About how many words the summary should have"
    )

    @model_validator(mode="after")
    def _one_text(self) -> SummaryOptions:
        if self.style is not None and self.instructions is not None:
            raise ValueError("give style or instructions, not both (instructions replace it)")
        if self.instructions is not None and not self.instructions.strip():
            raise ValueError("instructions is blank")
        return self

    def stored(self) -> dict[str, Any] | None:
        """The fields given, as a job's ``params`` holds them; None when none is."""
        return self.model_dump(mode="json", exclude_none=True) or None


def instruction(options: SummaryOptions | None) -> str:
    """The instruction a summary's model is given: the preset's text (or the caller's own,
    its line ends made ``\\n`` and its blank lines closed up, so the prompt's layout stays
    unambiguous), then the language and the length, each a sentence of its own."""
    if options is None:
        return DEFAULT_INSTRUCTION
    if options.instructions is not None:
        lines = options.instructions.replace("\r\n", "\n").replace("\r", "\n")
        text = _BLANK_LINES.sub("\n", lines.strip())
    else:
        text = PRESETS[options.style or SummaryStyle.CONCISE]
    if options.language is not None:
        text += f" Write your answer in {options.language}."
    if options.words is not None:
        text += f" Use about {options.words} words."
    return text


def summary_params(
    params: dict[str, Any] | None, options: SummaryOptions | None
) -> dict[str, Any] | None:
    """A job's stored ``params`` with its summary options (``summary``) added, when any
    field of them is given."""
    stored = options.stored() if options is not None else None
    if stored is None:
        return params
    return {**(params or {}), "summary": stored}


def check_summary(kind: JobKind, options: SummaryOptions | None) -> None:
    """SummaryNotApplicable when ``summary`` is given for a job that is not a summary."""
    if options is not None and kind is not JobKind.SUMMARIZE:
        raise SummaryNotApplicable(
            f"summary applies to summarize jobs only, not to kind {kind.value}"
        )


def options_of(params: Mapping[str, Any] | None) -> SummaryOptions | None:
    """The summary options a job's ``params`` holds (None: none, the default summary)."""
    stored = (params or {}).get("summary")
    return SummaryOptions.model_validate(stored) if stored else None
