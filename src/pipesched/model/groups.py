"""The parallel groups of a layer's collectives and the links they run over.

A layer's collectives (``LayerPlan.collectives``) name their group (``Group``); this module
says which ranks the group holds and over which levels (``CollectiveLevel``, innermost
first) ``collective_seconds`` times it:

- TENSOR: the ``tensor_parallel`` ranks of a pipeline stage, inside one node;
- EXPERT: the ``expert_parallel`` ranks of a MoE block, each holding ``num_experts / EP``
  routed experts, and EXPERT_TENSOR: the ``expert_tensor_parallel`` ranks inside one expert.

Megatron-Core's parallel folding: the EP x ETP ranks of a MoE block are drawn from the
stage's tensor-parallel ranks and its data-parallel peers (attention TP x DP = experts
ETP x EP x expert-DP), ETP innermost, so expert parallelism adds no devices. With
pipesched's rank layout (``stages.pipeline_ranks``: pipeline replica r on ranks r p t
onwards) fold index i of stage device k is cluster rank ``k t + (i mod t) + (i div t) p t``:
an EP group inside the tensor-parallel ranks stays on the node (NVLink), one that reaches
the data-parallel peers crosses nodes, hierarchically (``group_levels``).

With no cluster (``layer_costs`` on its own) a group is one ring on the given link, but
an expert group larger than a node: its ranks fill nodes of ``DEVICES_PER_NODE`` (ETP
innermost) over the link, and the nodes talk over the default cluster's InfiniBand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipesched.enums import Group
from pipesched.errors import require
from pipesched.model.clusters import INFINIBAND_400G
from pipesched.model.collectives import CollectiveLevel, group_levels, link_levels
from pipesched.model.hardware import Cluster, LinkSpec
from pipesched.model.spec import TrainingSettings

DEVICES_PER_NODE = 8  # GPUs of a node when no cluster says (homogeneous_cluster's)


@dataclass(frozen=True)
class GroupLevels:
    """The levels of the groups a layer's collectives run over; a group not listed is one
    ring of its ranks on the layer's link."""

    levels: tuple[tuple[Group, tuple[CollectiveLevel, ...]], ...] = ()

    def of(self, group: Group) -> tuple[CollectiveLevel, ...] | None:
        for listed, levels in self.levels:
            if listed == group:
                return levels
        return None


def group_ranks(settings: TrainingSettings, group: Group) -> int:
    """Ranks of ``group`` under ``settings`` (1 for a group the settings do not split over)."""
    return {Group.TENSOR: settings.tensor_parallel, Group.EXPERT: settings.expert_parallel,
            Group.EXPERT_TENSOR: settings.expert_tensor}.get(group, 1)


def levels_on_link(settings: TrainingSettings, group: Group, link: LinkSpec,
                   groups: GroupLevels | None = None) -> tuple[CollectiveLevel, ...]:
    """The levels of ``group``: as ``groups`` lists them, else one ring on ``link`` (an
    expert group beyond a node: hierarchical, module docstring).

    >>> from pipesched.model.clusters import NVLINK
    >>> [level.ranks for level in levels_on_link(TrainingSettings(tensor_parallel=1, expert_parallel=32),
    ...                                          Group.EXPERT, NVLINK)]
    [8, 4]
    """
    listed = groups.of(group) if groups is not None else None
    if listed is not None:
        return listed
    ranks = group_ranks(settings, group)
    per_node = max(1, DEVICES_PER_NODE // settings.expert_tensor)
    if group is not Group.EXPERT or ranks <= per_node:
        return link_levels(link, ranks)
    inside = math.gcd(ranks, per_node)
    across = INFINIBAND_400G
    return (*link_levels(link, inside),
            CollectiveLevel(ranks // inside, across.latency, across.bandwidth, across.collectives))


def fold_rank(first: int, index: int, tensor_parallel: int, stride: int) -> int:
    """Cluster rank of fold index ``index`` of the stage device on rank ``first``: its
    tensor-parallel ranks first, then the same ranks of the data-parallel replicas at
    ``stride`` (p x t) ranks.

    >>> [fold_rank(0, i, 2, 8) for i in range(4)]
    [0, 1, 8, 9]
    """
    return first + index % tensor_parallel + index // tensor_parallel * stride


def expert_group_levels(cluster: Cluster, settings: TrainingSettings, first: int, stride: int) -> GroupLevels:
    """The EXPERT and EXPERT_TENSOR groups of the stage device on rank ``first`` (its
    pipeline's devices x tensor parallelism = ``stride`` ranks), folded over its
    tensor-parallel ranks and data-parallel peers (module docstring); empty without expert
    parallelism.

    >>> from pipesched.model import load_cluster
    >>> settings = TrainingSettings(tensor_parallel=1, expert_parallel=8)
    >>> [(level.ranks, level.bandwidth) for level in expert_group_levels(
    ...     load_cluster("4x8-h100"), settings, 0, 4).of(Group.EXPERT)]
    [(2, 450000000000.0), (4, 50000000000.0)]
    """
    ep, etp, tp = settings.expert_parallel, settings.expert_tensor, settings.tensor_parallel
    if ep == 1:
        return GroupLevels()
    last = fold_rank(first, ep * etp - 1, tp, stride)
    require(last < cluster.num_devices, "expert_parallel", ep,
            f"x expert_tensor_parallel {etp} folds over the stage's {tp} tensor-parallel ranks and its "
            f"data-parallel peers every {stride} ranks, up to rank {last}, but cluster {cluster.name} has "
            f"{cluster.num_devices} devices; give a smaller --ep or a bigger cluster")
    expert = [fold_rank(first, e * etp, tp, stride) for e in range(ep)]
    inner = [fold_rank(first, j, tp, stride) for j in range(etp)]
    return GroupLevels(((Group.EXPERT, group_levels(cluster, expert)),
                        (Group.EXPERT_TENSOR, group_levels(cluster, inner))))
