"""The paged KV cache of an instance at run time (vLLM's block manager).

The cache is ``CAPACITY`` blocks of ``block`` tokens (``InstancePlan.kv_capacity_blocks``:
the tightest stage's; every stage of a pipeline caches the same tokens for its own layers,
so one count serves the whole pipeline). A request holds whole blocks, ``ceil(tokens /
block)`` for the tokens it has cached or reserved (``HELD``). Blocks are taken when a batch
is formed (a prefill chunk's tokens, a decode's next token when it starts a new block, the
whole prompt under vLLM, a reservation of prompt + output under Orca and static batching)
and given back when the request finishes, is preempted, or its cache leaves the instance
(swapped out, sent to a decode instance once the transfer ends).

A new prompt is admitted only while ``WATERMARK`` of the cache stays free after it (vLLM's
watermark: room for the running decodes to grow before anyone must be preempted); a
running request's growth may use the cache to its last block. The schedulers check before
they take, so the cache never holds more blocks than it has; the engine logs the blocks in
use after every change (``KVTrace``).

Plain indexing on the run's tables (``queues``): the functions compile with numba.
"""

from __future__ import annotations

from numba import njit

from pipesched.serving.queues import CAPACITY, HELD, USED
from pipesched.serving.queues import WATERMARK as WATERMARK_BLOCKS

WATERMARK = 0.01  # share of the blocks a new prompt must leave free (vLLM's default)


def watermark_blocks(capacity: int) -> int:
    """Blocks a new prompt must leave free in a cache of ``capacity`` blocks."""
    return int(WATERMARK * capacity)


@njit(cache=True, _nrt=False, inline="always")
def blocks_for(tokens, block):
    """Blocks that hold ``tokens`` tokens."""
    return -(-tokens // block)


@njit(cache=True, _nrt=False, inline="always")
def need(req, r, tokens, block):
    """More blocks request r must take to hold ``tokens`` tokens."""
    return max(0, blocks_for(tokens, block) - req[r, HELD])


@njit(cache=True, _nrt=False, inline="always")
def free(ins, i):
    return ins[i, CAPACITY] - ins[i, USED]


@njit(cache=True, _nrt=False, inline="always")
def admits(ins, i, blocks):
    """Whether a new prompt may take ``blocks`` and leave the watermark free."""
    return free(ins, i) - blocks >= ins[i, WATERMARK_BLOCKS]


@njit(cache=True, _nrt=False, inline="always")
def take(req, ins, i, r, blocks):
    req[r, HELD] += blocks
    ins[i, USED] += blocks


@njit(cache=True, _nrt=False, inline="always")
def release(req, ins, i, r):
    """Give back every block request r holds on instance i."""
    ins[i, USED] -= req[r, HELD]
    req[r, HELD] = 0
