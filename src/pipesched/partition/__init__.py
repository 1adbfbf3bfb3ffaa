"""Layers -> stages: uniform and balanced (exact min-max, memory-aware, heterogeneous)
partitions, in-flight memory of a schedule, and Megatron layout strings."""

from __future__ import annotations

from pipesched.partition.balanced import Bottleneck, min_bottleneck, stage_values
from pipesched.partition.core import Partition, uniform
from pipesched.partition.layout import expand_layout, format_layout, parse_layout
from pipesched.partition.memory import (
    device_peak_bytes,
    inflight_per_stage,
    stage_instances_per_device,
)

__all__ = [
    "Bottleneck",
    "Partition",
    "device_peak_bytes",
    "expand_layout",
    "format_layout",
    "inflight_per_stage",
    "min_bottleneck",
    "parse_layout",
    "stage_instances_per_device",
    "stage_values",
    "uniform",
]
