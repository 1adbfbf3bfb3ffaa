"""Several iterations back to back in one task graph, for the steady state.

One iteration's graph (``compile_graph``) is compiled once and repeated k times: op rows
device by device (each device's ops of iteration 0, then of iteration 1, ...), so each
queue runs its iterations in turn, microbatch mb of iteration i renamed i x m + mb, and every
transfer repeated with its iteration's ops. What joins two iterations is the family's
semantics:

- ``flush`` (synchronous training, the default): every device steps its optimizer when the
  iteration is over everywhere (its all-reduces included), so each device's first op of
  iteration i+1 waits for the last op of every device in iteration i;
- ``steady`` (the zero-bubble paper's optimizer post-validation): each stage steps its
  optimizer when its own last weight gradient is done (and its all-reduces, for a replicated
  stage) and starts the next iteration's forwards without waiting for a global check; the
  queues' order is the only link;
- ``async`` (PipeDream, PipeDream-2BW): the family's own table of k iterations, one
  continuous order without a flush (``generators.pipedream``), with per-stage weight-version
  waits: a stage keeps at most V versions, so the first forward of update batch b on a stage
  waits for the update of batch b - V there.

The steady-state iteration time is the mean over the iterations between the first (which
pays the fill ramp) and the last (whose drain no next iteration fills): (end of iteration
k-2 - end of iteration 0) / (k - 2), where an iteration ends with its last op or all-reduce
(with two iterations, the second's time; ``pipesched.timeline.steady_iteration_time``). The
timeline keeps the iterations' ends (``Timeline.iteration_end``), so every view and metric
of it speaks of one steady-state iteration.

Memory: a stage that keeps V weight versions holds V - 1 copies of its weights beyond its
static bytes, each the size of its bf16 weights (``graph.weight_bytes``: the parameters of
the gradient its replicas would all-reduce, 2 bytes each).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from pipesched.costs import StageCosts
from pipesched.defaults import DEFAULTS
from pipesched.dependencies import op_arrays, rule_arrays
from pipesched.errors import require
from pipesched.limits import MAX_OPS, check_iterations
from pipesched.ops import Op
from pipesched.rules import AT_START
from pipesched.schedule import Schedule, WeightUpdates
from pipesched.simulate.graph import TaskGraph, compile_graph, weight_bytes
from pipesched.simulate.network import Network
from pipesched.simulate.run import run
from pipesched.timeline import ALLREDUCE, Timeline
from pipesched.weight_versions import WeightVersions, weight_versions

# iterations a steady-state run strings together by default
DEFAULT_ITERATIONS = DEFAULTS.steady_iterations


@dataclass(frozen=True, eq=False)
class Iterations:
    """A task graph of several iterations and what tells them apart."""

    graph: TaskGraph  # every iteration in one graph; graph.schedule is the k-iteration table
    mode: str  # flush, steady or async
    iterations: int
    microbatches: int  # per iteration
    update_every: int  # microbatches per weight update
    delay: int  # updates behind the newest weights every batch runs on (PipeDream-2BW: 1)
    versions: tuple[int, ...]  # weight versions each stage keeps
    op_iteration: np.ndarray  # int32 per op row
    transfer_iteration: np.ndarray  # int32 per transfer

    @property
    def groups(self) -> tuple[np.ndarray, np.ndarray, int]:
        """The iteration of each op and transfer, and their number (``run_batch(groups=...)``)."""
        return self.op_iteration, self.transfer_iteration, self.iterations


@dataclass(frozen=True, eq=False)
class SteadyState:
    """A run of several iterations: the timeline, each iteration's end, the steady state."""

    iterations: Iterations
    timeline: Timeline
    iteration_end: tuple[float, ...]  # from the first op's start
    weights: WeightVersions

    @property
    def iteration_time(self) -> float:
        """The mean iteration between the first and the last (see the module docstring)."""
        return self.timeline.iteration_time

    @property
    def busy_per_iteration(self) -> np.ndarray:
        """Compute time per device in one iteration (the same every iteration)."""
        return self.timeline.iteration_busy_per_device()

    @property
    def bubble_ratio(self) -> float:
        """Idle over devices x steady-state iteration time."""
        return self.timeline.iteration_bubble_ratio()

    def to_dict(self) -> dict:
        return {"mode": self.iterations.mode, "iterations": self.iterations.iterations,
                "steady_iteration_time": self.iteration_time, "iteration_end": list(self.iteration_end),
                "steady_bubble_ratio": self.bubble_ratio, **self.weights.to_dict()}


