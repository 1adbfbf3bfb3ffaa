"""Collectives over a cluster's links, as NCCL runs them: the algorithm and protocol it
picks by size and group, the latency of each, the bus bandwidth each achieves, and the
hierarchical form (inside each node, then across the nodes) when a group spans nodes.

A collective runs over levels, innermost first: each level is ``ranks`` ranks on one kind of
link (``bandwidth`` bytes/s per rank, ``latency`` seconds per step). A level whose link has
a ``CollectiveCalibration`` (``pipesched.model.hardware``) is timed as NCCL runs it; one
without is a plain ring of its latency and bandwidth (the calibration's step latencies then
stand in for the link's latency).

With protocol p (LL, LL128, Simple), B bytes per rank, n ranks on a level:

- Ring all-reduce: 2 (n-1) steps, each sending B / n, in ``base[p] + 2 (n-1) step[p] +
  2 (n-1) / n x B / busbw[p](B)``; reduce-scatter and all-gather are each one half of it
  (``(n-1)`` steps, ``(n-1) / n x B``). ``busbw[p](B)`` = bandwidth x efficiency x
  protocol share x (B + ramp) / (B + 2 ramp): NCCL's achieved bus bandwidth, ramping with
  the message.
- Tree all-reduce (an outermost level across nodes, n >= 3): ``2 ceil(log2 n)`` steps of latency and the
  bytes at 0.45 x busbw (NCCL's tree: a pipelined reduce up and broadcast down a binary tree).
- In-switch all-reduce (NVLink SHARP, one NVSwitch level of at least ``switch_min_ranks``):
  ``base + 2 step`` of the Simple protocol, and B at ``switch_bandwidth`` x the link's
  bandwidth of algorithm bandwidth, whatever n.
- Over several levels: reduce-scatter inside each inner level (the buffer shrinks n times at
  each), all-reduce at the outermost level, all-gather back inward; one launch (``base``).
- All-to-all: each rank keeps 1 / n of its B and sends the rest, (n-1) steps; the share for
  other nodes goes over the outer level while the rest goes over the inner one.
- Send/recv: B over the outermost level's link, one step.

NCCL picks the fastest (algorithm, protocol); so does ``collective_choice``. Without a
calibration the protocols are alike and every formula is the plain ring / alpha-beta one.

>>> ring = (CollectiveLevel(8, 0.0, 1e9),)
>>> allreduce_seconds(8e9, ring), reduce_scatter_seconds(8e9, ring)
(14.0, 7.0)
>>> nvlink = (CollectiveLevel(8, 0.0, 450e9, NVLINK_H100),)
>>> choice = collective_choice(Collective.ALL_REDUCE, 2048, nvlink)
>>> choice.algorithm, choice.protocol
('ring', 'LL')
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipesched.enums import Collective
from pipesched.errors import require
from pipesched.limits import check_rate
from pipesched.model.hardware import PROTOCOLS, Cluster, CollectiveCalibration, LinkSpec

# Calibrations of the links the presets use. Latencies: NCCL's own tuning model
# (src/graph/tuning.cc, baseLat and hwLat of the Ring algorithm: NVLink and network).
# NVLink 4 on an H100 NVSwitch node: 370 GB/s of the 450 GB/s line rate as NCCL's bus
# bandwidth (NCCL maintainers, nccl-tests#212 and nccl#1442), NVLink SHARP all-reduce
# at about 273 GB/s of algorithm bandwidth from 5 ranks (nccl#1455; 470+ GB/s busbw on 8,
# nccl-tests#290), reaching 2/3 of it at 45 MB (nccl-tests#290); see benchmarks/data/.
NVLINK_H100 = CollectiveCalibration(fabric="nvlink", base_latency=(6.6e-6, 14e-6, 8.4e-6),
                                    step_latency=(0.6e-6, 1.9e-6, 3.4e-6), efficiency=370 / 450,
                                    ramp_bytes=45e6, switch_bandwidth=273 / 450, switch_min_ranks=5)
# InfiniBand NDR, one 400 Gb/s NIC per GPU: 46-48 GB/s of its 50 GB/s (nccl-tests#290).
INFINIBAND_NDR = CollectiveCalibration(fabric="infiniband", base_latency=(6.6e-6, 14e-6, 8.4e-6),
                                       step_latency=(2.7e-6, 4.0e-6, 14e-6), efficiency=0.94)

NETWORK_FABRICS = ("infiniband", "ethernet")  # fabrics across nodes: NCCL's tree runs over them
TREE_SHARE = 0.45  # NCCL's tree all-reduce: algorithm bandwidth / bus bandwidth (0.5 x 0.9)
_SIMPLE = PROTOCOLS.index("Simple")


@dataclass(frozen=True)
class CollectiveLevel:
    """One level of a collective: ``ranks`` ranks on one kind of link."""

    ranks: int  # ranks at this level
    latency: float  # seconds per step (the link's latency and the transfer set-up)
    bandwidth: float  # bytes/s each rank sends at on this level's link
    calibration: CollectiveCalibration | None = None  # how NCCL runs over the link; None: a plain ring

    def __post_init__(self) -> None:
        require(isinstance(self.ranks, int) and self.ranks >= 1, "ranks", self.ranks, "must be a whole number >= 1")
        require(self.latency >= 0, "latency", self.latency, "must be >= 0 seconds")
        check_rate("bandwidth", self.bandwidth, infinite=True)


@dataclass(frozen=True)
class CollectiveTime:
    """A collective's time and what NCCL would run it with."""

    seconds: float
    algorithm: str  # ring, tree, switch (NVLink SHARP), direct (all-to-all, send/recv); "" when nothing moves
    protocol: str  # LL, LL128, Simple; "" over uncalibrated links


