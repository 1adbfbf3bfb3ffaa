"""Colours, names, unit formatting and the time range a panel opens on, shared by every view
(terminal, Gantt, trace, HTML).

Forward is blue, the backward halves are warm (I orange, B the darker burnt orange of the
fused I+W), the deferrable weight gradient W is green, an overlapped forward-backward pair
(a fused op) dark slate; later chunks of a device are lighter shades of the same colours.
Activation offloads (O) and reloads (R), on a device's host link, are slate grey, the
reload lighter. Transfers: activations teal, gradients gold, all-reduces purple.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from pipesched.enums import IterationKind, MemoryUnit, TimeUnit
from pipesched.rules import RULES, Rules
from pipesched.timeline import TRANSFER_KIND_NAMES, Timeline
from pipesched.units import GiB, KiB, MiB, TiB

# index = the kind's position in rules.RULES (F, I, W, B, O, R, OVERLAP_F_B)
KIND_COLORS: tuple[str, ...] = ("#3274b5", "#f28e2b", "#4e9f50", "#d0582a", "#5d6d7e", "#8e9eae", "#3b3f5c")
KIND_LETTERS: tuple[str, ...] = RULES.letters
# one character per kind, where a box is too narrow for its label (a fused pair is ``&``)
KIND_MARKS: tuple[str, ...] = tuple(letter if len(letter) == 1 else "&" for letter in KIND_LETTERS)
KIND_NAMES: tuple[str, ...] = ("forward", "backward (input)", "backward (weight)", "backward (full)",
                               "offload to host", "reload from host", "overlapped forward + backward")
HOST_MEMORY_COLOR = "#5d6d7e"  # host memory curves: the offload colour
# kinds beyond the default table's (a kind a rules table adds), in the order they come
EXTRA_KIND_COLORS: tuple[str, ...] = ("#b07aa1", "#9c755f", "#76b7b2", "#edc948", "#ff9da7")


@dataclass(frozen=True)
class KindStyles:
    """Letters, one-character marks, names and colours of every kind of a rules table, by
    kind index (the table's position)."""

    letters: tuple[str, ...]
    marks: tuple[str, ...]
    names: tuple[str, ...]
    colors: tuple[str, ...]


# a serving timeline's iteration kinds (``pipesched.serving.timeline``): prefill in the
# forward's blue, decode green, a mixed batch orange (no training kind is drawn beside them)
SERVING_KIND_COLORS = {IterationKind.PREFILL: "#3274b5", IterationKind.DECODE: "#4e9f50",
                       IterationKind.MIXED: "#f28e2b"}


def kind_styles(rules: Rules) -> KindStyles:
    """The styles of ``rules``' kinds: a default kind's own, a serving iteration kind its
    SERVING_KIND_COLORS colour, another kind its letter, its rule's summary and the next of
    EXTRA_KIND_COLORS."""
    known = {letter: k for k, letter in enumerate(KIND_LETTERS)}
    extra = iter(itertools.cycle(EXTRA_KIND_COLORS))
    found = []
    for rule in rules:
        letter = str(rule.kind)
        k = known.get(letter)
        if k is not None:
            found.append((letter, KIND_MARKS[k], KIND_NAMES[k], KIND_COLORS[k]))
        elif isinstance(rule.kind, IterationKind):
            found.append((letter, letter, rule.summary, SERVING_KIND_COLORS[rule.kind]))
        else:
            found.append((letter, letter[0], rule.summary, next(extra)))
    return KindStyles(*(tuple(column) for column in zip(*found, strict=True)))

# index = timeline.TRANSFER_KIND_NAMES position (activation, gradient, allreduce,
# all-to-all, kv-cache, swap-out, swap-in): teal, gold, purple, slate, then serving's KV moves
# crimson and the swaps rose and pale rose, a change of shape's weight moves olive, apart
# from every op colour and its lighter shades
TRANSFER_COLORS: tuple[str, ...] = ("#5fb3b0", "#e3b52f", "#9d7cc1", "#607d8b", "#a63d57", "#d47a8f", "#e8b4c0",
                                    "#8a8f3a")
TRANSFER_NAMES: tuple[str, ...] = TRANSFER_KIND_NAMES

# one colour per device (memory curves), cycling beyond ten devices: apart from the red of
# out-of-memory, which only marks memory above a device's capacity
DEVICE_COLORS: tuple[str, ...] = ("#4c78a8", "#54a24b", "#b279a2", "#9d755d", "#f58518", "#72b7b2", "#8c6d31",
                                  "#7f7f7f", "#17becf", "#bcbd22")

IDLE_COLOR = "#ececec"
# request rows a serving op's hover lists (its count is always given)
LISTED_REQUESTS = 64
OOM_COLOR = "#c0392b"
# text drawn on a box of each kind (white reads on every fill)
LABEL_ON_KIND = "#ffffff"


def op_label(timeline: Timeline, row: int, *, several_stages: bool) -> str:
    """A box's text: ``F3`` (kind, microbatch), or the op text ``5F3`` when the device holds
    several stages; a fused op's parts joined by ``&`` (``F3&B1``, ``0F3&7B1``)."""
    entry = timeline.entry(row) if timeline.op_entry is not None else timeline.op(row)
    return "&".join(str(op) if several_stages else f"{op.kind}{op.microbatch}" for op in entry.atoms)


def device_labels(timeline: Timeline) -> tuple[str, ...]:
    """Each device's row label: ``d3``, or a serving timeline's stage group (``r0 s1``:
    replica 0's stage 1)."""
    if timeline.serving is not None:
        return timeline.serving.device_labels
    return tuple(f"d{d}" for d in range(timeline.num_devices))


def device_names(timeline: Timeline) -> tuple[str, ...]:
    """Each device in full: ``device 3``, or a serving stage group with its cluster ranks
    (``replica 0 · stage 1 · ranks 4-7``)."""
    if timeline.serving is not None:
        return timeline.serving.device_names
    return tuple(f"device {d}" for d in range(timeline.num_devices))


def device_color(device: int) -> str:
    """The colour of ``device`` in every view (its memory curve).

    >>> device_color(0) == device_color(len(DEVICE_COLORS))
    True
    """
    return DEVICE_COLORS[device % len(DEVICE_COLORS)]


def chunk_names(chunks: int) -> tuple[str, ...]:
    """What the legend calls each chunk shade of a device holding ``chunks`` stages (chunk 1
    is the device's lowest stage, drawn darkest).

    >>> chunk_names(2)
    ('chunk 1 of 2', 'chunk 2 of 2')
    """
    if chunks <= 1:
        return ("",)
    return tuple(f"chunk {c + 1} of {chunks}" for c in range(chunks))


def lighten(color: str, amount: float) -> str:
    """Mix ``#rrggbb`` with white; amount 0 keeps it, 1 gives white.

    >>> lighten("#000000", 0.5)
    '#808080'
    """
    rgb = [int(color[i : i + 2], 16) for i in (1, 3, 5)]
    mixed = [round(c + (255 - c) * amount) for c in rgb]
    return "#" + "".join(f"{c:02x}" for c in mixed)


def chunk_shade(chunk: int, chunks: int) -> float:
    """How much to lighten a device's ``chunk``-th stage (0 for the first) so the chunks of
    an interleaved or V schedule tell apart; never more than 0.45 so the kind stays clear."""
    if chunks <= 1:
        return 0.0
    return 0.45 * chunk / (chunks - 1)


@dataclass(frozen=True)
class TimeScale:
    """How to show times: ``value_in_unit = time * factor``."""

    factor: float
    unit: str  # "slots", "s", "ms" or "us"

    def format(self, time: float, *, digits: int = 4) -> str:
        return f"{time * self.factor:.{digits}g} {self.unit}"


# of a steady state's window, the margin shown on each side of one steady iteration
STEADY_MARGIN = 0.03


def home_window(timeline: Timeline) -> tuple[float, float]:
    """The time range a timeline's panel opens on (its unit, from its start): the whole
    timeline, or of iterations back to back the second one (the first steady iteration: the
    first pays the fill ramp), with a margin that shows the iteration ends at its sides."""
    ends = timeline.iteration_end
    if len(ends) < 3:
        return 0.0, timeline.makespan
    margin = STEADY_MARGIN * (ends[1] - ends[0])
    return max(0.0, ends[0] - margin), min(timeline.makespan, ends[1] + margin)


def time_scale(unit: str, span: float) -> TimeScale:
    """The display unit for a timeline in ``unit`` ("slot" or "s") spanning ``span``.

    >>> time_scale("s", 0.025)
    TimeScale(factor=1000.0, unit='ms')
    >>> time_scale("slot", 100).unit
    'slots'
    """
    if unit == TimeUnit.SLOT:
        return TimeScale(1.0, "slots")
    if span >= 1.0:
        return TimeScale(1.0, "s")
    if span >= 1e-3:
        return TimeScale(1e3, "ms")
    return TimeScale(1e6, "us")


def format_memory(value: float, unit: str) -> str:
    """Memory in a readable unit: bytes as GiB/MiB/KiB, other units (stage-microbatches) as
    a plain number.

    >>> format_memory(3 * 2**30, "bytes")
    '3.00 GiB'
    >>> format_memory(4, "stage-microbatches")
    '4 stage-microbatches'
    """
    if unit != MemoryUnit.BYTES:
        return f"{value:g} {unit}"
    for size, name in ((TiB, "TiB"), (GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if abs(value) >= size:
            return f"{value / size:.2f} {name}"
    return f"{value:g} B"


def memory_scale(unit: str, peak: float) -> tuple[float, str]:
    """(divisor, unit name) for a memory axis whose largest value is ``peak``."""
    if unit != MemoryUnit.BYTES:
        return 1.0, unit
    for size, name in ((TiB, "TiB"), (GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if peak >= size:
            return float(size), name
    return 1.0, "B"