def compile_iterations(schedule: Schedule, costs: StageCosts, network: Network | None = None, *,
                       iterations: int = DEFAULT_ITERATIONS, steady: bool = False, contention: bool = True,
                       overlap: bool = True) -> Iterations:
    """``iterations`` iterations of ``schedule`` in one task graph (see the module
    docstring): ``async`` for an asynchronous family's table (``Execution.updates``, which
    already holds its iterations), else ``steady`` when asked, else ``flush``."""
    updates = schedule.execution.updates
    if updates is not None:
        return _asynchronous(schedule, updates, costs, network, contention=contention, overlap=overlap)
    check_iterations(iterations)
    require(schedule.num_ops * iterations <= MAX_OPS, "iterations", iterations,
            f"{iterations} iterations of {schedule.num_ops:,} ops are over the {MAX_OPS:,} ops one graph holds; "
            "run fewer iterations")
    one = compile_graph(schedule, costs, network, contention=contention, overlap=overlap)
    mode = "steady" if steady else "flush"
    return _repeated(one, iterations, mode)


def run_iterations(compiled: Iterations, *, memory_capacity=None) -> SteadyState:
    """Run the graph: the timeline of all iterations, their ends and the weight versions."""
    timeline = run(compiled.graph, memory_capacity=memory_capacity)
    origin = timeline.origin
    ends = np.full(compiled.iterations, origin)
    np.maximum.at(ends, compiled.op_iteration, timeline.op_end)
    if len(timeline.transfers):
        np.maximum.at(ends, compiled.transfer_iteration, timeline.transfers.end)
    timeline = dataclasses.replace(timeline, iteration_end=tuple(float(x) for x in ends - origin))
    found = weight_versions(timeline, update_every=compiled.update_every, delay=compiled.delay,
                            iteration_microbatches=compiled.microbatches)
    return SteadyState(compiled, timeline, timeline.iteration_end, found)


def steady_state(schedule: Schedule, costs: StageCosts, network: Network | None = None, *,
                 iterations: int = DEFAULT_ITERATIONS, steady: bool = False, contention: bool = True,
                 overlap: bool = True, memory_capacity=None) -> SteadyState:
    """Compile and run several iterations (``compile_iterations`` then ``run_iterations``).

    >>> from pipesched.generators import generate
    >>> result = steady_state(generate("pipedream", 4, 8, iterations=4), StageCosts.slots().broadcast(4))
    >>> result.iteration_time, result.weights.versions
    (24.0, (4, 3, 2, 1))
    """
    compiled = compile_iterations(schedule, costs, network, iterations=iterations, steady=steady,
                                  contention=contention, overlap=overlap)
    return run_iterations(compiled, memory_capacity=memory_capacity)


