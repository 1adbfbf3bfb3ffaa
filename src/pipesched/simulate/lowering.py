"""Lowering: a Schedule plus stage costs and a network become a task graph of arrays.

Tasks are of two sorts.

Compute ops, one row per op in the schedule's table order (device 0's ops in order, then
device 1's, ...). Each op runs on its device's compute stream for ``op_duration`` seconds
and has at most two data predecessors (``pred0``, ``pred1``; -1 for none):

    F(s, mb)    needs F(s-1, mb)                     (the activation it consumes)
    I/B(s, mb)  needs F(s, mb) and I/B(s+1, mb)      (its own activations, the gradient)
    W(s, mb)    needs I(s, mb)

Transfers. An op whose consumer runs on another device sends its result:

    activation  after F(s, mb), to the device of F(s+1, mb); ``output_bytes[s]`` bytes
    gradient    after I/B(s, mb), to the device of the backward of (s-1, mb); the gradient of
                stage s-1's output, ``output_bytes[s-1]`` bytes

A consumer on the same device reads the producer's result in place: no transfer. Each op
sends at most one transfer (``op_transfer[row]``, -1 for none).

Gradient all-reduce. A stage that lives on two devices (two replicas: Chimera, DualPipe)
has its weight gradients summed between those devices once both replicas have run their
last weight-gradient op of the stage (the last W or B of the stage in each device's table).
Its size is ``StageCosts.grad_bytes[s]``; when unset it is ``static_bytes[s] / 9``: with
mixed-precision Adam a parameter keeps 18 bytes of static state (bf16 weight 2, fp32
gradient 4, fp32 master weight 4, two fp32 moments 8) and sends its 2-byte bf16 gradient.
A ring all-reduce between two ranks sends half the buffer and receives half in each of its
two steps: ``2 * latency + bytes / bandwidth``.

Optimizer step. After its last op and its all-reduces a device steps its optimizer. The
step is a zero-duration marker (``Timeline.meta["optimizer_step_s"]``): its cost does not
depend on the schedule, only on the parameters a device holds, which the memory trace
already shows.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from operator import itemgetter

import numpy as np
from numba import njit

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError, require
from pipesched.ops import KIND_INDEX, KIND_ORDER
from pipesched.schedule import Schedule
from pipesched.simulate.network import Network
from pipesched.timeline import ACTIVATION, ALLREDUCE, GRADIENT

# kind indices (ops.KIND_ORDER): F, I, W, B
KIND_F, KIND_I, KIND_W, KIND_B = (KIND_INDEX[kind] for kind in KIND_ORDER)


def _kind_lookup() -> np.ndarray:
    """Op kind index of each ASCII letter (F, I, W, B; no other letter occurs in an Op)."""
    table = np.zeros(256, np.int8)
    for kind in KIND_ORDER:
        table[ord(kind.value)] = KIND_INDEX[kind]
    table.setflags(write=False)
    return table


_KIND_OF_LETTER = _kind_lookup()

# bytes of static state per parameter over bytes of its bf16 gradient (see module docstring)
STATIC_PER_GRADIENT_BYTE = 9.0


@dataclass(frozen=True, eq=False)
class OpArrays:
    """The ops of a schedule as columns, rows in table order."""

    device: np.ndarray  # int32
    stage: np.ndarray  # int32
    kind: np.ndarray  # int8, index into ops.KIND_ORDER
    microbatch: np.ndarray  # int32
    device_offsets: np.ndarray  # int64 (D+1): device d owns rows offsets[d]:offsets[d+1]

    def __len__(self) -> int:
        return int(self.stage.shape[0])


@dataclass(frozen=True, eq=False)
class TaskGraph:
    """Everything the engine needs, as arrays (one row per op, one per transfer)."""

    ops: OpArrays
    op_duration: np.ndarray  # float64, seconds
    pred0: np.ndarray  # int32 op row, -1 for none
    pred1: np.ndarray  # int32 op row, -1 for none
    op_transfer: np.ndarray  # int32 transfer row sent after the op, -1 for none
    # transfers: num_p2p point-to-point ones first (in producer table order), then all-reduces
    tr_src: np.ndarray  # int32 device
    tr_dst: np.ndarray  # int32 device
    tr_kind: np.ndarray  # int8, timeline.ACTIVATION / GRADIENT / ALLREDUCE
    tr_stage: np.ndarray  # int32
    tr_microbatch: np.ndarray  # int32, -1 for all-reduces
    tr_bytes: np.ndarray  # float64
    tr_after: np.ndarray  # int32 op row that releases the transfer (its producer)
    ar_after: np.ndarray  # int32 the other replica's releasing op of each all-reduce, -1 for none
    num_p2p: int
    num_devices: int

    @property
    def num_ops(self) -> int:
        return len(self.ops)

    @property
    def num_transfers(self) -> int:
        return int(self.tr_src.shape[0])


def op_arrays(schedule: Schedule) -> OpArrays:
    """The schedule's ops as columns (fast path: no per-op Python objects are created)."""
    lengths = np.fromiter((len(ops) for ops in schedule.device_ops), np.int64, schedule.num_devices)
    offsets = np.zeros(schedule.num_devices + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    n = int(offsets[-1])
    flat = list(itertools.chain.from_iterable(schedule.device_ops))
    stage = np.fromiter(map(itemgetter(0), flat), np.int32, n)
    microbatch = np.fromiter(map(itemgetter(2), flat), np.int32, n)
    # kinds are one-letter strings: join them and map the letters through a lookup table
    letters = "".join(map(itemgetter(1), flat)).encode("ascii")
    kind = _KIND_OF_LETTER[np.frombuffer(letters, np.uint8)]
    del flat
    device = np.repeat(np.arange(schedule.num_devices, dtype=np.int32), lengths)
    return OpArrays(device, stage, kind, microbatch, offsets)


def _op_text(stage: int, kind: int, microbatch: int) -> str:
    return f"{stage}{KIND_ORDER[kind].value}{microbatch}"


# problems _index_ops reports: (code, row or stage-microbatch index)
_OK, _OUT_OF_RANGE, _DUPLICATE, _MISPLACED, _INCOMPLETE = range(5)


@njit(cache=True)
def _index_ops(device, stage, kind, microbatch, num_stages, m, replicas, route):
    """row_of[(stage * m + mb) * 4 + kind] -> op row (-1 if absent), plus the first problem:
    an op out of range, a duplicate, an op off its placement's device, or a stage-microbatch
    without exactly one F and one B or one I and one W."""
    n = stage.shape[0]
    row_of = np.full(num_stages * m * 4, -1, np.int32)
    for x in range(n):
        s = stage[x]
        mb = microbatch[x]
        if s < 0 or s >= num_stages or mb < 0 or mb >= m:
            return row_of, _OUT_OF_RANGE, x
        if replicas[route[mb], s] != device[x]:
            return row_of, _MISPLACED, x
        key = (s * m + mb) * 4 + kind[x]
        if row_of[key] >= 0:
            return row_of, _DUPLICATE, x
        row_of[key] = x
    for sm in range(num_stages * m):
        f = row_of[sm * 4 + KIND_F] >= 0
        i = row_of[sm * 4 + KIND_I] >= 0
        w = row_of[sm * 4 + KIND_W] >= 0
        b = row_of[sm * 4 + KIND_B] >= 0
        if not f or i != w or b == i:
            return row_of, _INCOMPLETE, sm
    return row_of, _OK, -1


@njit(cache=True)
def _link(device, stage, kind, microbatch, row_of, num_stages, m, replicas, route,
          per_kind, output_bytes, ar_src, ar_dst, ar_stage, ar_bytes, ar_after):
    """Durations, data predecessors and transfers of every op (one pass to count the
    point-to-point transfers, one to fill them); the all-reduces are appended."""
    n = stage.shape[0]
    op_duration = np.empty(n, np.float64)
    pred0 = np.full(n, -1, np.int32)
    pred1 = np.full(n, -1, np.int32)
    op_transfer = np.full(n, -1, np.int32)
    peer = np.full(n, -1, np.int32)
    count = 0
    for x in range(n):
        s = stage[x]
        k = kind[x]
        mb = microbatch[x]
        op_duration[x] = per_kind[k, s]
        if k == KIND_F:
            if s > 0:
                pred0[x] = row_of[((s - 1) * m + mb) * 4 + KIND_F]
            if s < num_stages - 1:
                peer[x] = replicas[route[mb], s + 1]
        elif k == KIND_W:
            pred0[x] = row_of[(s * m + mb) * 4 + KIND_I]
        else:
            pred0[x] = row_of[(s * m + mb) * 4 + KIND_F]
            if s < num_stages - 1:
                upper = row_of[((s + 1) * m + mb) * 4 + KIND_I]
                if upper < 0:
                    upper = row_of[((s + 1) * m + mb) * 4 + KIND_B]
                pred1[x] = upper
            if s > 0:
                peer[x] = replicas[route[mb], s - 1]
        if peer[x] >= 0 and peer[x] != device[x]:
            op_transfer[x] = count
            count += 1
    total = count + ar_src.shape[0]
    tr_src = np.empty(total, np.int32)
    tr_dst = np.empty(total, np.int32)
    tr_kind = np.empty(total, np.int8)
    tr_stage = np.empty(total, np.int32)
    tr_microbatch = np.empty(total, np.int32)
    tr_bytes = np.empty(total, np.float64)
    tr_after = np.empty(total, np.int32)
    for x in range(n):
        t = op_transfer[x]
        if t < 0:
            continue
        s = stage[x]
        a = device[x]
        b = peer[x]
        forward = kind[x] == KIND_F
        tr_src[t] = a
        tr_dst[t] = b
        tr_kind[t] = ACTIVATION if forward else GRADIENT
        tr_stage[t] = s
        tr_microbatch[t] = microbatch[x]
        # a gradient is the size of the activation the stage below sent up
        size = output_bytes[s] if forward else output_bytes[s - 1]
        tr_bytes[t] = size
        tr_after[t] = x
    for j in range(ar_src.shape[0]):
        t = count + j
        tr_src[t] = ar_src[j]
        tr_dst[t] = ar_dst[j]
        tr_kind[t] = ALLREDUCE
        tr_stage[t] = ar_stage[j]
        tr_microbatch[t] = -1
        tr_bytes[t] = ar_bytes[j]
        tr_after[t] = ar_after[j]
    return (op_duration, pred0, pred1, op_transfer,
            tr_src, tr_dst, tr_kind, tr_stage, tr_microbatch, tr_bytes, tr_after, count)


def _raise_problem(schedule: Schedule, ops: OpArrays, code: int, index: int) -> None:
    hint = "run `pipesched validate` on the schedule for the full report"
    if code == _INCOMPLETE:
        stage, mb = divmod(index, schedule.num_microbatches)
        raise PipeschedError(
            f"stage_microbatch={stage},{mb}: needs one F and either one B or one I and one W; {hint}"
        )
    text = _op_text(int(ops.stage[index]), int(ops.kind[index]), int(ops.microbatch[index]))
    if code == _OUT_OF_RANGE:
        raise PipeschedError(
            f"op={text}: stage or microbatch out of range (stages 0..{schedule.num_stages - 1}, "
            f"microbatches 0..{schedule.num_microbatches - 1}); {hint}"
        )
    if code == _DUPLICATE:
        raise PipeschedError(f"op={text}: appears more than once; {hint}")
    expected = schedule.device_of(int(ops.stage[index]), int(ops.microbatch[index]))
    raise PipeschedError(
        f"op={text}: on device {int(ops.device[index])} but the placement puts it on device {expected}; {hint}"
    )


def lower(schedule: Schedule, costs: StageCosts, network: Network) -> TaskGraph:
    """Build the task graph of ``schedule`` with ``costs`` on ``network``."""
    require(
        costs.num_stages == schedule.num_stages,
        "stage_costs",
        f"{costs.num_stages} stages",
        f"the schedule has {schedule.num_stages} stages; give one cost row per stage",
    )
    require(
        network.num_devices >= schedule.num_devices,
        "devices",
        network.num_devices,
        f"the network has {network.num_devices} devices but the schedule places stages on "
        f"{schedule.num_devices}; use a bigger cluster",
    )
    ops = op_arrays(schedule)
    m, num_stages = schedule.num_microbatches, schedule.num_stages
    replicas = np.asarray(schedule.placement.replicas, dtype=np.int32)
    route = np.asarray(schedule.route, dtype=np.int32)
    row_of, code, index = _index_ops(ops.device, ops.stage, ops.kind, ops.microbatch,
                                     num_stages, m, replicas, route)
    if code != _OK:
        _raise_problem(schedule, ops, code, index)
    # op durations by kind (rows F, I, W, B) and stage, seconds
    per_kind = np.empty((4, num_stages))
    per_kind[KIND_F] = costs.forward
    per_kind[KIND_I] = costs.backward_input
    per_kind[KIND_W] = costs.backward_weight
    per_kind[KIND_B] = [costs.full_backward(s) for s in range(num_stages)]
    # gradient all-reduce between the two replicas of each stage
    ar = _allreduces(schedule, ops, costs)
    (op_duration, pred0, pred1, op_transfer, src, dst, kind, stage, microbatch, nbytes, after,
     num_p2p) = _link(ops.device, ops.stage, ops.kind, ops.microbatch, row_of, num_stages, m,
                      replicas, route, per_kind, np.asarray(costs.output_bytes, np.float64),
                      ar["src"], ar["dst"], ar["stage"], ar["bytes"], ar["after0"])
    return TaskGraph(
        ops=ops,
        op_duration=op_duration,
        pred0=pred0,
        pred1=pred1,
        op_transfer=op_transfer,
        tr_src=src,
        tr_dst=dst,
        tr_kind=kind,
        tr_stage=stage,
        tr_microbatch=microbatch,
        tr_bytes=nbytes,
        tr_after=after,
        ar_after=ar["after1"],
        num_p2p=int(num_p2p),
        num_devices=schedule.num_devices,
    )


def gradient_bytes(costs: StageCosts, stage: int) -> float:
    """Bytes of stage's gradient all-reduce (see the module docstring for the default)."""
    if costs.grad_bytes is not None:
        return costs.grad_bytes[stage]
    return costs.static(stage) / STATIC_PER_GRADIENT_BYTE


def _allreduces(schedule: Schedule, ops: OpArrays, costs: StageCosts) -> dict[str, np.ndarray]:
    """One all-reduce per stage whose two replicas sit on different devices."""
    columns: dict[str, list] = {name: [] for name in ("src", "dst", "stage", "bytes", "after0", "after1")}
    if schedule.placement.num_replicas > 1:
        # the last weight-gradient op (W or B) of each (device, stage), by table position
        weight_rows = np.flatnonzero((ops.kind == KIND_W) | (ops.kind == KIND_B))
        last: dict[tuple[int, int], int] = {}
        keys = ops.device[weight_rows].astype(np.int64) * schedule.num_stages + ops.stage[weight_rows]
        # rows ascend, so the last occurrence of each key is its last op in table order
        unique_keys, first_in_reversed = np.unique(keys[::-1], return_index=True)
        for key, index in zip(unique_keys.tolist(), first_in_reversed.tolist(), strict=True):
            last[divmod(key, schedule.num_stages)] = int(weight_rows[len(weight_rows) - 1 - index])
        for stage_index in range(schedule.num_stages):
            devices = sorted({replica[stage_index] for replica in schedule.placement.replicas})
            if len(devices) < 2:
                continue
            for a, b in itertools.pairwise(devices):
                after = [last[(d, stage_index)] for d in (a, b) if (d, stage_index) in last]
                if not after:
                    continue
                columns["src"].append(a)
                columns["dst"].append(b)
                columns["stage"].append(stage_index)
                columns["bytes"].append(gradient_bytes(costs, stage_index))
                columns["after0"].append(after[0])
                columns["after1"].append(after[1] if len(after) > 1 else -1)
    return {
        "src": np.asarray(columns["src"], np.int32),
        "dst": np.asarray(columns["dst"], np.int32),
        "stage": np.asarray(columns["stage"], np.int32),
        "bytes": np.asarray(columns["bytes"], np.float64),
        "after0": np.asarray(columns["after0"], np.int32),
        "after1": np.asarray(columns["after1"], np.int32),
    }
