"""`pipesched costs --pair`: per layer the overlapped forward-backward pair as DualPipe runs
it (``pipesched.model.phases``): one microbatch's forward beside another's backward, each
one's communication on the other's compute."""

from __future__ import annotations

from rich.table import Table

from pipesched.model import TrainingSettings
from pipesched.model.groups import expert_group_levels
from pipesched.model.hardware import Cluster
from pipesched.model.phases import PairCost, chunk_pair, layer_phases
from pipesched.model.spec import ModelSpec
from pipesched.model.transformer import layer_ops


def cluster_ranks(settings: TrainingSettings) -> int:
    """Ranks one stage device's tensor and expert groups span (a cluster built from a device
    holds them, eight to a node)."""
    return max(settings.tensor_parallel, settings.expert_parallel * settings.expert_tensor)


def layer_pairs(model: ModelSpec, cluster: Cluster, settings: TrainingSettings) -> list[tuple[str, str, PairCost]]:
    """Every layer's (name, kind, overlapped pair) on rank 0 of ``cluster``: its tensor
    group on the intra-node link, its expert groups on the cluster's ranks, compute slowed
    by the device's ``comm_sm_fraction`` beside communication."""
    device = cluster.devices[0]
    groups = expert_group_levels(cluster, settings, 0, settings.tensor_parallel)
    full = settings.recompute == "full"
    pairs = []
    for ops in layer_ops(model, device, settings, tp_link=cluster.intra_node, groups=groups):
        layer = layer_phases(ops, full_recompute=full)
        pairs.append((ops.cost.name, ops.cost.kind, chunk_pair([layer], [layer],
                                                               comm_sm_fraction=device.comm_sm_fraction)))
    return pairs


def pair_rows(pairs: list[tuple[str, str, PairCost]]) -> list[dict[str, object]]:
    """The JSON rows of ``costs --pair --json`` (seconds)."""
    return [{"name": name, "kind": kind, "forward_s": cost.forward_s, "backward_s": cost.backward_s,
             "pair_s": cost.pair_s, "pair_comm_s": cost.pair_comm_s, "pair_hidden_comm_s": cost.pair_hidden_comm_s,
             "exposed_comm_s": cost.exposed_comm_s} for name, kind, cost in pairs]


def pair_table(title: str, pairs: list[tuple[str, str, PairCost]]) -> Table:
    """A row per layer (alike blocks in one row, with their count) and the model's totals, ms."""
    table = Table(title=f"{title}; overlapped F&B pair per layer, times in ms")
    for column in ("layer", "F", "B", "F + B", "pair", "comm", "hidden", "exposed", "hidden %"):
        table.add_column(column, justify="left" if column == "layer" else "right")
    runs: list[list] = []
    for name, _, cost in pairs:
        if runs and runs[-1][1] == cost:
            runs[-1][2].append(name)
        else:
            runs.append([name, cost, [name]])
    for _, cost, names in runs:
        label = names[0] if len(names) == 1 else f"{names[0]} ... {names[-1]} ({len(names)} alike)"
        table.add_row(label, *_cells(cost))
    table.add_section()
    total = PairCost(*(sum(getattr(cost, field) for _, _, cost in pairs) for field in PairCost.__dataclass_fields__))
    table.add_row("total (sum of layers)", *_cells(total))
    return table


def _cells(cost: PairCost) -> list[str]:
    hidden = 100 * cost.pair_hidden_comm_s / cost.pair_comm_s if cost.pair_comm_s > 0 else 100.0
    return [f"{t * 1e3:.3f}" for t in (cost.forward_s, cost.backward_s, cost.forward_s + cost.backward_s, cost.pair_s,
                                       cost.pair_comm_s, cost.pair_hidden_comm_s, cost.exposed_comm_s)] + \
        [f"{hidden:.1f}"]
