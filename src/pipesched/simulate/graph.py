"""Compile once: a schedule, its stage costs and a network become an immutable task graph of
arrays that ``pipesched.simulate.run`` runs as often as needed, with new durations each
time if wanted (a Monte Carlo sample, a straggler, a what-if) and without lowering again.

Tasks are of two sorts.

Ops, one row per op in the schedule's table order (device 0's ops in order, then device
1's, ...). Each runs on a queue, one of its device's streams (the rules' ``stream`` of its
kind: the compute stream, or the host link that offloads and reloads activations), for
``op_duration`` and waits for the ops it needs (``pipesched.rules``; ``pred_op``, CSR by op
row). An input produced on another device arrives by a transfer (``pred_via``), else in
place. A frozen stage's ops take the cost and memory effect of its role
(``Rules.cost_for``, ``Rules.memory_for``).

Streams (``op_queues``). The compute queue of device d is resource d. A device whose table
holds host-link ops gets a second queue (a resource after the channels and NICs) that runs
them in table order, beside its compute stream: an op there is issued when the compute op
before it in the device's table has ended (its runtime issues the copy at that point of
its program), so where a reload sits in the table says how early it may start. An
offload or reload lasts ``host latency + activation bytes / host bandwidth`` of its device
(``Network.host_bandwidth``; free without a network, as in the slot table); a device with
no host link cannot run one.

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
    all-reduce  of a stage's weight gradients, once every copy of the stage in the pipeline
                has run its last weight-gradient op: between the two devices that hold
                replicas of the stage (Chimera, DualPipe), and with data parallelism
                (``Network.data_parallel``, d > 1 pipelines) of every stage with the
                other pipelines' copies (src = dst when the pipeline holds one copy)

A transfer a -> b lasts ``latency[a, b] + bytes / bandwidth[a, b]``. The all-reduce's size
is ``StageCosts.grad_bytes[s]``; when unset it is ``static_bytes[s] x 4 / 18``: with
mixed-precision Adam a parameter keeps 18 bytes of static state (bf16 weight 2, fp32
gradient 4, fp32 master weight 4, two fp32 moments 8) and all-reduces its 4-byte fp32
gradient, as the model's costs do (``pipesched.model.spec.GRAD_BYTES_PER_PARAM``).
Its time is a collective's (``pipesched.model.collectives``): a ring of the stage's two
replicas (``2 * latency + bytes / bandwidth``), then the device's data-parallel levels
(``DataParallel.seconds``: ring inside a node, ring across nodes; with a sharded optimizer
a reduce-scatter of the gradients and an all-gather of the parameters). Buckets are per
stage, so a device holding several stages reduces the first ones while it still computes
the last, as Megatron overlaps the gradient reduction with the last backward ops.

Resources a transfer holds (see ``engine``): the sender's send channel and the receiver's
receive channel, the shared NIC egress and ingress of the two nodes when the devices of a
node share one and the nodes differ. An all-reduce holds the send and receive channels of
both replicas' devices, and with data parallelism each device's data-parallel channel (the
collective's own communicator, beside the point-to-point traffic) and, when its group
leaves the node and the node's devices share a NIC, that NIC's egress and ingress; without
overlap also the compute streams of its devices. Contention off: no channel is held.

Without overlap (a blocking runtime) messages go in batches between a device's steps of
compute, each batch waited out before the next step (``pipesched.simulate.blocking``: a
second releaser per message, the receiver's post, and edges from each batch to the op
after it).

Memory: each op changes the bytes its device holds by the rules' effect of its kind
(``MemoryEffect``), at its start or its end, and the bytes of host memory that hold its
device's offloaded activations (``host_delta``).

Optimizer step. After its last op and its all-reduces a device steps its optimizer. The
step is a zero-duration marker (``Timeline.optimizer_step``): its cost does not depend on
the schedule, only on the parameters a device holds, which the memory trace already shows.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from numba import njit

from pipesched.costs import StageCosts
from pipesched.dependencies import OpArrays, dependencies, memory_deltas, role_index, rule_arrays
from pipesched.errors import PipeschedError, require
from pipesched.model.collectives import allreduce_seconds
from pipesched.model.spec import (
    GRAD_BYTES_PER_PARAM,
    STATIC_BYTES_PER_PARAM,
    WEIGHT_BYTES_PER_PARAM,
)
from pipesched.ops import W
from pipesched.passes.communication import AllReduces, allreduces, messages
from pipesched.rules import COMPUTE, HOST_TRANSFER, ROLES, STREAMS
from pipesched.schedule import Schedule
from pipesched.simulate.blocking import blocking_program
from pipesched.simulate.engine import NO_RELEASE
from pipesched.simulate.network import Network
from pipesched.timeline import ALLREDUCE


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
    host_delta: np.ndarray | None = None  # float64 host-memory bytes each op adds or frees (offloads)
    host_at_start: np.ndarray | None = None  # bool, like memory_at_start
    side_queues: int = 0  # queues beyond one compute queue per device (host links)
    blocking_steps: str | None = None  # without overlap: "op" or "pair" batches (simulate.blocking)
    # earliest start of each op, in costs.unit (a request that arrives at t); None: all 0
    op_release: np.ndarray | None = None  # float64

    @property
    def release(self) -> np.ndarray | None:
        """The engine's release array: one time per op, or None when no op waits for one."""
        return NO_RELEASE if self.op_release is None else self.op_release

    def with_release(self, release: np.ndarray) -> TaskGraph:
        """This graph with op ``x`` not starting before ``release[x]`` (one time per op row,
        finite and >= 0)."""
        return dataclasses.replace(self, op_release=_checked(release, self.num_ops, "release"))

    @property
    def offloads(self) -> bool:
        """Whether some op moves activations to or from host memory."""
        return self.host_delta is not None and bool(np.any(self.host_delta != 0))

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
        """Point-to-point messages (activations, gradients): the first transfers."""
        return int(np.count_nonzero(self.tr_kind < ALLREDUCE))

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
    """Bytes of stage's gradient all-reduce (see the module docstring for the default).

    >>> gradient_bytes(StageCosts((1.0,), (1.0,), (1.0,), (1.0,), (0.0,), static_bytes=(18e9,)), 0)
    4000000000.0
    """
    if costs.grad_bytes is not None:
        return costs.grad_bytes[stage]
    return costs.static(stage) * GRAD_BYTES_PER_PARAM / STATIC_BYTES_PER_PARAM


