"""What the model is asked to do for each kind of job, shared by every real engine.

``summarize`` jobs carry the document alone; the instruction is added here, once, so a
``vllm serve``, an in-process vLLM and llama.cpp all see the same request. The instruction is
the job's own (``schemas.sampling.instruction`` of its summary options, carried in
``SamplingParams.instruction``), else the default one. ``complete`` jobs are sent as they
are.

Two shapes, for the two kinds of endpoint:

- ``build_prompt``: plain text for a completion endpoint (vLLM's ``/v1/completions``,
  ``AsyncLLM.generate``). No chat template is applied, so it works for base and instruct
  models alike.
- ``chat_messages``: OpenAI chat messages for a chat endpoint (llama.cpp's
  ``/v1/chat/completions``), where the server applies the model's own chat template.
"""

from __future__ import annotations

from schemas.jobs import JobKind
from schemas.sampling import DEFAULT_INSTRUCTION

# An instruction never holds a blank line (schemas.sampling.instruction closes them up), so
# the first DOCUMENT mark of a prompt is the one after its instruction.
DOCUMENT, SUMMARY = "\n\nDocument:\n", "\n\nSummary:"


def build_prompt(kind: JobKind, text: str, instruction: str | None = None) -> str:
    """The plain-text prompt the model sees for a job of ``kind`` with input ``text``; a
    summary's ``instruction`` (None: the default one) comes first."""
    if kind is JobKind.SUMMARIZE:
        return f"{instruction or DEFAULT_INSTRUCTION}{DOCUMENT}{text}{SUMMARY}"
    return text


def split_prompt(prompt: str) -> tuple[str, str] | None:
    """The instruction and the document of a summarize prompt made by ``build_prompt``;
    None if it is not one."""
    instruction, mark, rest = prompt.partition(DOCUMENT)
    if not mark or not instruction or not rest.endswith(SUMMARY):
        return None
    return instruction, rest[: -len(SUMMARY)]


def document_of(prompt: str) -> str:
    """The document inside a summarize prompt made by ``build_prompt``, whatever its
    instruction (the prompt itself if it is not one): the simulator's summaries are
    extracts of the document alone."""
    parts = split_prompt(prompt)
    return parts[1] if parts is not None else prompt


def chat_messages(kind: JobKind, text: str, instruction: str | None = None) -> list[dict[str, str]]:
    """The chat messages for a job of ``kind``: a summary's instruction (None: the default
    one) as the system message."""
    if kind is JobKind.SUMMARIZE:
        return [
            {"role": "system", "content": instruction or DEFAULT_INSTRUCTION},
            {"role": "user", "content": text},
        ]
    return [{"role": "user", "content": text}]