def link_levels(link: LinkSpec, ranks: int) -> tuple[CollectiveLevel, ...]:
    """The one level of a group of ``ranks`` ranks on ``link`` (a tensor-parallel group
    inside a node).

    >>> link_levels(LinkSpec(450e9, 3e-6), 4)[0].ranks
    4
    """
    return (CollectiveLevel(ranks, link.latency, link.bandwidth, link.collectives),)


def _active(levels: Sequence[CollectiveLevel]) -> list[CollectiveLevel]:
    return [level for level in levels if level.ranks > 1]


def _protocols(levels: Sequence[CollectiveLevel]) -> tuple[int | None, ...]:
    """Protocol indices to try: all three once any level is calibrated, else none."""
    return tuple(range(len(PROTOCOLS))) if any(level.calibration for level in levels) else (None,)


def _base(levels: Sequence[CollectiveLevel], p: int | None) -> float:
    """Seconds once per collective: the slowest level's launch and synchronisation."""
    return max((level.calibration.base_latency[p] for level in levels if level.calibration and p is not None),
               default=0.0)


def _step(level: CollectiveLevel, p: int | None) -> float:
    calibration = level.calibration
    return level.latency if calibration is None or p is None else calibration.step_latency[p]


def _busbw(level: CollectiveLevel, p: int | None, nbytes: float) -> float:
    """Bytes/s a rank achieves on ``level`` with protocol ``p`` moving a buffer of ``nbytes``."""
    calibration = level.calibration
    if calibration is None or p is None:
        return level.bandwidth
    ramp = calibration.ramp_bytes
    share = (nbytes + ramp) / (nbytes + 2 * ramp) if ramp > 0 else 1.0
    return level.bandwidth * calibration.efficiency * calibration.protocol_bandwidth[p] * share


def _label(p: int | None) -> str:
    return "" if p is None else PROTOCOLS[p]


