"""Op timing on a GPU rank (the nccl backend): CUDA events, mapped onto the host clock.

GPU work is asynchronous, so an op's host-side begin and end say when it was queued, not
when it ran. Each op instead records a CUDA event before and after itself on the current
stream. At the start of a step the recorder synchronizes, records a reference event and
reads the host clock right after; at the end it synchronizes once and places every event
at ``reference host time + elapsed GPU time since the reference``. So ranks' GPU ops land
on the same host clock as CPU ranks' (``pipesched.runtime.measure``).

Input waits (``wait_ns``) and all-reduce times stay on the host clock: they are when the
host blocked, which on a GPU rank is an upper bound of the device-side wait. An op's CPU
time is not meaningful on a GPU rank; it is recorded as the op's duration.
"""

from __future__ import annotations

import time

from pipesched.ops import Op
from pipesched.runtime.measure import HostRecorder, RankStep
from pipesched.runtime.torch_import import require_torch

torch = require_torch()


class CudaRecorder(HostRecorder):
    """HostRecorder's interface, timing ops with CUDA events on device ``device``."""

    def __init__(self, device: int) -> None:
        super().__init__(device)
        self._pending: list[tuple[Op, object, object, int]] = []
        self._reference = None
        self._reference_ns = 0

    def start_step(self) -> None:
        super().start_step()
        self._pending = []
        torch.cuda.synchronize()
        self._reference = torch.cuda.Event(enable_timing=True)
        self._reference.record()
        torch.cuda.synchronize()
        self._reference_ns = time.perf_counter_ns()

    def begin(self):
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def end(self, op: Op, begun, *, wait_ns: int = 0) -> None:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self._pending.append((op, begun, event, wait_ns))

    def extend_last(self) -> None:
        op, begun, _, wait_ns = self._pending[-1]
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self._pending[-1] = (op, begun, event, wait_ns)

    def finish(self) -> RankStep:
        torch.cuda.synchronize()
        for op, begun, ended, wait_ns in self._pending:
            # Event.elapsed_time is in milliseconds
            start = self._reference_ns + round(self._reference.elapsed_time(begun) * 1e6)
            end = self._reference_ns + round(self._reference.elapsed_time(ended) * 1e6)
            self._append(op, start, end, wait_ns, end - start)
        self._pending = []
        return self.step
