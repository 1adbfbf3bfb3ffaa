"""The figures every view prints beside a timeline (iteration time, bubble, peak memory),
and the facts views need about its rows (which chunk of its device an op belongs to).

A timeline of several iterations back to back (a steady state) is labelled with one
steady-state iteration: its time, its microbatches and its bubble (``pipesched.metrics``),
while the drawing spans every iteration."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipesched.bubbles import BUBBLE_PARTS, bubble_breakdown
from pipesched.metrics import bubble_over_work, bubble_ratio, iteration_microbatches
from pipesched.metrics import summarize as timeline_metrics
from pipesched.render.style import format_memory, time_scale
from pipesched.timeline import ServingInfo, Timeline


@dataclass(frozen=True)
class Summary:
    """Key metrics of one timeline (times in the timeline's unit)."""

    name: str
    source: str  # "table", "simulated" or "measured"
    unit: str  # "slot" or "s"
    devices: int
    stages: int
    microbatches: float  # of one iteration (whole microbatches: the user's m)
    ops: int
    transfers: int
    makespan: float  # span of the whole timeline (every iteration it holds)
    iteration_time: float  # one iteration: the makespan, or the steady-state iteration
    iterations: int  # iterations the timeline holds back to back
    bubble_ratio: float  # idle / (devices x iteration time)
    bubble_over_work: float  # idle / busy, summed over devices
    peak_memory: float | None  # worst device; None without a memory trace
    memory_unit: str | None  # "bytes" or "stage-microbatches"
    out_of_memory: bool  # some device's peak exceeds its capacity
    bubble_parts: tuple[float, ...] = ()  # share of the idle time of each BUBBLE_PARTS part
    critical_compute: float = 0.0  # time the critical path spends in ops (whole timeline)
    critical_comm: float = 0.0  # and in transfers
    exposed_comm: float = 0.0  # communication no compute hides, summed over devices, one iteration
    hidden_comm: float = 0.0  # communication under compute, summed over devices, one iteration
    serving: ServingInfo | None = None  # a serving run's window: its ops are iterations, not a schedule's

    def headline(self) -> str:
        """One line for a title: ``iteration 33 slots · bubble 27.3% · peak memory 4 ...``
        (``steady-state iteration 24 slots (4 iterations of m=8 back to back) · ...`` for a
        steady state)."""
        scale = time_scale(self.unit, self.iteration_time)
        if self.serving is not None:
            return self._serving_headline()
        iteration = f"iteration {scale.format(self.iteration_time)}"
        if self.iterations > 1:
            iteration = (f"steady-state {iteration} ({self.iterations} iterations of m={self.microbatches:g} "
                         "back to back)")
        parts = [iteration, f"bubble {self.bubble_ratio:.1%}"]
        if self.peak_memory is not None and self.memory_unit is not None:
            parts.append(f"peak memory {format_memory(self.peak_memory, self.memory_unit)}")
            if self.out_of_memory:
                parts.append("OUT OF MEMORY")
        return " · ".join(parts)

    def _serving_headline(self) -> str:
        """``window 1.2 s: 400 of 9,120 iterations · idle 23.1% · KV cache peak 3.20 GiB``:
        a serving window has no iteration of its own, and its idle time is the stages'."""
        info = self.serving
        assert info is not None
        scale = time_scale(self.unit, self.makespan)
        parts = [f"window {scale.format(self.makespan)}: {len(info.batch):,} of {info.run_iterations:,} iterations",
                 f"idle {self.bubble_ratio:.1%}"]
        if self.peak_memory is not None and self.memory_unit is not None:
            parts.append(f"KV cache peak {format_memory(self.peak_memory, self.memory_unit)}")
        return " · ".join(parts)


def summarize(timeline: Timeline) -> Summary:
    memory = timeline.memory
    figures = timeline_metrics(timeline)
    return Summary(
        name=timeline.schedule.name,
        source=timeline.source,
        unit=timeline.unit,
        devices=timeline.num_devices,
        stages=timeline.schedule.num_stages,
        microbatches=iteration_microbatches(timeline),
        ops=len(timeline),
        transfers=len(timeline.transfers),
        makespan=timeline.makespan,
        iteration_time=timeline.iteration_time,
        iterations=timeline.iterations,
        bubble_ratio=bubble_ratio(timeline),
        bubble_over_work=bubble_over_work(timeline),
        peak_memory=max(memory.peak) if memory is not None and memory.peak else None,
        memory_unit=memory.unit if memory is not None else None,
        out_of_memory=bool(memory is not None and any(memory.out_of_memory)),
        bubble_parts=tuple(bubble_breakdown(timeline).shares().values()),
        critical_compute=figures.critical_path_compute,
        critical_comm=figures.critical_path_comm,
        exposed_comm=float(sum(figures.exposed_comm)),
        hidden_comm=float(sum(figures.hidden_comm)),
        serving=timeline.serving,
    )


def report_headline(summaries: Sequence[Summary], *, baseline: str = "1f1b") -> str:
    """One sentence for the top of a report: the fastest schedule that fits in memory and
    how much faster it is than ``baseline`` (else than the slowest that fits), e.g.
    ``fastest that fits: zb-v 3.368 s, 13.6% faster than 1f1b``; of one schedule its own
    headline (``Summary.headline``)."""
    if len(summaries) == 1:
        return f"{summaries[0].name}: {summaries[0].headline()}"
    fitting = [s for s in summaries if not s.out_of_memory]
    if not fitting:
        return f"no schedule fits in memory ({len(summaries)} out of memory)"
    best = min(fitting, key=lambda s: s.iteration_time)
    scale = time_scale(best.unit, best.iteration_time)
    text = f"fastest that fits: {best.name} {scale.format(best.iteration_time)}"
    same_unit = [s for s in fitting if s.unit == best.unit and s is not best]
    other = next((s for s in same_unit if s.name == baseline), None)
    if other is None and same_unit:
        other = max(same_unit, key=lambda s: s.iteration_time)
    if other is not None and other.iteration_time > 0:
        text += f", {1 - best.iteration_time / other.iteration_time:.1%} faster than {other.name}"
    out = len(summaries) - len(fitting)
    if out:
        text += f"; {out} of {len(summaries)} out of memory"
    return text


def bubble_parts_text(summary: Summary) -> str:
    """The bubble's parts as shares of the idle time, largest first, parts under 0.5% left
    out: ``dependency stalls 61% · warm-up and cool-down 32% · exposed communication 7%``."""
    parts = sorted(zip(summary.bubble_parts, BUBBLE_PARTS, strict=True), reverse=True)
    return " · ".join(f"{name} {share:.0%}" for share, name in parts if share >= 0.005) or "-"


def op_chunks(timeline: Timeline) -> tuple[np.ndarray, np.ndarray]:
    """(chunk of each op row, chunks on each device).

    A device that runs several model stages (interleaved, V-shaped or bidirectional
    schedules) holds several chunks; chunk 0 is its lowest stage. Views shade later chunks
    lighter and name the stage in labels.
    """
    chunk = np.zeros(len(timeline), np.int32)
    counts = np.zeros(timeline.num_devices, np.int32)
    for device in range(timeline.num_devices):
        rows = np.flatnonzero(timeline.op_device == device)
        stages, position = np.unique(timeline.op_stage[rows], return_inverse=True)
        chunk[rows] = position
        counts[device] = len(stages)
    return chunk, counts
