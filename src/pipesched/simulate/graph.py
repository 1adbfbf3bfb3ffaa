"""Compile once: a schedule, its stage costs and a network become an immutable task graph of
arrays that ``pipesched.simulate.run`` runs as often as needed, with new durations each
time if wanted (a Monte Carlo sample, a straggler, a what-if) and without lowering again.

Tasks are of two sorts.

Compute ops, one row per op in the schedule's table order (device 0's ops in order, then
device 1's, ...). Each runs on a queue (its device's compute stream) for ``op_duration``
and waits for the ops it needs (``pipesched.rules``; ``pred_op``, CSR by op row). An input
produced on another device arrives by a transfer (``pred_via``), else in place.

A fused entry (``(0F1;1B0)OVERLAP_F_B``) is its parts' rows (``dependencies``) lowered as
one op, as DeepSeek's DualPipe runtime runs an overlapped pair: its first part holds the
device for the pair's time (``StageCosts.fused_time``) and waits for every input of every
part (both receives are waited before the pair); the other parts follow it on the queue
with no duration of their own, so they end with it, and every part's messages leave when
the pair ends (both sends after it). Memory: the forward part allocates when the pair
starts, the backward part frees when it ends. Without overlap (a blocking runtime), the
sends and receives of a fused op still overlap its computation: they do not hold its
device's compute stream.

Transfers, from the communication pass (``pipesched.passes.communication``):

    message     after its producing op ends, to the device of the op that needs it:
                ``output_bytes`` of the lower of the two stages (a gradient is the size
                of the activation the stage below sent up)
    all-reduce  between the two devices that hold replicas of a stage (Chimera, DualPipe),
                once both replicas have run its last weight-gradient op

A transfer a -> b lasts ``latency[a, b] + bytes / bandwidth[a, b]``. The all-reduce's size
is ``StageCosts.grad_bytes[s]``; when unset it is ``static_bytes[s] / 9``: with
mixed-precision Adam a parameter keeps 18 bytes of static state (bf16 weight 2, fp32
gradient 4, fp32 master weight 4, two fp32 moments 8) and sends its 2-byte bf16 gradient.
A ring all-reduce between two ranks sends half the buffer and receives half in each of its
two steps: ``2 * latency + bytes / bandwidth``.

Resources a transfer holds (see ``engine``): the sender's send channel and the receiver's
receive channel (an all-reduce: both of each), the shared NIC egress and ingress of the two
nodes when the devices of a node share one and the nodes differ, and without overlap the
compute streams of both devices (a blocking runtime: neither computes while it sends or
receives). Contention off: no channel is held.

Memory: each op changes the bytes its device holds by the rules' effect of its kind
(``MemoryEffect``), at its start or its end.

Optimizer step. After its last op and its all-reduces a device steps its optimizer. The
step is a zero-duration marker (``Timeline.optimizer_step``): its cost does not depend on
the schedule, only on the parameters a device holds, which the memory trace already shows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from pipesched.costs import StageCosts
from pipesched.dependencies import OpArrays, dependencies, rule_arrays
from pipesched.errors import require
from pipesched.passes.communication import allreduces, messages
from pipesched.schedule import Schedule
from pipesched.simulate.network import Network
from pipesched.timeline import ALLREDUCE

# bytes of static state per parameter over bytes of its bf16 gradient (see module docstring)
STATIC_PER_GRADIENT_BYTE = 9.0


@dataclass(frozen=True, eq=False)
class TaskGraph:
    """Everything the engine needs, as arrays (one row per op, one per transfer), and what it
    was compiled from."""

    schedule: Schedule
    costs: StageCosts
    network: Network | None  # None: free communication (the slot table)
    contention: bool
    overlap: bool
    ops: OpArrays
    op_queue: np.ndarray  # int32 queue (resource id) of each op
    queue_rows: np.ndarray  # int32 op rows of queue 0, then queue 1, ... in program order
    queue_offsets: np.ndarray  # int64 (Q+1)
    op_duration: np.ndarray  # float64, in costs.unit
    pred_ptr: np.ndarray  # int64 (N+1): op x needs pred_op[pred_ptr[x]:pred_ptr[x+1]]
    pred_op: np.ndarray  # int32
    pred_via: np.ndarray  # int32 transfer carrying that input, -1 when local
    # transfers: messages first (in producer table order), then all-reduces
    tr_src: np.ndarray  # int32 device
    tr_dst: np.ndarray  # int32 device
    tr_kind: np.ndarray  # int8, timeline.ACTIVATION / GRADIENT / ALLREDUCE
    tr_stage: np.ndarray  # int32
    tr_microbatch: np.ndarray  # int32, -1 for all-reduces
    tr_bytes: np.ndarray  # float64
    tr_duration: np.ndarray  # float64, seconds
    tr_rel_ptr: np.ndarray  # int64 (T+1): ops that release each transfer
    tr_rel: np.ndarray  # int32
    tr_res_ptr: np.ndarray  # int64 (T+1): resources each transfer holds
    tr_res: np.ndarray  # int32
    num_resources: int
    memory_delta: np.ndarray  # float64 bytes each op adds (+) or frees (-)
    memory_at_start: np.ndarray  # bool: the change happens when the op starts (else when it ends)
    static_bytes: tuple[float, ...]  # per device: parameters, gradients, optimizer state

    @property
    def num_ops(self) -> int:
        return len(self.ops)

    @property
    def num_transfers(self) -> int:
        return int(self.tr_src.shape[0])

    @property
    def num_devices(self) -> int:
        return self.schedule.num_devices

    @property
    def num_messages(self) -> int:
        return int(np.count_nonzero(self.tr_kind != ALLREDUCE))

    def durations_of(self, op_durations: np.ndarray | None = None,
                     transfer_durations: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Checked duration vectors for a run (the compiled ones where None is given)."""
        ops = self.op_duration if op_durations is None else _checked(op_durations, self.num_ops, "op_durations")
        transfers = (self.tr_duration if transfer_durations is None
                     else _checked(transfer_durations, self.num_transfers, "transfer_durations"))
        return ops, transfers


