"""``simulate``: level 3, a schedule run with real op times and communication costs."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.schedule import Schedule
from pipesched.simulate import engine
from pipesched.simulate.critical import from_binder
from pipesched.simulate.lowering import TaskGraph, lower
from pipesched.simulate.memory import memory_trace
from pipesched.simulate.network import Network
from pipesched.timeline import ALLREDUCE, Timeline, TransferTable


def simulate(
    schedule: Schedule,
    costs: StageCosts,
    network: Network,
    *,
    contention: bool = True,
    overlap: bool = True,
    memory_capacity: Sequence[float] | None = None,
) -> Timeline:
    """Simulate one training iteration of ``schedule``.

    costs: per-stage op times (seconds) and sizes (bytes), one entry per schedule stage.
    network: links between the devices; pipeline device d is network device d.
    contention: transfers sharing a channel (a device's send or receive side, a shared NIC)
        queue one behind the other; False lets every transfer run at full speed at once.
    overlap: devices compute while they communicate; False models a blocking runtime where
        a device's compute stream waits out its own sends and receives.
    memory_capacity: device memory in bytes for the out-of-memory flags (default: the
        network's device capacities, when known).

    Returns a Timeline (source "simulated", unit "s") with op rows in table order, every
    transfer, the memory trace, and in ``meta``: the critical path, the optimizer-step time
    of each device and the settings used.

    >>> from pipesched.generators import generate
    >>> timeline = simulate(generate("1f1b", 4, 8), StageCosts.uniform(4),
    ...                     Network.uniform(4, latency=0.0, bandwidth=float("inf")))
    >>> timeline.makespan  # (m + p - 1) x (F + B) with F = 1, B = 2
    33.0
    """
    graph = lower(schedule, costs, network)
    n = graph.num_ops
    order, count = engine.completion_order(
        graph.ops.device_offsets, graph.pred0, graph.pred1, graph.op_duration
    )
    if count < n:
        raise PipeschedError(_deadlock_message(schedule))
    node_of = np.asarray(network.node_of[: schedule.num_devices], dtype=np.int64)
    op_start, op_end, tr_start, tr_end, binder = engine.sweep(
        order, graph.ops.device, graph.pred0, graph.pred1, graph.op_duration, graph.op_transfer,
        graph.tr_src, graph.tr_dst, graph.tr_bytes, graph.tr_after, graph.ar_after,
        graph.num_p2p, network.latency, network.bandwidth, node_of, network.shared_nic,
        contention, overlap,
    )
    del order
    # keep the columns the timeline needs; the per-op links go
    ops, transfers = graph.ops, _transfer_table(graph, tr_start, tr_end)
    optimizer_step = _optimizer_steps(graph, op_end, tr_end)
    del graph
    chain = np.zeros(0, np.int64)
    if n:
        # the last task to end: an op, or a transfer that ends after every op
        last = int(np.argmax(op_end))
        if len(tr_end) and tr_end.max() > op_end[last]:
            last = n + int(np.argmax(tr_end))
        chain = engine.critical_chain(binder, last)
    del binder
    capacity = memory_capacity
    if capacity is None and network.capacity is not None:
        capacity = network.capacity[: schedule.num_devices]
    memory = memory_trace(schedule, ops, op_start, op_end, costs, capacity=capacity)
    return Timeline(
        schedule=schedule,
        source="simulated",
        unit="s",
        op_device=ops.device,
        op_stage=ops.stage,
        op_kind=ops.kind,
        op_microbatch=ops.microbatch,
        op_start=op_start,
        op_end=op_end,
        transfers=transfers,
        memory=memory,
        meta={
            "costs": costs,
            "network": network,
            "contention": contention,
            "overlap": overlap,
            "critical_path": from_binder(chain, n),
            "optimizer_step_s": optimizer_step,
        },
    )


def _transfer_table(graph: TaskGraph, start: np.ndarray, end: np.ndarray) -> TransferTable:
    """Transfers with the link each used: ``"a->b"`` for a point-to-point transfer from device
    a to device b, ``"a<->b"`` for an all-reduce between them."""
    d = graph.num_devices
    # link id: directed pairs a*d+b, then all-reduce pairs d*d + a*d+b
    link = graph.tr_src * d + graph.tr_dst
    link[graph.tr_kind == ALLREDUCE] += d * d
    used = np.zeros(2 * d * d, bool)
    used[link] = True
    names = []
    for pair in np.flatnonzero(used).tolist():
        allreduce, directed = divmod(pair, d * d)
        a, b = divmod(directed, d)
        names.append(f"{a}<->{b}" if allreduce else f"{a}->{b}")
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
    """When each device may step its optimizer: after its last op and its all-reduces."""
    step = np.zeros(graph.num_devices)
    offsets = graph.ops.device_offsets
    busy = offsets[1:] > offsets[:-1]
    # a device's ops end in table order: its last op ends last
    step[busy] = op_end[offsets[1:][busy] - 1]
    reduces = slice(graph.num_p2p, graph.num_transfers)
    np.maximum.at(step, graph.tr_src[reduces], tr_end[reduces])
    np.maximum.at(step, graph.tr_dst[reduces], tr_end[reduces])
    return tuple(step.tolist())


def _deadlock_message(schedule: Schedule) -> str:
    from pipesched.validate import validate

    violations = validate(schedule)
    detail = str(violations[0]) if violations else "the tables cannot run to completion"
    return f"schedule={schedule.name}: {detail}; run `pipesched validate` on it for the full report"