def _half_ring(nbytes: float, level: CollectiveLevel, p: int | None) -> float:
    """Reduce-scatter (or all-gather) of ``nbytes`` over one ring, less the launch."""
    steps = level.ranks - 1
    return steps / level.ranks * nbytes / _busbw(level, p, nbytes) + steps * _step(level, p)


def _allreduce_top(nbytes: float, top: CollectiveLevel, p: int | None, algorithm: str) -> float:
    """The outermost level's all-reduce of ``nbytes``, less the launch."""
    n = top.ranks
    if algorithm == "tree":
        return nbytes / (TREE_SHARE * _busbw(top, p, nbytes)) + 2 * math.ceil(math.log2(n)) * _step(top, p)
    return 2 * (n - 1) / n * nbytes / _busbw(top, p, nbytes) + 2 * (n - 1) * _step(top, p)


def _switch_allreduce(nbytes: float, level: CollectiveLevel) -> float:
    """All-reduce with the reduction in the NVSwitch (NVLink SHARP): each rank writes its
    buffer once and reads the sum once, whatever the group size."""
    calibration = level.calibration
    assert calibration is not None
    ramp = calibration.ramp_bytes
    share = (nbytes + ramp) / (nbytes + 2 * ramp) if ramp > 0 else 1.0
    latency = calibration.base_latency[_SIMPLE] + 2 * calibration.step_latency[_SIMPLE]
    return latency + nbytes / (level.bandwidth * calibration.switch_bandwidth * share)


def _allreduce_choices(nbytes: float, levels: list[CollectiveLevel]) -> list[CollectiveTime]:
    top = levels[-1]
    tree = top.calibration is not None and top.calibration.fabric in NETWORK_FABRICS and top.ranks >= 3
    algorithms = ["ring"] + (["tree"] if tree else [])
    choices = []
    for p in _protocols(levels):
        inner, size = _base(levels, p), nbytes
        for level in levels[:-1]:
            inner += 2 * _half_ring(size, level, p)  # reduce-scatter in, all-gather back out
            size /= level.ranks
        choices += [CollectiveTime(inner + _allreduce_top(size, top, p, a), a, _label(p)) for a in algorithms]
    calibration = top.calibration
    if len(levels) == 1 and calibration and calibration.switch_bandwidth > 0 and top.ranks >= calibration.switch_min_ranks:
        choices.append(CollectiveTime(_switch_allreduce(nbytes, top), "switch", "Simple"))
    return choices


def _reduce_scatter_choices(nbytes: float, levels: list[CollectiveLevel]) -> list[CollectiveTime]:
    choices = []
    for p in _protocols(levels):
        total, size = _base(levels, p), nbytes
        for level in levels:
            total += _half_ring(size, level, p)
            size /= level.ranks
        choices.append(CollectiveTime(total, "ring", _label(p)))
    return choices


def _all_to_all_choices(nbytes: float, levels: list[CollectiveLevel]) -> list[CollectiveTime]:
    total_ranks = math.prod(level.ranks for level in levels)
    choices = []
    for p in _protocols(levels):
        slowest, inside = 0.0, 1
        for level in levels:
            # ranks reached over this level: those of the next ranks-in outward, less those inside
            reached = inside * level.ranks - inside
            share = reached / total_ranks * nbytes
            slowest = max(slowest, share / _busbw(level, p, share) + (level.ranks - 1) * _step(level, p))
            inside *= level.ranks
        choices.append(CollectiveTime(_base(levels, p) + slowest, "direct", _label(p)))
    return choices


def _send_recv_choices(nbytes: float, levels: list[CollectiveLevel]) -> list[CollectiveTime]:
    top = levels[-1]
    return [CollectiveTime(_base(levels, p) + nbytes / _busbw(top, p, nbytes) + _step(top, p), "direct", _label(p))
            for p in _protocols(levels)]