def weight_bytes(costs: StageCosts, stage: int) -> float:
    """Bytes of one copy of a stage's bf16 working weights (a weight version an asynchronous
    schedule keeps): its gradient's parameters at ``WEIGHT_BYTES_PER_PARAM`` each."""
    return gradient_bytes(costs, stage) * WEIGHT_BYTES_PER_PARAM / GRAD_BYTES_PER_PARAM


def static_per_device(schedule: Schedule, costs: StageCosts) -> tuple[float, ...]:
    """Bytes of parameters, gradients and optimizer state each device holds (each replica's
    copy counts: Chimera and DualPipe keep two)."""
    held = [0.0] * schedule.num_devices
    for replica in schedule.placement.replicas:
        for stage, device in enumerate(replica):
            held[device] += costs.static(stage)
    return tuple(held)


def compile_graph(schedule: Schedule, costs: StageCosts, network: Network | None = None, *,
                  contention: bool = True, overlap: bool = True, blocking_steps: str = "auto") -> TaskGraph:
    """Build the task graph of ``schedule`` with ``costs`` on ``network`` (None: free
    communication, no transfers, as in the slot table). Without ``overlap``, a blocking
    runtime's batches of ``blocking_steps`` ("op", "pair" or "auto": see
    ``pipesched.simulate.blocking``). The graph of free communication is compiled first and
    the network lowered onto it (``with_network``), so a graph compiled without one (a
    search's bound) takes its network later without compiling its ops again.

    Raises PipeschedError when the table is not a complete, well-placed schedule, the
    costs and network do not fit it (``pipesched validate`` names every problem), or a
    blocking runtime deadlocks on it.
    """
    fields = _op_fields(schedule, costs)
    if network is None:
        return TaskGraph(**fields, **_free_communication(schedule, fields["costs"], fields["ops"], fields["op_duration"]),
                         network=None, contention=contention, overlap=overlap)
    _require_devices(schedule, network)
    # lowered at once: the free-communication queues and edges are not built to be replaced
    return TaskGraph(**(fields | _network_fields(schedule, fields["costs"], fields["ops"], fields["op_duration"],
                                                  network, contention, overlap, blocking_steps)))