def _checked(values: np.ndarray, length: int, name: str) -> np.ndarray:
    array = np.ascontiguousarray(values, dtype=np.float64)
    require(array.shape == (length,), name, f"shape {array.shape}", f"give one duration per task ({length})")
    require(bool(np.all(np.isfinite(array)) and np.all(array >= 0)), name, "a negative or non-finite value",
            "durations must be finite numbers >= 0")
    return array


def gradient_bytes(costs: StageCosts, stage: int) -> float:
    """Bytes of stage's gradient all-reduce (see the module docstring for the default)."""
    if costs.grad_bytes is not None:
        return costs.grad_bytes[stage]
    return costs.static(stage) / STATIC_PER_GRADIENT_BYTE


def static_per_device(schedule: Schedule, costs: StageCosts) -> tuple[float, ...]:
    """Bytes of parameters, gradients and optimizer state each device holds (each replica's
    copy counts: Chimera and DualPipe keep two)."""
    held = [0.0] * schedule.num_devices
    for replica in schedule.placement.replicas:
        for stage, device in enumerate(replica):
            held[device] += costs.static(stage)
    return tuple(held)


def compile_graph(schedule: Schedule, costs: StageCosts, network: Network | None = None, *,
                  contention: bool = True, overlap: bool = True) -> TaskGraph:
    """Build the task graph of ``schedule`` with ``costs`` on ``network`` (None: free
    communication, no transfers, as in the slot table).

    Raises PipeschedError when the table is not a complete, well-placed schedule or the
    costs and network do not fit it (``pipesched validate`` names every problem).
    """
    require(
        costs.num_stages == schedule.num_stages,
        "stage_costs",
        f"{costs.num_stages} stages",
        f"the schedule has {schedule.num_stages} stages; give one cost row per stage",
    )
    if network is not None:
        require(
            network.num_devices >= schedule.num_devices,
            "devices",
            network.num_devices,
            f"the network has {network.num_devices} devices but the schedule places stages on "
            f"{schedule.num_devices}; use a bigger cluster",
        )
    deps = dependencies(schedule)
    ops = deps.ops
    n, num_devices = len(ops), schedule.num_devices
    kinds = ops.kind.astype(np.int64)
    # op durations by kind (rows: the rules' kinds) and stage
    per_kind = np.array([costs.times(rule.cost) if not rule.fused else (0.0,) * costs.num_stages
                         for rule in schedule.rules], np.float64)
    op_duration = per_kind[kinds, ops.stage]
    # data dependencies, CSR by consumer row
    consumer, producer, _ = deps.edges
    if ops.fused:
        op_duration, consumer = fuse_entries(ops, costs, op_duration, consumer)
    pred_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(consumer, minlength=n), out=pred_ptr[1:])
    # memory effects of each op (rules x this stage's activation bytes)
    arrays = rule_arrays(schedule.rules)
    activation = np.asarray(costs.activation_bytes, np.float64)[ops.stage]
    memory_delta = (arrays.memory_whole[kinds] + arrays.memory_input_part[kinds] * costs.input_frees) * activation
    if costs.kept_for_w_bytes is not None:
        memory_delta += arrays.memory_kept[kinds] * np.asarray(costs.kept_for_w_bytes, np.float64)[ops.stage]
    memory_at_start = arrays.memory_at_start[kinds]
    # one queue per device: its compute stream, in table order
    op_queue = ops.device.astype(np.int32)
    queue_rows = np.arange(n, dtype=np.int32)
    queue_offsets = ops.device_offsets.astype(np.int64)
    static = static_per_device(schedule, costs)
    if network is None:
        return _graph(schedule, costs, None, contention, overlap, ops, op_queue, queue_rows, queue_offsets,
                      op_duration, pred_ptr, producer, np.full(producer.shape[0], -1, np.int32),
                      _no_transfers(), num_devices, memory_delta, memory_at_start, static)
    sent = messages(schedule)
    reduces = allreduces(schedule)
    m_count, r_count = len(sent), len(reduces)
    src = np.concatenate([sent.src, reduces.src]).astype(np.int32)
    dst = np.concatenate([sent.dst, reduces.dst]).astype(np.int32)
    kind = np.concatenate([sent.kind, np.full(r_count, ALLREDUCE, np.int8)]).astype(np.int8)
    stage = np.concatenate([sent.stage, reduces.stage]).astype(np.int32)
    microbatch = np.concatenate([sent.microbatch, np.full(r_count, -1, np.int32)]).astype(np.int32)
    output = np.asarray(costs.output_bytes, np.float64)
    nbytes = np.concatenate([output[sent.boundary],
                             [gradient_bytes(costs, int(s)) for s in reduces.stage]]).astype(np.float64)
    # latency + bytes / bandwidth; an all-reduce of two ranks pays the latency twice
    latency = network.latency[src, dst]
    duration = latency + nbytes / network.bandwidth[src, dst]
    duration[m_count:] += latency[m_count:]
    # the ops that release each transfer: its producer; an all-reduce: each replica's last
    # weight-gradient op of the stage (row-major: the first device's, then the second's)
    released = reduces.after >= 0
    rel = np.concatenate([sent.producer, reduces.after[released]]).astype(np.int32)
    rel_ptr = np.zeros(m_count + r_count + 1, np.int64)
    np.cumsum(np.concatenate([np.ones(m_count, np.int64), released.sum(axis=1)]), out=rel_ptr[1:])
    blocks = np.ones((m_count + r_count, 2), np.bool_)
    if ops.fused and not overlap:
        blocks[:m_count] = _blocking_ends(ops, deps.edges[0], sent)
    res_ptr, res, num_resources = _transfer_resources(network, src, dst, m_count, contention, overlap, num_devices,
                                                      blocks)
    transfers = (src, dst, kind, stage, microbatch, nbytes, duration, rel_ptr, rel, res_ptr, res)
    return _graph(schedule, costs, network, contention, overlap, ops, op_queue, queue_rows, queue_offsets,
                  op_duration, pred_ptr, producer, sent.via, transfers, num_resources, memory_delta,
                  memory_at_start, static)


