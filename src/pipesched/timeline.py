"""Timeline: when each op and transfer of one iteration ran.

The same type holds the idealized slot table (level 2, unit = slot), the simulator's output
(level 3, seconds) and a measured run (seconds, from the profiler), so every renderer and
metric works on all three. It is columnar (numpy arrays, one row per event) because
timelines of a million ops are normal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from pipesched.dependencies import op_arrays, rule_arrays
from pipesched.enums import MemoryUnit
from pipesched.errors import require
from pipesched.ops import Op
from pipesched.rules import COMPUTE, STREAMS, TRANSFER_KIND_NAMES
from pipesched.schedule import Schedule

if TYPE_CHECKING:
    from pipesched.costs import StageCosts
    from pipesched.simulate.critical import CriticalPath
    from pipesched.simulate.network import Network

# Transfer kinds stored in TransferTable.kind: their index in rules.TRANSFER_KIND_NAMES; an
# all-to-all is one transfer per pair of its group (``pipesched.simulate.collective``); a
# serving timeline's KV-cache moves (``pipesched.serving.timeline``)
(ACTIVATION, GRADIENT, ALLREDUCE, ALL_TO_ALL, KV_CACHE, SWAP_OUT, SWAP_IN,
 WEIGHT_MOVE) = range(len(TRANSFER_KIND_NAMES))


@dataclass(frozen=True, eq=False)
class TransferTable:
    """Point-to-point transfers and collectives; arrays of equal length, one row each.

    ``channel`` indexes ``channel_names`` (a link, a NIC, or a rank's send queue: whatever
    resource the transfer occupied). For an all-reduce, src and dst are the two replicas'
    devices and stage names the model stage whose gradients are reduced (microbatch = -1).
    """

    src_device: np.ndarray  # int32
    dst_device: np.ndarray  # int32
    kind: np.ndarray  # int8, ACTIVATION / GRADIENT / ALLREDUCE
    stage: np.ndarray  # int32, the stage that sent (activation: producer; gradient: producer)
    microbatch: np.ndarray  # int32, -1 for collectives
    nbytes: np.ndarray  # float64, bytes moved
    start: np.ndarray  # float64
    end: np.ndarray  # float64
    channel: np.ndarray  # int32, index into channel_names
    channel_names: tuple[str, ...] = ()

    def __len__(self) -> int:
        return int(self.start.shape[0])

    @classmethod
    def empty(cls) -> TransferTable:
        i32, f64 = np.zeros(0, np.int32), np.zeros(0, np.float64)
        return cls(i32, i32, np.zeros(0, np.int8), i32, i32, f64, f64, f64, i32, ())


@dataclass(frozen=True, eq=False)
class MemoryTrace:
    """Memory in use on each device over time, as step functions.

    ``times[d][k]`` is when the usage of device d became ``bytes[d][k]`` (bytes, or
    stage-microbatches for the slot table: see ``unit``). ``static`` is the part that is
    there all iteration (parameters, gradients, optimizer state).
    """

    times: tuple[np.ndarray, ...]
    values: tuple[np.ndarray, ...]
    static: tuple[float, ...]
    capacity: tuple[float, ...] | None = None  # device memory, bytes; None when unknown
    unit: str = MemoryUnit.BYTES  # bytes or stage-microbatches

    @property
    def peak(self) -> tuple[float, ...]:
        return tuple(float(v.max()) if v.size else s for v, s in zip(self.values, self.static, strict=True))

    @property
    def out_of_memory(self) -> tuple[bool, ...]:
        if self.capacity is None:
            return tuple(False for _ in self.values)
        return tuple(p > c for p, c in zip(self.peak, self.capacity, strict=True))


class Source(StrEnum):
    """Where a timeline came from."""

    TABLE = "table"  # level 2: the idealized slot table
    SIMULATED = "simulated"  # level 3: the communication-aware simulation
    MEASURED = "measured"  # a real run, timed


def median_step(step_times: Sequence[float]) -> int:
    """The index of the median step: the lower middle one of the steps sorted by time (the
    first in run order among equal times).

    >>> median_step([5.0, 3.0, 4.0, 9.0])
    2
    """
    require(len(step_times) > 0, "steps", 0, "measure at least one step")
    return int(np.argsort(np.asarray(step_times, np.float64), kind="stable")[(len(step_times) - 1) // 2])


def steady_iteration_time(iteration_end):
    """The steady-state iteration of iterations back to back that ended at ``iteration_end``
    (from the first op's start; the last axis, one row per run of a batch): the mean
    iteration between the first (which pays the fill ramp) and the last (whose drain no next
    iteration fills), (end of iteration k-2 - end of iteration 0) / (k - 2); with two
    iterations the second's time, with one its own. A float for one run, an array for rows.

    >>> steady_iteration_time((10.0, 16.0, 22.0, 30.0))
    6.0
    >>> steady_iteration_time(np.array([[10.0, 16.0, 22.0, 30.0], [5.0, 9.0, 13.0, 20.0]])).tolist()
    [6.0, 4.0]
    """
    ends = np.asarray(iteration_end, np.float64)
    k = ends.shape[-1]
    if k == 0:
        found = np.zeros(ends.shape[:-1])
    elif k < 3:
        found = ends[..., -1] - (ends[..., 0] if k == 2 else 0.0)
    else:
        found = (ends[..., -2] - ends[..., 0]) / (k - 2)
    return float(found) if ends.ndim == 1 else found


@dataclass(frozen=True, eq=False)
class SimulationInfo:
    """What a table or simulated timeline was computed from, and what the engine found."""

    costs: StageCosts
    network: Network | None  # None: free communication (the slot table)
    contention: bool
    overlap: bool
    critical_path: CriticalPath
    optimizer_step: tuple[float, ...]  # per device: when it may step its optimizer
    blocking_steps: str | None = None  # without overlap: the blocking runtime's batches ("op" or "pair")

    @property
    def replicas(self) -> int:
        """Data-parallel pipeline replicas the simulation stands for (1: this pipeline alone)."""
        return 1 if self.network is None else self.network.replicas


@dataclass(frozen=True, eq=False)
class MeasuredInfo:
    """How a measured timeline was run, and what was measured beside the op times."""

    runtime: str  # "pytorch" or "pipesched" (our executor)
    backend: str  # "gloo" or "nccl"
    partition: str  # layers per stage
    dtype: str
    micro_batch_size: int
    seq_len: int
    step: int  # which measured step of the run
    op_wait_s: np.ndarray  # per op row: time spent waiting for its inputs inside the op's span
    op_cpu_s: np.ndarray  # per op row: CPU time the op's thread got during the op
    step_times_s: tuple[float, ...] = ()  # every measured step of the run, seconds (this one among them)


@dataclass(frozen=True, eq=False)
class ServingInfo:
    """What a serving timeline (``pipesched.serving.timeline``) draws beside the times: its
    microbatches are a window of the run's iterations (batches), its devices the stages'
    tensor-parallel groups, and each batch's content is kept for the views' hovers."""

    batch: np.ndarray  # int64 per microbatch: the run's iteration (batch) number
    instance: np.ndarray  # int32 per microbatch: the instance that ran it
    prefill_tokens: np.ndarray  # int64 per microbatch: prefill chunk tokens
    decodes: np.ndarray  # int64 per microbatch: decode requests
    kv_tokens: np.ndarray  # int64 per microbatch: KV tokens its decodes read
    members: np.ndarray  # int64: request rows (of the run's trace), microbatch after microbatch
    offsets: np.ndarray  # int64 [microbatches + 1] into members
    device_names: tuple[str, ...]  # per device: "replica 0 · stage 1 · ranks 4-7"
    device_labels: tuple[str, ...]  # per device, short: "r0 s1"
    transfer_request: np.ndarray  # int64 per transfer row: the request a KV-cache move carries (-1: a batch's)
    window: tuple[float, float]  # seconds of the run drawn (the first batch's start to the last's end)
    run_iterations: int  # iterations of the whole run
    run_span: tuple[float, float]  # seconds: the run's first start and last end
    how: str  # how the window was chosen, in words


@dataclass(frozen=True, eq=False)
class Timeline:
    """Start and end of every compute op (and transfer) of one iteration.

    Op rows follow the schedule's table order (device 0's ops in order, then device 1's, ...),
    so row ``k`` is the k-th pair of ``schedule.ops()``; a measured timeline keeps the order
    in which the ops really ran.

    A fused op (``(0F1;1B0)OVERLAP_F_B``) has a row per part: its first part's row spans the
    whole fused op, the others have no duration and end with it (their results are ready
    then). ``op_entry`` ties them together; views draw the entry as one box (``entry``).
    """

    schedule: Schedule
    source: Source
    unit: str  # TimeUnit: slot or s
    op_device: np.ndarray  # int32
    op_stage: np.ndarray  # int32
    op_kind: np.ndarray  # int8, index into the schedule's rules (F, I, W, B)
    op_microbatch: np.ndarray  # int32
    op_start: np.ndarray  # float64
    op_end: np.ndarray  # float64
    transfers: TransferTable = field(default_factory=TransferTable.empty)
    memory: MemoryTrace | None = None
    simulation: SimulationInfo | None = None  # table and simulated timelines
    measured: MeasuredInfo | None = None  # measured timelines
    host_memory: MemoryTrace | None = None  # host bytes of each device's offloaded activations, when it offloads
    # the row of the first part of the table entry each row belongs to (itself for a plain
    # op); None when no row is part of a fused op
    op_entry: np.ndarray | None = None  # int32
    # several iterations back to back (``pipesched.simulate.iterations``): when each ended,
    # from the origin; empty for one iteration
    iteration_end: tuple[float, ...] = ()
    # each row's step index (``Op.step``: a decode step); None when every op is at step 0
    op_step: np.ndarray | None = None  # int32
    # a serving run's window (``pipesched.serving.timeline``): its batches and device groups
    serving: ServingInfo | None = None

    def __len__(self) -> int:
        return int(self.op_start.shape[0])

    @property
    def num_devices(self) -> int:
        return self.schedule.num_devices

    @cached_property
    def makespan(self) -> float:
        """Iteration time: from the first start to the last end of any op or transfer."""
        end = float(self.op_end.max()) if len(self) else 0.0
        if len(self.transfers):
            end = max(end, float(self.transfers.end.max()))
        return end - self.origin

    @property
    def iterations(self) -> int:
        """Iterations the timeline holds back to back (1 unless ``iteration_end`` says more)."""
        return max(1, len(self.iteration_end))

    @property
    def iteration_time(self) -> float:
        """One iteration's time: the makespan, or of iterations back to back the steady-state
        iteration (``steady_iteration_time``)."""
        return steady_iteration_time(self.iteration_end) if self.iteration_end else self.makespan

    def iteration_busy_per_device(self) -> np.ndarray:
        """Compute time per device in one iteration (the same in every iteration)."""
        return self.busy_per_device() / self.iterations

    def iteration_bubble_ratio(self) -> float:
        """Idle compute time over (devices x iteration time), of one (steady-state) iteration."""
        total = self.iteration_time * self.num_devices
        busy = float(self.iteration_busy_per_device().sum())
        return float(max(0.0, 1.0 - busy / total)) if total > 0 else 0.0

    @property
    def origin(self) -> float:
        return float(self.op_start.min()) if len(self) else 0.0

    @property
    def on_compute(self) -> np.ndarray:
        """bool per op row: the op runs on its device's compute stream (not on its host link)."""
        return rule_arrays(self.schedule.rules).stream[self.op_kind] == STREAMS.index(COMPUTE)

    def busy_per_device(self) -> np.ndarray:
        """Compute time per device (float64 array of length num_devices): the ops on its
        compute stream."""
        durations = self.op_end - self.op_start
        return np.bincount(self.op_device, weights=np.where(self.on_compute, durations, 0.0),
                           minlength=self.num_devices)

    def idle_per_device(self) -> np.ndarray:
        return self.makespan - self.busy_per_device()

    def bubble_ratio(self) -> float:
        """Idle compute time over (devices x iteration time)."""
        total = self.makespan * self.num_devices
        return float(self.idle_per_device().sum() / total) if total > 0 else 0.0

    def op(self, row: int) -> Op:
        """The plain op of ``row`` (a part, for a row of a fused op)."""
        return Op(int(self.op_stage[row]), self.schedule.rules.kinds[int(self.op_kind[row])].kind,
                  int(self.op_microbatch[row]))

    def drawn(self) -> np.ndarray:
        """Rows that views draw as a box (bool per row): all but the later parts of fused ops."""
        if self.op_entry is None:
            return np.ones(len(self), np.bool_)
        return self.op_entry == np.arange(len(self), dtype=self.op_entry.dtype)

    def entry(self, row: int) -> Op:
        """The table entry of ``row``: the fused op whose first part it is, else its op."""
        if self.op_entry is None or not self.schedule.has_fused_ops:
            return self.op(row)
        head = int(self.op_entry[row])
        last = head + 1  # an entry's parts are consecutive rows
        while last < len(self) and self.op_entry[last] == head:
            last += 1
        if last == head + 1:
            return self.op(row)
        kind = self.schedule.rules.kinds[int(self._entry_kinds[head])].kind
        return Op.fused(*(self.op(part) for part in range(head, last)), kind=kind)

    @cached_property
    def box_kind(self) -> np.ndarray:
        """The kind each row is drawn as (rules index, int8): its own, or the fused kind for
        the first part of a fused op."""
        if self.op_entry is None or not self.schedule.has_fused_ops:
            return self.op_kind
        kinds = self.op_kind.copy()
        heads = np.flatnonzero(self.drawn())
        kinds[heads] = self._entry_kinds[heads]
        return kinds

    @cached_property
    def _entry_kinds(self) -> np.ndarray:
        return op_arrays(self.schedule).entry_kind

    def rows_of_device(self, device: int, *, compute: bool = True) -> np.ndarray:
        """Row indices of device's ops on its compute stream (``compute=False``: on its
        host link), in start-time order."""
        rows = np.flatnonzero((self.op_device == device) & (self.on_compute == compute))
        return rows[np.argsort(self.op_start[rows], kind="stable")]
