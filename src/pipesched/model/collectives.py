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

from pipesched.enums import Collective
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


def all_to_all_seconds(nbytes: float, levels: Sequence[CollectiveLevel]) -> float:
    """All-to-all where each rank holds ``nbytes`` to spread evenly over the group (expert
    dispatch or combine): a rank keeps 1 / n of them and sends the rest, (n - 1) steps of
    latency. Over several levels the share for ranks on other nodes goes over the outer
    level's link, the rest over the inner one; both run at once, so the slower sets the time.

    >>> all_to_all_seconds(8e9, (CollectiveLevel(8, 0.0, 1e9),))
    7.0
    """
    levels = [level for level in levels if level.ranks > 1]
    if not levels:
        return 0.0
    total_ranks = 1
    for level in levels:
        total_ranks *= level.ranks
    slowest, inside = 0.0, 1
    for level in levels:
        # ranks reached over this level: those of the next ranks-in outward, less those inside
        reached = inside * level.ranks - inside
        share = reached / total_ranks * nbytes
        slowest = max(slowest, share / level.bandwidth + (level.ranks - 1) * level.latency)
        inside *= level.ranks
    return slowest


def send_recv_seconds(nbytes: float, levels: Sequence[CollectiveLevel]) -> float:
    """One point-to-point hand-off of ``nbytes`` over the outermost level's link (a ring
    attention step sends its KV block to the next rank of the ring)."""
    levels = [level for level in levels if level.ranks > 1]
    if not levels or nbytes <= 0:
        return 0.0
    return nbytes / levels[-1].bandwidth + levels[-1].latency


def collective_seconds(kind: Collective, nbytes: float, levels: Sequence[CollectiveLevel]) -> float:
    """Seconds of one collective ``kind`` of ``nbytes`` per rank over ``levels`` (innermost
    first): the one entry every layer cost and the engine's transfers time collectives with.
    ``nbytes`` is the buffer each rank holds: for an all-reduce the buffer reduced, for an
    all-gather the gathered result, for a reduce-scatter its input, for an all-to-all what
    each rank dispatches.

    >>> ring = (CollectiveLevel(8, 0.0, 1e9),)
    >>> [collective_seconds(kind, 8e9, ring) for kind in Collective]
    [14.0, 7.0, 7.0, 7.0, 8.0]
    """
    if kind is Collective.ALL_REDUCE:
        return allreduce_seconds(nbytes, levels)
    if kind in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER):
        return reduce_scatter_seconds(nbytes, levels)
    if kind is Collective.ALL_TO_ALL:
        return all_to_all_seconds(nbytes, levels)
    return send_recv_seconds(nbytes, levels)


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
