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
  Simple's ``base`` and ``switch_latency``, and B at ``switch_bandwidth`` x the link's
  bandwidth of algorithm bandwidth (ramped by ``switch_ramp_bytes``), whatever n.
- Over several levels: reduce-scatter inside each inner level (the buffer shrinks n times at
  each), all-reduce at the outermost level, all-gather back inward; one launch (``base``).
- All-to-all: each rank keeps 1 / n of its B and sends the rest straight to its peers,
  point-to-point at the link's ``p2p_efficiency``; the sends are posted at once and overlap:
  one step, and ``peer_latency`` per further peer (over a plain link: a step per peer). The
  share for other nodes goes over the outer level while the rest goes over the inner one,
  at once: the slower sets the time.
- Send/recv: B over the outermost level's link at its ``p2p_efficiency``, one step.

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

import dataclasses
import functools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipesched.enums import Collective
from pipesched.errors import require
from pipesched.limits import check_rate
from pipesched.model.hardware import PROTOCOLS, Cluster, CollectiveCalibration, LinkSpec

# Calibrations of the links the presets use (benchmarks/data/README.md gives the sources).
# NVLink 4 on an H100 NVSwitch node: 370 GB/s of the 450 GB/s line rate as NCCL's bus
# bandwidth (NCCL's maintainers, nccl-tests#212 and nccl#1442); Simple's step latency and
# ramp fitted to NCCL all-reduces on 4 H100s from 0.5 to 4 MiB (vllm#24111); NVLink SHARP
# all-reduce at 273 GB/s of algorithm bandwidth from 5 ranks on (nccl#1455), its ramp fitted
# to 8 H100s from 128 MiB to 4 GiB (nccl-tests#290). LL and LL128, every base latency and
# the in-switch latency: NCCL's own tuning model (src/graph/tuning.cc, baseLat and hwLat of
# the Ring and NVLS algorithms).
NVLINK_H100 = CollectiveCalibration(fabric="nvlink", base_latency=(6.6e-6, 14e-6, 8.4e-6),
                                    step_latency=(0.6e-6, 1.9e-6, 0.65e-6), efficiency=370 / 450,
                                    ramp_bytes=3e6, switch_bandwidth=273 / 450, switch_min_ranks=5,
                                    switch_ramp_bytes=40e6, switch_latency=25e-6)
# InfiniBand NDR, one 400 Gb/s NIC per GPU: the bus bandwidth the hierarchical form
# reaches across nodes and Simple's step latency fitted to NCCL's all-reduce on 2 x 8 H100s
# from 8 MiB to 8 GiB (nccl-tests#290): its cross-node algorithms reach about a third of
# the NIC's line rate on the share of the buffer each NIC carries. LL and LL128: NCCL's model.
# Point-to-point traffic (all-to-all, send/recv) is no such algorithm: RDMA writes straight
# to each peer reach near the NIC's line rate, DeepEP's 39-46 GB/s of a 400 Gb/s NIC's 50
# (deepseek-ai/DeepEP README, low-latency kernels at EP 16-256; its normal kernels 43-58 GB/s
# of bottleneck-domain bytes), and the sends to all peers are posted at once: a peer beyond
# the first adds the cost of posting one more work request, not a step.
INFINIBAND_NDR = CollectiveCalibration(fabric="infiniband", base_latency=(6.6e-6, 14e-6, 8.4e-6),
                                       step_latency=(2.7e-6, 4.0e-6, 10e-6), efficiency=0.32,
                                       p2p_efficiency=0.92, peer_latency=0.5e-6)

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


def _busbw(level: CollectiveLevel, p: int | None, nbytes: float, *, p2p: bool = False) -> float:
    """Bytes/s a rank achieves on ``level`` with protocol ``p`` moving a buffer of ``nbytes``
    (``p2p``: as point-to-point sends, an all-to-all's or a send/recv's)."""
    calibration = level.calibration
    if calibration is None or p is None:
        return level.bandwidth
    ramp = calibration.ramp_bytes
    share = (nbytes + ramp) / (nbytes + 2 * ramp) if ramp > 0 else 1.0
    efficiency = calibration.point_to_point_efficiency if p2p else calibration.efficiency
    return level.bandwidth * efficiency * calibration.protocol_bandwidth[p] * share


def _peer_steps(level: CollectiveLevel, p: int | None, peers: int) -> float:
    """Latency of sends to ``peers`` peers over ``level``: over a calibrated link they are
    posted at once and overlap (one step, ``peer_latency`` per further peer); over a plain
    one they go one after the other (a step each)."""
    calibration = level.calibration
    if calibration is None or p is None:
        return peers * level.latency
    return _step(level, p) + max(0, peers - 1) * calibration.peer_latency


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
    ramp = calibration.switch_ramp_bytes
    share = (nbytes + ramp) / (nbytes + 2 * ramp) if ramp > 0 else 1.0
    latency = calibration.base_latency[_SIMPLE] + calibration.switch_latency
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
            size = size / level.ranks  # a new value: nbytes may be an array
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
            size = size / level.ranks  # a new value: nbytes may be an array
        choices.append(CollectiveTime(total, "ring", _label(p)))
    return choices


def _all_to_all_choices(nbytes: float, levels: list[CollectiveLevel]) -> list[CollectiveTime]:
    total_ranks = math.prod(level.ranks for level in levels)
    choices = []
    for p in _protocols(levels):
        slowest, inside = 0.0, 1
        for level in levels:
            # ranks reached over this level: those of the next ranks-in outward, less those
            # inside; a rank posts a send to each of them
            reached = inside * level.ranks - inside
            share = reached / total_ranks * nbytes
            seconds = share / _busbw(level, p, share, p2p=True) + _peer_steps(level, p, reached)
            slowest = np.maximum(slowest, seconds) if isinstance(seconds, np.ndarray) else max(slowest, seconds)
            inside *= level.ranks
        choices.append(CollectiveTime(_base(levels, p) + slowest, "direct", _label(p)))
    return choices