# --- asynchronous tables: one continuous order, weight-version waits --------------------------
def _asynchronous(schedule: Schedule, updates: WeightUpdates, costs: StageCosts, network: Network | None, *,
                  contention: bool, overlap: bool) -> Iterations:
    k = schedule.execution.iterations
    m = schedule.num_microbatches // k
    update_every, versions = updates.update_every, updates.versions
    graph = compile_graph(schedule, costs, network, contention=contention, overlap=overlap)
    graph = _version_waits(graph, update_every, versions)
    graph = dataclasses.replace(graph, static_bytes=_with_versions(schedule, costs, graph.static_bytes, versions))
    op_iteration = (graph.ops.microbatch // m).astype(np.int32)
    transfer_iteration = np.where(graph.tr_microbatch >= 0, graph.tr_microbatch // m, k - 1).astype(np.int32)
    return Iterations(graph, "async", k, m, update_every, updates.delay, versions, op_iteration, transfer_iteration)


def _version_waits(graph: TaskGraph, update_every: int, versions: tuple[int, ...]) -> TaskGraph:
    """The first forward of update batch b on stage s waits for the update of batch
    b - versions[s] there (its last weight-gradient op)."""
    ops = graph.ops
    rules = graph.schedule.rules
    arrays = rule_arrays(rules)
    forward = np.array([rule.memory.at == AT_START and rule.memory.whole > 0 for rule in rules], np.bool_)
    batch = ops.microbatch.astype(np.int64) // update_every
    batches = int(batch.max(initial=-1)) + 1
    stages = graph.schedule.num_stages
    first = np.full(stages * batches, -1, np.int64)
    last = np.full(stages * batches, -1, np.int64)
    # rows ascend in table order, which is each stage's order: the first forward and the
    # last weight-gradient op of each (stage, batch)
    key = ops.stage.astype(np.int64) * batches + batch
    rows = np.arange(len(ops))
    is_forward = forward[ops.kind]
    forward_rows = rows[is_forward][::-1]
    first[key[forward_rows]] = forward_rows
    update_rows = rows[arrays.ends_weight_gradient[ops.kind]]
    last[key[update_rows]] = update_rows
    consumers, producers = [], []
    for stage in range(stages):
        lag = versions[stage]
        for b in range(lag, batches):
            consumer, producer = first[stage * batches + b], last[stage * batches + b - lag]
            if consumer >= 0 and producer >= 0:
                consumers.append(consumer)
                producers.append(producer)
    return _with_edges(graph, np.asarray(consumers, np.int64), np.asarray(producers, np.int64),
                       np.full(len(consumers), -1, np.int64))


def _with_versions(schedule: Schedule, costs: StageCosts, static: tuple[float, ...],
                   versions: tuple[int, ...]) -> tuple[float, ...]:
    """Static bytes per device plus V - 1 copies of each stage's weights."""
    held = list(static)
    for replica in schedule.placement.replicas:
        for stage, device in enumerate(replica):
            held[device] += (versions[stage] - 1) * weight_bytes(costs, stage)
    return tuple(held)


# --- repeated iterations ---------------------------------------------------------------------
def _repeated(one: TaskGraph, k: int, mode: str) -> Iterations:
    schedule, ops = one.schedule, one.ops
    n, t, m = one.num_ops, one.num_transfers, schedule.num_microbatches
    table = _repeated_table(schedule, k)
    new_ops = op_arrays(table)
    # row of (iteration i, op x): device-major, each device's iterations in turn
    offsets = ops.device_offsets.astype(np.int64)
    device = ops.device.astype(np.int64)
    length = offsets[1:] - offsets[:-1]
    position = np.arange(n, dtype=np.int64) - offsets[device]
    iteration = np.arange(k, dtype=np.int64)[:, None]
    row = k * offsets[device][None, :] + iteration * length[device][None, :] + position[None, :]  # (k, n)
    # op columns in the new order
    order = np.empty(k * n, np.int64)
    order[row.ravel()] = np.tile(np.arange(n), k)
    op_iteration = np.empty(k * n, np.int32)
    op_iteration[row.ravel()] = np.repeat(np.arange(k), n)

    # queues: each queue's rows, iteration after iteration
    q_offsets = one.queue_offsets.astype(np.int64)
    queue_rows = np.concatenate([row[:, one.queue_rows[q_offsets[q]:q_offsets[q + 1]]].ravel()
                                 for q in range(len(q_offsets) - 1)]).astype(np.int32)
    queue_offsets = k * q_offsets
    op_queue = one.op_queue[order]
    # predecessors: each iteration's own, then the links between iterations
    counts = np.diff(one.pred_ptr)
    consumer_old = np.repeat(np.arange(n), counts)
    consumer = np.concatenate([row[i, consumer_old] for i in range(k)])
    producer = np.concatenate([row[i, one.pred_op.astype(np.int64)] for i in range(k)])
    via = np.concatenate([np.where(one.pred_via >= 0, one.pred_via.astype(np.int64) + i * t, -1) for i in range(k)])
    # transfers, iteration after iteration
    tile = np.tile
    rel_counts = np.diff(one.tr_rel_ptr)
    tr_rel = np.concatenate([row[i, one.tr_rel.astype(np.int64)] for i in range(k)]).astype(np.int32)
    tr_rel_ptr = np.zeros(k * t + 1, np.int64)
    np.cumsum(tile(rel_counts, k), out=tr_rel_ptr[1:])
    res_counts = np.diff(one.tr_res_ptr)
    tr_res_ptr = np.zeros(k * t + 1, np.int64)
    np.cumsum(tile(res_counts, k), out=tr_res_ptr[1:])
    shift = np.repeat(np.arange(k, dtype=np.int64) * m, t)
    microbatch = tile(one.tr_microbatch.astype(np.int64), k)
    transfer_iteration = np.repeat(np.arange(k, dtype=np.int32), t)
    links = _links(one, row, k, mode)
    consumer = np.concatenate([consumer, links[0]])
    producer = np.concatenate([producer, links[1]])
    via = np.concatenate([via, links[2]])
    graph = dataclasses.replace(
        one, schedule=table, ops=new_ops, op_queue=op_queue.astype(np.int32), queue_rows=queue_rows,
        queue_offsets=queue_offsets, op_duration=one.op_duration[order],
        pred_ptr=np.zeros(1, np.int64), pred_op=np.zeros(0, np.int32), pred_via=np.zeros(0, np.int32),
        tr_src=tile(one.tr_src, k), tr_dst=tile(one.tr_dst, k), tr_kind=tile(one.tr_kind, k),
        tr_stage=tile(one.tr_stage, k),
        tr_microbatch=np.where(microbatch >= 0, microbatch + shift, -1).astype(np.int32),
        tr_bytes=tile(one.tr_bytes, k), tr_duration=tile(one.tr_duration, k), tr_rel_ptr=tr_rel_ptr, tr_rel=tr_rel,
        tr_res_ptr=tr_res_ptr, tr_res=tile(one.tr_res, k), memory_delta=one.memory_delta[order],
        memory_at_start=one.memory_at_start[order],
    )
    graph = _set_edges(graph, consumer, producer, via)
    return Iterations(graph, mode, k, m, m, 0, (1,) * schedule.num_stages, op_iteration, transfer_iteration)


def _repeated_table(schedule: Schedule, k: int) -> Schedule:
    """The table of k iterations: each device's ops, iteration after iteration, microbatch mb
    of iteration i named i x m + mb."""
    m = schedule.num_microbatches

    def renamed(op: Op, shift: int) -> Op:
        if op.parts:
            return Op.fused(*(renamed(part, shift) for part in op.parts), kind=op.kind)
        return Op(op.stage, op.kind, op.microbatch + shift)

    device_ops = tuple(tuple(renamed(op, i * m) for i in range(k) for op in ops) for ops in schedule.device_ops)
    execution = dataclasses.replace(schedule.execution, iterations=k * schedule.execution.iterations)
    return Schedule(schedule.name, schedule.placement, k * m, device_ops, route=schedule.route * k,
                    params=schedule.params, rules=schedule.rules, execution=execution)


def _links(one: TaskGraph, row: np.ndarray, k: int, mode: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(consumer, producer, via) of the waits between iterations: ``flush``: each queue's
    first op of iteration i+1 waits for every queue's last op and every all-reduce of
    iteration i; ``steady``: for the all-reduces its device takes part in."""
    q_offsets = one.queue_offsets.astype(np.int64)
    busy = [q for q in range(len(q_offsets) - 1) if q_offsets[q + 1] > q_offsets[q]]
    firsts = np.array([one.queue_rows[q_offsets[q]] for q in busy], np.int64)
    lasts = np.array([one.queue_rows[q_offsets[q + 1] - 1] for q in busy], np.int64)
    first_device = one.ops.device[firsts].astype(np.int64)
    t = one.num_transfers
    reduces = np.flatnonzero(one.tr_kind == ALLREDUCE)
    # an all-reduce is waited through its last releasing op (for the free-communication walk)
    reduce_op = np.array([one.tr_rel[one.tr_rel_ptr[r + 1] - 1] for r in reduces], np.int64)
    consumers, producers, vias = [], [], []
    for i in range(k - 1):
        for first, device in zip(firsts.tolist(), first_device.tolist(), strict=True):
            if mode == "flush":
                for last in lasts.tolist():
                    consumers.append(row[i + 1, first])
                    producers.append(row[i, last])
                    vias.append(-1)
            for r, op in zip(reduces.tolist(), reduce_op.tolist(), strict=True):
                if mode == "flush" or device in (one.tr_src[r], one.tr_dst[r]):
                    consumers.append(row[i + 1, first])
                    producers.append(row[i, op])
                    vias.append(r + i * t)
    return (np.asarray(consumers, np.int64), np.asarray(producers, np.int64), np.asarray(vias, np.int64))


def _with_edges(graph: TaskGraph, consumers: np.ndarray, producers: np.ndarray, vias: np.ndarray) -> TaskGraph:
    """``graph`` with extra predecessors (consumer op waits for producer op, or for transfer
    ``via`` when >= 0)."""
    counts = np.diff(graph.pred_ptr)
    existing = np.repeat(np.arange(graph.num_ops, dtype=np.int64), counts)
    return _set_edges(graph, np.concatenate([existing, consumers]),
                      np.concatenate([graph.pred_op.astype(np.int64), producers]),
                      np.concatenate([graph.pred_via.astype(np.int64), vias]))


def _set_edges(graph: TaskGraph, consumer: np.ndarray, producer: np.ndarray, via: np.ndarray) -> TaskGraph:
    order = np.argsort(consumer, kind="stable")
    pred_ptr = np.zeros(graph.num_ops + 1, np.int64)
    np.cumsum(np.bincount(consumer, minlength=graph.num_ops), out=pred_ptr[1:])
    return dataclasses.replace(graph, pred_ptr=pred_ptr, pred_op=producer[order].astype(np.int32),
                               pred_via=via[order].astype(np.int32))

