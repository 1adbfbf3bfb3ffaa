"""Per-op timing of a real run, and the measured Timeline built from it.

Every rank records, for each compute op it runs, its start and end on the host's monotonic
clock (``time.perf_counter_ns``, CLOCK_MONOTONIC on Linux: one clock for every process of
the machine, so the ranks' records line up without an offset exchange; the launcher only
starts ranks on one machine). GPU ranks time ops with CUDA events mapped onto the same
clock (``pipesched.runtime.gpu``).

An op's start is when its compute starts, after any wait for its input; the wait is kept
apart (``Timeline.measured.op_wait_s``). The last stage's forward includes the loss.
``Timeline.measured.op_cpu_s`` is the CPU time the op's thread got during the op: on a CPU
rank (one torch thread) it falls short of the op's duration exactly when other processes
took the core, which ``cpu_share`` sums up.

Every point-to-point message is recorded on both ends on the same host clock: the sender
notes when it posted the send, the receiver when its wait for the receive returned (at once
when the data had already arrived). A measured transfer spans the two, posted on the sender
to received on the receiver: its end is when the receiver took the data, which can be later
than when the data arrived, and it includes the time the sender's message waited for the
receiver. On a GPU rank both are host times, as the input waits are.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np

from pipesched.enums import TimeUnit
from pipesched.ops import Op
from pipesched.rules import RULES
from pipesched.schedule import Schedule
from pipesched.timeline import ALLREDUCE, MeasuredInfo, Source, Timeline, TransferTable

# a message's key on both of its ends: (kind, producing stage, microbatch, sender, receiver)
MessageKey = tuple[int, int, int, int, int]


ELEMENT_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2}  # bytes per element of each runtime dtype


@dataclass(frozen=True)
class StageTiming:
    """Median op times of a run of layers for one microbatch (seconds) and its sizes (bytes)."""

    forward: float
    backward_input: float
    backward_weight: float
    backward: float  # full backward B, timed on its own (not I + W)
    activation_bytes: float  # tensors autograd saves in F (parameters excluded)
    output_bytes: float  # the tensor sent to the next stage (0 on the last stage: nothing is sent)
    params: int
    # every timed repeat, seconds: (op kind letter F, I, W or B, its times), the medians' samples
    repeats: tuple[tuple[str, tuple[float, ...]], ...] = ()

    def repeat_seconds(self, *, offset_s: float = 0.0) -> dict[str, tuple[float, ...]]:
        """Kind letter -> every repeat's seconds, plus ``offset_s`` (the per-op overhead a
        cost file adds to the medians)."""
        return {kind: tuple(t + offset_s for t in times) for kind, times in self.repeats}


@dataclass
class RankStep:
    """What one rank recorded in one step; times in ns on the common clock."""

    device: int
    stage: list[int] = field(default_factory=list)
    kind: list[int] = field(default_factory=list)  # index into rules.RULES
    microbatch: list[int] = field(default_factory=list)
    start_ns: list[int] = field(default_factory=list)
    end_ns: list[int] = field(default_factory=list)
    wait_ns: list[int] = field(default_factory=list)  # input wait before the op started
    cpu_ns: list[int] = field(default_factory=list)  # CPU time of the op's thread during the op
    # gradient all-reduces of replicated stages: (stage, partner device, posted, finished)
    reduces: list[tuple[int, int, int, int]] = field(default_factory=list)
    reduce_bytes: list[float] = field(default_factory=list)
    # point-to-point messages this rank sent: (key, when the send was posted, bytes)
    sends: list[tuple[MessageKey, int, int]] = field(default_factory=list)
    # messages this rank received: (key, when its wait for the receive returned)
    receives: list[tuple[MessageKey, int]] = field(default_factory=list)

    def ops(self) -> list[Op]:
        return [Op(s, RULES.kinds[k].kind, mb) for s, k, mb in zip(self.stage, self.kind, self.microbatch, strict=True)]


class HostRecorder:
    """Op timing on the host clock (CPU ranks, where compute is synchronous)."""

    def __init__(self, device: int) -> None:
        self.device = device
        self.step = RankStep(device)

    def start_step(self) -> None:
        self.step = RankStep(self.device)

    def begin(self) -> tuple[int, int]:
        return time.perf_counter_ns(), time.thread_time_ns()

    def end(self, op: Op, begun: tuple[int, int], *, wait_ns: int = 0) -> None:
        cpu = time.thread_time_ns() - begun[1]
        self._append(op, begun[0], time.perf_counter_ns(), wait_ns, cpu)

    def extend_last(self) -> None:
        """Move the last op's end to now (the loss computed right after the last forward)."""
        end = time.perf_counter_ns()
        # the thread was busy with the loss all along: its CPU time grows by the same span
        self.step.cpu_ns[-1] += end - self.step.end_ns[-1]
        self.step.end_ns[-1] = end

    def now(self) -> int:
        return time.perf_counter_ns()

    def sent(self, message: tuple[int, int, int], peer: int, nbytes: int) -> None:
        """``message`` (kind, producing stage, microbatch) is being posted to ``peer`` now."""
        kind, stage, microbatch = message
        self.step.sends.append(((kind, stage, microbatch, self.device, peer), time.perf_counter_ns(), nbytes))

    def received(self, message: tuple[int, int, int], peer: int) -> None:
        """``message`` from ``peer`` is in this rank's hands now."""
        kind, stage, microbatch = message
        self.step.receives.append(((kind, stage, microbatch, peer, self.device), time.perf_counter_ns()))

    def finish(self) -> RankStep:
        return self.step

    def _append(self, op: Op, start: int, end: int, wait_ns: int, cpu_ns: int) -> None:
        step = self.step
        step.stage.append(op.stage)
        step.kind.append(RULES.index(op.kind))
        step.microbatch.append(op.microbatch)
        step.start_ns.append(start)
        step.end_ns.append(end)
        step.wait_ns.append(wait_ns)
        step.cpu_ns.append(cpu_ns)