_CHOICES = {Collective.ALL_REDUCE: _allreduce_choices, Collective.ALL_GATHER: _reduce_scatter_choices,
            Collective.REDUCE_SCATTER: _reduce_scatter_choices, Collective.ALL_TO_ALL: _all_to_all_choices,
            Collective.SEND_RECV: _send_recv_choices}


def collective_choice(kind: Collective, nbytes: float, levels: Sequence[CollectiveLevel]) -> CollectiveTime:
    """The fastest way NCCL has to run one collective ``kind`` of ``nbytes`` per rank over
    ``levels`` (innermost first), and its seconds (see the module docstring). ``nbytes`` is
    the buffer each rank holds: for an all-reduce the buffer reduced, for an all-gather the
    gathered result, for a reduce-scatter its input, for an all-to-all what each rank
    dispatches."""
    active = _active(levels)
    if not active or (kind is Collective.SEND_RECV and nbytes <= 0):
        return CollectiveTime(0.0, "", "")
    return min(_CHOICES[kind](nbytes, active), key=lambda choice: choice.seconds)


def collective_seconds(kind: Collective, nbytes: float, levels: Sequence[CollectiveLevel]) -> float:
    """Seconds of one collective ``kind`` of ``nbytes`` per rank over ``levels`` (innermost
    first): the one entry every layer cost and the engine's transfers time collectives with
    (``collective_choice`` also says which algorithm and protocol).

    ``nbytes`` may be an array (a serving stage's collectives at every token count): the
    seconds of each, each with its own choice.

    >>> ring = (CollectiveLevel(8, 0.0, 1e9),)
    >>> [collective_seconds(kind, 8e9, ring) for kind in Collective]
    [14.0, 7.0, 7.0, 7.0, 8.0]
    """
    if not isinstance(nbytes, np.ndarray):
        return collective_choice(kind, nbytes, levels).seconds
    active = _active(levels)
    if not active:
        return np.zeros(nbytes.shape)
    seconds = np.min([choice.seconds for choice in _CHOICES[kind](nbytes, active)], axis=0)
    return np.where(nbytes > 0, seconds, 0.0) if kind is Collective.SEND_RECV else seconds


def allreduce_seconds(nbytes: float, levels: Sequence[CollectiveLevel]) -> float:
    """All-reduce of ``nbytes`` over ``levels`` (innermost first; see the module docstring)."""
    return collective_seconds(Collective.ALL_REDUCE, nbytes, levels)


def reduce_scatter_seconds(nbytes: float, levels: Sequence[CollectiveLevel]) -> float:
    """Reduce-scatter of ``nbytes`` over ``levels`` (an all-gather of the result takes the
    same time)."""
    return collective_seconds(Collective.REDUCE_SCATTER, nbytes, levels)


def all_to_all_seconds(nbytes: float, levels: Sequence[CollectiveLevel]) -> float:
    """All-to-all where each rank holds ``nbytes`` to spread evenly over the group (expert
    dispatch or combine).

    >>> all_to_all_seconds(8e9, (CollectiveLevel(8, 0.0, 1e9),))
    7.0
    """
    return collective_seconds(Collective.ALL_TO_ALL, nbytes, levels)


def send_recv_seconds(nbytes: float, levels: Sequence[CollectiveLevel]) -> float:
    """One point-to-point hand-off of ``nbytes`` over the outermost level's link (a ring
    attention step sends its KV block to the next rank of the ring)."""
    return collective_seconds(Collective.SEND_RECV, nbytes, levels)


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
                                      cluster.intra_node.bandwidth, cluster.intra_node.collectives))
    if len(per_node) > 1:
        pairs = [(a, b) for a in ranks for b in ranks if not cluster.same_node(a, b)]
        sharing = 1 if cluster.nic_per_device else inside * concurrent
        levels.append(CollectiveLevel(len(per_node), max(cluster.latency(a, b) for a, b in pairs),
                                      cluster.inter_node.bandwidth / sharing, cluster.inter_node.collectives))
    return tuple(levels)
