"""Throughput against residency: a serving point run at each share of its layers kept on the
GPU (``ServeConfig.resident``; the rest streamed from host memory or disk every iteration),
the same requests at every share, for each model asked for (``serve residency``).

A row per (model, residency): the run's throughput and latencies, and the memory trade the
residency makes (the weights the busiest stage keeps in device memory, the KV-cache blocks
that leaves); a residency at which the model's KV cache cannot hold one request is a row
that does not fit (``fits`` false, why in ``reason``), not an error: a big model's curve
starts where it fits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from pipesched.errors import PipeschedError, require
from pipesched.experiments.serving import (
    KV_CACHE_FIELD,
    ServingPoint,
    point_deployment,
    served_requests,
)
from pipesched.limits import MAX_CURVE_MODELS, MAX_RESIDENCIES
from pipesched.model.inference import check_resident
from pipesched.serving.engine import simulate_serving
from pipesched.serving.results import serve_result, summarize


@dataclass(frozen=True)
class ResidencyRow:
    """One point of a residency curve."""

    model: str
    resident: float  # share of each stage's layers kept on the GPU
    fits: bool  # the KV cache holds a request at this residency (else the metrics are None)
    throughput_tokens_per_s: float | None = None  # output tokens per second
    requests_per_s: float | None = None
    ttft_p50_s: float | None = None
    tpot_p50_s: float | None = None
    slo_attainment: float | None = None
    device_weight_bytes: float | None = None  # parameters in device memory, the stage keeping the most, per device
    kv_capacity_blocks: int | None = None  # the paged cache's blocks, the tightest instance's
    streamed_blocks: int | None = None  # blocks streamed per iteration, all stages of one instance together
    reason: str = ""  # why it does not fit

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def parse_fractions(text: str, *, field: str = "fractions") -> tuple[float, ...]:
    """``"0.25,0.5,1"`` -> the residencies, each in (0, 1], in increasing order (an error
    names ``field``, the option that gave them)."""
    values = []
    for part in (piece.strip() for piece in text.split(",")):
        try:
            values.append(float(part))
        except ValueError:
            raise PipeschedError(f"{field}={text[:40]!r}: give shares in (0, 1] separated by commas, "
                                 "e.g. 0.25,0.5,1") from None
    require(1 <= len(values) <= MAX_RESIDENCIES, field, text[:40],
            f"give 1 to {MAX_RESIDENCIES} shares in (0, 1]")
    for value in values:
        require(0.0 < value <= 1.0, field, value, "give shares of the layers kept on the GPU in (0, 1]")
    return tuple(sorted({check_resident(value) for value in values}))


def residency_curve(point: ServingPoint, fractions: Sequence[float], *,
                    models: Sequence[str] = ()) -> tuple[ResidencyRow, ...]:
    """``point`` at each residency of ``fractions``, for each of ``models`` (preset names or
    files; none: the point's), the same requests throughout (cut to the tightest model's
    context)."""
    names = tuple(dict.fromkeys(models)) or (point.model,)
    require(len(names) <= MAX_CURVE_MODELS, "models", len(names), f"give at most {MAX_CURVE_MODELS} models")
    rows = []
    for name in names:
        for resident in fractions:
            config = dataclasses.replace(point.config, resident=resident)
            rows.append(_row(point.replace(model=name, config=config)))
    return tuple(rows)


def _row(point: ServingPoint) -> ResidencyRow:
    try:
        deployment = point_deployment(point)
    except PipeschedError as exc:
        if not str(exc).startswith(KV_CACHE_FIELD):
            raise
        return ResidencyRow(model=point.model, resident=point.config.resident, fits=False, reason=str(exc))
    run = simulate_serving(deployment, served_requests(point.workload, deployment.max_context))
    result = serve_result(run, slo_ttft=point.targets.slo_ttft, slo_tpot=point.targets.slo_tpot)
    stages = [stage for plan in deployment.instances for stage in plan.stages]
    return ResidencyRow(
        model=point.model, resident=point.config.resident, fits=True, throughput_tokens_per_s=result.throughput_tokens_per_s,
        requests_per_s=result.requests_per_s, ttft_p50_s=summarize(result.ttft_s).p50,
        tpot_p50_s=summarize(result.tpot_s).p50, slo_attainment=result.slo_attainment,
        device_weight_bytes=max(stage.device_weight_bytes for stage in stages),
        kv_capacity_blocks=min(plan.kv_capacity_blocks for plan in deployment.instances),
        streamed_blocks=sum(stage.streamed_blocks for stage in deployment.instances[0].stages))
