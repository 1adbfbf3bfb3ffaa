"""The paged KV cache of one instance at run time (vLLM's block manager).

The cache is ``capacity`` blocks of ``block_size`` tokens (``InstancePlan.kv_capacity_blocks``:
the tightest stage's; every stage of a pipeline holds the same tokens of its own layers, so
one count serves the whole pipeline). A request holds whole blocks: ``ceil(tokens / block)``
for the tokens it has cached or reserved. Blocks are taken when a batch is formed (the
prefill chunk's tokens, a decode's next token when it starts a new block, or a whole
reservation under Orca and static batching) and given back when the request finishes, is
preempted, or its cache leaves the instance (swapped out, sent to a decode instance).

New prompts are admitted only while ``WATERMARK`` of the cache stays free after them
(vLLM's watermark: room for the running decodes to grow before anyone must be preempted);
a running request's growth may use the cache to its last block. The scheduler checks
before it takes: the cache never holds more blocks than it has, and every change is logged
(``trace``: blocks in use from each time on).

The blocks each request holds live in one array shared by the run's caches (``held``,
indexed by trace row): a request holds blocks on one instance at a time.
"""

from __future__ import annotations

import numpy as np

WATERMARK = 0.01  # share of the blocks kept free when a new prompt is admitted (vLLM's default)


class PagedKVCache:
    """Blocks in use on one instance; ``held[r]``: blocks request r holds (shared array)."""

    def __init__(self, capacity: int, block_size: int, held: np.ndarray) -> None:
        self.capacity = capacity  # blocks
        self.block_size = block_size  # tokens per block
        self.held = held
        self.used = 0  # blocks
        self.watermark = int(WATERMARK * capacity)  # blocks
        self._times: list[float] = [0.0]
        self._blocks: list[int] = [0]

    @property
    def free(self) -> int:
        return self.capacity - self.used

    def blocks_for(self, tokens: int) -> int:
        """Blocks that hold ``tokens`` tokens."""
        return -(-tokens // self.block_size)

    def need(self, request: int, tokens: int) -> int:
        """More blocks ``request`` must take to hold ``tokens`` tokens."""
        return max(0, self.blocks_for(tokens) - int(self.held[request]))

    def grow_need(self, requests: np.ndarray, cached: np.ndarray) -> np.ndarray:
        """More blocks each decode needs to append one token to its ``cached`` tokens."""
        return np.maximum(0, (cached + self.block_size) // self.block_size - self.held[requests])

    def admits(self, blocks: int) -> bool:
        """Whether a new prompt may take ``blocks`` and leave the watermark free."""
        return self.free - blocks >= self.watermark

    def take(self, request: int, blocks: int, now: float) -> None:
        if blocks:
            self.held[request] += blocks
            self.used += blocks
            self._log(now)

    def take_each(self, requests: np.ndarray, blocks: np.ndarray, now: float) -> None:
        total = int(blocks.sum())
        if total:
            self.held[requests] += blocks
            self.used += total
            self._log(now)

    def release(self, requests: np.ndarray | int, now: float) -> None:
        """Give back every block of ``requests``."""
        total = int(np.sum(self.held[requests]))
        self.held[requests] = 0
        if total:
            self.used -= total
            self._log(now)

    def _log(self, now: float) -> None:
        if self._times[-1] == now:
            self._blocks[-1] = self.used
        else:
            self._times.append(now)
            self._blocks.append(self.used)

    def trace(self) -> tuple[np.ndarray, np.ndarray]:
        """When the use changed (seconds) and the blocks in use from then on."""
        return np.asarray(self._times, np.float64), np.asarray(self._blocks, np.int64)
