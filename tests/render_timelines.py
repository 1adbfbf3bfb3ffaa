"""Timelines with transfers and memory for the render tests, built by hand.

``with_transfers`` runs each device's table in order like the slot table, but every data
dependency that crosses devices goes through a transfer on the link ``dA->dB`` (one at a
time per link), and memory follows the in-flight activations. It is deliberately simple:
the render tests need realistic shapes (gaps, transfers, memory steps), not exact costs.
"""

from __future__ import annotations

import numpy as np

from pipesched.ops import B, F, I, Op, W
from pipesched.rules import RULES
from pipesched.schedule import Schedule
from pipesched.timeline import ACTIVATION, GRADIENT, MemoryTrace, Timeline, TransferTable

GIB = 2.0**30


def with_transfers(
    schedule: Schedule,
    *,
    forward: float = 1e-3,  # seconds
    backward_input: float = 1e-3,
    backward_weight: float = 1e-3,
    comm: float = 2e-4,  # seconds per transfer
    activation: float = 2 * GIB,  # bytes held per in-flight stage-microbatch
    static: float = 10 * GIB,  # bytes, parameters and optimizer state
    capacity: float | None = None,  # bytes per device
) -> Timeline:
    durations = {F: forward, I: backward_input, W: backward_weight, B: backward_input + backward_weight}
    rows = list(schedule.ops())
    row_of = {op: row for row, (_, op) in enumerate(rows)}
    offsets = np.cumsum([0] + [len(ops) for ops in schedule.device_ops])
    start = np.full(len(rows), np.nan)
    end = np.full(len(rows), np.nan)
    position = [0] * schedule.num_devices
    free_at = [0.0] * schedule.num_devices
    link_free: dict[tuple[int, int], float] = {}
    links: dict[tuple[int, int], int] = {}
    transfers: list[tuple] = []
    delivered: dict[tuple[int, int], float] = {}  # (consumer row, producer row) -> arrival
    moved = True
    while moved:
        moved = False
        for device in range(schedule.num_devices):
            while position[device] < len(schedule.device_ops[device]):
                op = schedule.device_ops[device][position[device]]
                preds = [row_of[p] for p in schedule.predecessors(op) if p in row_of]
                if any(np.isnan(end[p]) for p in preds):
                    break
                row = int(offsets[device]) + position[device]
                ready = free_at[device]
                for pred in preds:
                    source = rows[pred][0]
                    if source == device:
                        ready = max(ready, end[pred])
                        continue
                    if (row, pred) not in delivered:
                        link = (source, device)
                        begin = max(end[pred], link_free.get(link, 0.0))
                        link_free[link] = begin + comm
                        channel = links.setdefault(link, len(links))
                        kind = ACTIVATION if op.kind is F else GRADIENT
                        transfers.append((source, device, kind, rows[pred][1].stage, op.microbatch,
                                          activation / 8, begin, begin + comm, channel))
                        delivered[(row, pred)] = begin + comm
                    ready = max(ready, delivered[(row, pred)])
                start[row] = ready
                end[row] = free_at[device] = ready + durations[op.kind]
                position[device] += 1
                moved = True
    assert not np.isnan(end).any(), "the fixture schedule deadlocks"

    columns = list(zip(*transfers, strict=True)) if transfers else [[]] * 9
    table = TransferTable(
        src_device=np.array(columns[0], np.int32),
        dst_device=np.array(columns[1], np.int32),
        kind=np.array(columns[2], np.int8),
        stage=np.array(columns[3], np.int32),
        microbatch=np.array(columns[4], np.int32),
        nbytes=np.array(columns[5], np.float64),
        start=np.array(columns[6], np.float64),
        end=np.array(columns[7], np.float64),
        channel=np.array(columns[8], np.int32),
        channel_names=tuple(f"link d{a}->d{b}" for (a, b) in links),
    )
    return Timeline(
        schedule=schedule,
        source="simulated",
        unit="s",
        op_device=np.array([d for d, _ in rows], np.int32),
        op_stage=np.array([op.stage for _, op in rows], np.int32),
        op_kind=np.array([RULES.index(op.kind) for _, op in rows], np.int8),
        op_microbatch=np.array([op.microbatch for _, op in rows], np.int32),
        op_start=start,
        op_end=end,
        transfers=table,
        memory=_memory(schedule, rows, start, end, activation, static, capacity),
    )


