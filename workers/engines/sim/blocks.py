"""A paged KV block allocator: fixed-size blocks, one block table per request."""

from __future__ import annotations

import math


class OutOfBlocks(Exception):
    pass


class BlockAllocator:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free = list(range(num_blocks - 1, -1, -1))
        self._tables: dict[str, list[int]] = {}

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    def blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size) if tokens > 0 else 0

    def held(self, request_id: str) -> int:
        return len(self._tables.get(request_id, ()))

    def grow_to(self, request_id: str, tokens: int) -> None:
        """Make the request's table cover ``tokens``; all or nothing."""
        table = self._tables.setdefault(request_id, [])
        missing = self.blocks_for(tokens) - len(table)
        if missing <= 0:
            return
        if missing > len(self._free):
            if not table:
                del self._tables[request_id]
            raise OutOfBlocks(f"{request_id} needs {missing} more blocks, {len(self._free)} free")
        for _ in range(missing):
            table.append(self._free.pop())

    def can_grow_to(self, request_id: str, tokens: int) -> bool:
        return self.blocks_for(tokens) - self.held(request_id) <= len(self._free)

    def release(self, request_id: str) -> int:
        """Free every block of the request; returns how many."""
        table = self._tables.pop(request_id, [])
        self._free.extend(reversed(table))
        return len(table)
