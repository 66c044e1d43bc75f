"""The simulator's output model: what a request decodes to."""

from __future__ import annotations

import pytest

from schemas.jobs import JobKind
from workers.engines.base import GenerationRequest
from workers.engines.sim.output import COMPLETION_MARK, pseudo_completion, simulated_output
from workers.engines.sim.summarize import split_sentences, summarize
from workers.engines.sim.tokens import tokenize

DOC = (
    "The harbour master reopened the east basin on Friday. Dredging had removed most of the "
    "silt that stopped larger boats from mooring. Fishing crews said the basin is deep enough "
    "again for the winter fleet. A survey of the west basin will follow next spring."
)
PROMPT = "Write a short note about the harbour reopening and the winter fishing fleet."


def request(
    *, kind: JobKind = JobKind.SUMMARIZE, text: str = DOC, max_tokens: int = 200
) -> GenerationRequest:
    return GenerationRequest(request_id="r1", kind=kind, input=text, max_tokens=max_tokens)


def test_summarize_decodes_the_extractive_summary() -> None:
    pieces = simulated_output(request(max_tokens=30))
    text = "".join(pieces)
    assert text == summarize(DOC, max_tokens=30)
    assert pieces == tokenize(text)
    assert set(split_sentences(text)) <= set(split_sentences(DOC))


@pytest.mark.parametrize("max_tokens", [0, 1, 5, 17])
def test_max_tokens_respected(max_tokens: int) -> None:
    expected = {
        JobKind.SUMMARIZE: tokenize(summarize(DOC, max_tokens=max_tokens))[:max_tokens],
        JobKind.COMPLETE: tokenize(pseudo_completion(DOC))[:max_tokens],
    }
    for kind in JobKind:
        pieces = simulated_output(request(kind=kind, max_tokens=max_tokens))
        assert pieces == expected[kind]
        assert len(pieces) == max_tokens or kind is JobKind.SUMMARIZE


def test_completion_is_deterministic_and_marked() -> None:
    first = "".join(simulated_output(request(kind=JobKind.COMPLETE, text=PROMPT, max_tokens=999)))
    assert first == pseudo_completion(PROMPT) == pseudo_completion(PROMPT)
    assert first.startswith(COMPLETION_MARK)
    prompt_words = {w.lower().strip(".") for w in PROMPT.split()}
    body = first.removeprefix(COMPLETION_MARK).split()
    assert all(w.lower().strip(".") in prompt_words for w in body)


def test_completion_length_depends_on_the_prompt() -> None:
    lengths = {
        len(
            simulated_output(request(kind=JobKind.COMPLETE, text=f"{PROMPT} {i}.", max_tokens=9999))
        )
        for i in range(8)
    }
    assert len(lengths) > 1
    assert max(lengths) < 9999
