"""What a serving run produced: when every request and every iteration ran (``ServeRun``).

The engine (``pipesched.serving.engine``) writes it, a real run (``pipesched.runtime``)
measures one of the same shape, and everything after reads it: the metrics
(``pipesched.serving.results``), capacity, the timeline and the pictures.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipesched.serving.config import ServeConfig
from pipesched.serving.trace import Trace

WEIGHTS = "weights"  # the kind of a weight move in ``KVMoves`` (rules.TRANSFER_KIND_NAMES' name)


@dataclass(frozen=True, eq=False)
class IterationLog:
    """One row per (iteration, stage) that ran: columnar, in start order per device group.

    An iteration is one batch of one instance (a replica, or a prefill or decode instance),
    run stage by stage; ``batch`` numbers the iterations of the whole run. Its requests are
    ``members[offsets[batch]:offsets[batch + 1]]`` (request rows of the trace), one list per
    batch, not per stage.
    """

    batch: np.ndarray  # int64: the iteration this row belongs to
    instance: np.ndarray  # int32: replica (or instance) index, see ``ServeRun.instance_kind``
    stage: np.ndarray  # int32: pipeline stage within the instance
    first_device: np.ndarray  # int32: cluster rank of the stage's first device (its group is tp ranks)
    start: np.ndarray  # float64 seconds
    end: np.ndarray  # float64 seconds
    prefill_tokens: np.ndarray  # int64: prefill chunk tokens in the batch
    decodes: np.ndarray  # int64: decode requests in the batch
    kv_tokens: np.ndarray  # int64: KV tokens the batch's decodes read
    flops: np.ndarray  # float64: model FLOPs of the row (StageIterationCosts.flops)
    members: np.ndarray  # int64: request rows, batch after batch
    offsets: np.ndarray  # int64 [batches + 1] into members
    # the hidden state each row sends to the next stage of its instance: when it arrived there
    # (seconds; its end on the last stage) and its bytes; None when the run does not record them
    send_end: np.ndarray | None = None  # float64
    send_bytes: np.ndarray | None = None  # float64

    def __len__(self) -> int:
        return int(self.start.shape[0])


@dataclass(frozen=True, eq=False)
class KVTrace:
    """KV-cache blocks in use on each instance over time, as step functions."""

    times: tuple[np.ndarray, ...]  # per instance: when the use changed (seconds)
    blocks: tuple[np.ndarray, ...]  # per instance: blocks in use from then on
    capacity_blocks: tuple[int, ...]  # per instance: blocks its cache holds (the tightest stage's)
    block_size: int  # tokens per block
    preempted_at: tuple[np.ndarray, ...] = ()  # per instance: when it preempted a request (seconds); () unrecorded


@dataclass(frozen=True, eq=False)
class KVMoves:
    """KV caches moved over a link: a prefill instance's cache sent to a decode instance
    (``"transfer"``), a preempted request's cache swapped to host memory and back
    (``"swap-out"``, ``"swap-in"``), and a model's weights moved onto a device (``WEIGHTS``,
    request -1, bytes per device): brought back onto a device group it shares with other
    models (``serving.pool``), or moved when a deployment changes shape (``serving.events``).
    One row each."""

    request: np.ndarray  # int64 trace row (-1: weights)
    kind: tuple[str, ...]  # "transfer", "swap-out", "swap-in" or WEIGHTS
    src_device: np.ndarray  # int32 cluster rank (-1: host memory)
    dst_device: np.ndarray  # int32 cluster rank (-1: host memory)
    nbytes: np.ndarray  # float64
    start: np.ndarray  # float64 seconds
    end: np.ndarray  # float64 seconds
    instance: np.ndarray | None = None  # int32: the instance whose move it is (the sender of a transfer)

    def __len__(self) -> int:
        return int(self.start.shape[0])

    @classmethod
    def empty(cls) -> KVMoves:
        i64, i32, f64 = np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.float64)
        return cls(i64, (), i32, i32, f64, f64, f64, instance=i32)


# the columns of ``ServeRun.preemption_s``: the parts of a preemption's cost, then its span
PREEMPTION_PARTS = ("save", "reload", "recompute", "queueing")
PREEMPTION_TOTAL = "total"


@dataclass(frozen=True, eq=False)
class ServeRun:
    """A serving run of ``trace`` under ``config``; per-request arrays in trace order."""

    trace: Trace
    config: ServeConfig
    instance: np.ndarray  # int32: the instance that made its tokens (the decode instance when disaggregated)
    scheduled_at: np.ndarray  # float64: when its first prefill chunk started on the first stage
    first_token_at: np.ndarray  # float64: when its first output token was made (its prefill's last chunk ended)
    finished_at: np.ndarray  # float64: when its last output token was made
    preemptions: np.ndarray  # int32: times it was preempted
    token_times: np.ndarray  # float64: every output token's time, request after request
    token_offsets: np.ndarray  # int64 [requests + 1] into token_times
    iterations: IterationLog
    kv: KVTrace
    instance_kind: tuple[str, ...]  # per instance: "replica", or "prefill" / "decode" when disaggregated
    instance_devices: tuple[tuple[int, ...], ...]  # per instance, per stage: the stage's first cluster rank
    tp: tuple[int, ...]  # per instance: devices per stage
    peak_flops: float  # per device, for MFU
    moves: KVMoves = field(default_factory=KVMoves.empty)
    source: str = "simulated"  # or "measured"
    # per instance, per stage: KV cache of one token on each device of the stage, bytes
    # (``StageIterationCosts.kv_bytes_per_token``); () when not recorded
    kv_bytes_per_token: tuple[tuple[float, ...], ...] = ()
    # float64 [requests, 5]: what its preemptions cost it, seconds, in PREEMPTION_PARTS order
    # (save, reload, recompute, queueing: ``engine``'s parts) and their total span; None unrecorded
    preemption_s: np.ndarray | None = None

    @property
    def duration(self) -> float:
        """From the first arrival to the last token."""
        if len(self.trace) == 0:
            return 0.0
        return float(self.finished_at.max() - self.trace.arrived_at[0])
