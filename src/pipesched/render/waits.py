"""Why each op started when it did: the event whose end released it.

An op starts once its device is free (the previous op on the device ended; for an offload
or reload on the device's host link, the previous op there or the compute op that issues
it) and its inputs are there (each data predecessor ended, or, across devices, the transfer carrying its
activation or gradient arrived). The cause is the latest of these; on a tie the transfer or
data dependency is named, since it explains more than "the device was busy".

Everything here works on whole columns (numpy), so a timeline of a million ops takes
about a second.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipesched.ops import KIND_INDEX, B, F, I, O, R, W
from pipesched.render.style import time_scale
from pipesched.timeline import ACTIVATION, GRADIENT, TRANSFER_KIND_NAMES, Timeline

# cause codes, stored in Waits.cause
WAIT_NONE, WAIT_DEPENDENCY, WAIT_TRANSFER, WAIT_DEVICE = 0, 1, 2, 3
WAIT_NAMES = ("nothing", "dependency", "transfer", "device")
# tie order: a transfer explains most, then the producing op, then the device order
_PRIORITY = np.array([-1, 1, 2, 0])
_F, _I, _W, _B, _O, _R = (KIND_INDEX[k] for k in (F, I, W, B, O, R))


@dataclass(frozen=True)
class Waits:
    """One entry per op row of the timeline."""

    cause: np.ndarray  # int8, WAIT_* code
    ref: np.ndarray  # int32: op row (dependency, device), transfer row (transfer), -1 (nothing)
    ready: np.ndarray  # float64: when that cause ended (nan for nothing)


@dataclass(frozen=True)
class Dependencies:
    """The data dependencies of a timeline's rows, as row numbers (-1: none).

    ``carried[r]`` is the predecessor whose output reaches op row r from another stage (the
    activation of F(s-1) for F(s), the gradient of stage s+1's backward for I/B(s)); ``local``
    is the other one (F(s) for I/B(s), or R(s) when its activations were offloaded; I(s) for
    W(s); F(s) for an offload O(s), O(s) for its reload R(s)). ``consumer[t]`` is the op row that
    transfer row t feeds (-1 for all-reduces), ``delivery[r]`` the transfer that brought row
    r its carried input (-1 when none did: same device, or no transfers recorded);
    ``producer[t]`` the op row whose output transfer row t carries (-1 for all-reduces).
    """

    carried: np.ndarray
    local: np.ndarray
    consumer: np.ndarray
    delivery: np.ndarray
    producer: np.ndarray


def dependencies(timeline: Timeline) -> Dependencies:
    """Row-level data dependencies (see ``Schedule.predecessors`` for the rules)."""
    stage = timeline.op_stage.astype(np.int64)
    kind = timeline.op_kind.astype(np.int64)
    microbatch = timeline.op_microbatch.astype(np.int64)
    stages = timeline.schedule.num_stages
    microbatches = max(timeline.schedule.num_microbatches, int(microbatch.max(initial=-1)) + 1)
    kinds = len(timeline.schedule.rules)
    row_of = np.full(stages * microbatches * kinds + kinds, -1, np.int64)

    def lookup(s: np.ndarray, k: np.ndarray | int, mb: np.ndarray) -> np.ndarray:
        inside = (s >= 0) & (s < stages) & (mb >= 0)
        keys = np.where(inside, (s * microbatches + mb) * kinds + k, len(row_of) - 1)
        return np.where(inside, row_of[keys], -1)

    row_of[(stage * microbatches + microbatch) * kinds + kind] = np.arange(len(timeline))

    def backward_of(s: np.ndarray, mb: np.ndarray) -> np.ndarray:
        """The op producing stage s's input gradient: I when split, else B."""
        split = lookup(s, _I, mb)
        return np.where(split >= 0, split, lookup(s, _B, mb))

    is_f, is_w = kind == _F, kind == _W
    is_back = (kind == _I) | (kind == _B)
    carried = np.full(len(timeline), -1, np.int64)
    local = np.full(len(timeline), -1, np.int64)
    carried[is_f] = lookup(stage - 1, _F, microbatch)[is_f]
    carried[is_back] = backward_of(stage + 1, microbatch)[is_back]
    reloaded = lookup(stage, _R, microbatch)
    local[is_back] = np.where(reloaded >= 0, reloaded, lookup(stage, _F, microbatch))[is_back]
    local[is_w] = lookup(stage, _I, microbatch)[is_w]
    local[kind == _O] = lookup(stage, _F, microbatch)[kind == _O]
    local[kind == _R] = lookup(stage, _O, microbatch)[kind == _R]

    table = timeline.transfers
    t_stage = table.stage.astype(np.int64)
    t_mb = table.microbatch.astype(np.int64)
    consumer = np.full(len(table), -1, np.int64)
    producer = np.full(len(table), -1, np.int64)
    activation, gradient = table.kind == ACTIVATION, table.kind == GRADIENT
    consumer[activation] = lookup(t_stage + 1, _F, t_mb)[activation]
    consumer[gradient] = backward_of(t_stage - 1, t_mb)[gradient]
    producer[activation] = lookup(t_stage, _F, t_mb)[activation]
    producer[gradient] = backward_of(t_stage, t_mb)[gradient]
    delivery = np.full(len(timeline), -1, np.int64)
    fed = consumer >= 0
    delivery[consumer[fed]] = np.flatnonzero(fed)
    return Dependencies(carried, local, consumer, delivery, producer)


def waited_for(timeline: Timeline) -> Waits:
    """The cause of every op's start time (see the module docstring)."""
    n = len(timeline)
    deps = dependencies(timeline)
    previous = np.full(n, -1, np.int64)
    for device in range(timeline.num_devices):
        for compute in (True, False):
            rows = timeline.rows_of_device(device, compute=compute)
            previous[rows[1:]] = rows[:-1]

    end = timeline.op_end
    device = timeline.op_device
    on_host = ~timeline.on_compute
    if on_host.any():
        # a host-link op is also held by the compute op before it in its device's table
        # (rows are in table order), which issues it: the later of the two is its device cause
        last_compute = np.where(on_host, -1, np.arange(n))
        np.maximum.accumulate(last_compute, out=last_compute)
        issuer = np.where(on_host & (last_compute >= 0) & (device[np.maximum(last_compute, 0)] == device),
                          last_compute, -1)
        later = (issuer >= 0) & ((previous < 0) | (end[np.maximum(issuer, 0)] > end[np.maximum(previous, 0)]))
        previous = np.where(later, issuer, previous)
    # candidates per row: [previous op on the device, local input, carried input]
    time = np.full((n, 3), -np.inf)
    code = np.zeros((n, 3), np.int64)
    ref = np.full((n, 3), -1, np.int64)
    for column, rows, what in ((0, previous, WAIT_DEVICE), (1, deps.local, WAIT_DEPENDENCY),
                               (2, deps.carried, WAIT_DEPENDENCY)):
        present = rows >= 0
        time[present, column] = end[rows[present]]
        code[present, column] = what
        ref[present, column] = rows[present]
    # a carried input from another device arrives with its transfer
    crossed = (deps.carried >= 0) & (deps.delivery >= 0)
    crossed[crossed] = device[deps.carried[crossed]] != device[crossed]
    time[crossed, 2] = timeline.transfers.end[deps.delivery[crossed]]
    code[crossed, 2] = WAIT_TRANSFER
    ref[crossed, 2] = deps.delivery[crossed]
    if timeline.op_entry is not None:
        # a fused op waits for the inputs of all its parts: its later parts' inputs count
        # for its first part (the row that holds the device)
        tails = np.flatnonzero(~timeline.drawn())
        heads = timeline.op_entry[tails].astype(np.int64)
        for column in (1, 2):
            later = time[tails, column] > time[heads, column]
            time[heads[later], column] = time[tails[later], column]
            code[heads[later], column] = code[tails[later], column]
            ref[heads[later], column] = ref[tails[later], column]

    latest = time.max(axis=1, initial=-np.inf)
    tolerance = 1e-9 * max(timeline.makespan, 1e-30)
    tied = time >= (latest - tolerance)[:, None]
    choice = np.argmax(np.where(tied, _PRIORITY[code], -2), axis=1)
    picked = np.arange(n)
    found = np.isfinite(latest)
    return Waits(
        cause=np.where(found, code[picked, choice], WAIT_NONE).astype(np.int8),
        ref=np.where(found, ref[picked, choice], -1).astype(np.int32),
        ready=np.where(found, time[picked, choice], np.nan),
    )


def wait_texts(timeline: Timeline, waits: Waits) -> list[str]:
    """The cause of every op's start, in words (for traces; the HTML report builds the same
    sentences in the page).

    >>> from pipesched.generators import generate
    >>> from pipesched.slots import slot_table
    >>> t = slot_table(generate("1f1b", 2, 2))  # device 0 runs 0F0 0F1 0B0 0B1
    >>> wait_texts(t, waited_for(t))[:3]
    ['nothing: starts the iteration', 'device: 0F0 on device 0 ended at 1 slots', 'dependency: 1B0 on device 1 ended at 4 slots']
    """
    scale = time_scale(timeline.unit, timeline.makespan)
    letters = timeline.schedule.rules.letters
    stage, kind, microbatch = (timeline.op_stage.tolist(), timeline.op_kind.tolist(),
                               timeline.op_microbatch.tolist())
    device = timeline.op_device.tolist()
    table = timeline.transfers
    when = ((waits.ready - timeline.origin) * scale.factor).tolist()
    texts = []
    for row, (code, target) in enumerate(zip(waits.cause.tolist(), waits.ref.tolist(), strict=True)):
        at = f"{when[row]:.6g} {scale.unit}"
        if code == WAIT_NONE:
            texts.append("nothing: starts the iteration")
        elif code == WAIT_TRANSFER:
            texts.append(f"transfer: {TRANSFER_KIND_NAMES[int(table.kind[target])]} of microbatch "
                         f"{int(table.microbatch[target])} d{int(table.src_device[target])}->"
                         f"d{int(table.dst_device[target])} arrived at {at}")
        else:
            op = f"{stage[target]}{letters[kind[target]]}{microbatch[target]}"
            texts.append(f"{WAIT_NAMES[code]}: {op} on device {device[target]} ended at {at}")
    return texts
