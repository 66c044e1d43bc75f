"""What the HTTP engines share: one request in flight as a reader task and the items it read.

The reader task owns the HTTP response; ``generate`` takes items from its queue. Aborting a
request from elsewhere (``engine.abort(id)``) cancels the reader, which closes the connection:
vLLM and llama.cpp both abort a request whose client went away and free its KV. The queue
holds at most one item per generated token, so ``max_tokens`` bounds it.
"""

from __future__ import annotations

import asyncio

from workers.engines.errors import EngineError


class End:
    """Marks the end of a stream's items."""


END = End()
Item = str | End | EngineError


class Stream:
    """One request in flight: the task reading its response, and what it read."""

    def __init__(self) -> None:
        self.items: asyncio.Queue[Item] = asyncio.Queue()
        self.reader: asyncio.Task[None] | None = None
        self.stopped = False

    async def stop(self) -> None:
        """Drop what was read but not taken and close the connection."""
        self.stopped = True
        self.items.put_nowait(END)
        if self.reader is not None:
            self.reader.cancel()
            await asyncio.wait([self.reader])


def padding(yielded: int, server_count: int | None) -> list[str]:
    """Empty items that bring a stream's count up to the server's own count of generated
    tokens (text that came merged in one chunk, or tokens without text such as EOS)."""
    if server_count is None or server_count <= yielded:
        return []
    return [""] * (server_count - yielded)


def output_pieces(text: str, num_tokens: int) -> list[str]:
    """One item per generated token from a delta of ``num_tokens`` tokens and ``text``: the
    text first, then empty strings (detokenized text cannot be split back into tokens)."""
    if num_tokens <= 0:
        return [text] if text else []
    return [text] + [""] * (num_tokens - 1)