def fuse_entries(ops: OpArrays, costs: StageCosts, op_duration: np.ndarray,
                 consumer: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fused entries as one op each (see the module docstring): the durations with each
    entry's time on its first part and none on the others, and the dependency edges'
    consumers moved to the entry's first part. Edges stay sorted by consumer: an entry's
    parts are consecutive rows."""
    tails = ops.tails()
    heads = np.unique(ops.entry_head[tails])
    backward = np.zeros(len(ops), np.float64)
    np.add.at(backward, ops.entry_head[tails], op_duration[tails])
    fused = op_duration.copy()
    fused[heads] = [costs.fused_time(int(stage), float(forward), float(rest))
                    for stage, forward, rest in zip(ops.stage[heads], op_duration[heads], backward[heads], strict=True)]
    fused[tails] = 0.0
    return fused, ops.entry_head[consumer].astype(np.int32)


def _graph(schedule, costs, network, contention, overlap, ops, op_queue, queue_rows, queue_offsets, op_duration,
           pred_ptr, pred_op, pred_via, transfers, num_resources, memory_delta, memory_at_start, static) -> TaskGraph:
    src, dst, kind, stage, microbatch, nbytes, duration, rel_ptr, rel, res_ptr, res = transfers
    return TaskGraph(
        schedule=schedule, costs=costs, network=network, contention=contention, overlap=overlap, ops=ops,
        op_queue=op_queue, queue_rows=queue_rows, queue_offsets=queue_offsets, op_duration=op_duration,
        pred_ptr=pred_ptr, pred_op=pred_op.astype(np.int32), pred_via=pred_via.astype(np.int32),
        tr_src=src, tr_dst=dst, tr_kind=kind, tr_stage=stage, tr_microbatch=microbatch, tr_bytes=nbytes,
        tr_duration=duration, tr_rel_ptr=rel_ptr, tr_rel=rel, tr_res_ptr=res_ptr, tr_res=res,
        num_resources=int(num_resources), memory_delta=memory_delta, memory_at_start=memory_at_start,
        static_bytes=static,
    )


def _no_transfers() -> tuple[np.ndarray, ...]:
    i32, f64, ptr = np.zeros(0, np.int32), np.zeros(0, np.float64), np.zeros(1, np.int64)
    return (i32, i32, np.zeros(0, np.int8), i32, i32, f64, f64, ptr, i32, ptr, i32)


def _blocking_ends(ops: OpArrays, consumer: np.ndarray, sent) -> np.ndarray:
    """Without overlap, which end of each message a blocking runtime holds (messages x 2:
    sender, receiver): not a fused op's, whose sends and receives overlap its computation
    as DeepSeek's runtime runs an overlapped pair."""
    part = ops.entry_kind != ops.kind  # rows that are a part of a fused op
    blocks = np.ones((len(sent), 2), np.bool_)
    blocks[:, 0] = ~part[sent.producer]
    carried = sent.via >= 0
    np.logical_and.at(blocks[:, 1], sent.via[carried], ~part[consumer[carried]])
    return blocks


def _transfer_resources(network: Network, src: np.ndarray, dst: np.ndarray, num_messages: int,
                        contention: bool, overlap: bool, num_devices: int,
                        blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """CSR of the resources each transfer holds, in the order it claims them. Resource ids:
    compute stream (queue) d, send channel d, receive channel d, then each node's NIC egress
    and ingress. ``blocks[t]``: without overlap, whether transfer t holds its sender's and
    its receiver's compute stream."""
    node_of = np.asarray(network.node_of[:num_devices], np.int64)
    num_nodes = int(node_of.max()) + 1 if num_devices else 1
    res_ptr, res = _resources(src.astype(np.int64), dst.astype(np.int64), node_of, num_devices, num_nodes,
                              num_messages, contention, overlap, bool(network.shared_nic), blocks)
    return res_ptr, res, 3 * num_devices + 2 * num_nodes


@njit(cache=True)
def _resources(src, dst, node_of, num_devices, num_nodes, num_messages, contention, overlap, shared_nic, blocks):
    send0 = num_devices
    recv0 = 2 * num_devices
    egress0 = 3 * num_devices
    ingress0 = egress0 + num_nodes
    total = src.shape[0]
    res_ptr = np.zeros(total + 1, np.int64)
    res = np.empty(total * 10, np.int32)
    k = 0
    for t in range(total):
        a = src[t]
        b = dst[t]
        allreduce = t >= num_messages
        if not overlap:
            # a blocking runtime: neither compute stream runs while the transfer does
            if blocks[t, 0]:
                res[k] = a
                k += 1
            if blocks[t, 1]:
                res[k] = b
                k += 1
        if contention:
            res[k] = send0 + a
            res[k + 1] = recv0 + b
            k += 2
            if allreduce:
                res[k] = send0 + b
                res[k + 1] = recv0 + a
                k += 2
            if shared_nic and node_of[a] != node_of[b]:
                res[k] = egress0 + node_of[a]
                res[k + 1] = ingress0 + node_of[b]
                k += 2
                if allreduce:
                    res[k] = egress0 + node_of[b]
                    res[k + 1] = ingress0 + node_of[a]
                    k += 2
        res_ptr[t + 1] = k
    return res_ptr, res[:k].copy()