def _memory(schedule, rows, start, end, activation, static, capacity) -> MemoryTrace:
    """F allocates a stage-microbatch's activations at its start; the op ending its backward
    (B, or W when split; I frees half) releases them at its end."""
    times, values = [], []
    for device in range(schedule.num_devices):
        events = []
        for row, (d, op) in enumerate(rows):
            if d != device:
                continue
            if op.kind is F:
                events.append((start[row], activation))
            elif op.kind is B:
                events.append((end[row], -activation))
            elif op.kind in (I, W):
                events.append((end[row], -activation / 2))
        events.sort()
        stamps = np.array([0.0] + [t for t, _ in events])
        levels = static + np.cumsum([0.0] + [delta for _, delta in events])
        times.append(stamps)
        values.append(levels)
    caps = None if capacity is None else (capacity,) * schedule.num_devices
    return MemoryTrace(tuple(times), tuple(values), (static,) * schedule.num_devices, caps, "bytes")


def split_backward(schedule: Schedule) -> Schedule:
    """The same tables with every full backward B split into I then W right after it
    (a valid zero-bubble style table with 3 ops per stage-microbatch)."""
    rows = tuple(
        tuple(part for op in ops for part in ((Op(op.stage, I, op.microbatch), Op(op.stage, W, op.microbatch))
                                              if op.kind is B else (op,)))
        for ops in schedule.device_ops
    )
    return schedule.with_ops(rows, name=f"{schedule.name}-split")


def simulated(schedule: Schedule, *, capacity: float | None = None) -> Timeline:
    """The level-3 simulator's timeline of ``schedule`` on a uniform network: 1 ms ops,
    16 MiB activations over 50 GB/s links, 1 GiB kept per in-flight stage-microbatch."""
    from pipesched.costs import StageCosts
    from pipesched.simulate import Network, simulate

    p = schedule.num_stages
    costs = StageCosts.uniform(p, forward=1e-3, backward_input=1e-3, backward_weight=0.8e-3,
                               activation_bytes=GIB, output_bytes=16 * 2**20)
    network = Network.uniform(schedule.num_devices, latency=5e-6, bandwidth=50e9)
    caps = None if capacity is None else (capacity,) * schedule.num_devices
    return simulate(schedule, costs, network, memory_capacity=caps)


def measured_like(predicted: Timeline, *, seed: int = 0, clock: float = 1234.5) -> Timeline:
    """A fake measurement of ``predicted``: every op's duration scaled by a random factor in
    [0.6, 1.6], each device's ops pushed back to run one after another, rows in the order
    they ran (as a real run records them), on a clock that starts at ``clock`` seconds."""
    rng = np.random.default_rng(seed)
    factor = rng.uniform(0.6, 1.6, len(predicted))
    start = np.empty(len(predicted))
    end = np.empty(len(predicted))
    for device in range(predicted.num_devices):
        free = 0.0
        for row in predicted.rows_of_device(device):
            start[row] = max(free, 1.05 * (predicted.op_start[row] - predicted.origin))
            end[row] = free = start[row] + factor[row] * (predicted.op_end[row] - predicted.op_start[row])
    order = np.argsort(start, kind="stable")
    return Timeline(
        schedule=predicted.schedule, source="measured", unit=predicted.unit,
        op_device=predicted.op_device[order], op_stage=predicted.op_stage[order],
        op_kind=predicted.op_kind[order], op_microbatch=predicted.op_microbatch[order],
        op_start=start[order] + clock, op_end=end[order] + clock,
    )