def measured_timeline(schedule: Schedule, ranks: list[RankStep], *, info: MeasuredInfo) -> Timeline:
    """The Timeline (source "measured", seconds from the step's first op) of one step; ``info``
    says how it was run (its op waits and CPU times are filled in from ``ranks``).

    Op rows go device by device, each device's ops in the order they ran.
    """
    ordered = sorted(ranks, key=lambda r: r.device)
    starts = [s for r in ordered for s in r.start_ns]
    origin = min(starts) if starts else 0

    def column(name: str, dtype: type) -> np.ndarray:
        return np.array([x for r in ordered for x in getattr(r, name)], dtype=dtype)

    device = np.array([r.device for r in ordered for _ in r.start_ns], dtype=np.int32)
    to_s = 1e-9
    info = dataclasses.replace(info, op_wait_s=column("wait_ns", np.int64).astype(np.float64) * to_s,
                               op_cpu_s=column("cpu_ns", np.int64).astype(np.float64) * to_s)
    return Timeline(
        schedule=schedule,
        source=Source.MEASURED,
        unit=TimeUnit.SECONDS,
        op_device=device,
        op_stage=column("stage", np.int32),
        op_kind=column("kind", np.int8),
        op_microbatch=column("microbatch", np.int32),
        op_start=(column("start_ns", np.int64) - origin).astype(np.float64) * to_s,
        op_end=(column("end_ns", np.int64) - origin).astype(np.float64) * to_s,
        transfers=transfer_table(ordered, origin),
        measured=info,
    )


