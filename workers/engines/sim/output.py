"""The simulator's output model: what text a request produces.

The extractive summary of the document for ``summarize``, a pseudo-completion built from the
prompt's own words for ``complete``, cut to ``max_tokens`` tokens. Deterministic: the same
request always gives the same pieces. Sampling parameters: a ``seed`` picks another
completion (the same one for the same seed), the output ends before the first ``stop``
string it would contain, and ``temperature`` and ``top_p`` change nothing. The output ends
as vLLM says it did (``finish_reason``).
"""

from __future__ import annotations

import hashlib
import random
import re
from itertools import pairwise

from schemas.jobs import FinishReason, JobKind
from workers.engines.base import GenerationRequest
from workers.engines.sim.summarize import summarize
from workers.engines.sim.tokens import tokenize

COMPLETION_MARK = "[sim]"
"""The first piece of every simulated completion, so nobody mistakes it for a model's text."""

_WORD = re.compile(r"\w+(?:['\u2019]\w+)*")
_FALLBACK_WORDS = ("simulated", "output", "for", "an", "empty", "prompt")
MIN_COMPLETION_WORDS = 12
MAX_EXTRA_COMPLETION_WORDS = 120


def simulated_output(request: GenerationRequest) -> list[str]:
    """The pieces the simulator decodes for ``request``, at most ``max_tokens`` of them."""
    sampling = request.sampling
    if request.kind is JobKind.SUMMARIZE:
        text = summarize(request.input, max_tokens=request.max_tokens)
    else:
        text = pseudo_completion(request.input, seed=sampling.seed if sampling else None)
    pieces = tokenize(text)[: max(0, request.max_tokens)]
    if sampling is not None and sampling.stop:
        return tokenize(cut_at_stop("".join(pieces), sampling.stop))
    return pieces


def finish_reason(pieces: list[str], max_tokens: int) -> FinishReason:
    """Why vLLM would say an output of ``pieces`` ended: ``stop`` when its text ended first
    (the model's end-of-text token came within ``max_tokens``, or a ``stop`` string cut it),
    ``length`` when it took all of them; vLLM checks the end-of-text token before the
    length (``v1/core/sched/utils.py`` ``check_stop``), so only text that fills
    ``max_tokens`` is cut."""
    return "stop" if len(pieces) < max_tokens else "length"


def cut_at_stop(text: str, stop: tuple[str, ...]) -> str:
    """``text`` up to the first of the ``stop`` strings in it (left out, as OpenAI does)."""
    ends = [at for at in (text.find(s) for s in stop) if at >= 0]
    return text[: min(ends)] if ends else text


def pseudo_completion(prompt: str, *, seed: int | None = None) -> str:
    """A deterministic continuation of ``prompt`` made of the prompt's own words.

    A random walk over the prompt's word pairs, seeded by a hash of the prompt, cut into
    sentences. Its length depends on the prompt (its hash and its length); it always starts
    with ``COMPLETION_MARK``. A ``seed`` is hashed in with the prompt.
    """
    salted = prompt if seed is None else f"{seed}\x00{prompt}"
    seed = int.from_bytes(hashlib.sha256(salted.encode("utf-8")).digest()[:8], "big")
    rng = random.Random(seed)
    words = _WORD.findall(prompt) or list(_FALLBACK_WORDS)
    following: dict[str, list[str]] = {}
    for current, after in pairwise(words):
        following.setdefault(current.lower(), []).append(after)
    length = MIN_COMPLETION_WORDS + min(MAX_EXTRA_COMPLETION_WORDS, seed % 48 + len(words) // 4)
    out: list[str] = [COMPLETION_MARK]
    word = rng.choice(words)
    while len(out) <= length:  # whole sentences until the length is reached
        sentence_words = rng.randint(6, 14)
        for position in range(sentence_words):
            out.append(word.capitalize() if position == 0 else word.lower())
            word = rng.choice(following.get(word.lower()) or words)
        out[-1] += "."
    return " ".join(out)
