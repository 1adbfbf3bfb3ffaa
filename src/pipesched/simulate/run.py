"""Run many times: a compiled task graph (``pipesched.simulate.graph``) becomes a Timeline, with
its compiled durations or new ones, one at a time (``run``) or a batch of duration vectors
in one compiled loop (``run_batch``: Monte Carlo samples, stragglers, what-ifs).

>>> from pipesched.costs import StageCosts
>>> from pipesched.generators import generate
>>> from pipesched.simulate import Network, compile_graph
>>> graph = compile_graph(generate("1f1b", 4, 8), StageCosts.uniform(4),
...                       Network.uniform(4, latency=0.0, bandwidth=float("inf")))
>>> run(graph).makespan, run(graph, op_durations=2 * graph.op_duration).makespan
(33.0, 66.0)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipesched.enums import MemoryUnit, TimeUnit
from pipesched.errors import PipeschedError, require
from pipesched.simulate import engine
from pipesched.simulate.critical import from_binder
from pipesched.simulate.graph import TaskGraph
from pipesched.simulate.memory import host_memory_trace, memory_trace
from pipesched.timeline import ALLREDUCE, SimulationInfo, Source, Timeline, TransferTable
from pipesched.validation import validate

# the most duration vectors one batch call takes (samples x tasks x 8 bytes stays in memory)
MAX_BATCH_VALUES = 2**27


def run(graph: TaskGraph, *, op_durations: np.ndarray | None = None,
        transfer_durations: np.ndarray | None = None, memory_capacity: Sequence[float] | None = None,
        memory: bool = True) -> Timeline:
    """One iteration of ``graph``: start and end of every op and transfer, memory over time,
    the critical path. ``op_durations`` / ``transfer_durations`` replace the compiled
    durations (one per op row / transfer); the result equals compiling costs with those
    durations. ``memory_capacity`` (bytes per device) sets the out-of-memory flags; default:
    the network's device capacities, when known. ``memory=False`` leaves the memory trace
    out."""
    durations, transfer = graph.durations_of(op_durations, transfer_durations)
    n = graph.num_ops
    order, count = engine.completion_order(graph.queue_rows, graph.queue_offsets, graph.pred_ptr,
                                           graph.pred_op, durations, graph.release)
    if count < n:
        raise PipeschedError(_deadlock_message(graph))
    tr_order, tr_key = engine.transfer_order(order, graph.tr_rel_ptr, graph.tr_rel)
    op_start, op_end, tr_start, tr_end, binder = engine.sweep(
        order, graph.op_queue, graph.pred_ptr, graph.pred_op, graph.pred_via, durations, tr_order, tr_key,
        graph.tr_rel_ptr, graph.tr_rel, graph.tr_res_ptr, graph.tr_res, transfer, graph.num_resources, graph.release,
    )
    del order, tr_order, tr_key
    chain = np.zeros(0, np.int64)
    if n:
        chain = engine.critical_chain(binder, engine.last_task(op_end, tr_end))
    del binder
    capacity = memory_capacity
    network = graph.network
    if capacity is None and network is not None and network.capacity is not None:
        capacity = network.capacity[: graph.num_devices]
    slots = graph.costs.unit == TimeUnit.SLOT
    trace = host = None
    if memory:
        unit = MemoryUnit.STAGE_MICROBATCHES if slots else MemoryUnit.BYTES
        trace = memory_trace(graph, op_start, op_end, capacity=capacity, unit=unit)
        host_capacity = None
        if network is not None and network.host_capacity is not None:
            host_capacity = network.host_capacity[: graph.num_devices]
        host = host_memory_trace(graph, op_start, op_end, capacity=host_capacity, unit=unit)
    ops = graph.ops
    return Timeline(
        schedule=graph.schedule,
        source=Source.TABLE if network is None else Source.SIMULATED,
        unit=graph.costs.unit,
        op_device=ops.device,
        op_stage=ops.stage,
        op_kind=ops.kind,
        op_microbatch=ops.microbatch,
        op_start=op_start,
        op_end=op_end,
        transfers=_transfer_table(graph, tr_start, tr_end),
        memory=trace,
        host_memory=host,
        simulation=SimulationInfo(
            costs=graph.costs,
            network=network,
            contention=graph.contention,
            overlap=graph.overlap,
            critical_path=from_binder(chain, n),
            optimizer_step=_optimizer_steps(graph, op_end, tr_end),
            blocking_steps=graph.blocking_steps,
        ),
        op_entry=ops.entry_head,
        op_step=ops.step,
    )


@dataclass(frozen=True, eq=False)
class BatchResult:
    """Iteration times of a batch of runs, and how often each task set the end."""

    makespan: np.ndarray  # float64 (samples,)
    critical_ops: np.ndarray | None  # int64 (ops,): samples in which the op is on the critical path
    critical_transfers: np.ndarray | None  # int64 (transfers,)
    critical_op_seconds: np.ndarray | None = None  # float64 (ops,): its duration summed over those samples
    critical_transfer_seconds: np.ndarray | None = None  # float64 (transfers,)
    group_end: np.ndarray | None = None  # float64 (samples, groups): with ``groups``, each group's last end


def run_batch(graph: TaskGraph, op_durations: np.ndarray, transfer_durations: np.ndarray | None = None, *,
              critical: bool = False, groups: tuple[np.ndarray, np.ndarray, int] | None = None) -> BatchResult:
    """Iteration times of ``graph`` for each row of ``op_durations`` (samples x ops; with
    ``transfer_durations``, samples x transfers, else the compiled transfer durations), in
    one compiled loop; ``critical`` also counts, per task, the samples in which it lies on
    the critical path (and its duration summed over those samples). ``groups`` = (group of
    each op, group of each transfer, number of groups), e.g. the iteration of each task of
    a steady-state graph: each sample's last end per group too, from its first op's start.
    Each sample equals ``run`` with the same durations."""
    ops = np.ascontiguousarray(op_durations, dtype=np.float64)
    require(ops.ndim == 2 and ops.shape[1] == graph.num_ops, "op_durations", f"shape {ops.shape}",
            f"give samples x {graph.num_ops} durations")
    samples = ops.shape[0]
    require(samples * (graph.num_ops + graph.num_transfers) <= MAX_BATCH_VALUES, "samples", samples,
            f"at most {MAX_BATCH_VALUES // max(graph.num_ops + graph.num_transfers, 1):,} samples of this graph "
            "in one batch; run several batches")
    if transfer_durations is None:
        transfers = np.broadcast_to(graph.tr_duration, (samples, graph.num_transfers))
    else:
        transfers = np.ascontiguousarray(transfer_durations, dtype=np.float64)
        require(transfers.shape == (samples, graph.num_transfers), "transfer_durations", f"shape {transfers.shape}",
                f"give {samples} x {graph.num_transfers} durations")
    for name, values in (("op_durations", ops), ("transfer_durations", transfers)):
        require(bool(np.all(np.isfinite(values)) and np.all(values >= 0)), name, "a negative or non-finite value",
                "durations must be finite numbers >= 0")
    counts = np.zeros(graph.num_ops + graph.num_transfers if critical else 0, np.int64)
    seconds = np.zeros(counts.shape[0], np.float64)
    op_group, tr_group, ends = _group_arrays(graph, samples, groups)
    makespan = engine.makespans(graph.queue_rows, graph.queue_offsets, graph.op_queue, graph.pred_ptr, graph.pred_op,
                                graph.pred_via, graph.tr_rel_ptr, graph.tr_rel, graph.tr_res_ptr, graph.tr_res,
                                graph.num_resources, ops, np.ascontiguousarray(transfers), counts, seconds,
                                op_group, tr_group, ends, graph.release)
    if samples and makespan.min() < 0:
        raise PipeschedError(_deadlock_message(graph))
    group_end = ends if groups is not None else None
    if not critical:
        return BatchResult(makespan, None, None, group_end=group_end)
    n = graph.num_ops
    return BatchResult(makespan, counts[:n], counts[n:], seconds[:n], seconds[n:], group_end=group_end)


def _group_arrays(graph: TaskGraph, samples: int,
                  groups: tuple[np.ndarray, np.ndarray, int] | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The engine's (op group, transfer group, ends) arrays; no columns without groups."""
    if groups is None:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((samples, 0))
    op_group, tr_group, count = groups
    op_group = np.ascontiguousarray(op_group, np.int64)
    tr_group = np.ascontiguousarray(tr_group, np.int64)
    require(op_group.shape == (graph.num_ops,) and tr_group.shape == (graph.num_transfers,), "groups",
            f"shapes {op_group.shape}, {tr_group.shape}", f"give one group per op ({graph.num_ops}) and per transfer "
            f"({graph.num_transfers})")
    for values in (op_group, tr_group):
        require(not values.size or (values.min() >= 0 and values.max() < count), "groups", count,
                "every group must be from 0 to the number of groups - 1")
    return op_group, tr_group, np.zeros((samples, count))


