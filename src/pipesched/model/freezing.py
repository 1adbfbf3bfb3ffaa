"""Frozen layers: what a layer costs when its parameters do not train.

Fine-tuning and adaptive freezing leave some layers' parameters fixed. A frozen layer
needs no weight gradient: no W time, none of the matmul inputs only W reads kept from F
(``weight_input_bytes``), no gradients kept from I for W, and only its working weights
in memory (no gradient, no optimizer state). Whether it still needs a backward depends
on the layers before it, in model order: when some earlier layer trains, the gradient
must flow through this one to reach it (its I stays); when every earlier layer is frozen
too, nothing upstream needs a gradient and the layer runs its forward only, keeping no
activations. With full recompute the kept input is all a layer keeps, and I recomputes
from it: a frozen layer there keeps it.

Layers are named by their position in the model's layer list (``ModelSpec.layer_names``:
the embedding first, then the blocks, then the head, as ``pipesched costs`` lists them).
``parse_frozen_layers`` reads ``0-39``, ``0-9,20-29``, or a fraction of the layers from
the front (``0.5`` or ``50%``).

A stage whose layers are all frozen is a frozen stage (``StageCosts.frozen``); the
schedule then drops its W, or its whole backward (``pipesched.rules.stage_roles``).

>>> parse_frozen_layers("0.25", 10), parse_frozen_layers("2-3,7", 10)
((0, 1), (2, 3, 7))
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from pipesched.errors import PipeschedError, require
from pipesched.indices import parse_indices
from pipesched.model.spec import LayerCost, TrainingSettings


def parse_frozen_layers(text: str, num_layers: int, *, field: str = "frozen_layers") -> tuple[int, ...]:
    """Layer positions from ``--frozen-layers`` text (see the module docstring); ``""`` or
    ``none`` freezes nothing. Raises PipeschedError for a position outside 0..num_layers-1."""
    value = str(text).strip()
    if value in ("", "none"):
        return ()
    if value.endswith("%") or "." in value:
        try:
            fraction = float(value.removesuffix("%")) / (100.0 if value.endswith("%") else 1.0)
        except ValueError:
            fraction = math.nan
        if not 0 <= fraction <= 1:
            raise PipeschedError(f"{field}={value[:40]}: a fraction of the layers must be in [0, 1] (or 0% to 100%); "
                                 "or give layer positions like 0-39")
        return tuple(range(math.floor(fraction * num_layers + 1e-9)))
    return parse_indices(value, field=field, count=num_layers, what="layers")


def frozen_mask(frozen_layers: Sequence[int], num_layers: int, model_name: str) -> tuple[bool, ...]:
    """Per layer, whether it is frozen; raises PipeschedError for a position outside the model."""
    outside = [layer for layer in frozen_layers if not 0 <= layer < num_layers]
    require(not outside, "frozen_layers", outside[0] if outside else "",
            f"{model_name} has layers 0..{num_layers - 1} (embedding first, as `pipesched costs` lists them)")
    chosen = set(frozen_layers)
    return tuple(layer in chosen for layer in range(num_layers))


def freeze_layers(layers: Sequence[LayerCost], frozen: Sequence[bool]) -> list[LayerCost]:
    """``layers`` (the whole model, in order) with the ``frozen`` ones costed as frozen."""
    require(len(frozen) == len(layers), "frozen_layers", f"{len(frozen)} flags", f"give one per layer ({len(layers)})")
    out = []
    upstream_trains = False  # some earlier layer trains: the gradient must pass through
    for layer, flag in zip(layers, frozen, strict=True):
        if not flag:
            out.append(layer)
            upstream_trains = True
        elif upstream_trains:
            only_w = layer.weight_input_bytes if layer.weight_input_bytes < layer.activation_bytes else 0.0
            out.append(dataclasses.replace(
                layer, backward_weight_s=0.0, activation_bytes=layer.activation_bytes - only_w, weight_input_bytes=0.0,
                kept_for_w_bytes=0.0, flops=max(layer.flops - layer.weight_flops, 0.0), weight_flops=0.0, frozen=True))
        else:
            out.append(dataclasses.replace(
                layer, backward_input_s=0.0, backward_weight_s=0.0, activation_bytes=0.0, weight_input_bytes=0.0,
                kept_for_w_bytes=0.0, recompute_s=0.0, flops=layer.forward_flops, weight_flops=0.0, recompute_flops=0.0,
                frozen=True))
    return out


def static_bytes(layer: LayerCost, settings: TrainingSettings) -> float:
    """Parameters, gradients and optimizer state of a layer: a frozen layer keeps its
    working weights only."""
    per_param = settings.weight_bytes if layer.frozen else settings.static_bytes_per_param
    return layer.params * per_param
