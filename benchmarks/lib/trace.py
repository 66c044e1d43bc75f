"""The arrival trace of the overload benchmark, and what each caller does after it submits.

Poisson arrivals at a fixed rate; summarization jobs of prose made of ``WORDS``; deadlines
from a log-normal spread in multiples of the engine's saturated service time (median 2.5x,
from 1x, tight, to 5x); a share of callers cancel, or stop polling and so let their
heartbeat lease lapse.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

WORDS = (
    "the",
    "lock",
    "gate",
    "canal",
    "basin",
    "water",
    "level",
    "boat",
    "crew",
    "harbour",
    "master",
    "survey",
    "silt",
    "dredging",
    "winter",
    "fleet",
    "channel",
    "pump",
    "sluice",
    "valve",
    "pressure",
    "river",
    "flood",
    "tide",
    "lever",
    "keeper",
    "bridge",
    "mooring",
    "cargo",
    "barge",
    "towpath",
    "engine",
    "weir",
    "reservoir",
    "spillway",
    "measured",
    "reported",
)


def document(rng: random.Random, tokens: int) -> str:
    """About ``tokens`` simulator tokens of prose (one per word and per full stop)."""
    sentences, count = [], 0
    while count < tokens:
        length = rng.randint(8, 20)
        words = [rng.choice(WORDS) for _ in range(length)]
        sentences.append(" ".join(words).capitalize() + ".")
        count += length + 1
    return " ".join(sentences)


Action = Literal["stay", "cancel", "leave"]


@dataclass(frozen=True, kw_only=True)
class Arrival:
    index: int
    at_s: float  # from the start of the run
    doc: str
    max_tokens: int
    ttl_s: float
    action: Action
    action_after_s: float  # cancel, or stop polling, this long after arriving


@dataclass(frozen=True, kw_only=True)
class Mix:
    prompt_tokens: tuple[int, int] = (300, 1200)
    max_tokens: tuple[int, int] = (32, 128)  # summaries run to max_tokens: lengths vary
    # Deadlines in multiples of the engine's service time of a job when saturated.
    ttl_median: float = 2.5
    ttl_sigma: float = 0.5
    ttl_range: tuple[float, float] = (1.0, 5.0)
    cancel_share: float = 0.05
    leave_share: float = 0.05


def ttl(rng: random.Random, mix: Mix, service_s: float) -> float:
    low, high = mix.ttl_range
    draw = rng.lognormvariate(math.log(mix.ttl_median), mix.ttl_sigma)
    return service_s * min(high, max(low, draw))


def trace(
    rate: float, duration_s: float, mix: Mix, *, service_s: float, seed: int = 5
) -> list[Arrival]:
    rng = random.Random(seed)
    out: list[Arrival] = []
    at = rng.expovariate(rate)
    while at < duration_s:
        deadline_s = ttl(rng, mix, service_s)
        draw = rng.random()
        action: Action = (
            "cancel"
            if draw < mix.cancel_share
            else "leave"
            if draw < mix.cancel_share + mix.leave_share
            else "stay"
        )
        out.append(
            Arrival(
                index=len(out),
                at_s=at,
                doc=document(rng, rng.randint(*mix.prompt_tokens)),
                max_tokens=rng.randint(*mix.max_tokens),
                ttl_s=deadline_s,
                action=action,
                action_after_s=rng.uniform(0.2, deadline_s),
            )
        )
        at += rng.expovariate(rate)
    return out


def backlog(count: int, mix: Mix, seed: int = 9) -> list[tuple[str, int]]:
    """Documents and max_tokens of the same mix, for measuring the engine's capacity."""
    rng = random.Random(seed)
    return [
        (document(rng, rng.randint(*mix.prompt_tokens)), rng.randint(*mix.max_tokens))
        for _ in range(count)
    ]
