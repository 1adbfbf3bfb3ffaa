"""Collectives over a cluster's links: the ring all-reduce, and the hierarchical form (a ring
inside each node, then one across the nodes) that NCCL runs when a group spans nodes.

A collective runs over levels, innermost first: each level is one ring of ``ranks`` ranks on
one kind of link (``latency`` seconds per step, ``bandwidth`` bytes/s per rank).

- Ring all-reduce of B bytes over n ranks: 2 (n-1) steps, each sending B / n:
  ``2 (n-1) / n x B / bandwidth + 2 (n-1) x latency``. A reduce-scatter (each rank ends with
  the sum of its 1/n share) and an all-gather (each rank's share to every rank) are each one
  half of it: ``(n-1) / n x B / bandwidth + (n-1) x latency``.
- Over several levels: reduce-scatter inside each inner level (the buffer shrinks n times
  at each), all-reduce at the outermost level, all-gather back inward. Across nodes each
  rank then sends only its share of the buffer: B / (ranks of the group on its node).

Two ranks (a Chimera or DualPipe stage and its replica) all-reduce in ``B / bandwidth + 2 x
latency``: each sends and receives half the buffer in each of two steps.

>>> ring = (CollectiveLevel(8, 0.0, 1e9),)
>>> allreduce_seconds(8e9, ring), reduce_scatter_seconds(8e9, ring)
(14.0, 7.0)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from pipesched.errors import require
from pipesched.limits import check_rate
from pipesched.model.hardware import Cluster


@dataclass(frozen=True)
class CollectiveLevel:
    """One ring of a collective."""

    ranks: int  # ranks in the ring
    latency: float  # seconds per step (the link's latency and the transfer set-up)
    bandwidth: float  # bytes/s each rank sends at on this level's link

    def __post_init__(self) -> None:
        require(isinstance(self.ranks, int) and self.ranks >= 1, "ranks", self.ranks, "must be a whole number >= 1")
        require(self.latency >= 0, "latency", self.latency, "must be >= 0 seconds")
        check_rate("bandwidth", self.bandwidth, infinite=True)


def _half_ring(nbytes: float, level: CollectiveLevel) -> float:
    """Reduce-scatter (or all-gather) of ``nbytes`` over one ring."""
    steps = level.ranks - 1
    return steps / level.ranks * nbytes / level.bandwidth + steps * level.latency


def allreduce_seconds(nbytes: float, levels: Sequence[CollectiveLevel]) -> float:
    """All-reduce of ``nbytes`` over ``levels`` (innermost first; see the module docstring)."""
    levels = [level for level in levels if level.ranks > 1]
    if not levels:
        return 0.0
    total = 0.0
    for level in levels[:-1]:
        total += 2 * _half_ring(nbytes, level)  # reduce-scatter in, all-gather back out
        nbytes /= level.ranks
    top = levels[-1]
    steps = 2 * (top.ranks - 1)
    return total + steps / top.ranks * nbytes / top.bandwidth + steps * top.latency


def reduce_scatter_seconds(nbytes: float, levels: Sequence[CollectiveLevel]) -> float:
    """Reduce-scatter of ``nbytes`` over ``levels`` (an all-gather of the result takes the
    same time)."""
    total = 0.0
    for level in levels:
        if level.ranks > 1:
            total += _half_ring(nbytes, level)
            nbytes /= level.ranks
    return total


def group_levels(cluster: Cluster, ranks: Sequence[int], *, concurrent: int = 1) -> tuple[CollectiveLevel, ...]:
    """The levels of a collective among cluster ``ranks``: a ring over the intra-node link
    among the group's ranks on each node, then a ring over the inter-node link across the
    nodes. A step waits for the slowest pair's latency (set-up included, ``Cluster.latency``).

    ``concurrent``: collectives of the same size that every rank's node runs at the same
    time (the tensor-parallel ranks of a pipeline device each reduce their own shard). With
    one NIC per node they and the group's ranks on the node share it; with one NIC per rank
    each has its own.

    >>> from pipesched.model import load_cluster
    >>> [(level.ranks, level.bandwidth) for level in group_levels(load_cluster("4x8-h100"), (0, 8, 16, 24))]
    [(4, 50000000000.0)]
    """
    ranks = tuple(ranks)
    require(len(ranks) >= 1, "ranks", "[]", "a collective needs at least one rank")
    per_node = Counter(cluster.node_of[r] for r in ranks)
    inside = max(per_node.values())
    levels = []
    if inside > 1:
        pairs = [(a, b) for a in ranks for b in ranks if a != b and cluster.same_node(a, b)]
        levels.append(CollectiveLevel(inside, max(cluster.latency(a, b) for a, b in pairs),
                                      cluster.intra_node.bandwidth))
    if len(per_node) > 1:
        pairs = [(a, b) for a in ranks for b in ranks if not cluster.same_node(a, b)]
        sharing = 1 if cluster.nic_per_device else inside * concurrent
        levels.append(CollectiveLevel(len(per_node), max(cluster.latency(a, b) for a, b in pairs),
                                      cluster.inter_node.bandwidth / sharing))
    return tuple(levels)
