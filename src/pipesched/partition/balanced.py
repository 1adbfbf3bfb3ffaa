"""Balanced partitions: the exact minimum of the bottleneck stage time, by dynamic programming.

The time of stage ``s`` holding layers ``i .. j-1`` is

    compute[s, i:j].sum() + send_forward[s, j-1] + send_backward[s, i-1]

``compute[s, l]`` is the F + I + W time of layer ``l`` on the device of stage ``s`` (rows differ
on heterogeneous clusters). A stage pays for what it sends: its output to the next stage
(``send_forward``, not for the last stage) and the gradient of its input to the previous
stage (``send_backward``, not for the first stage); both depend on the layer at the boundary.

Optionally every stage must fit in memory: ``memory[s, i:j].sum() <= memory_cap[s]``.

The recurrence ``best[s][j] = min_i max(best[s-1][i], time(s, i, j))`` visits every (stage,
last layer, first layer) triple once: O(S L^2) work, in one compiled loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from pipesched.errors import require
from pipesched.partition.core import Partition, check_fits


@dataclass(frozen=True)
class Bottleneck:
    """The result of a min-max search: the partition and its largest stage value."""

    partition: Partition
    value: float


def _matrix(values: object, shape: tuple[int, int], field: str) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.ndim == 1:
        array = np.broadcast_to(array, shape)
    require(array.shape == shape, field, array.shape, f"must have shape (stages, layers) = {shape}")
    require(bool(np.all(np.isfinite(array)) and np.all(array >= 0)), field, "...", "must be finite and >= 0")
    return array


def stage_values(partition: Partition, compute: object, *, send_forward: object = None,
                 send_backward: object = None) -> np.ndarray:
    """The time (or any additive value) of every stage of ``partition``."""
    stages, layers = partition.num_stages, partition.num_layers
    shape = (stages, layers)
    cost = _matrix(compute, shape, "compute")
    forward = _matrix(send_forward, shape, "send_forward") if send_forward is not None else np.zeros(shape)
    backward = _matrix(send_backward, shape, "send_backward") if send_backward is not None else np.zeros(shape)
    out = np.zeros(stages)
    for s in range(stages):
        i, j = partition.bounds[s], partition.bounds[s + 1]
        out[s] = cost[s, i:j].sum()
        if s < stages - 1 and j > 0:
            out[s] += forward[s, j - 1]
        if s > 0 and i > 0:
            out[s] += backward[s, i - 1]
    return out


@njit(cache=True)
def _recurrence(prefix, entering, leaving, mem_prefix, caps, capped):
    """best[s, j]: the smallest largest stage time of stages 0..s covering layers 0..j-1,
    and choice[s, j] the first layer of stage s there (the first such layer on ties)."""
    stages = prefix.shape[0]
    layers = prefix.shape[1] - 1
    best = np.full((stages, layers + 1), np.inf)
    choice = np.zeros((stages, layers + 1), dtype=np.int64)
    for s in range(stages):
        # stage s ends at j: j >= s + 1, and leaves one layer per later stage
        for j in range(s + 1, layers - (stages - 1 - s) + 1):
            # stage s starts at layer i >= s (one layer per earlier stage); the first at 0
            last = s + 1 if s == 0 else j
            lowest = np.inf
            chosen = s
            for i in range(s, last):
                time = prefix[s, j] - prefix[s, i] + entering[s, i] + leaving[s, j]
                if capped and not (mem_prefix[s, j] - mem_prefix[s, i]) <= caps[s] * (1 + 1e-12):
                    time = np.inf
                if s > 0 and best[s - 1, i] > time:
                    time = best[s - 1, i]
                if time < lowest:
                    lowest = time
                    chosen = i
            best[s, j] = lowest
            choice[s, j] = chosen
    return best, choice


def min_bottleneck(compute: object, *, send_forward: object = None, send_backward: object = None,
                   memory: object = None, memory_cap: object = None) -> Bottleneck | None:
    """The partition of L layers into S non-empty stages with the smallest largest stage time.

    ``compute`` has shape (S, L), or (L,) for identical devices. Returns None when no
    partition satisfies the memory caps.

    >>> result = min_bottleneck([[1, 1, 1, 5], [1, 1, 1, 5]])
    >>> str(result.partition), result.value
    ('3|1', 5.0)
    """
    cost = np.asarray(compute, dtype=float)
    require(cost.ndim in (1, 2), "compute", cost.shape, "must be (stages, layers) or (layers,)")
    stages = cost.shape[0] if cost.ndim == 2 else 1
    layers = cost.shape[-1]
    shape = (stages, layers)
    check_fits(layers, stages)
    cost = _matrix(cost, shape, "compute")
    forward = _matrix(send_forward, shape, "send_forward") if send_forward is not None else np.zeros(shape)
    backward = _matrix(send_backward, shape, "send_backward") if send_backward is not None else np.zeros(shape)
    prefix = np.concatenate([np.zeros((stages, 1)), np.cumsum(cost, axis=1)], axis=1)
    if memory is not None:
        require(memory_cap is not None, "memory_cap", None, "give a cap per stage with memory")
        mem = _matrix(memory, shape, "memory")
        mem_prefix = np.concatenate([np.zeros((stages, 1)), np.cumsum(mem, axis=1)], axis=1)
        caps = np.broadcast_to(np.asarray(memory_cap, dtype=float), (stages,))
    # entering[s, i]: cost of stage s starting at layer i (gradient sent back over boundary i)
    entering = np.zeros((stages, layers + 1))
    entering[1:, 1:] = backward[1:, :]
    # leaving[s, j]: cost of stage s ending before layer j (output of layer j-1 sent on)
    leaving = np.zeros((stages, layers + 1))
    leaving[:-1, 1:] = forward[:-1, :]

    if memory is None:
        mem_prefix, caps = np.zeros((stages, 1)), np.zeros(stages)
    best, choice = _recurrence(prefix, entering, leaving, np.ascontiguousarray(mem_prefix, dtype=float),
                               np.ascontiguousarray(caps, dtype=float), memory is not None)
    value = float(best[stages - 1, layers])
    if not np.isfinite(value):
        return None
    bounds = [layers]
    for s in range(stages - 1, 0, -1):
        bounds.append(int(choice[s, bounds[-1]]))
    bounds.append(0)
    return Bottleneck(Partition(tuple(reversed(bounds))), value)
