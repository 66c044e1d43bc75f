"""What the model is asked to do for each kind of job, shared by every real engine.

``summarize`` jobs carry the document alone; the instruction is added here, once, so a
``vllm serve``, an in-process vLLM and llama.cpp all see the same request. ``complete`` jobs
are sent as they are.

Two shapes, for the two kinds of endpoint:

- ``build_prompt``: plain text for a completion endpoint (vLLM's ``/v1/completions``,
  ``AsyncLLM.generate``). No chat template is applied, so it works for base and instruct
  models alike.
- ``chat_messages``: OpenAI chat messages for a chat endpoint (llama.cpp's
  ``/v1/chat/completions``), where the server applies the model's own chat template.
"""

from __future__ import annotations

from schemas.jobs import JobKind

SUMMARIZE_INSTRUCTION = "Summarize the following document concisely, in plain prose."


def build_prompt(kind: JobKind, text: str) -> str:
    """The plain-text prompt the model sees for a job of ``kind`` with input ``text``."""
    if kind is JobKind.SUMMARIZE:
        return f"{SUMMARIZE_INSTRUCTION}\n\nDocument:\n{text}\n\nSummary:"
    return text


def document_of(prompt: str) -> str:
    """The document inside a summarize prompt made by ``build_prompt`` (the prompt itself if
    it is not one): the simulator's summaries are extracts of the document alone."""
    head, tail = f"{SUMMARIZE_INSTRUCTION}\n\nDocument:\n", "\n\nSummary:"
    if prompt.startswith(head) and prompt.endswith(tail):
        return prompt[len(head) : -len(tail)]
    return prompt


def chat_messages(kind: JobKind, text: str) -> list[dict[str, str]]:
    """The chat messages for a job of ``kind``: the instruction as the system message."""
    if kind is JobKind.SUMMARIZE:
        return [
            {"role": "system", "content": SUMMARIZE_INSTRUCTION},
            {"role": "user", "content": text},
        ]
    return [{"role": "user", "content": text}]
