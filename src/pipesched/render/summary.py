"""The figures every view prints beside a timeline (iteration time, bubble, peak memory),
and the facts views need about its rows (which chunk of its device an op belongs to).

A timeline of several iterations back to back (a steady state) is labelled with one
steady-state iteration: its time, its microbatches and its bubble (``pipesched.metrics``),
while the drawing spans every iteration."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipesched.metrics import bubble_over_work, bubble_ratio, iteration_microbatches
from pipesched.render.style import format_memory, time_scale
from pipesched.timeline import Timeline


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

    def headline(self) -> str:
        """One line for a title: ``iteration 33 slots · bubble 27.3% · peak memory 4 ...``
        (``steady-state iteration 24 slots (4 iterations of m=8 back to back) · ...`` for a
        steady state)."""
        scale = time_scale(self.unit, self.iteration_time)
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


def summarize(timeline: Timeline) -> Summary:
    memory = timeline.memory
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
    )


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