def _transfer_table(graph: TaskGraph, start: np.ndarray, end: np.ndarray) -> TransferTable:
    """Transfers with the link each used: ``"a->b"`` for a message from device a to device b,
    ``"a<->b"`` for an all-reduce between them, ``"dp a"`` for device a's data-parallel
    all-reduce of a stage it alone holds in the pipeline."""
    d = graph.num_devices
    # link id: directed pairs a*d+b, then all-reduce pairs d*d + a*d+b
    link = graph.tr_src.astype(np.int64) * d + graph.tr_dst
    link[graph.tr_kind == ALLREDUCE] += d * d
    used = np.zeros(2 * d * d, bool)
    used[link] = True
    names = []
    for pair in np.flatnonzero(used).tolist():
        allreduce, directed = divmod(pair, d * d)
        a, b = divmod(directed, d)
        names.append((f"{a}<->{b}" if a != b else f"dp {a}") if allreduce else f"{a}->{b}")
    channel_of_link = (np.cumsum(used) - 1).astype(np.int32)
    return TransferTable(
        src_device=graph.tr_src,
        dst_device=graph.tr_dst,
        kind=graph.tr_kind,
        stage=graph.tr_stage,
        microbatch=graph.tr_microbatch,
        nbytes=graph.tr_bytes,
        start=start,
        end=end,
        channel=channel_of_link[link],
        channel_names=tuple(names),
    )


def _optimizer_steps(graph: TaskGraph, op_end: np.ndarray, tr_end: np.ndarray) -> tuple[float, ...]:
    """When each device may step its optimizer: after its last op and its all-reduces (a
    blocking runtime: after every transfer it takes part in, its last batch included)."""
    step = np.zeros(graph.num_devices)
    offsets = graph.ops.device_offsets
    busy = offsets[1:] > offsets[:-1]
    if graph.side_queues:
        np.maximum.at(step, graph.ops.device, op_end)
    else:
        # a device's ops end in table order: its last op ends last
        step[busy] = op_end[offsets[1:][busy] - 1]
    reduces = graph.tr_kind == ALLREDUCE if graph.overlap else np.ones(graph.num_transfers, np.bool_)
    np.maximum.at(step, graph.tr_src[reduces], tr_end[reduces])
    np.maximum.at(step, graph.tr_dst[reduces], tr_end[reduces])
    return tuple(step.tolist())


def _deadlock_message(graph: TaskGraph) -> str:
    schedule = graph.schedule
    violations = validate(schedule)
    detail = str(violations[0]) if violations else "the tables cannot run to completion"
    return f"schedule={schedule.name}: {detail}; run `pipesched validate` on it for the full report"
