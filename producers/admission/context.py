"""A pool's engine context, read at most every ``every_s`` seconds: a summarize job longer
than it is judged at submit as the graph it becomes (``schemas.jobs.shape``)."""

from __future__ import annotations

import time

from producers.admission.context_store import ContextStore
from schemas.jobs import GraphShape, shape

EVERY_S = 10.0


class EngineContext:
    def __init__(self, store: ContextStore, model: str, every_s: float = EVERY_S) -> None:
        self._store = store
        self._model = model
        self._every_s = every_s
        self._tokens: int | None = None
        self._read_at = -float("inf")

    async def tokens(self) -> int | None:
        if time.monotonic() - self._read_at >= self._every_s:
            self._read_at = time.monotonic()
            self._tokens = await self._store.smallest(self._model)
        return self._tokens

    async def graph_of(self, prompt_tokens: int, max_tokens: int) -> GraphShape | None:
        """The graph a summarize job of this size becomes on the pool's engines; None when
        it fits one request, or while no worker has said how much fits."""
        context = await self.tokens()
        return None if context is None else shape(prompt_tokens, max_tokens, context)