def _send_recv_choices(nbytes: float, levels: list[CollectiveLevel]) -> list[CollectiveTime]:
    top = levels[-1]
    return [CollectiveTime(_base(levels, p) + nbytes / _busbw(top, p, nbytes, p2p=True) + _step(top, p), "direct",
                           _label(p))
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
    return _choice(kind, nbytes, tuple(levels))


@functools.lru_cache(maxsize=65536)
def _choice(kind: Collective, nbytes: float, levels: tuple[CollectiveLevel, ...]) -> CollectiveTime:
    """``collective_choice``, pure in hashable inputs: a sweep times the same few buffers
    over the same groups on every placement."""
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


# per kind, on one ring of n ranks: (steps of latency, share of the buffer each rank moves)
def _ring_terms(kind: Collective, n: int) -> tuple[float, float]:
    if kind is Collective.ALL_REDUCE:
        return 2 * (n - 1), 2 * (n - 1) / n
    if kind is Collective.SEND_RECV:
        return 1, 1.0
    return n - 1, (n - 1) / n  # all-gather, reduce-scatter, all-to-all


@dataclass(frozen=True)
class CollectiveFit:
    """Constants fitted to measured collectives of one group: ``seconds = launch + steps x
    step + share x bytes / bus_bandwidth`` for every kind (``_ring_terms``)."""

    ranks: int
    launch: float  # seconds once per collective
    step: float  # seconds per step
    bus_bandwidth: float  # bytes/s each rank achieves
    median_error: float  # |fit / measured - 1| over the samples, the median

    def calibration(self, link_bandwidth: float, *, like: CollectiveCalibration | None = None) -> CollectiveCalibration:
        """The fit as a link's calibration: efficiency = bus bandwidth / ``link_bandwidth``.
        ``like`` (NCCL, which has protocols): the fit is its Simple protocol and LL and LL128
        keep ``like``'s ratios to it; None (gloo): one protocol, all three alike. The fit has
        one bandwidth and one step for every kind: point-to-point bytes go at the same
        efficiency and an all-to-all's further peers cost a step each, as they were fitted."""
        efficiency = min(1.0, self.bus_bandwidth / link_bandwidth)
        if like is None:
            return CollectiveCalibration(fabric="measured", base_latency=(self.launch,) * 3,
                                         step_latency=(self.step,) * 3, efficiency=efficiency,
                                         protocol_bandwidth=(1.0, 1.0, 1.0), peer_latency=self.step)

        def scaled(values: tuple[float, float, float], fitted: float) -> tuple[float, ...]:
            return tuple(fitted * v / values[_SIMPLE] if values[_SIMPLE] > 0 else fitted for v in values)

        return dataclasses.replace(like, base_latency=scaled(like.base_latency, self.launch),
                                   step_latency=scaled(like.step_latency, self.step), efficiency=efficiency,
                                   ramp_bytes=0.0, p2p_efficiency=0.0, peer_latency=self.step)


def fit_collectives(ranks: int, samples: Sequence[tuple[Collective, float, float]]) -> CollectiveFit:
    """Least squares over (kind, bytes per rank, seconds) samples of one group of ``ranks``:
    the launch, the step latency and the bus bandwidth (each at least 0; kinds with different
    step counts tell the launch from the steps; when the bytes do not show in the times, the
    fastest throughput seen stands for the bandwidth).

    >>> samples = [(k, b, 1e-5 + s * 2e-6 + f * b / 1e9) for k in (Collective.ALL_REDUCE, Collective.ALL_GATHER)
    ...            for b in (1e3, 1e6) for s, f in [_ring_terms(k, 4)]]
    >>> fit = fit_collectives(4, samples)
    >>> round(fit.launch * 1e6, 3), round(fit.step * 1e6, 3), round(fit.bus_bandwidth / 1e9, 3)
    (10.0, 2.0, 1.0)
    """
    require(isinstance(ranks, int) and ranks >= 2, "ranks", ranks, "a collective needs at least 2 ranks")
    require(len(samples) >= 3, "samples", len(samples), "give at least 3 measured collectives to fit")
    rows = np.array([(1.0, *_ring_terms(kind, ranks)) for kind, _, _ in samples])
    rows[:, 2] *= [nbytes for _, nbytes, _ in samples]
    seconds = np.array([t for _, _, t in samples], dtype=np.float64)
    # relative errors count alike: each row weighted by 1 / its time
    weights = 1.0 / np.maximum(seconds, 1e-12)
    columns = [0, 1, 2]
    while True:
        solved = np.linalg.lstsq(rows[:, columns] * weights[:, None], seconds * weights, rcond=None)[0]
        if (solved >= 0).all() or len(columns) == 1:
            break
        columns = [c for c, x in zip(columns, solved, strict=True) if x > 0] or [2]
    values = dict.fromkeys(range(3), 0.0) | dict(zip(columns, np.maximum(solved, 0.0), strict=True))
    fitted = rows @ np.array([values[0], values[1], values[2]])
    error = float(np.median(np.abs(fitted / np.maximum(seconds, 1e-12) - 1)))
    inverse = float(values[2])
    # sizes too small (or too noisy) to show the bandwidth: the fastest throughput seen, a
    # lower bound of it
    seen = float(np.max(rows[:, 2] / np.maximum(seconds, 1e-12)))
    bandwidth = 1.0 / inverse if inverse > 0 else seen
    return CollectiveFit(ranks, float(values[0]), float(values[1]), bandwidth, error)


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