def _op_fields(schedule: Schedule, costs: StageCosts) -> dict:
    """What a graph holds of its ops whatever the network: the ops, their durations with
    free communication, memory and host-memory effects, static bytes."""
    require(
        costs.num_stages == schedule.num_stages,
        "stage_costs",
        f"{costs.num_stages} stages",
        f"the schedule has {schedule.num_stages} stages; give one cost row per stage",
    )
    # costs describe the user's microbatch; a table of half-size microbatches (Chimera's
    # backward halving) runs each at half of them
    costs = costs.of_microbatch_fraction(schedule.microbatch_fraction)
    ops = dependencies(schedule).ops
    kinds = ops.kind.astype(np.int64)
    arrays = rule_arrays(schedule.rules)
    op_duration, _, _, _ = _op_edges(schedule, costs, None)
    # memory effects of each op (its stage role's effect x this stage's activation bytes)
    memory_delta, memory_at_start = memory_deltas(schedule, ops, costs)
    tokens = token_scales(schedule)
    if tokens is not None:  # a token slice holds activations in proportion to its tokens
        memory_delta = memory_delta * tokens[ops.microbatch]
    host = (None, None)
    if _uses_side_streams(schedule):
        activation = np.asarray(costs.activation_bytes, np.float64)[ops.stage]
        role = role_index(schedule.roles)[ops.stage] if schedule.frozen else 0
        host = (arrays.role_host[role, kinds] * activation, arrays.role_host_at_start[role, kinds])
    return dict(schedule=schedule, costs=costs, ops=ops, op_duration=op_duration, memory_delta=memory_delta,
                memory_at_start=memory_at_start, static_bytes=static_per_device(schedule, costs),
                host_delta=host[0], host_at_start=host[1])


def _free_communication(schedule: Schedule, costs: StageCosts, ops, op_duration: np.ndarray) -> dict:
    """A graph's queues and edges with free communication: no transfers, no links."""
    num_devices = schedule.num_devices
    _, consumer, producer, issued_after = _op_edges(schedule, costs, None, op_duration)
    stream = rule_arrays(schedule.rules).stream if _uses_side_streams(schedule) else None
    op_queue, queue_rows, queue_offsets, side = op_queues(ops, stream, num_devices, num_devices)
    pred_ptr, pred_op, pred_via = _with_issue_edges(consumer, producer, np.full(producer.shape[0], -1, np.int32),
                                                    issued_after, len(ops))
    return dict(op_queue=op_queue, queue_rows=queue_rows, queue_offsets=queue_offsets, pred_ptr=pred_ptr,
                pred_op=pred_op.astype(np.int32), pred_via=pred_via.astype(np.int32),
                **_transfer_fields(_no_transfers()), num_resources=int(num_devices + side * num_devices),
                side_queues=side)