def transfer_table(ranks: list[RankStep], origin: int) -> TransferTable:
    """The step's transfers, seconds from ``origin`` (ns): every point-to-point message, from
    its send posted on the sender to its receive completed on the receiver (the module
    docstring), on channel ``"a->b"`` as simulated transfers are, in the order the senders
    posted them (device by device); then the replica all-reduces (``_reduce_table``)."""
    received = {key: done for rank in ranks for key, done in rank.receives}
    sends = [(key, posted, nbytes) for rank in ranks for key, posted, nbytes in rank.sends]
    reduces = _reduce_table(ranks, origin)
    if not sends:
        return reduces
    links = sorted({(key[3], key[4]) for key, _, _ in sends})
    channel_of = {link: k for k, link in enumerate(links)}
    n = len(sends)

    def column(index: int, dtype: type) -> np.ndarray:
        return np.fromiter((key[index] for key, _, _ in sends), dtype, n)

    start = np.fromiter((posted for _, posted, _ in sends), np.int64, n)
    end = np.fromiter((received[key] for key, _, _ in sends), np.int64, n)
    return TransferTable(
        src_device=np.concatenate([column(3, np.int32), reduces.src_device]),
        dst_device=np.concatenate([column(4, np.int32), reduces.dst_device]),
        kind=np.concatenate([column(0, np.int8), reduces.kind]),
        stage=np.concatenate([column(1, np.int32), reduces.stage]),
        microbatch=np.concatenate([column(2, np.int32), reduces.microbatch]),
        nbytes=np.concatenate([np.fromiter((b for _, _, b in sends), np.float64, n), reduces.nbytes]),
        start=np.concatenate([(start - origin).astype(np.float64) * 1e-9, reduces.start]),
        end=np.concatenate([(end - origin).astype(np.float64) * 1e-9, reduces.end]),
        channel=np.concatenate([np.fromiter((channel_of[(key[3], key[4])] for key, _, _ in sends), np.int32, n),
                                reduces.channel + len(links)]).astype(np.int32),
        channel_names=tuple(f"{a}->{b}" for a, b in links) + reduces.channel_names,
    )


def _reduce_table(ranks: list[RankStep], origin: int) -> TransferTable:
    """One row per replicated stage: from the later of the two posts to the later finish."""
    sides: dict[tuple[int, int, int], list[tuple[int, int, float]]] = {}
    for rank in ranks:
        for (stage, partner, posted, finished), nbytes in zip(rank.reduces, rank.reduce_bytes, strict=True):
            pair = (min(rank.device, partner), max(rank.device, partner), stage)
            sides.setdefault(pair, []).append((posted, finished, nbytes))
    if not sides:
        return TransferTable.empty()
    keys = sorted(sides)
    start = np.array([max(p for p, _, _ in sides[k]) for k in keys], np.int64)
    end = np.array([max(f for _, f, _ in sides[k]) for k in keys], np.int64)
    n = len(keys)
    return TransferTable(
        src_device=np.array([k[0] for k in keys], np.int32),
        dst_device=np.array([k[1] for k in keys], np.int32),
        kind=np.full(n, ALLREDUCE, np.int8),
        stage=np.array([k[2] for k in keys], np.int32),
        microbatch=np.full(n, -1, np.int32),
        nbytes=np.array([sides[k][0][2] for k in keys], np.float64),
        start=(start - origin).astype(np.float64) * 1e-9,
        end=(end - origin).astype(np.float64) * 1e-9,
        channel=np.arange(n, dtype=np.int32),
        channel_names=tuple(f"all-reduce {k[0]}<->{k[1]} stage {k[2]}" for k in keys),
    )


def order_mismatch(schedule: Schedule, timeline: Timeline) -> str | None:
    """None when every device ran exactly its table's ops in table order (a fused entry's
    parts one after the other); else where not."""
    for device, expected in enumerate(schedule.device_atoms):
        rows = np.flatnonzero(timeline.op_device == device)
        ran = [timeline.op(int(row)) for row in rows]
        if ran == list(expected):
            continue
        for index, (want, got) in enumerate(zip(expected, ran, strict=False)):
            if want != got:
                return f"device {device} ran {got} as its op {index}; the table has {want}"
        return f"device {device} ran {len(ran)} ops; the table has {len(expected)}"
    return None


def cpu_share(timeline: Timeline) -> float:
    """CPU time the ops' threads got over the ops' total duration (1.0: nothing else ran on
    the ranks' cores during the ops; only meaningful for CPU ranks)."""
    cpu = timeline.measured.op_cpu_s if timeline.measured is not None else None
    busy = float(np.sum(timeline.op_end - timeline.op_start))
    if cpu is None or busy <= 0:
        return 1.0
    return float(np.sum(cpu)) / busy
