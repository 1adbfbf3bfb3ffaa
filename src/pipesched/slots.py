"""Level 2: the idealized slot table. Ops take whole slots (F, I, W lengths; B = I + W), data
moves for free, each device runs its table in order. Gives the classic grid picture."""

from __future__ import annotations

from dataclasses import dataclass

from pipesched.costs import StageCosts
from pipesched.rules import held_after_each_op
from pipesched.schedule import Schedule
from pipesched.simulate.graph import compile_graph
from pipesched.simulate.run import run
from pipesched.timeline import Timeline


def slot_table(schedule: Schedule, costs: StageCosts | None = None) -> Timeline:
    """The unit-time timeline of ``schedule`` (source "table", unit "slot"): the compiled
    engine with free communication and slot costs (``StageCosts.slots()``: F = I = W = 1 by
    default; one row of costs applies to every stage). In-flight activations are
    ``table_metrics``' (the timeline carries no memory trace).

    Raises PipeschedError if the tables deadlock; validate first for the full report.
    """
    return run(compile_graph(schedule, table_costs(schedule, costs), None), memory=False)


def table_costs(schedule: Schedule, costs: StageCosts | None = None) -> StageCosts:
    """The slot table's costs for ``schedule``: op lengths in slots (one row of ``costs``
    for every stage; default F = I = W = 1), one unit of activations per stage-microbatch
    held from its F until the op that ends its backward, free messages
    (``StageCosts.in_slots``)."""
    given = costs if costs is not None else StageCosts.slots()
    return given.broadcast(schedule.num_stages, family=schedule.name).in_slots()


def inflight_per_device(schedule: Schedule) -> list[int]:
    """Peak stage-microbatches whose activations each device holds at once."""
    return [max((held for _, held in held_after_each_op(ops, schedule.rules, schedule.roles)), default=0)
            for ops in schedule.device_ops]


@dataclass(frozen=True)
class TableMetrics:
    """Level-2 figures of one schedule (times in slots)."""

    makespan: float
    bubble_ratio: float  # idle / (devices x makespan)
    bubble_over_work: float  # idle / busy, summed over devices
    idle_per_device: tuple[float, ...]
    peak_inflight: tuple[int, ...]  # per device, stage-microbatches
    activation_units: float  # worst device's peak x devices / stages (units of a 1F1B stage)


def one_f_one_b_units(schedule: Schedule) -> float:
    """One of ``schedule``'s stage ops (a slot) and one of its stage-microbatches of
    activations, in units of a 1F1B stage's, as ``compare`` counts them: p / S (a schedule
    with S stages on p devices runs ops of 1/S of the model; an interleaved chunk op with
    v = 2 is half a 1F1B-stage op).

    >>> from pipesched.generators import generate
    >>> one_f_one_b_units(generate("zb-v", 4, 8))
    0.5
    """
    return schedule.num_devices / schedule.num_stages


def table_metrics(schedule: Schedule, costs: StageCosts | None = None, *,
                  timeline: Timeline | None = None) -> TableMetrics:
    """Level-2 figures; pass ``timeline`` when the slot table of ``schedule`` (with the same
    costs) is already at hand."""
    timeline = timeline if timeline is not None else slot_table(schedule, costs)
    idle = timeline.idle_per_device()
    busy = timeline.busy_per_device()
    peaks = inflight_per_device(schedule)
    return TableMetrics(
        makespan=timeline.makespan,
        bubble_ratio=timeline.bubble_ratio(),
        bubble_over_work=float(idle.sum() / busy.sum()) if busy.sum() > 0 else 0.0,
        idle_per_device=tuple(float(x) for x in idle),
        peak_inflight=tuple(peaks),
        # half-size microbatches (Chimera's backward halving) hold half the activations each
        # x one_f_one_b_units (p / S), multiplied before dividing as the closed forms count it
        activation_units=max(peaks) * schedule.num_devices / schedule.num_stages * schedule.microbatch_fraction,
    )
