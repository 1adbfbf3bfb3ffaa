"""Layer-wise costs: model shapes and presets, devices and clusters, per-layer costs from
Megatron FLOP formulas and a shape-aware kernel time model, and per-stage costs of a
partition.

>>> from pipesched.model import TrainingSettings, layer_costs, load_device, load_model
>>> costs = layer_costs(load_model("gpt3-1.3b"), load_device("a100-80gb"), TrainingSettings())
>>> len(costs), costs[0].name, costs[-1].name
(26, 'embedding', 'head')
"""

from __future__ import annotations

from pipesched.model.clusters import (
    cluster_presets,
    homogeneous_cluster,
    load_cluster,
    parse_cluster,
)
from pipesched.model.collectives import (
    CollectiveLevel,
    allreduce_seconds,
    group_levels,
    reduce_scatter_seconds,
)
from pipesched.model.devices import DEVICES, load_device
from pipesched.model.hardware import Cluster, DeviceSpec, LinkSpec
from pipesched.model.loading import (
    LAYER_COLUMNS,
    load_model,
    parse_hf_config,
    parse_layer_csv,
    parse_model_yaml,
)
from pipesched.model.presets import MODELS
from pipesched.model.spec import LayerCost, ModelSpec, TrainingSettings
from pipesched.model.stages import (
    METHODS,
    StagePlan,
    build_stage_costs,
    data_parallel_groups,
    pipeline_ranks,
    plan_stages,
)
from pipesched.model.transformer import (
    allreduce_time,
    hardware_flops_per_iteration,
    layer_costs,
    layer_params,
    model_flops_per_iteration,
)

__all__ = [
    "DEVICES",
    "LAYER_COLUMNS",
    "METHODS",
    "MODELS",
    "Cluster",
    "CollectiveLevel",
    "DeviceSpec",
    "LayerCost",
    "LinkSpec",
    "ModelSpec",
    "StagePlan",
    "TrainingSettings",
    "allreduce_seconds",
    "allreduce_time",
    "build_stage_costs",
    "cluster_presets",
    "data_parallel_groups",
    "group_levels",
    "hardware_flops_per_iteration",
    "homogeneous_cluster",
    "layer_costs",
    "layer_params",
    "load_cluster",
    "load_device",
    "load_model",
    "model_flops_per_iteration",
    "parse_cluster",
    "parse_hf_config",
    "parse_layer_csv",
    "parse_model_yaml",
    "pipeline_ranks",
    "plan_stages",
    "reduce_scatter_seconds",
]
