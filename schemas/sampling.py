"""The model and sampling parameters a request may carry, with OpenAI's names and ranges.

They are stored with the job (the ``params`` column, only those given) and applied by the
worker's engine. ``model`` must be one of the deployment's served names (``models``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BaseModel, Field, StrictFloat, StrictInt, StrictStr

from schemas.errors import SluicegateError

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