def _op_edges(schedule: Schedule, costs: StageCosts, network: Network | None,
              durations: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """(op durations, consumer and producer rows of the data dependencies, issue edges or
    None): fused entries as one op; host-link ops also wait for the compute op before them
    in their device's table (where the runtime issues them). ``durations``: the ones of a
    graph of free communication, kept unless host-link ops take the network's time."""
    ops = dependencies(schedule).ops
    side = _uses_side_streams(schedule)
    # data dependencies, CSR by consumer row
    consumer, producer, _ = dependencies(schedule).edges
    op_duration = durations
    if durations is None or side:
        op_duration = op_durations(schedule, costs, network)
        if ops.fused:
            op_duration, _ = fuse_entries(ops, costs, op_duration, consumer)
    if ops.fused:
        consumer = ops.entry_head[consumer].astype(np.int32)  # as fuse_entries moves them
    issued_after = _issue_edges(ops, rule_arrays(schedule.rules).stream) if side else None
    return op_duration, consumer, producer, issued_after


def with_network(graph: TaskGraph, network: Network, *, contention: bool = True, overlap: bool = True,
                 blocking_steps: str = "auto") -> TaskGraph:
    """``graph`` (compiled with free communication) on ``network``: its messages and
    all-reduces as transfers holding their links, host-link ops at their links' time, and
    without ``overlap`` a blocking runtime's batches (see ``compile_graph``)."""
    _require_lowerable(graph, network)
    # the ops' memory and host-memory effects and static bytes are the graph's own
    return dataclasses.replace(graph, **_network_fields(graph.schedule, graph.costs, graph.ops, graph.op_duration,
                                                        network, contention, overlap, blocking_steps),
                               op_release=None)


def _network_fields(schedule: Schedule, costs: StageCosts, ops, durations: np.ndarray, network: Network,
                    contention: bool, overlap: bool, blocking_steps: str) -> dict:
    """A graph's queues, edges, durations and transfers on ``network``."""
    n, num_devices = len(ops), schedule.num_devices
    op_duration, consumer, producer, issued_after = _op_edges(schedule, costs, network, durations)
    sent = messages(schedule)
    reduces = allreduces(schedule, data_parallel=network.reduces_gradients)
    columns = _transfer_columns(costs, network, sent, reduces, token_scales(schedule))
    rel_ptr, rel = _release_rows(sent, reduces)
    res_ptr, res, num_resources = link_resources(network, sent.src, sent.dst, contention, num_devices)
    if len(reduces):
        res_ptr, res, num_resources = _with_collective_resources(res_ptr, res, network, reduces, contention, overlap)
    stream = rule_arrays(schedule.rules).stream if _uses_side_streams(schedule) else None
    op_queue, queue_rows, queue_offsets, side = op_queues(ops, stream, num_devices, num_resources)
    pred_ptr, pred_op, pred_via = _with_issue_edges(consumer, producer, sent.via, issued_after, n)
    steps = None
    if not overlap:
        if side:
            raise PipeschedError("overlap=False: a blocking runtime with offloads is not modelled; simulate "
                                 "offloads with overlap, or drop the offload")
        program = blocking_program(schedule, steps=blocking_steps, queue_rows=queue_rows, queue_offsets=queue_offsets,
                                   kinds=ops.kind.astype(np.int64), pred_ptr=pred_ptr, pred_op=pred_op,
                                   pred_via=pred_via, tr_rel_ptr=rel_ptr, tr_rel=rel, num_messages=len(sent),
                                   tails=ops.tails() if ops.fused else None)
        pred_ptr, pred_op, pred_via, rel_ptr, rel = (program.pred_ptr, program.pred_op, program.pred_via,
                                                     program.tr_rel_ptr, program.tr_rel)
        steps = program.steps
    return dict(network=network, contention=contention, overlap=overlap, op_queue=op_queue, queue_rows=queue_rows,
                queue_offsets=queue_offsets, op_duration=op_duration, pred_ptr=pred_ptr,
                pred_op=pred_op.astype(np.int32), pred_via=pred_via.astype(np.int32),
                **_transfer_fields((*columns, rel_ptr, rel, res_ptr, res)),
                num_resources=int(num_resources + side * num_devices), side_queues=side, blocking_steps=steps)


def _require_lowerable(graph: TaskGraph, network: Network) -> None:
    """Raise PipeschedError unless ``graph`` has no network yet and ``network`` holds its devices."""
    require(graph.network is None, "network", graph.network.name if graph.network is not None else "",
            "the graph has a network already; lower one onto a graph of free communication")
    _require_devices(graph.schedule, network)


def _require_devices(schedule: Schedule, network: Network) -> None:
    """Raise PipeschedError unless ``network`` holds the devices of ``schedule``."""
    devices = schedule.num_devices
    require(
        network.num_devices >= devices,
        "devices",
        network.num_devices,
        f"the network has {network.num_devices} devices but the schedule places stages on "
        f"{devices}; use a bigger cluster",
    )


def _transfer_columns(costs: StageCosts, network: Network, sent, reduces,
                      tokens: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """The transfers' columns, the messages then the all-reduces: src, dst, kind, stage,
    microbatch (-1 for an all-reduce), bytes, and duration in seconds (a message: latency
    + bytes / bandwidth; an all-reduce: a collective's time). ``tokens``: each microbatch's
    share of the mean one's tokens, which its messages' bytes scale by."""
    m_count, r_count = len(sent), len(reduces)
    src = np.concatenate([sent.src, reduces.src]).astype(np.int32)
    dst = np.concatenate([sent.dst, reduces.dst]).astype(np.int32)
    kind = np.concatenate([sent.kind, np.full(r_count, ALLREDUCE, np.int8)]).astype(np.int8)
    stage = np.concatenate([sent.stage, reduces.stage]).astype(np.int32)
    microbatch = np.concatenate([sent.microbatch, np.full(r_count, -1, np.int32)]).astype(np.int32)
    output = np.asarray(costs.output_bytes, np.float64)
    nbytes = np.concatenate([output[sent.boundary],
                             [gradient_bytes(costs, int(s)) for s in reduces.stage]]).astype(np.float64)
    if tokens is not None:
        nbytes[:m_count] *= tokens[sent.microbatch]
    duration = network.latency[src, dst] + nbytes / network.bandwidth[src, dst]
    duration[m_count:] = collective_seconds(network, reduces, nbytes[m_count:])
    return src, dst, kind, stage, microbatch, nbytes, duration


def _release_rows(sent, reduces) -> tuple[np.ndarray, np.ndarray]:
    """The ops that release each transfer, as (pointer, rows): a message's producer; an
    all-reduce's, each replica's last weight-gradient op of the stage (row-major: the first
    device's, then the second's)."""
    released = reduces.after >= 0
    rel = np.concatenate([sent.producer, reduces.after[released]]).astype(np.int32)
    rel_ptr = np.zeros(len(sent) + len(reduces) + 1, np.int64)
    np.cumsum(np.concatenate([np.ones(len(sent), np.int64), released.sum(axis=1)]), out=rel_ptr[1:])
    return rel_ptr, rel


def op_durations(schedule: Schedule, costs: StageCosts, network: Network | None) -> np.ndarray:
    """Duration of every op row: its kind's cost on its stage for its stage's role
    (``Rules.cost_for``), in ``costs.unit``; an op that moves activations over the host
    link (cost ``HOST_TRANSFER``) takes its device's host latency + the stage's activation
    bytes / host bandwidth, and nothing without a network.

    Raises PipeschedError when such an op runs on a device with no host link.
    """
    ops = dependencies(schedule).ops
    rules = schedule.rules
    kinds = ops.kind.astype(np.int64)
    if not schedule.frozen and not _uses_side_streams(schedule):
        # every stage trains and every op computes: its kind's cost on its stage
        return _scaled(schedule, ops, np.array([costs.times(rule.cost) if rule.cost != HOST_TRANSFER and not rule.fused
                                                else (0.0,) * schedule.num_stages for rule in rules],
                                               np.float64)[kinds, ops.stage])
    op_role = role_index(schedule.roles)[ops.stage]
    names = [[rules.cost_for(rule.kind, role) for rule in rules] for role in ROLES]
    per_role = np.zeros((len(ROLES), len(rules), schedule.num_stages))
    for r, row in enumerate(names):
        for k, name in enumerate(row):
            if name != HOST_TRANSFER and not rules.kinds[k].fused:
                per_role[r, k] = costs.times(name)
    duration = _scaled(schedule, ops, per_role[op_role, kinds, ops.stage])
    moves = np.array([[name == HOST_TRANSFER for name in row] for row in names], np.bool_)[op_role, kinds]
    if network is None or not moves.any():
        return duration
    rows = np.flatnonzero(moves)
    devices = ops.device[rows]
    bandwidth = np.zeros(schedule.num_devices) if network.host_bandwidth is None else \
        np.asarray(network.host_bandwidth[: schedule.num_devices], np.float64)
    lacking = devices[bandwidth[devices] <= 0]
    if lacking.size:
        device = int(lacking[0])
        raise PipeschedError(
            f"offload=device {device}: {network.device_name(device)} of {network.name} has no host link; offload "
            "on devices with one (a device preset or cluster entry with host_bandwidth, or --host-bandwidth "
            "with --stage-costs), or do not offload")
    latency = np.zeros(schedule.num_devices) if network.host_latency is None else \
        np.asarray(network.host_latency[: schedule.num_devices], np.float64)
    moved = np.asarray(costs.activation_bytes, np.float64)[ops.stage[rows]]
    duration[rows] = latency[devices] + moved / bandwidth[devices]
    return duration


def _scaled(schedule: Schedule, ops, duration: np.ndarray) -> np.ndarray:
    """``duration`` with each op's microbatch scale (``Execution.microbatch_scales``): W at its
    microbatch's tokens, every other op at its compute."""
    scales = schedule.execution.microbatch_scales
    if not scales:
        return duration
    table = np.asarray(scales, np.float64)
    column = np.where(ops.kind == schedule.rules.index(W), 1, 0)
    return duration * table[ops.microbatch, column]


def token_scales(schedule: Schedule) -> np.ndarray | None:
    """Each microbatch's tokens against the table's mean microbatch, or None when all are 1
    (what its messages' bytes scale by)."""
    scales = schedule.execution.microbatch_scales
    return np.asarray(scales, np.float64)[:, 1] if scales else None


def _uses_side_streams(schedule: Schedule) -> bool:
    """Whether some op of ``schedule`` runs off the compute stream (kept with the schedule)."""
    cache = schedule.derived
    if "side_streams" not in cache:
        ops = dependencies(schedule).ops
        present = np.bincount(ops.kind.astype(np.int64), minlength=len(schedule.rules)) > 0
        cache["side_streams"] = bool(np.any(present & (rule_arrays(schedule.rules).stream != 0)))
    return cache["side_streams"]


def op_queues(ops: OpArrays, kind_stream: np.ndarray | None, num_devices: int,
              first_side_resource: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(op_queue, queue_rows, queue_offsets, side queues per device): each op's queue as a
    resource id, the op rows of each queue in program order, and how many streams beyond
    the compute stream each device has.

    Queue q = stream x devices + device in walk order; its resource id is the device (the
    compute stream) or ``first_side_resource + (stream - 1) x devices + device``. A table
    whose kinds all run on the compute stream (``kind_stream`` None: known to) keeps one
    queue per device, the table itself.
    """
    n = len(ops)
    op_stream = kind_stream[ops.kind].astype(np.int64) if n and kind_stream is not None else np.zeros(0, np.int64)
    side = int(op_stream.max(initial=0))
    if side == 0:
        return (ops.device.astype(np.int32), np.arange(n, dtype=np.int32), ops.device_offsets.astype(np.int64), 0)
    queue = op_stream * num_devices + ops.device
    queue_rows = np.argsort(queue, kind="stable").astype(np.int32)
    queue_offsets = np.zeros((side + 1) * num_devices + 1, np.int64)
    np.cumsum(np.bincount(queue, minlength=(side + 1) * num_devices), out=queue_offsets[1:])
    resource = np.where(op_stream == 0, ops.device, first_side_resource + (op_stream - 1) * num_devices + ops.device)
    return resource.astype(np.int32), queue_rows, queue_offsets, side


def _issue_edges(ops: OpArrays, kind_stream: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(consumer, producer) rows: each op off the compute stream and the compute op before
    it in its device's table (none when it comes first)."""
    n = len(ops)
    if n == 0:
        return np.zeros(0, np.int32), np.zeros(0, np.int32)
    side = kind_stream[ops.kind] != STREAMS.index(COMPUTE)
    if not side.any():
        return np.zeros(0, np.int32), np.zeros(0, np.int32)
    rows = np.arange(n)
    # the last compute row at or before each row, within its device
    last_compute = np.where(~side, rows, -1)
    np.maximum.accumulate(last_compute, out=last_compute)
    first_row = ops.device_offsets[ops.device]
    consumer = rows[side]
    producer = last_compute[side]
    keep = producer >= first_row[side]
    return consumer[keep].astype(np.int32), producer[keep].astype(np.int32)


def _with_issue_edges(consumer: np.ndarray, producer: np.ndarray, via: np.ndarray,
                      issued_after: tuple[np.ndarray, np.ndarray] | None,
                      n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR (pred_ptr, pred_op, pred_via) of the data edges and the issue edges (if any)."""
    if issued_after is not None and issued_after[0].size:
        extra_consumer, extra_producer = issued_after
        consumer = np.concatenate([consumer, extra_consumer])
        order = np.argsort(consumer, kind="stable")
        consumer = consumer[order]
        producer = np.concatenate([producer, extra_producer])[order]
        via = np.concatenate([via, np.full(extra_consumer.shape[0], -1, np.int32)])[order]
    pred_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(consumer, minlength=n), out=pred_ptr[1:])
    return pred_ptr, producer, via


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


def _transfer_fields(transfers: tuple[np.ndarray, ...]) -> dict[str, np.ndarray]:
    """The TaskGraph fields of the transfers' columns (src, dst, kind, stage, microbatch,
    bytes, duration, then the release and resource CSRs)."""
    return dict(zip(_TRANSFER_FIELDS, transfers, strict=True))


_TRANSFER_FIELDS = ("tr_src", "tr_dst", "tr_kind", "tr_stage", "tr_microbatch", "tr_bytes", "tr_duration",
                    "tr_rel_ptr", "tr_rel", "tr_res_ptr", "tr_res")


def _no_transfers() -> tuple[np.ndarray, ...]:
    i32, f64, ptr = np.zeros(0, np.int32), np.zeros(0, np.float64), np.zeros(1, np.int64)
    return (i32, i32, np.zeros(0, np.int8), i32, i32, f64, f64, ptr, i32, ptr, i32)


def collective_seconds(network: Network, reduces: AllReduces, nbytes: np.ndarray) -> np.ndarray:
    """Seconds of each gradient all-reduce on ``network`` (see the module docstring)."""
    data_parallel = network.data_parallel if network.reduces_gradients else None
    seconds = np.empty(len(reduces), np.float64)
    timed: dict[tuple[int, int, float], float] = {}  # a stage's gradients on a device pair: one time
    for j, key in enumerate(zip(reduces.src.tolist(), reduces.dst.tolist(), nbytes.tolist(), strict=True)):
        if key not in timed:
            a, b, size = key
            pair = network.pair_level(a, b) if a != b else None
            if data_parallel is None:
                timed[key] = allreduce_seconds(size, (pair,))
            else:
                timed[key] = max(data_parallel.seconds(a, size, inner=pair), data_parallel.seconds(b, size, inner=pair))
        seconds[j] = timed[key]
    return seconds


def _with_collective_resources(res_ptr: np.ndarray, res: np.ndarray, network: Network, reduces: AllReduces,
                               contention: bool, overlap: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """The messages' resource CSR with each all-reduce's resources appended, in the order
    it claims them (see the module docstring); data-parallel channels are resources
    3 x devices + 2 x nodes + device."""
    node_of = network.node_of
    num_devices = len(node_of)
    num_nodes = max(node_of) + 1
    send0, recv0, egress0 = num_devices, 2 * num_devices, 3 * num_devices
    ingress0, channel0 = egress0 + num_nodes, egress0 + 2 * num_nodes
    data_parallel = network.data_parallel if network.reduces_gradients else None
    lists = []
    for a, b in zip(reduces.src.tolist(), reduces.dst.tolist(), strict=True):
        held: list[int] = []
        if not overlap:
            held += [a] if a == b else [a, b]  # a blocking runtime: no compute while it runs
        if contention:
            if a != b:
                held += [send0 + a, recv0 + b, send0 + b, recv0 + a]
                if network.shared_nic and node_of[a] != node_of[b]:
                    held += [egress0 + node_of[a], ingress0 + node_of[b], egress0 + node_of[b], ingress0 + node_of[a]]
            if data_parallel is not None:
                for device in dict.fromkeys((a, b)):
                    held.append(channel0 + device)
                    nic = (egress0 + node_of[device], ingress0 + node_of[device])
                    if network.shared_nic and data_parallel.leaves_node[device] and nic[0] not in held:
                        held += nic
        lists.append(held)
    counts = np.array([len(held) for held in lists], np.int64)
    ptr = np.concatenate([res_ptr, res_ptr[-1] + np.cumsum(counts)]).astype(np.int64)
    flat = np.array([r for held in lists for r in held], np.int32)
    total = channel0 + (num_devices if data_parallel is not None else 0)
    return ptr, np.concatenate([res, flat]).astype(np.int32), total


def link_resources(network: Network, src: np.ndarray, dst: np.ndarray, contention: bool,
                       num_devices: int) -> tuple[np.ndarray, np.ndarray, int]:
    """CSR of the channels each message holds, in the order it claims them (a blocking
    runtime's messages hold no compute stream: they block through their batches,
    ``pipesched.simulate.blocking``). Resource ids: compute stream (queue) d, send channel d,
    receive channel d, then each node's NIC egress and ingress."""
    node_of = np.asarray(network.node_of[:num_devices], np.int64)
    num_nodes = int(node_of.max()) + 1 if num_devices else 1
    res_ptr, res = _resources(src.astype(np.int64), dst.astype(np.int64), node_of, num_devices, num_nodes,
                              contention, bool(network.shared_nic))
    return res_ptr, res, 3 * num_devices + 2 * num_nodes


@njit(cache=True)
def _resources(src, dst, node_of, num_devices, num_nodes, contention, shared_nic):
    send0 = num_devices
    recv0 = 2 * num_devices
    egress0 = 3 * num_devices
    ingress0 = egress0 + num_nodes
    total = src.shape[0]
    res_ptr = np.zeros(total + 1, np.int64)
    res = np.empty(total * 4, np.int32)
    k = 0
    for t in range(total):
        a = src[t]
        b = dst[t]
        if contention:
            res[k] = send0 + a
            res[k + 1] = recv0 + b
            k += 2
            if shared_nic and node_of[a] != node_of[b]:
                res[k] = egress0 + node_of[a]
                res[k + 1] = ingress0 + node_of[b]
                k += 2
        res_ptr[t + 1] = k
    return res_ptr, res[:k].copy()
